"""`analyze --run DIR --checkpoint NAME --case seen|unseen --output DIR`: gradient noise x Hessian (SPEC §11).

One checkpoint of a run on one data case; resumable sample by sample (rerun the same command), refusing an
output directory that holds another analysis. Prints the statistics as one JSON line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiny_llm.analysis.settings import AnalysisConfig, parse_noise_samples


def configure_parser(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, metavar="DIR", help="training run directory")
    source.add_argument(
        "--best-of",
        type=Path,
        metavar="RANKING",
        help="a campaign stage's ranking.json: analyse its best run (the run directory beside the ranking)",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="NAME",
        help="epoch-NNN, final or latest (the .pt state, else the .safetensors weights), or a file name",
    )
    parser.add_argument("--case", required=True, choices=("seen", "unseen"), help="data case")
    parser.add_argument("--output", required=True, type=Path, metavar="DIR", help="this job's directory")
    parser.add_argument(
        "--noise-samples",
        type=parse_noise_samples,
        default=32,
        metavar="N|all",
        help="effective batches whose noise is measured (default 32; all: every batch of the epoch)",
    )
    parser.add_argument(
        "--random-samples", type=int, default=32, metavar="R", help="Rademacher directions (default 32)"
    )
    parser.add_argument("--seed", type=int, default=42, help="noise batches and Rademacher seed (default 42)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--amp", action="store_true", help="BF16 autocast forward (attention stays FP32)")
    parser.add_argument(
        "--hvp-batch-size",
        type=int,
        default=None,
        metavar="B",
        help="sequences per microbatch of the Hessian passes (default: the run's micro_batch_size)",
    )
    parser.add_argument(
        "--directions-per-pass",
        type=int,
        default=8,
        metavar="K",
        help="Hessian-vector products sharing one pass over the epoch (default 8; one vector of memory each)",
    )
    parser.add_argument("--no-consensus", action="store_true", help="packed runs: skip the consensus errors")
    parser.add_argument(
        "--no-tf32",
        action="store_true",
        help="IEEE FP32 matmuls on CUDA (default: TF32, as the runtime sets)",
    )
    parser.add_argument("--device", default=None, help="default: the run's runtime.device")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the run's)")


def run(args: argparse.Namespace) -> int:
    settings = AnalysisConfig(
        case=args.case,
        noise_samples=args.noise_samples,
        random_samples=args.random_samples,
        seed=args.seed,
        dtype=args.dtype,
        amp=args.amp,
        consensus=not args.no_consensus,
        tf32=not args.no_tf32,
        hvp_batch_size=args.hvp_batch_size,
        directions_per_pass=args.directions_per_pass,
        device=args.device,
        threads=args.threads,
    )
    from tiny_llm.analysis.job import result_line, run_analysis

    run_dir = args.run
    if args.best_of is not None:
        from tiny_llm.export.runs import best_run_dir

        run_dir = best_run_dir(args.best_of)
    print(result_line(run_analysis(run_dir, args.checkpoint, args.output, settings)))
    return 0
