"""`train_language_model(config, workdir)`: the training loop of a language model.

Like `deq_jax.training.train_and_evaluate`, for a text task (`deq_jax.tasks`
``char_text`` / ``wikitext``) and `deq_jax.models.language.DEQTransformerLM`: batches
come in Transformer-XL order (each row continues the same row of the previous batch),
so the loop carries the model's segment memory from step to step, clears it where the
data starts a new epoch, and checkpoints it with the train state (a resumed run
continues exactly). The first ``train.pretrain_steps`` train the same parameters as a
weight-tied stack (locuslab's warm-up). Evaluation streams a whole split with the
memory and reports bits per character (character level) or perplexity (word level), the
solver's steps per segment and tokens per second; the final report is written to
``lm_report.json``.

Files in the workdir: ``checkpoints/`` (orbax: ``{"state", "mems"}``), ``vocab.json``
(the vocabulary the checkpoints were trained on: a run on another vocabulary is
refused), ``metrics.jsonl``, ``tensorboard/``, ``config.json``, ``lm_report.json`` and
``data/`` (the tfds build, unless ``task.data_dir`` is set).

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from deq_jax.tasks.text import Vocabulary
from deq_jax.training import build, sharding
from deq_jax.training.checkpoint import Checkpointer
from deq_jax.training.lm_steps import LM_KEYS, make_lm_eval_step, make_lm_train_step, place_memory
from deq_jax.training.optim import make_optimizer
from deq_jax.training.regularizer import JacobianRegularizer
from deq_jax.training.state import TrainState
from deq_jax.training.train import NonFiniteLossError, config_json
from deq_jax.training.writers import MetricWriter, ProgressLogger

VOCAB_FILE = "vocab.json"
REPORT_FILE = "lm_report.json"


class VocabularyMismatchError(ValueError):
    """The workdir's checkpoints were trained on another vocabulary than the data's."""


class LMRun(NamedTuple):
    """A language-model run before its first step (`setup_language_model`).

    Attributes:
      mesh: the data-parallel mesh.
      task: the text task.
      model: the linen language model.
      schedule: the learning-rate schedule.
      state: the train state (restored if the workdir had a checkpoint), replicated.
      mems: the training memory of the global batch (restored with the state).
      start_step: the restored step (0 for a fresh run).
      checkpointer: the workdir's `Checkpointer`.
    """

    mesh: Mesh
    task: Any
    model: Any
    schedule: optax.Schedule
    state: TrainState
    mems: Any
    start_step: int
    checkpointer: Checkpointer


class LMRunResult(NamedTuple):
    """What `train_language_model` returns: the final state and memory, the step, and
    ``eval_metrics`` (``{split: metrics}`` of the final evaluation at the eval budget)."""

    state: TrainState
    mems: Any
    step: int
    eval_metrics: dict[str, dict]


def check_vocabulary(workdir: str, vocab: Vocabulary, *, write: bool = True) -> None:
    """Checks ``vocab`` against the workdir's ``vocab.json`` (written on a fresh run).

    Raises:
      VocabularyMismatchError: if the workdir was trained on another vocabulary.
    """
    path = os.path.join(workdir, VOCAB_FILE)
    if os.path.exists(path):
        with open(path) as f:
            saved = Vocabulary.from_json(f.read())
        if saved.fingerprint != vocab.fingerprint:
            raise VocabularyMismatchError(
                f"The checkpoints in {workdir} were trained on another vocabulary "
                f"({saved.size} tokens, fingerprint {saved.fingerprint}) than this data's "
                f"({vocab.size} tokens, fingerprint {vocab.fingerprint}). Use the data the "
                "run was trained on, or a fresh --workdir."
            )
    elif write:
        with open(path, "w") as f:
            f.write(vocab.to_json())


def model_fields(config: Any, vocab_size: int) -> Any:
    """``config.model`` with ``vocab_size`` from the data (``0`` in the config).

    Raises:
      ValueError: for a non-zero ``model.vocab_size`` that differs from the data's.
    """
    fields = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
    given = fields.get("vocab_size", 0)
    if given and given != vocab_size:
        raise ValueError(
            f"config.model.vocab_size={given} but the data's vocabulary has {vocab_size} "
            "tokens; set it to 0 (taken from the data)."
        )
    fields["vocab_size"] = vocab_size
    return fields


def init_state(model: Any, tx: optax.GradientTransformation, seq_len: int, seed: int):
    """The train state of a fresh language model (initialised on one segment)."""
    k_params, k_z0, k_dropout, k_run = jax.random.split(jax.random.PRNGKey(seed), 4)
    tokens = jnp.zeros((1, seq_len), jnp.int32)

    def init(rngs):
        return model.init(rngs, tokens, mems=model.init_mems(1), train=False)

    variables = dict(jax.jit(init)({"params": k_params, "z0": k_z0, "dropout": k_dropout}))
    params = variables.pop("params")
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=tx, model_state=variables, rng=k_run
    )
    return state.replace(step=jnp.zeros((), jnp.int32))


def setup_language_model(config: Any, workdir: str) -> LMRun:
    """Builds the run ``config`` describes and restores the workdir's latest checkpoint.

    Raises:
      ValueError: for an invalid config or a batch size that does not split evenly
        over the devices.
      VocabularyMismatchError: if the workdir was trained on another vocabulary.
      CheckpointMismatchError: if the workdir's checkpoint does not fit the model.
    """
    build.check_layout(config)
    tc = config.train
    sharding.initialize_distributed(
        tc.distributed, tc.coordinator_address, tc.num_processes, tc.process_id
    )
    os.makedirs(workdir, exist_ok=True)
    mesh = sharding.make_mesh()
    sharding.check_batch_size(tc.batch_size, mesh)
    task = build.build_task(config.task, workdir)
    task.prepare()
    check_vocabulary(workdir, task.vocab, write=jax.process_index() == 0)
    model = build.build_model(
        model_fields(config, task.vocab_size), build.build_deq_spec(config.deq)
    )
    tx, schedule = make_optimizer(tc)
    state = init_state(model, tx, tc.seq_len, tc.seed)
    mems = jax.tree_util.tree_map(np.asarray, model.init_mems(tc.batch_size))
    ckpt = Checkpointer(
        workdir,
        every_steps=config.ckpt.every_steps,
        keep=config.ckpt.keep,
        async_save=config.ckpt.async_save,
    )
    restored, start = ckpt.restore_or_init({"state": state, "mems": mems})
    return LMRun(
        mesh=mesh,
        task=task,
        model=model,
        schedule=schedule,
        state=sharding.replicate(restored["state"], mesh),
        mems=place_memory(restored["mems"], mesh, tc.batch_size),
        start_step=start,
        checkpointer=ckpt,
    )


def restore_language_model(config: Any, workdir: str) -> tuple[Any, Any, Vocabulary, int]:
    """The trained model of ``workdir``, without its data: ``(model, variables, vocab,
    step)``, the vocabulary read from the workdir's ``vocab.json``.

    Raises:
      FileNotFoundError: if the workdir has no ``vocab.json`` or no checkpoint.
      CheckpointMismatchError: if the checkpoint does not fit the config's model.
    """
    path = os.path.join(workdir, VOCAB_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No {VOCAB_FILE} in {workdir}: is it a language-model run?")
    with open(path) as f:
        vocab = Vocabulary.from_json(f.read())
    build.check_layout(config)
    tc = config.train
    model = build.build_model(model_fields(config, vocab.size), build.build_deq_spec(config.deq))
    tx, _ = make_optimizer(tc)
    state = init_state(model, tx, tc.seq_len, tc.seed)
    mems = jax.tree_util.tree_map(np.asarray, model.init_mems(tc.batch_size))
    ckpt = Checkpointer(workdir, every_steps=1, keep=max(config.ckpt.keep, 1))
    try:
        if ckpt.latest_step() is None:
            raise FileNotFoundError(f"No checkpoint in {ckpt.directory}.")
        restored, step = ckpt.restore_or_init({"state": state, "mems": mems})
    finally:
        ckpt.close()
    return model, restored["state"].variables(), vocab, step


def lm_device_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """The global, sharded token arrays of this process's rows of ``batch``."""
    return sharding.shard_batch({k: batch[k] for k in LM_KEYS}, mesh)


