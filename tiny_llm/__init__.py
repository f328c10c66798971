"""tiny-llm: train, tune and compare small Llama-style language models.

Importing the package is cheap and torch-free, so the Snakefile and the
pure modules (config, budget, campaign, tuner candidates) can use it.
"""

__version__ = "0.1.0"
