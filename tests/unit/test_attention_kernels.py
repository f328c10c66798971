"""Forced SDPA kernels: entered inside the (compiled) loss, and recorded as the kernel that actually ran."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from tiny_llm.config import load_recipe
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.runtime.device import compile_loss, dispatched_attention_kernels, quiet_profile

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def attention(q: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, q, q, is_causal=True).sum()


@pytest.mark.parametrize(
    "compile_flag",
    ["false", pytest.param("true", marks=pytest.mark.slow)],  # slow: an inductor compile
)
def test_the_loss_carries_its_forced_kernel_into_the_compiled_graph(compile_flag):
    # 'efficient' is GPU-only: forced on the CPU it must fail, wherever the loss is called from. Called
    # outside any kernel restriction, only a restriction inside the (compiled) function can make it fail;
    # a compiled graph does not guard on one entered around the call.
    forced = load_recipe(["tiny"], [f"runtime.compile={compile_flag}", "runtime.sdpa_backend=efficient"])
    with pytest.raises(RuntimeError, match="No viable backend"):
        compile_loss(attention, forced)(torch.randn(1, 2, 8, 16))
    auto = load_recipe(["tiny"], [f"runtime.compile={compile_flag}"])
    assert torch.isfinite(compile_loss(attention, auto)(torch.randn(1, 2, 8, 16)))


@pytest.mark.parametrize(
    "compile_flag",
    ["false", pytest.param("true", marks=pytest.mark.slow)],  # slow: compiles a packed update
)
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


@pytest.mark.slow  # a fresh process that starts torch's profiler
def test_the_kernel_probe_prints_nothing_of_its_own() -> None:
    """The probe runs in every training job: nothing it prints may reach the job's console or log."""
    code = (
        "import torch\n"
        "from tiny_llm.runtime.device import dispatched_attention_kernels\n"
        "q = torch.randn(1, 2, 8, 16, requires_grad=True)\n"
        "sdpa = torch.nn.functional.scaled_dot_product_attention\n"
        "f = lambda: sdpa(q, q, q, is_causal=True).sum().backward()\n"
        "print(dispatched_attention_kernels(f))\n"
        "print(dispatched_attention_kernels(f))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and "flash" in lines[0] and lines[0] == lines[1]


def test_the_profilers_one_cycle_warning_is_not_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch warns on CUDA that a profiler "clears events at the end of each cycle" (seen on an H200 in every
    training log); the probe filters that warning and nothing else."""
    from torch.profiler import profile

    prepare = profile.prepare_trace

    def warning_prepare(self) -> None:
        warnings.warn("Warning: Profiler clears events at the end of each cycle.", UserWarning, stacklevel=1)
        prepare(self)

    monkeypatch.setattr(profile, "prepare_trace", warning_prepare)
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatched_attention_kernels(lambda: attention(q).backward())
        with pytest.raises(UserWarning, match="clears events"), profile():
            pass
        with pytest.raises(DeprecationWarning), quiet_profile(cuda=False):
            warnings.warn("other warnings still show", DeprecationWarning, stacklevel=1)


def test_one_filter_names_operators_and_kernels_not_the_autograd_nodes_around_them() -> None:
    """Training (environment.json) and the benchmark worker name kernels with the same filter."""
    from tiny_llm.runtime.device import attention_kernels

    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with quiet_profile(cuda=False) as prof:
        attention(q).backward()
    every = {e.key for e in prof.key_averages()}
    assert any("Backward0" in k for k in every)  # the profile holds autograd nodes of the attention
    names = attention_kernels(prof)
    assert names and all("Backward0" not in k and not k.startswith("autograd::") for k in names)
    assert any("scaled_dot_product" in k for k in names)
    reference = torch.randn(1, 2, 8, 8, requires_grad=True)
    kernels = dispatched_attention_kernels(lambda: reference.softmax(-1).sum().backward())
    assert any("softmax" in k for k in kernels)  # the reference attention's softmax counts too
