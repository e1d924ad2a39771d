"""Evaluating a language model on whole splits, the segment memory carried across
segments (`StreamEvaluator`), and a trained run's checkpoint at any solver budgets
(`evaluate_lm_checkpoint`, behind ``python -m launch.evaluate`` for a language model).

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019 (evaluation over the whole stream with the memory).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from deq_jax.tasks import text_batches
from deq_jax.tasks.text_vocab import pattern_mask
from deq_jax.training.families.evaluate import format_report
from deq_jax.training.families.lm_setup import saved_vocabulary_path, setup_language_model
from deq_jax.training.families.lm_steps import LM_KEYS, make_lm_eval_step, place_memory
from deq_jax.training.families.setup import restore_trained
from deq_jax.training.run import sharding
from deq_jax.training.run.selection import describe_selected, restore_selected
from deq_jax.training.run.state import TrainState


def check_token_ids(batch: dict[str, Any], vocab_size: int) -> None:
    """Checks on the host that a batch's ``inputs`` and ``targets`` are ids of the
    vocabulary (the model cannot: under ``jit`` an id out of range reads a clamped or
    undefined row instead of failing).

    Raises:
      ValueError: naming the key, the ids' range and the vocabulary size.
    """
    for key in ("inputs", "targets"):
        ids = np.asarray(batch[key])
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(
                f"The batch's {key} must lie in [0, vocab_size={vocab_size}); got ids in "
                f"[{ids.min()}, {ids.max()}]. Is the data the run's vocabulary's?"
            )


def lm_device_batch(
    batch: dict[str, Any], mesh: Mesh, vocab_size: int | None = None
) -> dict[str, jax.Array]:
    """The global, sharded token arrays of this process's rows of ``batch`` (with its
    ``"keep"`` flags, if it has them), their ids checked against ``vocab_size``
    (`check_token_ids`; ``None``: unchecked)."""
    if vocab_size is not None:
        check_token_ids(batch, vocab_size)
    keys = (*LM_KEYS, "keep") if "keep" in batch else LM_KEYS
    return sharding.shard_batch({k: batch[k] for k in keys}, mesh)


class StreamEvaluator:
    """Evaluates a language model on whole splits, carrying the memory across segments.

    Args:
      model: the language model.
      task: the text task (``eval_iterator``, ``summarize``).
      mesh: the run's mesh.
      batch_size: the global eval batch size (rows of the stream; padded with masked
        rows to a multiple of data x fsdp).
      seq_len: tokens per segment.
      max_batches: evaluate at most this many segments per split (0: the whole split).
    """

    def __init__(self, model, task, mesh, batch_size: int, seq_len: int, max_batches: int = 0):
        self.model, self.task, self.mesh = model, task, mesh
        self.batch_size, self.seq_len, self.max_batches = batch_size, seq_len, max_batches
        self.rows = sharding.local_padded_rows(batch_size, mesh)
        self.padded = sharding.padded_batch_size(batch_size, mesh)
        self._template = jax.tree_util.tree_map(np.asarray, model.init_mems(self.padded))
        self._steps: dict[int | None, Callable[..., Any]] = {}

    def _step(self, max_iter: int | None):
        if max_iter not in self._steps:
            self._steps[max_iter] = make_lm_eval_step(
                self.model, self.mesh, self._template, max_iter=max_iter
            )
        return self._steps[max_iter]

    def evaluate(
        self,
        state: TrainState,
        split: str,
        *,
        max_iter: int | None = None,
        segments: bool = False,
        keep: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Streams ``split`` (the first ``max_batches`` segments; 0: all of it).

        Args:
          state: the train state to score.
          split: the split's name.
          max_iter: the solver budget (``None``: the model's eval budget).
          segments: also return ``segments``, one entry per batch of segments in stream
            order (`segment_record`), to see where the loss and the unconverged
            solves are.
          keep: ``bool [N]`` over the split's tokens: also score the targets it keeps,
            in the same pass (`pattern_mask` makes one).

        Returns:
          The task's summary (``bpc`` or ``ppl``, ``nll``, ``tokens``) plus the solver's
          ``nstep_mean`` (steps per segment row), ``nstep_max``, ``converged`` (the
          fraction of row-segments that met the tolerance), ``rel_residual`` (their
          mean final relative residual), ``seconds`` and
          ``tokens_per_second`` (wall time of the steps, the first compile excluded);
          with ``keep``, also ``kept_nll`` (nats per kept token) and ``kept_tokens``.
        """
        step = self._step(max_iter)
        mems = place_memory(self._template, self.mesh, self.padded)
        totals: dict[str, float] = {}
        records: list[dict[str, float]] = []
        seconds, timed_tokens = 0.0, 0.0
        if keep is not None and len(keep) != self.task.num_tokens(split):
            raise ValueError(
                f"keep has {len(keep)} flags but split {split!r} has "
                f"{self.task.num_tokens(split)} tokens."
            )
        where = dict(process_index=jax.process_index(), process_count=jax.process_count())
        batches = self.task.eval_iterator(split, self.batch_size, self.seq_len, **where)
        if keep is not None:  # the same layout over the kept flags: targets line up
            flags = np.asarray(keep, np.int32)
            kept = text_batches.eval_batches(flags, self.batch_size, self.seq_len, **where)
            batches = (
                dict(b, keep=k["targets"].astype(bool)) for b, k in zip(batches, kept, strict=True)
            )
        for i, batch in enumerate(batches):
            if self.max_batches and i >= self.max_batches:
                break
            began = time.perf_counter()
            batch = sharding.pad_rows(batch, self.rows, mask_keys=("mask", "keep"))
            batch = lm_device_batch(batch, self.mesh, self.model.vocab_size)
            mems, sums = step(state, mems, batch)
            sums = jax.device_get(sums)
            if segments:
                records.append(segment_record(sums))
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
        metrics = summary(self.task, totals, seconds, timed_tokens, kept=keep is not None)
        if segments:
            metrics["segments"] = records
        return metrics


