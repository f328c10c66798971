"""Training: engine, loop, checkpoints, metrics, evaluation, runtime setup."""
