"""Second-order analysis of saved training states: gradient noise x Hessian (SPEC §11).

At a run's checkpoint and on one epoch of data (``seen``: the run's own first epoch, replayed; ``unseen``: an
epoch of blocks after the budget's last one), it measures how the noise of effective-batch gradients lines up
with the curvature of the full-epoch loss, using Hessian-vector products only.

Torch-free modules (the workflow plan and the summariser import them): ``names`` (checkpoint names a run
saves), ``settings`` (the typed settings and their identity), ``stats`` (statistics from sample rows),
``summary`` (summary.csv, figures). Torch modules: ``hessian`` (gradients, HVP passes, Rademacher vectors),
``data`` (the epochs), ``checkpoints`` (weights of a saved state), ``job`` (one checkpoint x case, resumable).
"""
