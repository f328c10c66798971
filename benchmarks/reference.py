"""The reference's GH200 figures (SPEC §5 and §7), stated once: 32,768-token updates, compiled, micro 32,
bf16, synthetic data. The GPU check compares its throughput with them, and the workflow configs that
estimate GPU hours from them (config/cluster.yaml, config/sweep-20m.yaml, config/optimizers-20m.yaml) are
held to them by tests/unit/test_gpu_check.py. Standard library only."""

REFERENCE_TOKENS_PER_SECOND = {"20m": 1_636_281, "50m": 871_826, "90m": 508_930}
"""Benchmark-worker tokens/s of each size."""
REFERENCE_PACKED_SPEEDUP_N4 = 1.51
"""Packed over sequential, N=4 at the 20m shape, compiled."""
REFERENCE_PACKED_N4 = {"sequential": 692_000, "packed": 1_040_000}  # tok/s, rounded in the reference
