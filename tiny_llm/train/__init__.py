"""Training: the ordinary engine, the loop, checkpoints, metrics, evaluation (on ``tiny_llm.runtime``)."""
