"""Default configuration: every section and knob that `deq_jax.training` reads.

A small prefix-sum DEQ. Run it with::

    python -m launch.main --config configs/default.py --workdir /tmp/deq_default

Override any field from the command line, e.g. ``--config.deq.solver.name=broyden`` or
``--config.train.steps=500``; an unknown field fails and lists the valid ones, and a key
of the old layout (``--config.solver.name``) names its new place.

Task configs start from `get_config`, override what their task needs, and shrink to
their seconds-long test variant with `smoke`.

Sections:
  task: ``name`` picks `deq_jax.tasks.get(name, ...)`; every other field is a keyword
    of that task (``data_dir=""`` means ``{workdir}/data``).
  model: ``name`` picks `deq_jax.models.get(name, ...)`; every other field is an
    attribute of that model. What its DEQ solves with comes from ``deq``.
  deq: everything a DEQ solves with, every budget and tolerance of the run
    (`deq_jax.nn.DEQSpec`, `deq_jax.training.run.build.build_deq_spec`):
    ``solver.name`` picks `deq_jax.solvers.get(name, ...)` with ``tol``, ``stop_mode``,
    ``full_budget`` (run every sample for the whole budget: a fixed depth) and the
    fields of the sub-section named like the solver (``anderson.m``, ...); a composed
    solver is a spec string (``solver.name="fallback(anderson, broyden)"``,
    ``"sequence(fixed_point_iteration:3, anderson)"``, ``"restart(anderson)"``) whose
    parts read their sub-sections (``fallback.patience``, ``restart.patience``);
    ``backward.name`` picks `deq_jax.backward.get(name, ...)` with the fields of the
    sub-section named like it (``phantom.k``, ...); ``backward.name="reversible"``
    (the reversible DEQ's exact gradient) needs ``solver.name="reversible"``
    (``reversible.beta``); ``backward.ift.solver=""``
    inherits the forward solver, whose tolerance and budget a non-zero ``ift.tol`` and
    ``ift.max_iter`` change, and a solver name (or ``"gmres"``) uses that one with
    them. ``z_init`` is the initial state (``zeros``, ``normal``, ``mixed``);
    ``train_max_iter`` / ``eval_max_iter`` the budgets of training and evaluation
    solves. ``settle_patience > 0`` also stops each sample's eval solve once the
    model's decoded answer has not changed for that many steps
    (`deq_jax.nn.settled_apply`), with the residual tolerance ``settle_tol`` (0: the
    solver's); 0 stops on the residual only. ``neural_solver`` holds the budgets of
    a neural-solver run (`NeuralSolverSpec`): the fitted solver's ``tol`` and
    ``max_iter`` (also those of the Anderson it is compared with) and the reference
    Anderson solve of its fitting targets (``target_tol``, ``target_max_iter``).
    ``precision`` is the arithmetic of the cell's matmuls and convolutions:
    ``default`` (the backend's), ``float32``, or ``bfloat16`` (bfloat16 operands,
    float32 accumulation; the solver's state, residuals, parameters and backward solve
    stay float32); below float32 each solve stops at its measured residual floor times
    ``floor_margin`` (`deq_jax.nn.DEQSpec`, `deq_jax.precision`).
  train: steps, global batch size, optimiser, schedule, clipping, seed,
    ``pretrain_steps`` (a warm-up: the first steps train the same parameters as the
    explicit weight-tied network, for models with ``mode="weight_tied"``, e.g. MDEQ),
    ``stop_at_step`` (end this invocation early, e.g. to fit a job slot; the next run
    resumes), ``max_nonfinite_steps`` (a step whose loss or gradients are NaN or
    infinite is skipped, its parameters and optimiser state left unchanged, logged and
    counted in the ``skipped_steps`` metric; this many in a row stop the run with
    `deq_jax.training.NonFiniteLossError`, the last good checkpoint kept; 1 stops at
    the first), ``ema_decay`` (above 0, e.g. 0.999: evaluation, model selection and
    the report use an exponential moving average of the weights, kept in the optimiser
    state and its checkpoints; `deq_jax.training.run.optim.weight_average`) and
    ``distributed`` (call `jax.distributed.initialize()` first, for multi-host runs;
    ``coordinator_address``, ``num_processes`` and ``process_id`` are auto-detected on
    TPU pods and SLURM when left empty, 0 and -1; ``heartbeat_timeout_s`` bounds how
    long the other processes wait after one dies). ``mesh`` sizes the device mesh's
    axes ``data``, ``fsdp`` and ``tensor`` (-1: the devices left over;
    `deq_jax.training.run.mesh`): the batch is split over data x fsdp, the parameters
    and optimiser state over fsdp (arrays of at least ``fsdp_min_size`` entries), and
    the features each model's partition rules name over tensor
    (`deq_jax.training.run.partition`), e.g. ``--config.train.mesh.fsdp=8``.
  eval: periodic evaluation (``every_steps``, ``splits``: empty means every eval split
    of the task, ``max_batches``: 0 means all) and the final per-length report at
    ``budget_multipliers`` times the train budget (on every batch of each split, or
    at most ``report_max_batches`` of them: a smoke run's cap). Model selection
    (`deq_jax.training.run.selection`): after each periodic evaluation and at the end, the
    state with the best ``select_metric`` (``"max"`` or ``"min"``: ``select_mode``) on
    ``select_split`` is kept in ``checkpoints_best/``, and the final report scores it;
    empty values are the task's (its first eval split, `Task.selection_metric`).
    ``score_raw_weights`` (with ``train.ema_decay > 0``) also scores the raw weights
    at each periodic evaluation, logged as ``{split}_raw`` and never selected on.
  regularizer: the Jacobian regulariser of Bai et al. (2021), off by default
    (`deq_jax.training.families.regularizer.JacobianRegularizer`): weight ``jacobian_weight``
    (gamma), ramped linearly from ``jacobian_weight_start`` over
    ``jacobian_weight_steps`` steps (0: no ramp), applied on a step with probability
    ``jacobian_freq`` (p) with ``jacobian_samples`` Hutchinson probes (M), and not from
    step ``jacobian_stop_step`` on (0: never stops; locuslab's ``JAC_STOP_EPOCH``); the
    spectral radius of ``J_f(z*)`` is logged every ``spectral_every`` steps (0: never) with
    ``spectral_iters`` power iterations; ``spectral_weight > 0`` adds
    ``spectral_weight * max(0, rho - spectral_target)^2`` on every step, ``rho`` from
    ``spectral_penalty_iters`` detached power steps and two differentiated ones.
  path_independence: training interventions of Anil et al. (2022), off by default
    (`deq_jax.training.families.interventions.PathIndependence`): a randomised forward budget
    drawn per step from ``budget_choices`` evenly spaced values in ``[budget_min,
    budget_max]`` (``budget_max=0``: off) and the fixed-point alignment penalty with
    weight ``alignment_weight``. Mixed initialisation is ``deq.z_init="mixed"``;
    unroll + backprop is ``deq.solver.name="fixed_point_iteration"``,
    ``deq.solver.full_budget=True``, ``deq.backward.name="unrolled"``.
  neural_solver: the neural DEQ solver of Bai et al. (2022)
    (`deq_jax.training.NeuralSolverSpec`). A non-empty ``deq_workdir`` makes
    ``launch.main`` restore that trained DEQ and fit a HyperAnderson solver and
    initialiser to it (``configs/*_hypersolver.py``; by default the paper's recipe: its
    loss weights, BPTT through every unrolled step, ``train_steps`` on fresh batches);
    ``alternating=True`` instead
    interleaves solver fits with DEQ training (warm-up ``alt_warmup_steps``, then the
    DEQ trains ``alt_deq_steps`` with the solver between fine-tunings of
    ``alt_finetune_steps``).
  ckpt: orbax checkpoints every ``every_steps`` and at the end, the last ``keep`` kept;
    ``async_save`` writes them in the background while training goes on.
  log: progress line and metric interval (``every_steps``), TensorBoard on/off.
"""

