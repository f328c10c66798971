"""optimizer.name muon: torch's Muon on the hidden matrices, AdamW on the embedding/head and norm scales, as
one optimizer; its keys, its device-side skip of a non-finite update, a run that trains, resumes bitwise and
exports unchanged."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from host_reads import HostReads
from train_helpers import metric_rows, small_recipe

from tiny_llm.config import load_recipe, recipe_identity_payload
from tiny_llm.engines import evaluate_checkpoint, run_training
from tiny_llm.errors import ConfigError
from tiny_llm.export.hf import export_model
from tiny_llm.io import read_json
from tiny_llm.runtime import optim, signals
from tiny_llm.runtime.engine import NonFiniteError
from tiny_llm.runtime.optim import MuonAdamW, hidden_matrices, set_lr
from tiny_llm.train import loop
from tiny_llm.train.engine import ModelEngine

CPU = torch.device("cpu")
MUON = ["optimizer.name=muon", "training.batch_tokens=512", "training.micro_batch_size=4"]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def batches(count: int, seed: int = 5) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (8, 65), generator=gen) for _ in range(count)]


def engine(*sets: str) -> ModelEngine:
    return ModelEngine(load_recipe(["tiny"], [*MUON, *sets]), CPU)


# ----------------------------------------------------------------------------- recipe keys


def test_adamw_recipes_keep_their_identity_and_muon_enters_it_with_its_section() -> None:
    plain = recipe_identity_payload(load_recipe(["tiny"]))["optimizer"]
    assert "name" not in plain and "muon" not in plain
    assert recipe_identity_payload(load_recipe(["tiny"], ["optimizer.name=adamw"]))["optimizer"] == plain
    muon = recipe_identity_payload(load_recipe(["tiny"], ["optimizer.name=muon", "optimizer.muon.lr=0.02"]))
    section = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "adjust_lr_fn": "match_rms_adamw"}
    expected = {**section, "lr": 0.02, "weight_decay": None}  # null: AdamW's
    assert muon["optimizer"] == {**plain, "name": "muon", "muon": expected}
    defaults = load_recipe(["tiny"], ["optimizer.name=muon"])  # no section: its defaults, written out
    assert recipe_identity_payload(defaults)["optimizer"]["muon"] == {**expected, "lr": None}
    assert defaults == load_recipe(["tiny"], ["optimizer.name=muon", "optimizer.muon={}"])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["optimizer.muon.momentum=0.9"], "optimizer.muon: applies only under optimizer.name muon"),
        (["optimizer.muon_lr=0.02"], "optimizer.muon_lr: is optimizer.muon.lr now (a section of its own)"),
        (["optimizer.name=sgd"], "optimizer.name: expected one of adamw, muon, got str 'sgd'"),
        (
            ["optimizer.name=muon", "optimizer.muon.momentum=1.0"],
            "optimizer.muon.momentum: must be in [0, 1)",
        ),
        (["optimizer.name=muon", "optimizer.muon.ns_steps=0"], "optimizer.muon.ns_steps: must be in [1, 99]"),
        (["optimizer.name=muon", "optimizer.muon.lr=0"], "optimizer.muon.lr: must be > 0 or null"),
        (
            ["optimizer.name=muon", "optimizer.muon.weight_decay=-1"],
            "optimizer.muon.weight_decay: must be >= 0",
        ),
        (
            ["optimizer.name=muon", "optimizer.muon.adjust_lr_fn=none"],
            "optimizer.muon.adjust_lr_fn: expected",
        ),
    ],
)
def test_bad_keys_are_one_line_naming_the_key(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(["tiny"], sets)
    lines = str(info.value).split("\n")
    assert len(lines) == 1 and message in lines[0]


def test_packed_muon_is_a_recipe_and_a_captured_muon_update_is_refused_in_one_line() -> None:
    assert load_recipe(["packed4-tiny"], ["optimizer.name=muon"]).optimizer.name == "muon"
    with pytest.raises(ConfigError, match=r"^invalid recipe: runtime.cuda_graph: captures the fused AdamW"):
        load_recipe(["tiny"], ["optimizer.name=muon", "runtime.cuda_graph=true"])


# ----------------------------------------------------------------------------- the optimizer


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest() -> None:
    eng = engine("optimizer.muon.lr=0.02")
    opt = eng.optimizer
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in eng.model.named_parameters()}
    muon = [names[id(p)] for g in opt.muon.param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in opt.adamw.param_groups for p in g["params"]]
    assert len(muon) == 2 * 7 and all(n.startswith("blocks.") and n.endswith("_proj.weight") for n in muon)
    assert adamw == ["embed.weight", *[n for n in names.values() if n.endswith("norm.weight")]]
    assert opt.adamw.param_groups[0]["weight_decay"] == 0.1 and opt.adamw.param_groups[1]["weight_decay"] == 0
    group = opt.muon.param_groups[0]
    assert (group["momentum"], group["nesterov"], group["ns_steps"]) == (0.95, True, 5)
    assert (group["adjust_lr_fn"], group["weight_decay"]) == ("match_rms_adamw", 0.1)
    set_lr(opt, 0.003)  # the tiny preset's peak lr: each part at its own peak
    assert [g["lr"] for g in opt.param_groups] == [0.02, 0.003, 0.003]
    set_lr(opt, 0.0015)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01, 0.0015, 0.0015], rel=1e-15)


def test_the_update_is_torchs_muon_and_adamw() -> None:
    """The engine's update equals torch.optim.Muon and torch.optim.AdamW stepped on their own."""
    eng, ref = engine(), engine()
    hidden = hidden_matrices(ref.model)
    ids = {id(p) for p in hidden}
    rest = [p for p in ref.model.parameters() if id(p) not in ids]
    muon = torch.optim.Muon(hidden, lr=3e-3, momentum=0.95, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(
        [{"params": rest[:1], "weight_decay": 0.1}, {"params": rest[1:], "weight_decay": 0.0}],
        lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
    )  # fmt: skip
    for step, blocks in enumerate(batches(3), start=1):
        eng.train_step(blocks, 3e-3, step)
        ref.forward_backward(blocks, blocks.shape[0] * 64)
        ref.clip(ref.norm_and_values(torch.zeros(()), 1)[0])
        muon.step()
        adamw.step()
    for a, b in zip(eng.model.parameters(), ref.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_batched_step_in_chunks_equals_torchs_muon_and_resumes_its_state(
    nesterov: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shapes stepped in chunks of two matrices (the cap lowered), from a state torch's Muon wrote: the same
    weights and momentum buffers as torch's Muon, bit for bit on the CPU."""
    monkeypatch.setattr(optim, "MUON_CHUNK_ELEMENTS", 2 * 64 * 172)  # two gate/up matrices of the tiny preset
    model = ModelEngine(load_recipe(["tiny"], MUON), CPU).model
    hidden = hidden_matrices(model)
    assert len(optim.shape_chunks(hidden)) > len({p.shape for p in hidden})  # chunks, not whole shapes
    ours = [p.detach().clone().requires_grad_() for p in hidden]
    settings = {"lr": 0.02, "momentum": 0.9, "nesterov": nesterov, "weight_decay": 0.1, "ns_steps": 5}
    torch_muon, batched = torch.optim.Muon(hidden, **settings), optim.BatchedMuon(ours, **settings)
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        for p, q in zip(hidden, ours, strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        torch_muon.step()
        if step == 0:  # the rest from torch's own state
            batched.load_state_dict(copy.deepcopy(torch_muon.state_dict()))
            for p, q in zip(hidden, ours, strict=True):
                q.data.copy_(p)
        else:
            batched.step()
    for p, q in zip(hidden, ours, strict=True):
        assert torch.equal(p, q)
        assert torch.equal(torch_muon.state[p]["momentum_buffer"], batched.state[q]["momentum_buffer"])


def test_state_round_trips_and_refuses_an_adamw_state() -> None:
    a, b = engine(), engine()
    data = batches(4)
    for step in (1, 2):
        a.train_step(data[step - 1], 3e-3, step)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for step in (3, 4):
        a.train_step(data[step - 1], 3e-3, step)
        b.train_step(data[step - 1], 3e-3, step)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))
    adamw = ModelEngine(load_recipe(["tiny"], MUON[1:]), CPU)
    with pytest.raises(ValueError, match="not a Muon\\+AdamW optimizer state"):
        a.optimizer.load_state_dict(adamw.optimizer.state_dict())


# ----------------------------------------------------------------------------- no non-finite update


def fused() -> ModelEngine:
    eng = engine("runtime.fused_optimizer=true")
    assert eng.deferred_check and eng.optimizer.found_inf is eng.guard.found_inf
    return eng


def test_the_guarded_update_is_the_plain_one_and_reads_nothing_on_the_host() -> None:
    guarded, plain = fused(), fused()
    plain.optimizer.found_inf = None
    for step, blocks in enumerate(batches(3), start=1):
        with HostReads() as reads:
            guarded.train_step(blocks, 3e-3, step)
        assert reads.count == 0, reads.what  # the first update (Muon's lazy buffers) included
        plain.train_step(blocks, 3e-3, step)
    for a, b in zip(guarded.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)
    guarded.check_finite()


def test_a_non_finite_update_is_skipped_on_the_device_and_names_its_step() -> None:
    eng = fused()
    data = batches(5)
    for step in (1, 2):
        eng.train_step(data[step - 1], 3e-3, step)
    weights = [p.detach().clone() for p in eng.model.parameters()]
    state = copy.deepcopy(eng.optimizer.state_dict())
    finite = eng._loss
    eng._loss = eng._compiled_loss = lambda i, t: finite(i, t) * float("nan")  # type: ignore[method-assign]
    with HostReads() as reads:
        bad = eng.train_step(data[2], 3e-3, 3)
    assert reads.count == 0
    eng._loss = eng._compiled_loss = finite  # type: ignore[method-assign]
    eng.train_step(data[3], 3e-3, 4)  # finite, but the run failed at step 3: skipped too
    assert all(torch.equal(p, q) for p, q in zip(eng.model.parameters(), weights, strict=True))
    after = eng.optimizer.state_dict()
    for part, keys in (("muon", ("momentum_buffer",)), ("adamw", ("step", "exp_avg", "exp_avg_sq"))):
        assert after[part]["state"].keys() == state[part]["state"].keys()
        for index, values in after[part]["state"].items():
            assert all(torch.equal(values[k], state[part]["state"][index][k]) for k in keys)
    assert bad.values is not None and torch.isnan(bad.values[0])
    with pytest.raises(NonFiniteError, match=r"step 3: non-finite loss \(loss nan, grad_norm nan\)"):
        eng.check_finite()


def test_a_nan_in_the_first_update_leaves_the_initial_weights() -> None:
    eng = fused()
    weights = [p.detach().clone() for p in eng.model.parameters()]
    finite = eng._loss
    eng._loss = eng._compiled_loss = lambda i, t: finite(i, t) * float("nan")  # type: ignore[method-assign]
    eng.train_step(batches(1)[0], 3e-3, 1)
    assert all(torch.equal(p, q) for p, q in zip(eng.model.parameters(), weights, strict=True))
    assert all(not b["momentum_buffer"].any() for b in eng.optimizer.muon.state.values())
    with pytest.raises(NonFiniteError, match=r"step 1: "):
        eng.check_finite()


# ----------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def muon_run(tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path, tiny_recipe_args: Callable) -> Path:
    run_dir = tmp_path_factory.mktemp("muon") / "run"
    assert (
        run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, "optimizer.name=muon"), quiet=True)
        == 0
    )
    return run_dir


