"""A config's run, its training loop's step, its eval step and its data, ready to time.

What `benchmarks.step_time` times, built as training builds it but without reading the
task's data: fresh weights (``train.seed``), the family's own step
(`deq_jax.training.families.family_for`, `Family.phase`: the step the training loop runs),
the evaluators' eval step (`make_eval_step`, `make_lm_eval_step`) and host batches drawn
with seed 1 before any timing:

* a language model: uniform tokens ``[B, L+1]`` over ``vocab`` ids, a new segment each
  step (the memory carried from step to step by the timing loop, as in training, and
  from one evaluation batch to the next, as the stream evaluator does); no text task is
  built, so no corpus is needed;
* every other task: ``N(0, 1)`` inputs of ``input_shape`` (default: the task's, when it
  can tell without its files: an image task reads its shape from them, so without them
  ``input_shape`` must be given) and uniform labels (standard-normal targets for a
  regression), shaped as the model's outputs; the task object is built (for its
  metrics and classes) but its data are never read. A task whose batches carry more
  than inputs and targets (a graph's adjacency, CLRS's features) uses its own generated
  batches, under the workdir.

The DEQ's cell, fixed point and arguments at an evaluation batch come from
`deq_jax.nn.deq_call` (its `deq_jax.nn.EquilibriumProblem`), in eval mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax.nn import deq_call
from deq_jax.tasks import DataError
from deq_jax.training.families import LANGUAGE_MODELS, family_for
from deq_jax.training.families.evaluate import device_batch
from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.lm_evaluate import lm_device_batch
from deq_jax.training.families.lm_setup import init_state, model_fields
from deq_jax.training.families.lm_steps import make_lm_eval_step, place_memory
from deq_jax.training.families.metrics import is_regression
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.families.settle import SettleRule
from deq_jax.training.families.setup import Run
from deq_jax.training.families.steps import RNG_STREAMS, make_eval_step
from deq_jax.training.families.task_family import TaskFamily
from deq_jax.training.run import build, sharding
from deq_jax.training.run.optim import make_optimizer
from deq_jax.training.run.state import create_train_state

DATA_SEED = 1  # the synthetic data's seed (the weights': train.seed)


class Options(NamedTuple):
    """What a timing run does besides the config (the command's flags).

    Attributes:
      batch: the train (and eval) batch size; 0: ``train.batch_size``.
      full_budget: every solve runs its whole budget.
      warmup: untimed train steps (the first compiles), at least 1.
      steps: timed train steps.
      eval_steps: timed evaluation batches.
      f_evals: timed calls of ``f(z*)`` and of its VJP.
      input_shape: one example's input shape for the synthetic data (empty: the task's).
      vocab: a language model's vocabulary size (0: ``model.vocab_size``).
      tag: a free label stored in the record.
      model_name: the record's ``model`` (empty: ``model.name``).
      workdir: where a task's own data are generated (empty: a temporary directory).
    """

    batch: int = 0
    full_budget: bool = False
    warmup: int = 3
    steps: int = 10
    eval_steps: int = 10
    f_evals: int = 20
    input_shape: tuple[int, ...] = ()
    vocab: int = 0
    tag: str = ""
    model_name: str = ""
    workdir: str = ""


class Bench(NamedTuple):
    """A built run and its data, ready to time.

    Attributes:
      run: the `deq_jax.training.families.setup.Run` (synthetic: no checkpointer, no data read;
        no task for a language model).
      step: the training loop's `deq_jax.training.families.family.Step` of the main phase.
      train_batches: host batches, ``warmup + steps`` of them.
      eval_batches: host batches, ``1 + eval_steps`` of them (the first compiles).
      evaluate: ``evaluate(state, batch) -> {"nstep_mean", "nstep_max",
        "rel_residual"}``, one evaluation batch (`make_eval_step` or
        `make_lm_eval_step`, the memory carried from call to call).
      problem: ``problem(state, batch) -> (f, z_star, args)``: the DEQ's cell, fixed
        point and arguments for ``batch``, in eval mode (for a language model with the
        memory the last `evaluate` call read).
      unit: what a batch is counted in: ``"tokens"``, ``"images"`` or ``"examples"``.
      per_batch: that count in one batch.
      data: ``"synthetic"`` or ``"task"`` (the task's own generated batches).
      sizes: the data's sizes for the record (``vocab`` and ``seq_len``, or
        ``input_shape``).
    """

    run: Run
    step: Callable[..., Any]
    train_batches: list[dict[str, Any]]
    eval_batches: list[dict[str, Any]]
    evaluate: Callable[..., dict[str, float]]
    problem: Callable[..., tuple[Callable, Any, Any]]
    unit: str
    per_batch: int
    data: str
    sizes: dict[str, Any]


def configured(config: Any, options: Options) -> Any:
    """A copy of ``config`` with ``options.batch`` and ``options.full_budget`` applied."""
    config = config.copy_and_resolve_references()
    if options.batch:
        config.train.batch_size = options.batch
    if options.full_budget:
        config.deq.solver.full_budget = True
    return config


def configured_family(config: Any):
    """The `deq_jax.training.families.family.Family` training runs for ``config``, with what its
    ``setup`` reads from the config besides the run (the penalty terms of the step)."""
    family = family_for(config, emit=lambda line: None)
    family.regularizer = JacobianRegularizer.from_config(config.get("regularizer", {}))
    if isinstance(family, TaskFamily):
        family.interventions = PathIndependence.from_config(config.get("path_independence", {}))
    return family


def cell_problem(model: Any, variables: Any, inputs: Any, **kwargs: Any):
    """``(f, z_star, args)`` of ``model``'s first DEQ on ``inputs`` in eval mode: the
    solve jitted once (`deq_jax.nn.deq_call`); ``f(z, args)`` is the pure cell."""
    seen = {}

    def capture(variables, inputs, kwargs):
        call = deq_call(model, variables, inputs, **kwargs)
        seen["f"] = call.problem.f  # a pure function of (z, args): no tracer inside
        return call.z_star, call.problem.args

    z_star, args = jax.jit(capture)(variables, inputs, kwargs)
    return seen["f"], z_star, args


def _lm_bench(config: Any, options: Options) -> Bench:
    """The `Bench` of a language model on uniform synthetic tokens (no corpus read)."""
    tc, b = config.train, config.train.batch_size
    vocab = options.vocab or config.model.get("vocab_size", 0)
    if not vocab:
        raise ValueError("A language model's synthetic tokens need --vocab (e.g. --vocab=96).")
    mesh = sharding.make_mesh()
    sharding.check_batch_size(b, mesh)
    model = build.build_model(model_fields(config, vocab), build.build_deq_spec(config.deq))
    tx, schedule = make_optimizer(tc)
    state = sharding.replicate(init_state(model, tx, tc.seq_len, tc.seed), mesh)
    template = jax.tree_util.tree_map(np.asarray, model.init_mems(b))
    # No task: the tokens are synthetic, and a text task would need its corpus.
    run = Run(mesh, None, model, schedule, state, 0, None, place_memory(template, mesh, b))
    step = configured_family(config).phase(config, run, model, warmup=False).step
    rng = np.random.default_rng(DATA_SEED)
    segments = lambda n: [_lm_segment(rng, b, tc.seq_len, vocab, i == 0) for i in range(n)]
    train_batches = segments(options.warmup + options.steps)
    eval_batches = segments(1 + options.eval_steps)
    eval_step = make_lm_eval_step(model, mesh, template)
    memory = {"mems": place_memory(template, mesh, b), "read": None}

    def evaluate(state, batch):
        memory["read"] = jax.tree_util.tree_map(jnp.copy, memory["mems"])
        began = time.perf_counter()
        mems, sums = eval_step(state, memory["mems"], lm_device_batch(batch, mesh, vocab))
        sums = jax.device_get(sums)
        memory["mems"] = jax.block_until_ready(mems)
        seconds = time.perf_counter() - began
        rows = max(float(sums["rows"]), 1.0)
        return seconds, {
            "nstep_mean": float(sums["nstep_sum"]) / rows,
            "nstep_max": float(sums["nstep_max"]),
            "rel_residual": float(sums["rel_residual_sum"]) / rows,
        }

    def problem(state, batch):
        tokens = lm_device_batch(batch, mesh)
        mems = memory["read"]
        return cell_problem(model, state.variables(), tokens["inputs"], mems=mems)

    sizes = {"vocab": vocab, "seq_len": tc.seq_len}
    count = b * tc.seq_len
    return Bench(
        run,
        step,
        train_batches,
        eval_batches,
        evaluate,
        problem,
        "tokens",
        count,
        "synthetic",
        sizes,
    )


def _lm_segment(rng: np.random.Generator, b: int, seq_len: int, vocab: int, first: bool):
    """One host batch of a language model: uniform tokens ``[B, L+1]`` split into inputs
    and next-token targets (``reset`` on the first: a fresh memory)."""
    tokens = rng.integers(0, vocab, (b, seq_len + 1)).astype(np.int32)
    return {
        "inputs": tokens[:, :-1].copy(),
        "targets": tokens[:, 1:].copy(),
        "mask": np.ones((b, seq_len), bool),
        "reset": np.bool_(first),
    }


def _task_run(config: Any, task: Any, input_shape: Sequence[int]) -> Run:
    """The `Run` of a task model with fresh weights, without reading ``task``'s data."""
    tc = config.train
    mesh = sharding.make_mesh()
    sharding.check_batch_size(tc.batch_size, mesh)
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    tx, schedule = make_optimizer(tc)
    sample = np.zeros((1, *input_shape), np.float32)
    state = create_train_state(model, tx, sample, jax.random.PRNGKey(tc.seed))
    return Run(mesh, task, model, schedule, sharding.replicate(state, mesh), 0, None)