import dataclasses

from ml_collections import ConfigDict

from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.solver_fit.spec import BUDGET_FIELDS, NeuralSolverSpec


def variant(arg: str | None, valid: tuple[str, ...] = ("smoke",)) -> str:
    """The variant a task config was asked for (``""`` is the full run).

    Raises:
      ValueError: for an argument that is not one of ``valid``, listing them.
    """
    arg = arg or ""
    if arg and arg not in valid:
        raise ValueError(f"Unknown config argument {arg!r}. Valid arguments: {', '.join(valid)}.")
    return arg


def variants(
    arg: str | None, valid: tuple[str, ...], exclusive: dict[str, tuple[str, ...]] | None = None
) -> tuple[str, ...]:
    """The variants of a comma-separated config argument such as ``"smoke,jacobian"``.

    Args:
      arg: the config argument (``None`` or ``""``: no variant).
      valid: the variant names the config knows.
      exclusive: groups of which at most one may be named, e.g. ``{"mode": (...)}``.

    Raises:
      ValueError: for an unknown or repeated name, or two names of one group.
    """
    names = tuple(v.strip() for v in (arg or "").split(",") if v.strip())
    for name in names:
        variant(name, valid)
    if len(set(names)) != len(names):
        raise ValueError(f"Config argument {arg!r} repeats a variant.")
    for kind, group in (exclusive or {}).items():
        if sum(name in group for name in names) > 1:
            raise ValueError(f"Config argument {arg!r} names more than one {kind}.")
    return names


