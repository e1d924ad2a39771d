"""A neural solver (HyperAnderson + learned initialiser) for a trained prefix-sum DEQ.

Train the DEQ, then its solver with the DEQ frozen, then sweep the solvers::

    python -m launch.main --config configs/prefix_sum.py --workdir /tmp/ps
    python -m launch.main --config configs/prefix_sum_hypersolver.py --workdir /tmp/ps_solver \\
        --config.neural_solver.deq_workdir=/tmp/ps
    python -m launch.solver_pareto --config configs/prefix_sum_hypersolver.py \\
        --workdir /tmp/ps_solver --config.neural_solver.deq_workdir=/tmp/ps

The task, model and solver sections are those of ``configs/prefix_sum.py`` (the
checkpoint must fit them); ``neural_solver`` sets the solver (see ``configs/default.py``).
The smoke variant pairs with ``configs/prefix_sum.py:smoke``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from ml_collections import ConfigDict

from configs import default, prefix_sum


def get_config(arg: str | None = None) -> ConfigDict:
    """The prefix-sum solver config; ``arg="smoke"`` gives the seconds-long variant."""
    arg = default.variant(arg)
    # Small enough to be a few percent of the 23.5K-parameter DEQ.
    return default.hypersolver(
        prefix_sum.get_config(arg), arg, hidden=8, init_hidden=8, unroll_steps=10
    )