def _synthetic_batches(run: Run, n: int, b: int, input_shape, rng: np.random.Generator):
    """``n`` host batches of ``N(0, 1)`` inputs and uniform labels (a regression's
    targets ``N(0, 1)``), the targets shaped as the model's outputs say."""
    model, task = run.model, run.task
    x = jax.ShapeDtypeStruct((b, *input_shape), jnp.float32)
    rngs = {name: jax.random.PRNGKey(0) for name in RNG_STREAMS}
    variables = run.state.variables()
    outputs, _ = jax.eval_shape(
        lambda v, x: model.apply(v, x, train=False, rngs=rngs), variables, x
    )
    regression = is_regression(task)
    target_shape = outputs.shape if regression else outputs.shape[:-1]
    batches = []
    for _ in range(n):
        inputs = rng.standard_normal((b, *input_shape)).astype(np.float32)
        if regression:
            targets = rng.standard_normal(target_shape).astype(np.float32)
        else:
            targets = rng.integers(0, task.num_classes, target_shape).astype(np.int32)
        batches.append({"inputs": inputs, "targets": targets, "mask": np.ones(b, bool)})
    return batches


def _task_batches(run: Run, n_train: int, n_eval: int, b: int) -> tuple[list, list]:
    """A task's own batches (generated under its ``data_dir``): ``n_train`` training
    batches of seed 1 and ``n_eval`` of its first eval split, cycled if it has fewer."""
    task = run.task
    task.prepare()
    train = task.train_iterator(b, seed=DATA_SEED)
    train_batches = [next(train) for _ in range(n_train)]
    split = list(task.eval_iterator(task.eval_splits[0], b))
    return train_batches, [split[i % len(split)] for i in range(n_eval)]


