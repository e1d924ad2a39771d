"""Evaluation on any split and solver budget, and the per-length accuracy report.

`Evaluator` runs one full ordered pass over a split (padding rows masked out) with a
jitted eval step per solver budget; a batch size that data x fsdp does not divide is
padded with masked rows (`deq_jax.training.run.sharding.pad_rows`), so every config's
``eval.batch_size`` runs on any device count. `length_report` evaluates every eval split at
several multiples of the train budget: for prefix sums, the bit and whole-string
accuracy per test length, showing whether extra test-time iterations help on longer
inputs (the path-independence experiment of Anil et al.).

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from deq_jax.training.families import metrics, steps
from deq_jax.training.families.settle import SettleRule
from deq_jax.training.families.setup import restore_trained
from deq_jax.training.run import sharding
from deq_jax.training.run.selection import describe_selected, restore_selected
from deq_jax.training.run.state import TrainState
from deq_jax.training.run.writers import write_json

REPORT_FILE = "length_generalization.json"
# With ``eval.score_raw_weights`` (and ``train.ema_decay > 0``) the periodic evaluation
# also scores the raw weights, logged under the split's name plus this suffix.
RAW_SUFFIX = "_raw"


def weights_to_score(state: TrainState, eval_config: Any) -> dict[str, TrainState]:
    """The periodic evaluation's weights by split suffix: ``{"": state}``, plus the raw
    weights under `RAW_SUFFIX` when the state keeps an average and
    ``eval.score_raw_weights`` is on (logged only, never selected on)."""
    weights = {"": state}
    if state.has_average and eval_config.get("score_raw_weights", False):
        weights[RAW_SUFFIX] = state.without_average()
    return weights


# The keys a batch needs on device; everything else (e.g. "index") stays on the host.
DEVICE_KEYS = ("inputs", "targets", "mask")


def device_batch(
    batch: dict[str, Any], mesh: Mesh, extras: tuple[str, ...] = ()
) -> dict[str, jax.Array]:
    """The global, sharded arrays of this process's rows of ``batch``.

    Keeps `DEVICE_KEYS` and the task's ``extras`` (its ``batch_extras``).
    """
    return sharding.shard_batch({k: batch[k] for k in (*DEVICE_KEYS, *extras)}, mesh)


class Evaluator:
    """Evaluates a model on a task's splits at any solver budget.

    Args:
      model: the linen model (see `deq_jax.training.families.steps`).
      task: a `deq_jax.tasks` task (``eval_iterator``, ``metrics``).
      mesh: the run's mesh.
      batch_size: the global eval batch size (the examples of a batch; padded with
        masked rows to a multiple of data x fsdp).
      max_batches: evaluate at most this many batches per split (0: all).
      settle: when a sample's solve also stops on its decoded answer
        (`SettleRule`; ``None``: never).
    """

    def __init__(
        self,
        model: Any,
        task: Any,
        mesh: Mesh,
        batch_size: int,
        max_batches: int = 0,
        settle: SettleRule | None = None,
    ):
        self.rows = sharding.local_padded_rows(batch_size, mesh)
        self.model, self.task, self.mesh = model, task, mesh
        self.batch_size, self.max_batches = batch_size, max_batches
        self.settle = settle or SettleRule()
        self._steps: dict[int | None, Callable[..., Any]] = {}

    def _step(self, max_iter: int | None) -> Callable[..., Any]:
        if max_iter is None:  # the model's own eval budget, shared with an explicit one
            max_iter = getattr(self.model, "eval_max_iter", None)
        if max_iter not in self._steps:
            self._steps[max_iter] = steps.make_eval_step(
                self.model,
                self.task.metrics,
                self.mesh,
                max_iter,
                regression=metrics.is_regression(self.task),
                extras=tuple(getattr(self.task, "batch_extras", ())),
                settle=self.settle,
            )
        return self._steps[max_iter]

    def evaluate(self, state: TrainState, split: str, max_iter: int | None = None) -> dict:
        """Metrics of ``split`` (combined over batches) at solver budget ``max_iter``.

        Args:
          state: the train state holding the parameters.
          split: any split of the task.
          max_iter: the solver budget; ``None`` is the model's eval budget.

        Returns:
          ``{"loss", <task metrics>, "nstep_mean", "nstep_max", ..., "count"}``.
        """
        step = self._step(max_iter)
        batches = self.task.eval_iterator(
            split,
            self.batch_size,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        if self.max_batches:
            batches = itertools.islice(batches, self.max_batches)
        extras = tuple(getattr(self.task, "batch_extras", ()))
        padded = (sharding.pad_rows(b, self.rows) for b in batches)
        results = [step(state, device_batch(b, self.mesh, extras)) for b in padded]
        return metrics.combine_split(self.task, jax.device_get(results))

    def evaluate_splits(
        self, state: TrainState, splits: Sequence[str], max_iter: int | None = None
    ) -> dict[str, dict]:
        """`evaluate` on each of ``splits``; ``{split: metrics}``."""
        return {split: self.evaluate(state, split, max_iter) for split in splits}


def length_report(
    evaluator: Evaluator,
    state: TrainState,
    splits: Sequence[str],
    budgets: dict[str, int],
    emit: Callable[[str], None] | None = None,
) -> dict[str, dict[str, dict]]:
    """Every split at every named budget: ``{budget_name: {split: metrics}}``.

    Args:
      evaluator: the `Evaluator` (use ``max_batches=0`` for the full splits).
      state: the train state.
      splits: the splits to report, e.g. ``("test_16", "test_32", ...)``.
      budgets: names to solver budgets, e.g. ``{"1x": 30, "2x": 60, "4x": 120}``.
      emit: if given, receives one short progress line per budget and split as each
        is done (`short_metrics` and the seconds it took).
    """
    report: dict[str, dict[str, dict]] = {}
    for name, max_iter in budgets.items():
        report[name] = {}
        for split in splits:
            began = time.perf_counter()
            report[name][split] = metrics = evaluator.evaluate(state, split, max_iter)
            if emit is not None:
                emit(
                    f"  {name} ({max_iter} iterations) {split}: {short_metrics(metrics)}  "
                    f"{time.perf_counter() - began:.1f} s"
                )
    return report


def report_budgets(config: Any) -> dict[str, int]:
    """The report's solver budgets, ``{"1x": k, "2x": 2k, ...}``: ``eval.budget_multipliers``
    times ``deq.train_max_iter``.

    Raises:
      ValueError: if ``deq.train_max_iter`` is not set.
    """
    base = config.deq.train_max_iter
    if not base:
        raise ValueError("deq.train_max_iter must be set for the per-length report.")
    return {f"{m}x": int(round(m * base)) for m in config.eval.budget_multipliers}


def eval_budget_name(config: Any) -> str | None:
    """The report budget (``"1x"``, ...) equal to the eval budget, or ``None``."""
    eval_budget = config.deq.eval_max_iter or config.deq.train_max_iter
    return next((b for b, k in report_budgets(config).items() if k == eval_budget), None)


def final_report(config, evaluator, state, splits, writer, emit, step: int) -> dict:
    """The end of training's per-length report of ``state`` at every budget, written to
    ``writer`` as ``{split}_{budget}`` metrics at ``step``, with one short line per
    budget and split as it goes. Every batch of each split counts unless
    ``eval.report_max_batches`` caps them (a smoke run's seconds-long report)."""
    evaluator.max_batches = config.eval.get("report_max_batches", 0)
    report = length_report(evaluator, state, splits, report_budgets(config), emit=emit)
    for budget, by_split in report.items():
        for split, values in by_split.items():
            writer.write(step, f"{split}_{budget}", values)
    first = next(iter(next(iter(report.values())).values()))
    keys = headline_keys(first)
    emit(
        f"{report_title(splits, keys)} (budget = multiple of the train solver budget):\n"
        + format_report(report, keys + ["nstep_mean"])
    )
    return report


def format_report(report: dict[str, dict[str, dict]], keys: Sequence[str]) -> str:
    """A plain-text table: one row per (budget, split), one column per metric key."""
    header = f"{'budget':>8} {'split':>12} " + " ".join(f"{k:>16}" for k in keys)
    lines = [header]
    for budget, by_split in report.items():
        for split, values in by_split.items():
            cells = " ".join(f"{values.get(k, float('nan')):>16.4f}" for k in keys)
            lines.append(f"{budget:>8} {split:>12} {cells}")
    return "\n".join(lines)


# Metrics worth printing besides the accuracies: a regression's error, a CLRS score and
# a language model's bits per character or perplexity.
HEADLINE = ("mse", "score", "bpc", "ppl")


def headline_keys(metrics: dict[str, Any]) -> list[str]:
    """The task-metric keys worth printing: accuracies and the `HEADLINE` metrics."""
    return [k for k in metrics if k.endswith("accuracy") or k in HEADLINE]


# A split named by its length (``test_16``): the report is then per length.
_LENGTH_SPLIT = re.compile(r"_\d+$")


def report_title(splits: Sequence[str], keys: Sequence[str]) -> str:
    """The final report's title: per length when every split is named by its length
    (``test_16``, ``test_32``), per split otherwise; accuracy when every headline
    metric is one."""
    what = "accuracy" if keys and all(k.endswith("accuracy") for k in keys) else "scores"
    if splits and all(_LENGTH_SPLIT.search(s) for s in splits):
        return f"Per-length {what}"
    return f"{what.capitalize()} per split"


def short_metrics(metrics: dict[str, Any]) -> str:
    """The metrics worth a glance, in one short line: the `headline_keys` and the mean
    solver steps (everything else is in ``metrics.jsonl``)."""
    text = "  ".join(f"{k} {metrics[k]:.4f}" for k in headline_keys(metrics))
    return f"{text}  nstep_mean {metrics['nstep_mean']:.1f}" if "nstep_mean" in metrics else text


def read_train_seconds(workdir: str, report_file: str = REPORT_FILE) -> float | None:
    """``train_seconds`` of a run's report, ``{workdir}/length_generalization.json`` by
    default (the language model's is ``lm_report.json``); ``None`` if absent."""
    path = os.path.join(workdir, report_file)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("train_seconds")


def write_report(workdir: str, report: dict, extra: dict | None = None) -> str:
    """Writes ``{"report": report, **extra}`` to ``{workdir}/length_generalization.json``."""
    path = os.path.join(workdir, REPORT_FILE)
    return write_json(path, {"report": report, **(extra or {})}, indent=2, sort_keys=True)


def evaluate_task_checkpoint(
    config: Any,
    workdir: str,
    splits: Sequence[str] = (),
    max_iters: Sequence[int] = (),
    emit: Callable[[str], None] = print,
    checkpoint: str = "",
    run: Any = None,
    max_batches: int = 0,
    exclude: str = "",
) -> dict[str, dict[str, dict]]:
    """Evaluates a checkpoint of ``workdir`` on any splits and solver budgets: the best
    on validation (`deq_jax.training.run.selection`) if the run has one, else the latest
    (`deq_jax.training.evaluate_checkpoint` of a task's config).

    Args:
      config: the configuration the checkpoint was trained with (``eval.batch_size``
        applies).
      workdir: the run's directory.
      splits: the splits to evaluate; empty means every eval split of the task.
      max_iters: solver budgets; empty means ``eval.budget_multipliers`` times
        ``deq.train_max_iter``.
      emit: receives the printed table; its first line names the checkpoint's step.
      checkpoint: ``"best"``, ``"last"`` or ``""`` (the best if there is one).
      run: the `deq_jax.training.Run` of ``workdir`` with its last state, if the caller
        has it already (e.g. `launch.runs.trained_run`'s); else it is restored here.
      max_batches: the first this many batches of each split (the same examples at
        every budget); 0: every split in full.
      exclude: must be empty (a language model's option).

    Returns:
      ``{budget_name: {split: metrics}}`` with budget names like ``"max_iter=60"``.

    Raises:
      FileNotFoundError: if the workdir holds no checkpoint (or no best one, for
        ``checkpoint="best"``).
      ValueError: for an unknown ``checkpoint``, or an ``exclude``.
      CheckpointMismatchError: if the checkpoint does not fit the config's model.
    """
    if exclude:
        raise ValueError("exclude (a pattern of characters) applies to a language model.")
    if run is None:
        run = restore_trained(config, workdir, "to evaluate")
    state, step, which = restore_selected(workdir, run.state, run.start_step, checkpoint)
    splits = tuple(splits) or tuple(run.task.eval_splits)
    max_iters = max_iters or list(report_budgets(config).values())
    evaluator = Evaluator(
        run.model,
        run.task,
        run.mesh,
        config.eval.batch_size,
        max_batches=max_batches,
        settle=SettleRule.from_config(config.deq),
    )
    named = describe_selected(workdir, which, run.start_step)
    emit(f"Checkpoint step {step} of {workdir} ({named}): evaluating, one line per split.")
    report = length_report(
        evaluator, state, splits, {f"max_iter={k}": int(k) for k in max_iters}, emit=emit
    )
    first = next(iter(next(iter(report.values())).values()))
    keys = headline_keys(first)
    emit(
        f"Checkpoint step {step} of {workdir} ({which}):\n"
        + format_report(report, keys + ["nstep_mean", "loss"])
    )
    return report