def smoke(
    config: ConfigDict,
    *,
    steps: int,
    batch_size: int,
    warmup_steps: int,
    eval_every: int,
    eval_batch_size: int,
    budgets: tuple[int, int],
    max_batches: int = 1,
    report_max_batches: int = 2,
    budget_multipliers: tuple[int, ...] = (1, 2),
    **sections: dict,
) -> ConfigDict:
    """Shrinks a task config to its seconds-long test variant (``:smoke``).

    The one smoke helper of every config: a few ``steps`` of ``batch_size`` after
    ``warmup_steps``, evaluated every ``eval_every`` steps (``max_batches`` batches of
    ``eval_batch_size``; 0: all) and by a final report of at most
    ``report_max_batches`` batches per split at ``budget_multipliers`` times the train
    budget, with the (train, eval) solver ``budgets``; a checkpoint every 2 steps and a
    log line every 2, so a smoke run still writes checkpoints, metrics and TensorBoard
    events. ``sections`` update whole sections, e.g. ``task=dict(train_size=256)``,
    ``model=dict(width=8)``.
    """
    config.train.update(dict(steps=steps, batch_size=batch_size, warmup_steps=warmup_steps))
    config.eval.update(
        dict(
            every_steps=eval_every,
            batch_size=eval_batch_size,
            max_batches=max_batches,
            report_max_batches=report_max_batches,
            budget_multipliers=budget_multipliers,
        )
    )
    config.deq.train_max_iter, config.deq.eval_max_iter = budgets
    config.ckpt.every_steps = 2
    config.log.every_steps = 2
    config.update(sections)
    return config


# The ``*_hypersolver`` configs' own variants (next to their model's): ``previous`` is
# the recipe before issue 79 (loss weights 1 : 1 : 0.1 with l3 decayed to 0 over the
# whole fit, h_phi trained by every term, a pool of batches cycled, the learned update
# past K; each config adds its old length and detached steps).
HYPERSOLVER_VARIANTS = ("previous",)
PREVIOUS_RECIPE = dict(
    l1=1.0,
    l2=1.0,
    l3=0.1,
    l3_final=0.0,
    l3_decay=1.0,
    detach_init=False,
    fresh_batches=False,
    anderson_tail=False,
)


def split_hypersolver_arg(arg: str | None) -> tuple[str, tuple[str, ...]]:
    """``(the model config's argument, the solver's variants)`` of a ``*_hypersolver``
    config argument such as ``"jacobian,previous"``."""
    names = [name.strip() for name in (arg or "").split(",") if name.strip()]
    solver = tuple(name for name in names if name in HYPERSOLVER_VARIANTS)
    return ",".join(name for name in names if name not in HYPERSOLVER_VARIANTS), solver


def hypersolver(
    config: ConfigDict,
    arg: str,
    budgets: dict | None = None,
    variants: tuple[str, ...] = (),
    previous: dict | None = None,
    **fields,
) -> ConfigDict:
    """Turns a trained DEQ's config into its neural-solver config (``*_hypersolver.py``).

    Sets the shared ``neural_solver`` fields (ablations on), then ``fields``, and the
    budgets ``deq.neural_solver`` (``tol``, ``max_iter``, ``target_tol``,
    ``target_max_iter``) from ``budgets``. The solver's ``variants``: ``"previous"``
    (`PREVIOUS_RECIPE` and the config's own ``previous`` fields). The smoke variant
    (``arg="smoke"``) shrinks the fit to 4 steps (half of them detached when the full
    fit detaches any).
    """
    ns = config.neural_solver
    ns.ablations = True
    ns.update(fields)
    if "previous" in variants:
        ns.update(dict(PREVIOUS_RECIPE, **(previous or {})))
    config.deq.neural_solver.update(budgets or {})
    if arg == "smoke":
        config.deq.neural_solver.update(dict(target_max_iter=20, max_iter=6))
        ns.update(
            dict(
                hidden=8,
                unroll_steps=3,
                train_steps=4,
                batch_size=8,
                target_batches=2,
                max_target_residual=1.0,
            )
        )
        if ns.detached_steps:
            ns.detached_steps = 2
    return config