def test_a_muon_run_trains(muon_run: Path) -> None:
    rows = metric_rows(muon_run)
    train = [r["loss"] for r in rows if r["event"] == "train"]
    validation = [r["loss"] for r in rows if r["event"] == "validation"]
    assert train[-1] < train[0] - 0.5 and validation == sorted(validation, reverse=True)
    assert read_json(muon_run / "status.json")["status"] == "complete"


@pytest.mark.slow
def test_a_stopped_muon_run_resumes_bitwise(
    muon_run: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run", "optimizer.name=muon")
    account = loop.Trainer._account

    def account_then_stop(self: loop.Trainer, *args: object) -> None:
        account(self, *args)
        if self.progress.step in (5, 17):
            signals.request_stop()

    for _ in range(2):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(loop.Trainer, "_account", account_then_stop)
            assert run_training(recipe, resume="auto", quiet=True) == 130
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert metric_rows(tmp_path / "run") == metric_rows(muon_run)
    assert (tmp_path / "run" / "final.safetensors").read_bytes() == (
        muon_run / "final.safetensors"
    ).read_bytes()
    assert (
        read_json(tmp_path / "run" / "result.json")["recipe_identity"]
        == read_json(muon_run / "result.json")["recipe_identity"]
    )


def test_a_muon_run_exports_unchanged(
    muon_run: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args
) -> None:
    recipe = small_recipe(tiny_cache, tiny_recipe_args, muon_run, "optimizer.name=muon")
    export_model(recipe, muon_run / "final.safetensors", tmp_path / "export")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "export").iterdir()
    }


def test_a_muon_run_evaluates_unchanged(muon_run: Path, tiny_cache: Path, tiny_recipe_args: Callable) -> None:
    """Its weights file and its final training state (Muon+AdamW state inside) give the run's final loss."""
    recipe = small_recipe(tiny_cache, tiny_recipe_args, muon_run, "optimizer.name=muon")
    final = read_json(muon_run / "result.json")["final_validation"]["loss"]
    for path in (muon_run / "final.safetensors", muon_run / "final.pt"):
        assert evaluate_checkpoint(recipe, path, full=True)["loss"] == pytest.approx(final, rel=1e-6)