def _task_input_shape(task: Any) -> tuple[int, ...]:
    """``task.input_shape``, when the task can tell it without its data files.

    Raises:
      ValueError: for a task that reads its shape from files it cannot find (an image
        task without its data), naming ``--input_shape``.
    """
    try:
        return tuple(task.input_shape)
    except DataError as e:
        raise ValueError(
            f"The {task.name} task reads its input shape from its data files, which are "
            "missing; synthetic data need none: pass --input_shape (e.g. 28,28,1 for "
            "Fashion-MNIST, 32,32,3 for CIFAR-10)."
        ) from e


def _task_bench(config: Any, options: Options, workdir: str) -> Bench:
    """The `Bench` of a task model (every family but the language model's)."""
    task = build.build_task(config.task, workdir)
    shape = tuple(options.input_shape) or _task_input_shape(task)
    run = _task_run(config, task, shape)
    b, extras = config.train.batch_size, tuple(run.task.batch_extras)
    n_train, n_eval = options.warmup + options.steps, 1 + options.eval_steps
    if extras:
        data = "task"
        train_batches, eval_batches = _task_batches(run, n_train, n_eval, b)
    else:
        data, rng = "synthetic", np.random.default_rng(DATA_SEED)
        train_batches = _synthetic_batches(run, n_train, b, shape, rng)
        eval_batches = _synthetic_batches(run, n_eval, b, shape, rng)
    step = configured_family(config).phase(config, run, run.model, warmup=False).step
    eval_step = make_eval_step(
        run.model,
        run.task.metrics,
        run.mesh,
        regression=is_regression(run.task),
        extras=extras,
        settle=SettleRule.from_config(config.deq),
    )

    def evaluate(state, batch):
        began = time.perf_counter()
        metrics = jax.device_get(eval_step(state, device_batch(batch, run.mesh, extras)))
        seconds = time.perf_counter() - began
        return seconds, {k: float(metrics[k]) for k in ("nstep_mean", "nstep_max", "rel_residual")}

    def problem(state, batch):
        batch = device_batch(batch, run.mesh, extras)
        rngs = state.step_rngs(*RNG_STREAMS)  # as the eval step: z_init="mixed" draws
        more = {k: batch[k] for k in extras}
        return cell_problem(run.model, state.variables(), batch["inputs"], rngs=rngs, **more)

    unit = "images" if len(shape) == 3 and not extras else "examples"
    sizes = {"input_shape": list(shape)}
    return Bench(run, step, train_batches, eval_batches, evaluate, problem, unit, b, data, sizes)


def build_bench(config: Any, options: Options, workdir: str) -> Bench:
    """The `Bench` of ``config`` (already `configured`)."""
    if options.warmup < 1 or min(options.steps, options.eval_steps, options.f_evals) < 1:
        raise ValueError("--warmup, --steps, --eval_steps and --f_evals must be at least 1.")
    if config.model.get("name") in LANGUAGE_MODELS:
        return _lm_bench(config, options)
    return _task_bench(config, options, workdir)
