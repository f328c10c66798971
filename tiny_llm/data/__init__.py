"""Data layer: corpus sources, tokenizers, the token cache (`prepare`, reader) and the training loader.

Submodules are imported where used; only `loader` needs torch.
"""
