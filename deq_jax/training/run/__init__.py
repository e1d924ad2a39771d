"""The run's machinery, shared by every family and the neural-solver fit: the workdir
and its lock (``workdir``), orbax checkpoints (``checkpoint``), the best checkpoint's
selection (``selection``), stopping on SIGTERM (``preemption``), metric writers
(``writers``), the named mesh, its partition rules and the placement of arrays on it
(``mesh``, ``partition``, ``sharding``; ``footprint`` reads a placed step's bytes and
collectives), the config's ranges (``config_checks``), the optimiser (``optim``), the
train state (``state``), the components a config names (``build``) and the skipping
of non-finite steps (``nonfinite``).

Nothing here imports a family, the loop or the fit.
"""