def summary(task, totals: dict[str, float], seconds: float, tokens: float, kept: bool):
    """A split's metrics from the sums of its segments (`StreamEvaluator.evaluate`):
    the task's summary, the solver's statistics per row, the timing (``seconds`` for
    ``tokens``) and, with ``kept``, ``kept_nll`` and ``kept_tokens``."""
    metrics = dict(task.summarize(totals["nll_sum"], totals["count"]))
    rows = max(totals["rows"], 1.0)
    metrics.update(
        nstep_mean=totals["nstep_sum"] / rows,
        nstep_max=totals["nstep_max"],
        converged=totals["converged_sum"] / rows,
        rel_residual=totals["rel_residual_sum"] / rows,
        seconds=seconds,
        tokens_per_second=tokens / seconds if seconds else float("nan"),
    )
    if kept:
        count = totals["kept_count"]
        metrics.update(
            kept_nll=totals["kept_nll_sum"] / count if count else float("nan"),
            kept_tokens=count,
        )
    return metrics


def segment_record(sums: dict[str, Any]) -> dict[str, float]:
    """One batch of segments from an eval step's sums: ``tokens``, ``nll`` (nats per
    token), ``nstep_mean`` and ``converged`` (over its rows)."""
    count, rows = float(sums["count"]), max(float(sums["rows"]), 1.0)
    return dict(
        tokens=count,
        nll=float(sums["nll_sum"]) / count if count else float("nan"),
        nstep_mean=float(sums["nstep_sum"]) / rows,
        converged=float(sums["converged_sum"]) / rows,
    )


def worst_segments_share(records: Sequence[dict[str, float]], fraction: float = 0.05) -> float:
    """The share of a split's total loss carried by its worst ``fraction`` of segment
    batches (at least one): ``fraction`` itself when the loss is spread evenly."""
    losses = sorted((r["nll"] * r["tokens"] for r in records if r["tokens"]), reverse=True)
    if not losses:
        return float("nan")
    worst = max(1, round(fraction * len(losses)))
    return sum(losses[:worst]) / sum(losses)


def split_by_pattern(metrics: dict[str, Any]) -> dict[str, float]:
    """``kept_bpc``, ``matched_bpc`` and ``matched_fraction`` of a split's metrics scored
    with ``keep`` (`StreamEvaluator.evaluate`; ``nll`` is nats per character)."""
    matched = metrics["tokens"] - metrics["kept_tokens"]
    nll_matched = metrics["nll"] * metrics["tokens"] - metrics["kept_nll"] * metrics["kept_tokens"]
    return dict(
        kept_bpc=metrics["kept_nll"] / math.log(2.0),
        matched_bpc=nll_matched / matched / math.log(2.0) if matched else float("nan"),
        matched_fraction=matched / metrics["tokens"],
    )


