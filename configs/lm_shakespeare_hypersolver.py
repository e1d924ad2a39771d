"""A neural solver (HyperAnderson + the LM initialiser) for a trained Shakespeare DEQ-LM.

Train the language model, then its solver with the LM frozen, then sweep the solvers::

    python -m launch.main --config configs/lm_shakespeare.py --workdir /tmp/lm
    python -m launch.main --config configs/lm_shakespeare_hypersolver.py \\
        --workdir /tmp/lm_solver --config.neural_solver.deq_workdir=/tmp/lm
    python -m experiments.neural_solver.pareto --config configs/lm_shakespeare_hypersolver.py \\
        --workdir /tmp/lm_solver --config.neural_solver.deq_workdir=/tmp/lm

The task, model and DEQ sections are those of ``configs/lm_shakespeare.py`` (the
checkpoint must fit them; pass the same variants, e.g. ``:jacobian``); ``neural_solver``
sets the solver (see ``configs/default.py``): the paper's LM initialiser (a causal
convolution of width 3 over the injection, ReLU, a linear map to the state) and
HyperAnderson with each residual compressed per sequence by its last token
(``pool="last"``; ``"mean"`` averages over the positions), fitted the paper's way (its
loss weights, BPTT through all ``K = 10`` steps, 1,000 steps on fresh training segments
with their memory). ``:previous`` is the recipe before issue 79 (200 steps, the first 150
without the backward pass through the cell, weights 1 : 1 : 0.1, a pool of 6 batches),
e.g. ``:jacobian,previous``. ``:smoke`` pairs with ``configs/lm_shakespeare.py:smoke``.

Results: docs/results/neural_solver.md (the issue-79 recipe) and
docs/results/language_model.md (the earlier one).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 5.1).
"""

from ml_collections import ConfigDict

from configs import default, lm_shakespeare


def get_config(arg: str | None = None) -> ConfigDict:
    """The LM solver config; ``arg``: the variants of `configs.lm_shakespeare` and
    ``previous`` (the earlier recipe)."""
    model_arg, variants = default.split_hypersolver_arg(arg)
    config = lm_shakespeare.get_config(model_arg)
    smoke = "smoke" in lm_shakespeare.variants(model_arg)
    # The solver and initialiser within 3% of the LM's parameters (2.7% of the
    # 275k-parameter LM); the fit's cost is reported, not capped.
    return default.hypersolver(
        config,
        "smoke" if smoke else "",
        variants=variants,
        previous=dict(train_steps=200, detached_steps=150, target_batches=6),
        hidden=8,
        init_hidden=3,
        pool="last",
        unroll_steps=10,
        budgets=dict(target_max_iter=60),
        batch_size=16,
        learning_rate=3e-3,
    )
