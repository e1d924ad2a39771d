"""CLRS-30 mst_prim (Prim's minimum spanning tree): trained on 16-node graphs, tested on 64.

The shared setup is `configs.clrs_base` (task, model, sizes, the variants); the score is
the parent-pointer accuracy.

The processor is the Triplet-GMPNN with a persistent edge state of width 8
(``model.edge_state``; the other modes run without it), Jacobian weight 0.3, trained on
graphs whose weights are raised to a power in [1, 4] each step (``task.weight_power``,
which keeps the tree); an eval solve stops once the answer has not changed for 6 steps.

Run it with::

    python -m launch.main --config configs/clrs_mst_prim.py --workdir /tmp/clrs_mst_prim

Variants (alone or joined by commas, `configs.clrs_base.apply_variants`)::

    python -m launch.main --config configs/clrs_mst_prim.py:smoke --workdir /tmp/clrs_smoke
    python -m launch.main --config configs/clrs_mst_prim.py:large --workdir /tmp/clrs_large
    python -m launch.main --config configs/clrs_mst_prim.py:hint_propagation --workdir /tmp/hp
    python -m launch.main --config configs/clrs_mst_prim.py:fixed_steps --workdir /tmp/clrs_fs

Results: BUILD_NOTES.md, "CLRS-30", the mst_prim row of the report table; the modes: the
paragraph on the three modes.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from ml_collections import ConfigDict

from configs import clrs_base


def get_config(arg: str | None = None) -> ConfigDict:
    """The mst_prim config; ``arg``: variants of `configs.clrs_base` (``"smoke"``, ``"large"``,
    ``"hint_propagation"``, ``"fixed_steps"``, or several joined by commas)."""
    config = clrs_base.base_config("mst_prim", train_max_iter=48, eval_max_iter=96)
    config.model.processor = "triplet_mpnn"  # the Triplet-GMPNN
    config.model.edge_state = 8  # a persistent edge state beside the node states
    config.regularizer.jacobian_weight = 0.3
    config.task.weight_power = 4.0  # training weights raised to a power in [1, 4]
    config.deq.settle_patience = 6  # Prim's answer pauses on its way
    return clrs_base.apply_variants(config, arg)
