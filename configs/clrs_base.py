"""The shared base of the CLRS configs: one file per algorithm, ``configs/clrs_<algorithm>.py``.

One CLRS-30 algorithm (`deq_jax.models.clrs.ClrsTask`: train on 1000 graphs of 16
nodes, validate on 32 of 16, test on 32 of 32 and 64 nodes) and the encode-process-
decode model `deq_jax.models.clrs.ClrsModel` (``clrs_deq``) with a gated MPNN processor
(CLRS's GMPNN). `base_config` holds what every algorithm shares; an algorithm's file
sets its own solver budgets and overrides (processor, Jacobian weight, loss weights,
training-graph augmentations, settle patience) and then applies the variants named
after the colon (`apply_variants`), alone or joined by commas
(``configs/clrs_bellman_ford.py:fixed_steps,smoke``):

* ``smoke``: a tiny model on tiny graphs, a few steps (seconds);
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
``deq.settle_patience`` steps, whichever comes first.

Data: ``task.sampler="clrs30"`` draws the graphs as CLRS's samplers do, so ``train``,
``val`` and ``test_64`` are CLRS-30's official splits (seeds 1, 2, 3);
``"generator"`` gives the project's earlier graphs (the same distribution).

Evaluation: every 500 steps on ``val`` only (``eval.splits``), which selects the
checkpoint; the final report scores that checkpoint on every split, test included.
``--config.eval.splits="()"`` evaluates every split periodically (the test curves).

Sizes: hidden 64, 2000 steps of batch 32, chosen to finish in well under an hour on a
2-core CPU per run. Results: BUILD_NOTES.md, "CLRS-30"; each
algorithm's file names its line.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

import importlib

from ml_collections import ConfigDict

from configs import default
from deq_jax.models.clrs import ALGORITHMS, model_spec

MODES = ("deq", "hint_propagation", "fixed_steps")
SIZES = ("smoke", "large")
VARIANTS = SIZES + MODES[1:]
SETTLE_TOL = 1e-6


def base_config(algorithm: str, train_max_iter: int, eval_max_iter: int) -> ConfigDict:
    """What every CLRS config shares, for ``algorithm`` with its solver budgets (train,
    eval): the eval budget covers the longer runs of the 64-node test graphs.

    Raises:
      ValueError: for an unknown algorithm, listing the valid ones.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown CLRS algorithm {algorithm!r}. Valid: {', '.join(ALGORITHMS)}.")
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
    config.deq.update(
        dict(
            train_max_iter=train_max_iter,
            eval_max_iter=eval_max_iter,
            settle_patience=3,
            settle_tol=SETTLE_TOL,
        )
    )
    config.regularizer.jacobian_weight = 1.0
    config.train.steps = 2_000
    config.train.batch_size = 32
    config.train.optimizer = "adam"
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 100
    config.eval.every_steps = 500
    # The periodic evaluation reads only CLRS's val (it selects the best checkpoint, as
    # CLRS does); the test graphs are read once, by the final report of that checkpoint.
    config.eval.splits = ("val",)
    config.eval.batch_size = 32
    config.eval.budget_multipliers = (1, 2)
    config.ckpt.every_steps = 500
    config.log.every_steps = 100
    return config


def variants(arg: str | None) -> tuple[str, ...]:
    """The variants of a config argument: ``None`` or ``""`` none, else names in
    `VARIANTS` joined by commas, at most one size and one mode.

    Raises:
      ValueError: for an unknown name (listing the valid ones), a repeated name, or two
        sizes or two modes.
    """
    names = tuple(v.strip() for v in (arg or "").split(",") if v.strip())
    for name in names:
        default.variant(name, VARIANTS)
    if len(set(names)) != len(names):
        raise ValueError(f"Config argument {arg!r} repeats a variant.")
    for kind, group in (("size", SIZES), ("mode", MODES)):
        if sum(name in group for name in names) > 1:
            raise ValueError(f"Config argument {arg!r} names more than one {kind}.")
    return names


def apply_variants(config: ConfigDict, arg: str | None) -> ConfigDict:
    """``config`` with the variants of ``arg`` (`variants`, module docstring) applied."""
    names = variants(arg)
    for mode in MODES[1:]:
        if mode in names:
            config.model.mode = mode
            config.model.edge_state = 0  # only the DEQ's solver carries the state pair
    if "fixed_steps" in names:
        config.regularizer.jacobian_weight = 0.0  # no fixed point to regularise
        config.model.decode_edge_latents = False  # no fixed point's latents to decode
        config.task.extra_edge_rate = 0.0  # the hints must be the graph's own
        config.task.weight_power = 1.0
    if "large" in names:
        config.model.hidden = 128
        config.train.steps = 6_000
        config.eval.every_steps = 1_000
        config.ckpt.every_steps = 1_000
    if "smoke" in names:
        config.task.train_nodes = 6
        config.task.test_nodes = (9,)
        config.task.train_size = 32
        config.task.eval_size = 8
        config.model.hidden = 8
        config.model.triplet_features = 4
        config.deq.train_max_iter = 5
        config.deq.eval_max_iter = 5
        config.train.steps = 4
        config.train.batch_size = 8
        config.train.warmup_steps = 2
        config.eval.every_steps = 2
        config.eval.batch_size = 8
        config.eval.budget_multipliers = (1,)
        config.ckpt.every_steps = 2
        config.log.every_steps = 2
    return config


def clrs_config(algorithm: str, arg: str | None = None) -> ConfigDict:
    """The config of ``configs/clrs_<algorithm>.py`` with the variants of ``arg``.

    Raises:
      ValueError: for an unknown algorithm or variant, listing the valid ones.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown CLRS algorithm {algorithm!r}. Valid: {', '.join(ALGORITHMS)}.")
    return importlib.import_module(f"configs.clrs_{algorithm}").get_config(arg)
