"""A neural solver (HyperAnderson + learned initialiser) for a trained prefix-sum DEQ.

Train the DEQ, then its solver with the DEQ frozen, then sweep the solvers::

    python -m launch.main --config configs/prefix_sum.py --workdir /tmp/ps
    python -m launch.main --config configs/prefix_sum_hypersolver.py --workdir /tmp/ps_solver \\
        --config.neural_solver.deq_workdir=/tmp/ps
    python -m experiments.neural_solver.pareto --config configs/prefix_sum_hypersolver.py \\
        --workdir /tmp/ps_solver --config.neural_solver.deq_workdir=/tmp/ps

The task, model and solver sections are those of ``configs/prefix_sum.py`` (the
checkpoint must fit them); ``neural_solver`` sets the solver (see ``configs/default.py``):
the paper's recipe (its loss weights, BPTT through all ``K`` steps, 1,000 steps on fresh
batches). ``:previous`` is the recipe before issue 79 (1,500 steps, the first 1,200
without the backward pass through the cell, weights 1 : 1 : 0.1, a pool of 8 batches).
The smoke variant pairs with ``configs/prefix_sum.py:smoke``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from ml_collections import ConfigDict

from configs import default, prefix_sum


def get_config(arg: str | None = None) -> ConfigDict:
    """The prefix-sum solver config; ``arg``: ``smoke`` (the seconds-long variant),
    ``previous`` (the earlier recipe), or both."""
    model_arg, variants = default.split_hypersolver_arg(arg)
    arg = default.variant(model_arg)
    # Unrolled for the 20 steps where this DEQ's answers are decided, at 3e-3, beta
    # fixed to 1. Results: docs/results/neural_solver.md.
    return default.hypersolver(
        prefix_sum.get_config(arg),
        arg,
        variants=variants,
        previous=dict(train_steps=1_500, detached_steps=1_200),
        hidden=8,
        init_hidden=8,
        unroll_steps=20,
        learning_rate=3e-3,
        learn_beta=False,
    )
