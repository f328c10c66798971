"""Would fusing help on the CPU? Forward+backward of the pieces named in issue 21, fused vs as they are.

At a model shape (default demo-s: one microbatch of `training.micro_batch_size` sequences), one thread, the
process's CPU seconds, alternating trials, median:

- `qkv`: three q/k/v projections vs one matmul on the concatenated weight, split after;
- `gate_up`: the SwiGLU gate and up projections vs one matmul on the concatenated weight;
- `lm_head_ce`: tied LM head + summed cross entropy through autograd vs a custom function that computes the
  gradient of the logits in the forward pass (softmax minus one-hot in place, as llm.c's fused classifier and
  Liger's CE do) so that the backward is the two matmuls only.

Prints one JSON object: seconds of each variant and the ratio as-is / fused (> 1: fusing is faster).

Example:
    python benchmarks/fusion_probe.py --config demo-s --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from tiny_llm.config import load_recipe
from tiny_llm.runtime.device import keep_cpu_heap


class FusedLinearCE(torch.autograd.Function):
    """Summed CE of h @ w.T; the logits' gradient is made in the forward pass, the logits never kept."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        logits = h @ w.T
        lse = torch.logsumexp(logits, -1)
        loss = (lse - logits.gather(-1, t[:, None]).squeeze(-1)).sum()
        grad = logits.sub_(lse[:, None]).exp_()
        grad[torch.arange(t.shape[0]), t] -= 1
        ctx.save_for_backward(h, w, grad)
        return loss

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # noqa: ANN001, ANN205
        h, w, grad = ctx.saved_tensors
        grad = grad * g
        return grad @ w, grad.T @ h, None


def timed(fn, trials: int) -> float:
    times = []
    for _ in range(trials):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="demo-s")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trials", type=int, default=9)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_cpu_heap()
    recipe = load_recipe([args.config])
    m = recipe.model
    rows = recipe.training.micro_batch_size * m.context_length
    torch.manual_seed(0)
    x = torch.randn(rows, m.width, requires_grad=True)
    wq, wk, wv = (torch.randn(m.width, m.width, requires_grad=True) for _ in range(3))
    wg, wu = (torch.randn(m.ffn_width, m.width, requires_grad=True) for _ in range(2))
    emb = (torch.randn(m.vocab_size, m.width) * 0.02).requires_grad_()
    t = torch.randint(0, m.vocab_size, (rows,))

    def qkv_apart() -> None:
        sum(F.linear(x, w).sum() for w in (wq, wk, wv)).backward()

    def qkv_fused() -> None:
        q, k, v = F.linear(x, torch.cat([wq, wk, wv])).split(m.width, -1)
        (q.sum() + k.sum() + v.sum()).backward()

    def gate_up_apart() -> None:
        (F.silu(F.linear(x, wg)) * F.linear(x, wu)).sum().backward()

    def gate_up_fused() -> None:
        g, u = F.linear(x, torch.cat([wg, wu])).split(m.ffn_width, -1)
        (F.silu(g) * u).sum().backward()

    def ce_autograd() -> None:
        F.cross_entropy(F.linear(x, emb), t, reduction="sum").backward()

    def ce_fused() -> None:
        FusedLinearCE.apply(x, emb, t).backward()

    pairs = {"qkv": (qkv_apart, qkv_fused), "gate_up": (gate_up_apart, gate_up_fused),
             "lm_head_ce": (ce_autograd, ce_fused)}  # fmt: skip
    out = {"config": args.config, "threads": args.threads, "rows": rows, "clock": "cpu"}
    for name, (apart, fused) in pairs.items():
        apart(), fused()  # warm-up
        a = timed(apart, args.trials)
        b = timed(fused, args.trials)
        out[name] = {"as_is_seconds": a, "fused_seconds": b, "ratio_as_is_to_fused": a / b}
    grads = []
    for fn in (ce_autograd, ce_fused):
        x.grad = emb.grad = None
        fn()
        grads.append((x.grad.clone(), emb.grad.clone()))
    out["lm_head_ce"]["max_gradient_difference"] = max(
        (a - b).abs().max().item() for a, b in zip(grads[0], grads[1], strict=True)
    )
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
