"""Runtime: what the ordinary and the packed engine share.

Device set-up, environment capture, stop signals, optimizer helpers, MFU, and the
engine contract (``Engine``, ``StepStats``, ``NonFiniteError``, ``build_model``).
``train/`` and ``packed/`` stand on it; it imports neither.
"""