class StreamEvaluator:
    """Evaluates a language model on whole splits, carrying the memory across segments.

    Args:
      model: the language model.
      task: the text task (``eval_iterator``, ``summarize``).
      mesh: the data-parallel mesh.
      batch_size: the global eval batch size (rows of the stream).
      seq_len: tokens per segment.
      max_batches: evaluate at most this many segments per split (0: the whole split).
    """

    def __init__(self, model, task, mesh, batch_size: int, seq_len: int, max_batches: int = 0):
        sharding.check_batch_size(batch_size, mesh, "eval.batch_size")
        self.model, self.task, self.mesh = model, task, mesh
        self.batch_size, self.seq_len, self.max_batches = batch_size, seq_len, max_batches
        self._template = jax.tree_util.tree_map(np.asarray, model.init_mems(batch_size))
        self._steps: dict[tuple[int | None, str | None], Callable[..., Any]] = {}

    def _step(self, max_iter: int | None, mode: str | None):
        key = (max_iter, mode)
        if key not in self._steps:
            self._steps[key] = make_lm_eval_step(
                self.model, self.mesh, self._template, max_iter=max_iter, mode=mode
            )
        return self._steps[key]

    def evaluate(
        self, state: TrainState, split: str, *, max_iter: int | None = None, mode: str | None = None
    ) -> dict[str, float]:
        """Streams ``split`` (the first ``max_batches`` segments; 0: all of it).

        Returns:
          The task's summary (``bpc`` or ``ppl``, ``nll``, ``tokens``) plus the solver's
          ``nstep_mean`` (steps per segment row), ``nstep_max``, ``converged`` (the
          fraction of row-segments that met the tolerance), ``rel_residual`` (their
          mean final relative residual), ``seconds`` and
          ``tokens_per_second`` (wall time of the steps, the first compile excluded).
        """
        step = self._step(max_iter, mode)
        mems = place_memory(self._template, self.mesh, self.batch_size)
        totals: dict[str, float] = {}
        seconds, timed_tokens = 0.0, 0.0
        batches = self.task.eval_iterator(
            split,
            self.batch_size,
            self.seq_len,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        for i, batch in enumerate(batches):
            if self.max_batches and i >= self.max_batches:
                break
            began = time.perf_counter()
            mems, sums = step(state, mems, lm_device_batch(batch, self.mesh))
            sums = jax.device_get(sums)
            if i:  # the first segment compiles
                seconds += time.perf_counter() - began
                timed_tokens += float(sums["count"])
            for k, v in sums.items():
                v = float(v)
                totals[k] = (
                    max(totals.get(k, 0.0), v) if k.endswith("_max") else totals.get(k, 0.0) + v
                )
        if not totals.get("count"):
            raise ValueError(f"Split {split!r} has no tokens to evaluate.")
        metrics = dict(self.task.summarize(totals["nll_sum"], totals["count"]))
        rows = max(totals["rows"], 1.0)
        metrics.update(
            nstep_mean=totals["nstep_sum"] / rows,
            nstep_max=totals["nstep_max"],
            converged=totals["converged_sum"] / rows,
            rel_residual=totals["rel_residual_sum"] / rows,
            seconds=seconds,
            tokens_per_second=timed_tokens / seconds if seconds else float("nan"),
        )
        return metrics


def _mean(history: list[dict[str, Any]]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for m in history for k in m))
    out = {}
    for key in keys:
        values = [float(m[key]) for m in history if key in m and math.isfinite(float(m[key]))]
        if values:
            out[key] = max(values) if key.endswith("_max") else float(np.mean(values))
    return out


