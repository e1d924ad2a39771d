"""Fitting a neural solver (`deq_jax.neural_solver`) to a trained, frozen DEQ.

* ``spec``: `NeuralSolverSpec` (the ``neural_solver`` config section) and `fit`.
* ``frozen_deq``: `FrozenDEQ`, the trained model as a fixed-point map with its known
  fixed points; ``targets``: `TargetStream`, the fit's batches of them.
* ``trainer``: `train_neural_solver`, the fit's optax loop.
* ``runs``: one fit for any family (`fit_solvers`, `load_solvers`); ``language``: the
  language model's part; ``hypersolver``: `train_hypersolver(config, workdir)`, the
  command line's entry, and `load_hypersolver`.
* ``alternating``: `AlternatingSolver`, DEQ and solver training interleaved (the loop
  runs it).
"""
