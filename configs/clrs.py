"""CLRS-30 with a DEQ: one config, the algorithm its argument (``configs/clrs.py:<algorithm>``).

One CLRS-30 algorithm (`deq_jax.models.clrs.ClrsTask`: train on 1000 graphs of 16
nodes, validate on 32 of 16, test on 32 of 32 and 64 nodes) and the encode-process-
decode model `deq_jax.models.clrs.ClrsModel` (``clrs_deq``) with a gated MPNN processor
(CLRS's GMPNN). Run one algorithm with::

    python -m launch.main --config configs/clrs.py:bellman_ford --workdir /tmp/clrs_bellman_ford
    python -m launch.main --config configs/clrs.py:bfs --workdir /tmp/clrs_bfs
    python -m launch.main --config configs/clrs.py:dfs --workdir /tmp/clrs_dfs
    python -m launch.main --config configs/clrs.py:dijkstra --workdir /tmp/clrs_dijkstra
    python -m launch.main --config configs/clrs.py:mst_kruskal --workdir /tmp/clrs_mst_kruskal
    python -m launch.main --config configs/clrs.py:mst_prim --workdir /tmp/clrs_mst_prim

What each algorithm sets beyond the shared setup is its entry of `ALGORITHMS`: its
solver budgets (the eval budget covers the longer runs of the 64-node test graphs) and,
for some, a processor, a Jacobian weight, loss weights, training-graph augmentations or
a settle patience. The variants follow the algorithm, alone or joined by commas
(``configs/clrs.py:bellman_ford,fixed_steps,smoke``)::

    python -m launch.main --config configs/clrs.py:bfs,smoke --workdir /tmp/clrs_smoke
    python -m launch.main --config configs/clrs.py:bellman_ford,large --workdir /tmp/clrs_large
    python -m launch.main --config configs/clrs.py:bfs,hint_propagation --workdir /tmp/hp
    python -m launch.main --config configs/clrs.py:bfs,fixed_steps --workdir /tmp/clrs_fs

* ``smoke``: a tiny model on tiny graphs, a few steps (`default.smoke`; ``bfs,smoke``:
  18 s of wall time on an idle 2-core CPU, compilation included, 2026-12-01);
* ``large``: hidden 128 and 6,000 steps (Bellman-Ford's goal recipe);
* ``hint_propagation``: the processor iterated until the residual test passes,
  backprop through time; without the persistent edge state (only the deq mode's solver
  carries the state pair);
* ``fixed_steps``: CLRS's baseline, the algorithm's true number of steps with hint
  supervision; no Jacobian regulariser (no fixed point), no decoding of a fixed
  point's edge latents, no edge state, and none of the training-graph augmentations
  (``task.extra_edge_rate``, ``task.weight_power``: the hints must be the graph's own).

Without a mode variant ``model.mode`` is ``deq``: the fixed point from Anderson
acceleration with implicit (IFT) gradients and the Jacobian regulariser (weight 1
unless the algorithm says otherwise); in evaluation the solve stops when the residual
passes ``deq.settle_tol`` (1e-6) or when the decoded answer has not changed for
``deq.settle_patience`` steps, whichever comes first. The score is the parent-pointer
accuracy (the F1 of the predicted tree edges for ``mst_kruskal``).

Data: ``task.sampler="clrs30"`` draws the graphs as CLRS's samplers do, so ``train``,
``val`` and ``test_64`` are CLRS-30's official splits (seeds 1, 2, 3);
``"generator"`` gives the project's earlier graphs (the same distribution).

Evaluation: every 500 steps on ``val`` only (``eval.splits``), which selects the
checkpoint; the final report scores that checkpoint on every split, test included.
``--config.eval.splits="()"`` evaluates every split periodically (the test curves).

Sizes: hidden 64, 2000 steps of batch 32, chosen to finish in well under an hour on a
2-core CPU per run. Results: BUILD_NOTES.md, "CLRS-30" (one row per algorithm; the
modes: the paragraph on the three modes).

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from ml_collections import ConfigDict

from configs import default
from deq_jax.models.clrs import model_spec

# What each algorithm sets beyond the shared setup (`get_config`): the (train, eval)
# solver budgets in ``deq``, then its own overrides.
ALGORITHMS = {
    "bellman_ford": dict(
        deq=dict(train_max_iter=32, eval_max_iter=64),
        # output-preserving extra edges in training (`deq_jax.models.clrs.augment`)
        task=dict(extra_edge_rate=1.0),
    ),
    "bfs": dict(deq=dict(train_max_iter=32, eval_max_iter=64)),
    "dfs": dict(deq=dict(train_max_iter=64, eval_max_iter=128)),
    "dijkstra": dict(deq=dict(train_max_iter=48, eval_max_iter=96)),
    "mst_kruskal": dict(
        deq=dict(train_max_iter=64, eval_max_iter=128),
        # the Triplet-GMPNN, whose decoder reads its edge latents at the fixed point (as
        # CLRS's Triplet-GMPNN decoders)
        model=dict(processor="triplet_mpnn", decode_edge_latents=True),
        regularizer=dict(jacobian_weight=0.1),
        # the loss weighs the edges outside the tree 50 times: the 16-node training
        # graphs are nearly forests
        task=dict(non_tree_edge_weight=50.0),
    ),
    "mst_prim": dict(
        # an eval solve stops once the answer has not changed for 6 steps: Prim's
        # answer pauses on its way
        deq=dict(train_max_iter=48, eval_max_iter=96, settle_patience=6),
        # the Triplet-GMPNN with a persistent edge state of width 8 beside the node
        # states (the other modes run without it)
        model=dict(processor="triplet_mpnn", edge_state=8),
        regularizer=dict(jacobian_weight=0.3),
        # training weights raised to a power in [1, 4] each step (the tree stays)
        task=dict(weight_power=4.0),
    ),
}
MODES = ("deq", "hint_propagation", "fixed_steps")
SIZES = ("smoke", "large")
VARIANTS = SIZES + MODES[1:]
SETTLE_TOL = 1e-6


def get_config(arg: str | None = None) -> ConfigDict:
    """The config of one algorithm with its variants: ``arg`` names the algorithm (a key
    of `ALGORITHMS`) and any of `VARIANTS`, joined by commas, at most one size and one
    mode (module docstring).

    Raises:
      ValueError: for a missing, unknown or repeated name (listing the valid ones), or
        two algorithms, sizes or modes.
    """
    names = default.variants(
        arg,
        tuple(ALGORITHMS) + VARIANTS,
        {"algorithm": tuple(ALGORITHMS), "size": SIZES, "mode": MODES},
    )
    algorithm = [name for name in names if name in ALGORITHMS]
    if not algorithm:
        raise ValueError(
            f"Config argument {arg!r} names no CLRS algorithm: configs/clrs.py:<algorithm>"
            f"[,variants]. Valid algorithms: {', '.join(ALGORITHMS)}."
        )
    config = _shared_config(algorithm[0])
    config.update(ALGORITHMS[algorithm[0]])
    return _apply_variants(config, names)


def clrs_config(algorithm: str, arg: str | None = None) -> ConfigDict:
    """``get_config`` of ``algorithm`` with the variants of ``arg`` (e.g. ``"smoke"``).

    Raises:
      ValueError: for an unknown algorithm or variant, listing the valid ones.
    """
    return get_config(",".join(name for name in (algorithm, arg) if name))


def _shared_config(algorithm: str) -> ConfigDict:
    """What every algorithm shares (module docstring), for ``algorithm``."""
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="clrs",
            algorithm=algorithm,
            data_dir="",
            seed=0,
            sampler="clrs30",  # CLRS's RandomState draws: the official CLRS-30 splits
            train_nodes=16,
            test_nodes=(32, 64),
            train_size=1000,
            eval_size=32,
            multiplier=1,
            non_tree_edge_weight=1.0,
            extra_edge_rate=0.0,
            weight_power=1.0,
        )
    )
    config.model = ConfigDict(
        dict(
            name="clrs_deq",
            spec=model_spec(algorithm),
            processor="gmpnn",
            hidden=64,
            triplet_features=8,
            edge_state=0,
            mode="deq",
            step_penalty=0.0,
            hint_loss_weight=1.0,
            teacher_forcing=0.0,
            gumbel_hints=False,
            gumbel_tau=1.0,
            decode_edge_latents=False,
        )
    )
    config.deq.update(dict(settle_patience=3, settle_tol=SETTLE_TOL))
    config.regularizer.jacobian_weight = 1.0
    config.train.update(dict(steps=2_000, batch_size=32, optimizer="adam"))
    # The periodic evaluation reads only CLRS's val (it selects the best checkpoint, as
    # CLRS does); the test graphs are read once, by the final report of that checkpoint.
    config.eval.update(dict(splits=("val",), batch_size=32, budget_multipliers=(1, 2)))
    config.log.every_steps = 100
    return config


def _apply_variants(config: ConfigDict, names: tuple[str, ...]) -> ConfigDict:
    """``config`` with the variants of ``names`` applied (module docstring)."""
    for mode in MODES[1:]:
        if mode in names:
            config.model.mode = mode
            config.model.edge_state = 0  # only the DEQ's solver carries the state pair
    if "fixed_steps" in names:
        config.regularizer.jacobian_weight = 0.0  # no fixed point to regularise
        # no fixed point's latents to decode, and the hints must be the graph's own
        config.model.decode_edge_latents = False
        config.task.update(dict(extra_edge_rate=0.0, weight_power=1.0))
    if "large" in names:
        config.model.hidden = 128
        config.train.steps = 6_000
        config.eval.every_steps = 1_000
        config.ckpt.every_steps = 1_000
    if "smoke" in names:
        default.smoke(
            config,
            steps=4,
            batch_size=8,
            warmup_steps=2,
            eval_every=2,
            eval_batch_size=8,
            budgets=(5, 5),
            budget_multipliers=(1,),
            task=dict(train_nodes=6, test_nodes=(9,), train_size=32, eval_size=8),
            model=dict(hidden=8, triplet_features=4),
        )
    return config