def _format(metrics: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())


def train_language_model(
    config: Any, workdir: str, *, emit: Callable[[str], None] = print
) -> LMRunResult:
    """Trains and evaluates the language model the config describes, in ``workdir``.

    Args:
      config: an `ml_collections.ConfigDict` like ``configs/lm_shakespeare.py``: the
        sections of ``configs/default.py`` with ``train.seq_len``,
        ``train.pretrain_steps`` and ``eval.seq_len``.
      workdir: where checkpoints, metrics and the report go; resumed if it has
        checkpoints.
      emit: receives every human-readable line.

    Returns:
      An `LMRunResult`.

    Raises:
      ValueError: for an invalid config.
      VocabularyMismatchError: if the workdir was trained on another vocabulary.
      NonFiniteLossError: if the loss or gradient norm stops being finite; the message
        names the step and the last good checkpoint.
    """
    tc, ec = config.train, config.eval
    regularizer = JacobianRegularizer.from_config(config.get("regularizer", {}))
    run = setup_language_model(config, workdir)
    mesh, task, model, state, mems = run.mesh, run.task, run.model, run.state, run.mems
    ckpt, start = run.checkpointer, run.start_step
    lead = jax.process_index() == 0
    if lead:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config_json(config))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    emit(
        f"{model.__class__.__name__} ({model.mode}): {n_params} parameters, vocabulary "
        f"{task.vocab_size}, {mesh.devices.size} device(s), "
        f"{'resuming from step ' + str(start) if start else 'starting from scratch'}; "
        f"workdir {workdir}"
    )
    template = jax.tree_util.tree_map(np.asarray, model.init_mems(tc.batch_size))

    def train_step_for(mode: str | None):
        return make_lm_train_step(
            model,
            run.schedule,
            mesh,
            template,
            mode=mode,
            regularizer=regularizer,
        )

    steps = {}
    evaluator = StreamEvaluator(
        model, task, mesh, ec.batch_size, ec.seq_len or tc.seq_len, ec.max_batches
    )
    eval_splits = tuple(ec.splits) or tuple(task.eval_splits)
    writer = MetricWriter(workdir, tensorboard=config.log.tensorboard, enabled=lead)
    stop = min(tc.stop_at_step, tc.steps) if tc.stop_at_step else tc.steps
    progress = ProgressLogger(tc.steps, start, emit=emit)
    batches = task.train_iterator(
        tc.batch_size,
        tc.seq_len,
        start_step=start,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )

    def phase(step: int) -> str | None:
        return "weight_tied" if step <= tc.pretrain_steps else None

    def run_eval(step: int, full: bool) -> dict[str, dict]:
        evaluator.max_batches = 0 if full else ec.max_batches
        results = {}
        for split in eval_splits:
            metrics = evaluator.evaluate(state, split, mode=phase(step))
            results[split] = metrics
            writer.write(step, split, metrics)
            emit(f"eval step {step} {split}: {_format(metrics)}")
        progress.restart_clock(step)
        return results

    history: list[dict[str, Any]] = []
    eval_metrics: dict[str, dict] = {}
    train_seconds, train_tokens = 0.0, 0.0
    try:
        for step in range(start + 1, stop + 1):
            mode = phase(step)
            if mode not in steps:
                steps[mode] = train_step_for(mode)
                if mode is None and tc.pretrain_steps and step > 1:
                    emit(f"step {step}: warm-up over, training the {model.mode} model")
            batch = next(batches)
            if batch["reset"]:
                mems = place_memory(template, mesh, tc.batch_size)
            began = time.perf_counter()
            state, mems, metrics = steps[mode](state, mems, lm_device_batch(batch, mesh))
            metrics = jax.device_get(metrics)
            if step > start + 1:  # the first step compiles
                train_seconds += time.perf_counter() - began
                train_tokens += float(metrics["tokens"])
            loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                raise NonFiniteLossError(
                    f"Non-finite training loss ({loss}) or gradient norm ({grad_norm}) at "
                    f"step {step}; stopping. The last good checkpoint is step "
                    f"{ckpt.latest_step()} in {ckpt.directory}. Lower train.learning_rate, "
                    "raise train.pretrain_steps or add the Jacobian regulariser."
                )
            history.append(metrics)
            if step == start + 1:
                progress.restart_clock(step)
            if step % config.log.every_steps == 0 or step == stop:
                mean = _mean(history)
                writer.write(step, "train", mean)
                progress.line(step, mean)
                history = []
            if ec.every_steps and step % ec.every_steps == 0 and step < tc.steps:
                eval_metrics = run_eval(step, full=False)
            ckpt.maybe_save(step, {"state": state, "mems": mems})
        last_step = max(stop, start)
        ckpt.maybe_save(last_step, {"state": state, "mems": mems}, force=True)
        ckpt.wait()
        if last_step >= tc.steps:
            eval_metrics = run_eval(last_step, full=True)
            if lead:
                report = {
                    "step": last_step,
                    "parameters": int(n_params),
                    "devices": int(mesh.devices.size),
                    "train_tokens_per_second": train_tokens / train_seconds
                    if train_seconds
                    else None,
                    "train_seconds": train_seconds,
                    "eval": eval_metrics,
                }
                path = os.path.join(workdir, REPORT_FILE)
                with open(path, "w") as f:
                    json.dump(report, f, indent=2)
                emit(f"Wrote {path}")
    finally:
        ckpt.close()
        writer.close()
    return LMRunResult(state=state, mems=mems, step=last_step, eval_metrics=eval_metrics)
