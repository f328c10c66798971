"""Llama model: exact sizes, causality, attention-path parity, init, RoPE cache, limits."""

from __future__ import annotations

import math

import pytest
import torch

from tiny_llm.budget import parameter_count
from tiny_llm.config import ModelConfig, load_recipe
from tiny_llm.model import Llama, RMSNorm, count_parameters, loss_sum, reference_attention

TOY = ModelConfig(vocab_size=97, num_layers=2, width=32, num_heads=4, ffn_width=48, context_length=16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(
    "preset", ["tiny", "demo-s", "demo-m", "demo-l", "20m", "50m", "90m", "250m", "500m"]
)
def test_parameter_count_matches_formula(preset: str) -> None:
    cfg = load_recipe([preset]).model
    with torch.device("meta"):
        model = Llama(cfg)
    assert count_parameters(model) == parameter_count(cfg)
    assert model.embed.weight.shape == (cfg.vocab_size, cfg.width)
    assert not any("lm_head" in name for name, _ in model.named_parameters())  # tied head


@pytest.mark.parametrize("reference", [False, True])
def test_causal(reference: bool) -> None:
    torch.manual_seed(0)
    model = Llama(TOY, reference_attention=reference)
    x = torch.randint(0, TOY.vocab_size, (2, TOY.context_length))
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % TOY.vocab_size
    a, b = model(x), model(changed)
    assert torch.equal(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_sdpa_and_reference_paths_agree() -> None:
    torch.manual_seed(0)
    sdpa = Llama(TOY)
    reference = Llama(TOY, reference_attention=True)
    reference.load_state_dict(sdpa.state_dict())
    x = torch.randint(0, TOY.vocab_size, (3, TOY.context_length))
    torch.testing.assert_close(sdpa(x), reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_attention_stays_fp32_under_bf16_autocast(dtype: torch.dtype) -> None:
    """The parity check's reference must be FP32: autocast must not recast its matmuls to BF16."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g).to(dtype) for _ in range(3))
    fp32 = reference_attention(q, k, v)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        autocast = reference_attention(q, k, v)
    assert autocast.dtype == dtype
    assert torch.equal(autocast, fp32)


def test_reference_attention_supports_double_backward() -> None:
    torch.manual_seed(0)
    model = Llama(TOY, reference_attention=True)
    x = torch.randint(0, TOY.vocab_size, (2, TOY.context_length + 1))
    loss = loss_sum(model, x[:, :-1], x[:, 1:])
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params, create_graph=True)
    penalty = sum(g.pow(2).sum() for g in grads)
    penalty.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)


def test_init_statistics() -> None:
    cfg = ModelConfig(vocab_size=2048, num_layers=8, width=256, num_heads=4, ffn_width=512, context_length=16)
    torch.manual_seed(0)
    model = Llama(cfg)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert model.blocks[0].attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)
    residual = 0.02 / math.sqrt(2 * cfg.num_layers)
    assert model.blocks[3].attn.out_proj.weight.std().item() == pytest.approx(residual, rel=0.03)
    assert model.blocks[3].ffn.down_proj.weight.std().item() == pytest.approx(residual, rel=0.03)
    assert torch.equal(model.norm.weight, torch.ones(cfg.width))


def test_rope_tables_are_cached_fp32_and_not_saved() -> None:
    model = Llama(TOY)
    assert model.rope_cos.dtype == torch.float32 and model.rope_cos.shape == (16, 8)
    assert "rope_cos" not in model.state_dict() and "rope_sin" not in model.state_dict()
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters()}


def test_rmsnorm_reduces_in_fp32() -> None:
    norm = RMSNorm(64, 1e-5)
    x = (torch.randn(4, 64) * 300).bfloat16()
    expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    out = norm(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


def test_too_long_input_is_rejected() -> None:
    model = Llama(TOY)
    with pytest.raises(ValueError, match="exceeds model.context_length 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_loss_ignores_padding_targets() -> None:
    torch.manual_seed(0)
    model = Llama(TOY)
    x = torch.randint(0, TOY.vocab_size, (1, TOY.context_length + 1))
    targets = x[:, 1:].clone()
    full = loss_sum(model, x[:, :-1], targets)
    targets[:, 10:] = -100
    partial = loss_sum(model, x[:, :-1], targets)
    assert 0 < partial.item() < full.item()
    logits = model(x[:, :-1])[0, :10]
    manual = torch.nn.functional.cross_entropy(logits, x[0, 1:11], reduction="sum")
    torch.testing.assert_close(partial, manual)
