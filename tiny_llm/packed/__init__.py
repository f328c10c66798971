"""Packed decentralized training: N copies of one model trained together in one process.

Every parameter of every worker lives in one contiguous arena ``[N, D_padded]``
(entries padded to 64 elements); gradients and Adam moments use arenas of the
same layout, so clipping, AdamW and mixing are a handful of whole-arena tensor
ops instead of per-worker, per-parameter loops.
"""