def evaluate_lm_checkpoint(
    config: Any,
    workdir: str,
    splits: Sequence[str] = (),
    max_iters: Sequence[int] = (),
    emit: Callable[[str], None] = print,
    checkpoint: str = "",
    exclude: str = "",
    max_batches: int = 0,
) -> dict[str, dict[str, dict]]:
    """Scores a language model's checkpoint on whole splits at any solver budgets.

    Args:
      config: the configuration the run was trained with (``eval.batch_size`` and
        ``eval.seq_len`` apply; each split is streamed with the memory carried).
      workdir: the run's directory.
      splits: the splits; empty means every eval split of the task.
      max_iters: solver budgets; empty means the config's eval budget
        (``deq.eval_max_iter``). The explicit stacks ignore them.
      emit: receives a line per split and budget, then the table; its first line names
        the checkpoint's step.
      checkpoint: ``"best"``, ``"last"`` or ``""`` (the best if there is one).
      exclude: a regular expression (character level): each split is also scored on
        the characters outside its matches (`pattern_mask`), in the same pass, which
        adds ``kept_bpc`` and ``matched_bpc`` (the bits per character outside and
        inside the matches) and ``matched_fraction`` to its metrics.
      max_batches: the first this many segments of each split; 0: every split in full.

    Returns:
      ``{"max_iter=K": {split: metrics}}``, each split's metrics with ``segments``
      (`StreamEvaluator.evaluate`) and ``worst_5pct_share`` (`worst_segments_share`).

    Raises:
      FileNotFoundError: if the workdir holds no checkpoint or no ``vocab.json`` (said
        before anything is built).
      VocabularyMismatchError: if the data's vocabulary is not the run's.
      ValueError: for an unknown ``checkpoint``, or an ``exclude`` that does not
        compile or is given for a word-level task.
    """
    run = restore_trained(config, workdir, "to evaluate", setup_fn=_setup_trained_language_model)
    state, step, which = restore_selected(workdir, run.state, run.start_step, checkpoint)
    ec = config.eval
    seq_len = ec.seq_len or config.train.seq_len
    evaluator = StreamEvaluator(
        run.model, run.task, run.mesh, ec.batch_size, seq_len, max_batches=max_batches
    )
    splits = tuple(splits) or tuple(run.task.eval_splits)
    budgets = [int(k) for k in max_iters] or [config.deq.eval_max_iter or config.deq.train_max_iter]
    named = describe_selected(workdir, which, run.start_step)
    emit(f"Checkpoint step {step} of {workdir} ({named}): streaming {', '.join(splits)}.")
    task, headline = run.task, run.task.headline
    keeps = {}
    if exclude:
        keeps = {s: ~pattern_mask(task.vocab, task.tokens(s), exclude) for s in splits}
    report: dict[str, dict[str, dict]] = {}
    for max_iter in budgets:
        name = f"max_iter={max_iter}"
        report[name] = {}
        for split in splits:
            keep = keeps.get(split)
            metrics = evaluator.evaluate(state, split, max_iter=max_iter, segments=True, keep=keep)
            metrics["worst_5pct_share"] = worst_segments_share(metrics["segments"])
            line = (
                f"  {name} {split}: {headline} {metrics[headline]:.4f}  nstep_mean "
                f"{metrics['nstep_mean']:.1f}  converged {metrics['converged']:.3f}  worst 5% "
                f"of segments carry {100 * metrics['worst_5pct_share']:.1f}% of the loss"
            )
            if exclude:
                metrics.update(split_by_pattern(metrics))
                line += (
                    f"; outside /{exclude}/ {metrics['kept_bpc']:.4f}, inside "
                    f"{metrics['matched_bpc']:.4f} ({100 * metrics['matched_fraction']:.2f}% "
                    "of the characters)"
                )
            report[name][split] = metrics
            emit(line)
    keys = [headline, "nstep_mean", "converged", "worst_5pct_share"]
    keys += ["kept_bpc", "matched_bpc", "matched_fraction"] if exclude else []
    emit(f"Checkpoint step {step} of {workdir} ({which}):\n" + format_report(report, keys))
    return report


def _setup_trained_language_model(config: Any, workdir: str):
    """`setup_language_model`, refused before anything is built when the workdir holds
    no ``vocab.json`` (not a language model's run)."""
    saved_vocabulary_path(workdir)
    return setup_language_model(config, workdir)
