"""`train_language_model(config, workdir)`: the training loop of a language model.

Like `deq_jax.training.train_and_evaluate`, for a text task (`deq_jax.tasks`
``char_text`` / ``wikitext``) and `deq_jax.models.language.DEQTransformerLM`: batches
come in Transformer-XL order (each row continues the same row of the previous batch),
so the loop carries the model's segment memory from step to step, clears it where the
data starts a new epoch, and checkpoints it with the train state (a resumed run
continues exactly). The first ``train.pretrain_steps`` train the same parameters as a
weight-tied stack (locuslab's warm-up). Evaluation streams a whole split with the
memory and reports bits per character (character level) or perplexity (word level), the
solver's steps per segment and tokens per second. After each periodic evaluation past
the warm-up, and for the last state, the state with the best validation score (``bpc``
or ``ppl``) is kept in ``checkpoints_best/`` (`deq_jax.training.selection`); the final
report scores it and is written to ``lm_report.json`` (``best``: its step and score).
A finished workdir run again with the same ``train.steps`` says so and writes nothing;
with a larger one it continues (the report's ``train_seconds`` and tokens per second
then cover every invocation since the first).

Files in the workdir: ``checkpoints/`` (orbax: ``{"state", "mems"}``), ``vocab.json``
(the vocabulary the checkpoints were trained on: a run on another vocabulary is
refused), ``checkpoints_best/`` (the best state), ``metrics.jsonl``, ``tensorboard/``,
``config.json``, ``lm_report.json`` and ``data/`` (the tfds build, unless ``task.data_dir`` is set).

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from deq_jax.training.evaluate import weights_to_score
from deq_jax.training.lm_evaluate import StreamEvaluator, lm_device_batch
from deq_jax.training.lm_setup import setup_language_model
from deq_jax.training.lm_steps import make_lm_train_step, place_memory
from deq_jax.training.nonfinite import NonFiniteSteps, logged
from deq_jax.training.regularizer import JacobianRegularizer
from deq_jax.training.selection import BestCheckpoint, SelectionRule
from deq_jax.training.state import TrainState
from deq_jax.training.train import config_json, earlier_report, interval_mean, run_is_finished
from deq_jax.training.writers import MetricWriter, ProgressLogger, write_json, write_text

REPORT_FILE = "lm_report.json"


class LMRunResult(NamedTuple):
    """What `train_language_model` returns: the final state and memory, the step, and
    ``eval_metrics`` (``{split: metrics}`` of the final evaluation at the eval budget:
    of the best checkpoint, which the report scores)."""

    state: TrainState
    mems: Any
    step: int
    eval_metrics: dict[str, dict]


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
      NonFiniteLossError: after ``train.max_nonfinite_steps`` steps in a row with a
        non-finite loss or gradient norm (each one skipped, logged and counted as
        ``skipped_steps``); the message names the steps and the last good checkpoint.
    """
    tc, ec = config.train, config.eval
    regularizer = JacobianRegularizer.from_config(config.get("regularizer", {}))
    run = setup_language_model(config, workdir)
    mesh, task, model, state, mems = run.mesh, run.task, run.model, run.state, run.mems
    ckpt, start = run.checkpointer, run.start_step
    lead = jax.process_index() == 0
    previous = earlier_report(workdir, REPORT_FILE, start)
    if run_is_finished(previous, workdir, REPORT_FILE, start, tc.steps, ckpt, emit):
        return LMRunResult(state=state, mems=mems, step=start, eval_metrics=previous["eval"])
    if lead:
        write_text(os.path.join(workdir, "config.json"), config_json(config))
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
    # The periodic evaluation reads ``eval.splits`` (the configs: the validation split,
    # which selects the checkpoint); the final one every eval split, test read once.
    periodic_splits = tuple(ec.splits) or tuple(task.eval_splits)
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

    def run_eval(step: int, full: bool, scored: TrainState | None = None) -> dict[str, dict]:
        """The periodic evaluation, or with ``full`` the final one: whole splits, each
        eval split of the task."""
        evaluator.max_batches = 0 if full else ec.max_batches
        results = {}
        weights = weights_to_score(state if scored is None else scored, ec)
        for split in task.eval_splits if full else periodic_splits:
            for suffix, scored_weights in weights.items():
                metrics = evaluator.evaluate(scored_weights, split, mode=phase(step))
                results.setdefault(split, metrics)  # the average's (or the only weights')
                writer.write(step, split + suffix, metrics)
                emit(f"eval step {step} {split + suffix}: {_format(metrics)}")
        progress.restart_clock(step)
        return results

    def select(step: int, results: dict[str, dict]) -> None:
        """Offers the state (past the warm-up) to the best checkpoint, scored on the
        selection split as the periodic evaluation scores it."""
        if phase(step) is not None:
            return
        evaluator.max_batches = ec.max_batches
        metrics = results.get(best.rule.split) or evaluator.evaluate(state, best.rule.split)
        best.offer(step, state, best.rule.score(metrics))

    nonfinite = NonFiniteSteps(
        tc.get("max_nonfinite_steps", 1),  # 1: a config written before the key stops as it did
        ckpt,
        emit,
        "Lower train.learning_rate, raise train.pretrain_steps or add the Jacobian regulariser.",
    )
    history: list[dict[str, Any]] = []
    eval_metrics: dict[str, dict] = {}
    train_seconds, train_tokens = 0.0, 0.0
    best = BestCheckpoint(workdir, SelectionRule.from_config(ec, task), emit)
    if previous is not None:
        train_seconds = previous.get("train_seconds") or 0.0
        train_tokens = (previous.get("train_tokens_per_second") or 0.0) * train_seconds
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
            skipped = nonfinite.skipped(metrics, step)
            history.append(logged(metrics, skipped))
            if step == start + 1:
                progress.restart_clock(step)
            if step % config.log.every_steps == 0 or step == stop:
                mean = interval_mean(history, sparse=None)
                writer.write(step, "train", mean)
                progress.line(step, mean)
                history = []
            if ec.every_steps and step % ec.every_steps == 0 and step < tc.steps:
                eval_metrics = run_eval(step, full=False)
                select(step, eval_metrics)
            if not skipped:  # the latest checkpoint stays the last good one
                ckpt.maybe_save(step, {"state": state, "mems": mems})
        last_step = max(stop, start)
        ckpt.maybe_save(last_step, {"state": state, "mems": mems}, force=True)
        ckpt.wait()
        if last_step >= tc.steps:
            select(last_step, {})
            scored = state if best.step in (None, last_step) else best.restore(state)
            emit(
                f"Final evaluation at step {last_step} of {best.describe()}, on every "
                f"segment of {tuple(task.eval_splits)}:"
            )
            eval_metrics = run_eval(last_step, full=True, scored=scored)
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
                    "best": best.record,
                }
                path = os.path.join(workdir, REPORT_FILE)
                write_json(path, report, indent=2)
                emit(f"Wrote {path}")
    finally:
        ckpt.close()
        best.close()
        writer.close()
    return LMRunResult(state=state, mems=mems, step=last_step, eval_metrics=eval_metrics)
