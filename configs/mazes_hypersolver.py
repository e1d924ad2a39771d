"""A neural solver (HyperAnderson + learned initialiser) for a trained maze DEQ.

Train the DEQ, then its solver with the DEQ frozen, then sweep the solvers::

    python -m launch.main --config configs/mazes.py --workdir /tmp/mazes
    python -m launch.main --config configs/mazes_hypersolver.py --workdir /tmp/mazes_solver \\
        --config.neural_solver.deq_workdir=/tmp/mazes
    python -m experiments.neural_solver.pareto --config configs/mazes_hypersolver.py \\
        --workdir /tmp/mazes_solver --config.neural_solver.deq_workdir=/tmp/mazes \\
        --split test_13 --budgets=10,20,30,40,50,60

The task, model and solver sections are those of ``configs/mazes.py`` (the checkpoint
must fit them); ``neural_solver`` sets the solver (see ``configs/default.py``): the
paper's recipe. ``:previous`` is the recipe before issue 79 (300 steps, all without the
backward pass through the cell, weights 1 : 1 : 0.1, a pool of 8 batches). The smoke
variant pairs with ``configs/mazes.py:smoke``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from ml_collections import ConfigDict

from configs import default, mazes


def get_config(arg: str | None = None) -> ConfigDict:
    """The maze solver config; ``arg``: ``smoke`` (the seconds-long variant),
    ``previous`` (the earlier recipe), or both."""
    model_arg, variants = default.split_hypersolver_arg(arg)
    arg = default.variant(model_arg)
    # A narrow network and a 1x1 initialiser, unrolled for 20 steps at learning rate
    # 5e-3, beta fixed to 1. The budget is the maze model's eval budget. Results:
    # docs/results/neural_solver.md, the maze table.
    config = default.hypersolver(
        mazes.get_config(arg),
        arg,
        variants=variants,
        previous=dict(train_steps=300, detached_steps=300),
        hidden=8,
        init_kernel_size=1,
        unroll_steps=20,
        learning_rate=5e-3,
        learn_beta=False,
    )
    if not arg:
        config.deq.neural_solver.max_iter = config.deq.eval_max_iter
    return config
