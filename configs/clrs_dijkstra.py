"""CLRS-30 dijkstra (Dijkstra's shortest paths): trained on 16-node graphs, tested on 64.

The shared setup is `configs.clrs_base` (task, model, sizes, the variants); the score is
the parent-pointer accuracy. Run it with::

    python -m launch.main --config configs/clrs_dijkstra.py --workdir /tmp/clrs_dijkstra

Variants (alone or joined by commas, `configs.clrs_base.apply_variants`)::

    python -m launch.main --config configs/clrs_dijkstra.py:smoke --workdir /tmp/clrs_smoke
    python -m launch.main --config configs/clrs_dijkstra.py:large --workdir /tmp/clrs_large
    python -m launch.main --config configs/clrs_dijkstra.py:hint_propagation --workdir /tmp/hp
    python -m launch.main --config configs/clrs_dijkstra.py:fixed_steps --workdir /tmp/clrs_fs

Results: BUILD_NOTES.md, "CLRS-30", the dijkstra row of the report table; the modes: the
paragraph on the three modes.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from ml_collections import ConfigDict

from configs import clrs_base


def get_config(arg: str | None = None) -> ConfigDict:
    """The dijkstra config; ``arg``: variants of `configs.clrs_base` (``"smoke"``, ``"large"``,
    ``"hint_propagation"``, ``"fixed_steps"``, or several joined by commas)."""
    config = clrs_base.base_config("dijkstra", train_max_iter=48, eval_max_iter=96)
    return clrs_base.apply_variants(config, arg)