def dataclass_section(
    cls: type, *, only: tuple[str, ...] = (), exclude: tuple[str, ...] = ()
) -> ConfigDict:
    """A config section holding the defaults of the dataclass ``cls`` (their one home).

    Args:
      cls: a dataclass whose fields all have defaults (e.g. `JacobianRegularizer`).
      only: keep just these fields (empty: all).
      exclude: leave these fields out (those a run keeps in another section).
    """
    values = dataclasses.asdict(cls())
    names = only or tuple(name for name in values if name not in exclude)
    return ConfigDict({name: values[name] for name in names})


def get_config() -> ConfigDict:
    """The default configuration (see the module docstring)."""
    config = ConfigDict()

    config.task = ConfigDict(
        dict(
            name="prefix_sum",
            data_dir="",
            seed=0,
            train_size=10_000,
            train_length=32,
            test_lengths=(16, 32, 48, 64),
            test_size=1_000,
            val_size=1_000,  # "valid": new strings of train_length, for model selection
            files_dir="",  # easy-to-hard-data's {L}_data.npy / {L}_targets.npy, if set
        )
    )

    config.model = ConfigDict(
        dict(
            name="prefix_sum_deq",
            width=32,
            num_blocks=2,
            kernel_size=3,
            num_classes=2,
            norm="",
            norm_groups=4,
            weight_norm=False,
            dropout_rate=0.0,
        )
    )

    config.deq = ConfigDict(
        dict(
            solver=dict(
                name="anderson",
                tol=1e-3,
                stop_mode="rel",
                full_budget=False,
                fixed_point_iteration=dict(tau=1.0),
                anderson=dict(m=5, beta=1.0, lam=1e-4),
                broyden=dict(memory=20),
                reversible=dict(beta=0.5),
                fallback=dict(patience=10, growth=100.0),
                restart=dict(patience=10),
            ),
            backward=dict(
                name="ift",
                ift=dict(solver="", tol=0.0, max_iter=0, on_failure="ignore"),
                phantom=dict(k=5, tau=0.5),
                jacobian_free=dict(),
                unrolled=dict(),
                reversible=dict(),
            ),
            z_init="zeros",
            train_max_iter=30,
            eval_max_iter=30,
            settle_patience=0,
            settle_tol=0.0,
            precision="default",
            floor_margin=1.0,
        )
    )
    config.deq.neural_solver = dataclass_section(NeuralSolverSpec, only=BUDGET_FIELDS)

    config.train = ConfigDict(
        dict(
            seed=0,
            steps=1_000,
            batch_size=64,
            optimizer="adamw",
            learning_rate=1e-3,
            weight_decay=2e-4,
            b1=0.9,
            b2=0.999,
            momentum=0.9,
            schedule="cosine",
            warmup_steps=100,
            end_lr_factor=0.01,
            grad_clip_norm=1.0,
            pretrain_steps=0,
            stop_at_step=0,
            max_nonfinite_steps=5,
            ema_decay=0.0,
            distributed=False,
            coordinator_address="",
            num_processes=0,
            process_id=-1,
            heartbeat_timeout_s=100,
            mesh=dict(data=-1, fsdp=1, tensor=1),
            fsdp_min_size=4096,
        )
    )

    config.eval = ConfigDict(
        dict(
            every_steps=500,
            batch_size=250,
            splits=(),
            max_batches=0,
            report_max_batches=0,
            budget_multipliers=(1, 2, 4),
            select_split="",
            select_metric="",
            select_mode="",
            score_raw_weights=False,
        )
    )

    # The defaults of these three sections live in their dataclasses, and only there.
    config.regularizer = dataclass_section(JacobianRegularizer)
    config.path_independence = dataclass_section(PathIndependence)
    config.neural_solver = dataclass_section(NeuralSolverSpec, exclude=BUDGET_FIELDS)

    # Saves are written in the background while training goes on (benchmarks/save_cost.py).
    config.ckpt = ConfigDict(dict(every_steps=500, keep=2, async_save=True))

    config.log = ConfigDict(dict(every_steps=50, tensorboard=True))

    return config
