"""Forced SDPA kernels: entered inside the (compiled) loss, and recorded as the kernel that actually ran."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tiny_llm.config import load_recipe
from tiny_llm.runtime.device import compile_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def attention(q: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, q, q, is_causal=True).sum()


@pytest.mark.parametrize("compile_flag", ["false", "true"])
def test_the_loss_carries_its_forced_kernel_into_the_compiled_graph(compile_flag):
    # 'efficient' is GPU-only: forced on the CPU it must fail, wherever the loss is called from. Called
    # outside any kernel restriction, only a restriction inside the (compiled) function can make it fail;
    # a compiled graph does not guard on one entered around the call.
    forced = load_recipe(["tiny"], [f"runtime.compile={compile_flag}", "runtime.sdpa_backend=efficient"])
    with pytest.raises(RuntimeError, match="No viable backend"):
        compile_loss(attention, forced)(torch.randn(1, 2, 8, 16))
    auto = load_recipe(["tiny"], [f"runtime.compile={compile_flag}"])
    assert torch.isfinite(compile_loss(attention, auto)(torch.randn(1, 2, 8, 16)))
