"""CLRS-30 mst_kruskal (Kruskal's minimum spanning tree): trained on 16-node graphs, tested on 64.

The shared setup is `configs.clrs_base` (task, model, sizes, the variants); the score is
the F1 of the predicted tree edges.

The processor is the Triplet-GMPNN, and the output decoder reads its edge latents at
the fixed point (``model.decode_edge_latents``, as CLRS's Triplet-GMPNN decoders), with
Jacobian weight 0.1, and the loss weighs the edges outside the tree 50 times
(``task.non_tree_edge_weight``: the 16-node training graphs are nearly forests).

Run it with::

    python -m launch.main --config configs/clrs_mst_kruskal.py --workdir /tmp/clrs_mst_kruskal

Variants (alone or joined by commas, `configs.clrs_base.apply_variants`)::

    python -m launch.main --config configs/clrs_mst_kruskal.py:smoke --workdir /tmp/clrs_smoke
    python -m launch.main --config configs/clrs_mst_kruskal.py:large --workdir /tmp/clrs_large
    python -m launch.main --config configs/clrs_mst_kruskal.py:hint_propagation --workdir /tmp/hp
    python -m launch.main --config configs/clrs_mst_kruskal.py:fixed_steps --workdir /tmp/clrs_fs

Results: BUILD_NOTES.md, "CLRS-30", the mst_kruskal row of the report table; the modes:
the paragraph on the three modes.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from ml_collections import ConfigDict

from configs import clrs_base


def get_config(arg: str | None = None) -> ConfigDict:
    """The mst_kruskal config; ``arg``: variants of `configs.clrs_base` (``"smoke"``, ``"large"``,
    ``"hint_propagation"``, ``"fixed_steps"``, or several joined by commas)."""
    config = clrs_base.base_config("mst_kruskal", train_max_iter=64, eval_max_iter=128)
    config.model.processor = "triplet_mpnn"  # the Triplet-GMPNN
    config.model.decode_edge_latents = True  # the decoder reads its edge latents at z*
    config.regularizer.jacobian_weight = 0.1
    config.task.non_tree_edge_weight = 50.0  # the training graphs are nearly forests
    return clrs_base.apply_variants(config, arg)
