"""Forced SDPA kernels: entered inside the (compiled) loss, and recorded as the kernel that actually ran."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tiny_llm.config import load_recipe
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.runtime.device import compile_loss, dispatched_attention_kernels

CPU = torch.device("cpu")

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


@pytest.mark.parametrize("compile_flag", ["false", "true"])
def test_packed_engine_records_the_attention_kernel_its_update_runs(compile_flag):
    recipe = load_recipe(
        ["packed4-tiny"],
        [
            "decentralized.num_models=2",
            "training.batch_tokens=512",
            f"runtime.compile={compile_flag}",
            "runtime.sdpa_backend=math",
        ],
    )
    engine = PackedEngine(recipe, CPU)
    recorded = engine.attention_kernels()  # what the trainer writes into environment.json
    assert not engine.model.grad_arena.any()  # the probe leaves no gradient behind
    blocks = torch.randint(0, recipe.model.vocab_size, (8, recipe.model.context_length + 1))
    engine.train_step(blocks, 1e-3, 1)  # compiles
    executed = dispatched_attention_kernels(lambda: engine.train_step(blocks, 1e-3, 2))
    assert "aten::_scaled_dot_product_attention_math" in recorded
    assert not any("flash" in k for k in recorded + executed)
    if compile_flag == "false":
        assert executed == recorded
    else:  # on the CPU inductor generates the attention from the math decomposition: no other kernel ran
        assert set(executed) <= set(recorded)
