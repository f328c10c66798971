"""Runtime: what the ordinary and the packed engine share.

Device set-up, compile set-up, environment capture, stop signals, optimizer helpers, the
MFU peak table, and the engine contract (``Engine``, ``StepStats``, ``NonFiniteError``,
``build_model``, weight export). ``train/`` and ``packed/`` stand on it; it imports
neither.
"""
