"""A neural solver (HyperAnderson + learned initialiser) for a trained digits DEQ.

Train the DEQ, then its solver with the DEQ frozen, then sweep the solvers::

    python -m launch.main --config configs/digits.py --workdir /tmp/digits
    python -m launch.main --config configs/digits_hypersolver.py --workdir /tmp/digits_solver \\
        --config.neural_solver.deq_workdir=/tmp/digits
    python -m experiments.neural_solver.pareto --config configs/digits_hypersolver.py \\
        --workdir /tmp/digits_solver --config.neural_solver.deq_workdir=/tmp/digits

The task, model and solver sections are those of ``configs/digits.py`` (the checkpoint
must fit them); ``neural_solver`` sets the solver (see ``configs/default.py``). The
smoke variant pairs with ``configs/digits.py:smoke``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from ml_collections import ConfigDict

from configs import default, digits


def get_config(arg: str | None = None) -> ConfigDict:
    """The digits solver config; ``arg``: ``smoke`` (the seconds-long variant),
    ``previous`` (the recipe before issue 79, 300 steps), or both."""
    model_arg, variants = default.split_hypersolver_arg(arg)
    arg = default.variant(model_arg)
    # Small next to the 7.4K-parameter DEQ: a narrow network, a 1x1 initialiser.
    return default.hypersolver(
        digits.get_config(arg),
        arg,
        variants=variants,
        previous=dict(train_steps=300),
        hidden=8,
        init_kernel_size=1,
        unroll_steps=10,
    )
