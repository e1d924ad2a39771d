"""CLRS-30 bellman_ford (Bellman-Ford shortest paths): trained on 16-node graphs, tested on 64.

The shared setup is `configs.clrs_base` (task, model, sizes, the variants); the score is
the parent-pointer accuracy.

The training graphs get extra edges that leave their shortest paths unchanged
(``task.extra_edge_rate=1``, `deq_jax.models.clrs.augment`).

Run it with::

    python -m launch.main --config configs/clrs_bellman_ford.py --workdir /tmp/clrs_bellman_ford

Variants (alone or joined by commas, `configs.clrs_base.apply_variants`)::

    python -m launch.main --config configs/clrs_bellman_ford.py:smoke --workdir /tmp/clrs_smoke
    python -m launch.main --config configs/clrs_bellman_ford.py:large --workdir /tmp/clrs_large
    python -m launch.main --config configs/clrs_bellman_ford.py:hint_propagation --workdir /tmp/hp
    python -m launch.main --config configs/clrs_bellman_ford.py:fixed_steps --workdir /tmp/clrs_fs

Results: BUILD_NOTES.md, "CLRS-30", the bellman_ford row of the official-splits table
(90.7 +- 1.9 over three seeds at 64 nodes, goal 96.4); ``large``: the table under it (96.7
+- 0.2 over three seeds); the modes: the paragraph on the three modes.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from ml_collections import ConfigDict

from configs import clrs_base


def get_config(arg: str | None = None) -> ConfigDict:
    """The bellman_ford config; ``arg``: variants of `configs.clrs_base` (``"smoke"``, ``"large"``,
    ``"hint_propagation"``, ``"fixed_steps"``, or several joined by commas)."""
    config = clrs_base.base_config("bellman_ford", train_max_iter=32, eval_max_iter=64)
    config.task.extra_edge_rate = 1.0  # output-preserving extra edges in training
    return clrs_base.apply_variants(config, arg)
