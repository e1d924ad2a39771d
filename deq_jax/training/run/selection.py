"""Model selection on validation: the best checkpoint of a run, kept besides the last.

After each periodic evaluation (and once more at the end) the training loop scores the
state on one split with one metric (`SelectionRule`); when the score beats every earlier
one, `BestCheckpoint` saves that state under ``{workdir}/checkpoints_best/{step}/``
(orbax, one kept) with a small JSON record of the step and the score beside it in the
same checkpoint (``selection/metadata``), written in the same atomic save, so the two
always agree. A resumed run reads the record back and keeps the best so far; the final
report and ``launch.evaluate`` score that state (CLRS's model selection on ``val``).

The metric and its direction are the task's (`deq_jax.tasks.Task.selection_metric`)
unless ``eval.select_metric`` (and ``eval.select_mode``) name others; the split is the
task's validation split (`deq_jax.tasks.Task.validation_split`; without one, its first
eval split) unless ``eval.select_split`` names one.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/examples/run.py``: the checkpoint with the best validation score is tested).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp

from deq_jax.training.run.checkpoint import CheckpointMismatchError, describe_mismatch, save_error

BEST_DIR = "checkpoints_best"
# The record's item name in a best checkpoint; orbax writes it as ``selection/metadata``.
_RECORD_ITEM = "selection"
_STATE_ITEM = "state"
MODES = ("max", "min")
# Metrics for which lower is better, when ``eval.select_metric`` is set without a mode.
LOWER_IS_BETTER = ("loss", "mse", "nll", "ppl", "bpc", "abs_residual", "rel_residual")


class SelectionRule(NamedTuple):
    """Which evaluation picks the best checkpoint.

    Attributes:
      split: the validation split scored.
      metric: the metric of that split compared.
      mode: ``"max"`` (higher is better) or ``"min"``.
    """

    split: str
    metric: str
    mode: str

    @classmethod
    def from_config(cls, eval_section: Mapping[str, Any], task: Any) -> SelectionRule:
        """The rule of ``config.eval`` for ``task``: ``select_split`` (default: the
        task's `validation_split`, or without one the first of ``eval.splits`` or of
        the task's eval splits), ``select_metric`` and
        ``select_mode`` (default: the task's `selection_metric`; a metric named
        without a mode is minimised if it is in `LOWER_IS_BETTER`).

        Raises:
          ValueError: for a split the task does not have or an unknown mode, naming
            the key and the valid values.
        """
        splits = tuple(eval_section.get("splits", ())) or tuple(task.eval_splits)
        valid = getattr(task, "validation_split", None)  # a duck-typed task may lack it
        split = eval_section.get("select_split", "") or valid or splits[0]
        if split not in task.splits:
            raise ValueError(
                f"eval.select_split={split!r} is not a split of the task; valid: "
                f"{', '.join(task.splits)} (--config.eval.select_split=...)."
            )
        default_metric, default_mode = task.selection_metric
        metric = eval_section.get("select_metric", "") or default_metric
        mode = eval_section.get("select_mode", "")
        if not mode:
            if metric == default_metric:
                mode = default_mode
            else:
                mode = "min" if metric in LOWER_IS_BETTER else "max"
        if mode not in MODES:
            raise ValueError(f"eval.select_mode={mode!r} must be one of {', '.join(MODES)}.")
        return cls(split=split, metric=metric, mode=mode)

    def score(self, metrics: Mapping[str, Any]) -> float:
        """The compared value of one split's ``metrics``.

        Raises:
          KeyError: if the split's metrics lack the metric, listing those it has.
        """
        if self.metric not in metrics:
            raise KeyError(
                f"Selecting on {self.split!r} by {self.metric!r}, which its evaluation does "
                f"not report; it reports {', '.join(sorted(metrics))}. Set "
                "--config.eval.select_metric to one of them."
            )
        return float(metrics[self.metric])

    def better(self, score: float, best: float | None) -> bool:
        """Whether ``score`` beats ``best``: strictly, except that anything beats no
        score (``None``) or a NaN one, and a NaN beats nothing else."""
        if best is None or math.isnan(best):
            return True
        if math.isnan(score):
            return False
        return score > best if self.mode == "max" else score < best

    def describe(self) -> str:
        """``"val score (max)"``."""
        return f"{self.split} {self.metric} ({self.mode})"


def best_directory(workdir: str) -> str:
    """``{workdir}/checkpoints_best``."""
    return os.path.join(os.path.abspath(workdir), BEST_DIR)


def read_best_record(workdir: str) -> dict[str, Any] | None:
    """The record of ``workdir``'s best checkpoint (``step``, ``score``, ``split``,
    ``metric``, ``mode``), read from its JSON file without orbax; ``None`` if there is
    none."""
    directory = best_directory(workdir)
    if not os.path.isdir(directory):
        return None
    steps = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    for step in reversed(steps):
        path = os.path.join(directory, str(step), _RECORD_ITEM, "metadata")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
    return None


class BestCheckpoint:
    """The best-so-far state of a run under ``{workdir}/checkpoints_best`` (one kept).

    Creating it creates the directory; a finished run's rerun must not create one.

    Args:
      workdir: the run's directory.
      rule: the `SelectionRule` (``None`` to read a saved record only).
      emit: receives a line when a record of another rule is set aside.
    """

    def __init__(
        self,
        workdir: str,
        rule: SelectionRule | None = None,
        emit: Callable[[str], None] = print,
    ):
        self.rule = rule
        self.directory = best_directory(workdir)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=1, create=True, cleanup_tmp_directories=True
        )
        handlers = {
            _STATE_ITEM: ocp.StandardCheckpointHandler(),
            _RECORD_ITEM: ocp.JsonCheckpointHandler(),
        }
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )
        self.record = self._read_record()
        if self.record is not None and rule is not None and not self._same_rule(self.record):
            emit(
                f"The best checkpoint (step {self.record['step']}) was selected by "
                f"{self.record['split']} {self.record['metric']} ({self.record['mode']}); "
                f"selecting by {rule.describe()} from now on."
            )
            self.record = None

    def _same_rule(self, record: Mapping[str, Any]) -> bool:
        return all(record.get(k) == v for k, v in self.rule._asdict().items())

    def _read_record(self) -> dict[str, Any] | None:
        step = self._manager.latest_step()
        if step is None:
            return None
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{_RECORD_ITEM: ocp.args.JsonRestore()})
        )
        return dict(restored[_RECORD_ITEM])

    @property
    def step(self) -> int | None:
        """The best checkpoint's step, or ``None``."""
        return None if self.record is None else int(self.record["step"])

    @property
    def score(self) -> float | None:
        """The best score so far, or ``None``."""
        return None if self.record is None else float(self.record["score"])

    def describe(self) -> str:
        """``"the best checkpoint, step 4 (val score (max) 0.8125)"``, or ``"the last
        state (none selected)"`` before the first offer."""
        if self.record is None:
            return "the last state (none selected)"
        return f"the best checkpoint, step {self.step} ({self.rule.describe()} {self.score:.4f})"

    def offer(self, step: int, state: Any, score: float) -> bool:
        """Saves ``state`` as the best if ``score`` beats the best so far, unless
        ``step`` is already the best one's (a resumed run replaying it); returns whether
        it saved. A checkpoint left at ``step`` by a set-aside rule is replaced.

        Every process calls it with the same score (the evaluation is global), so all
        take the same branch, as orbax's collective save needs.

        Raises:
          CheckpointSaveError: if the save failed (the previous best is intact).
        """
        if self.step == step or not self.rule.better(score, self.score):
            return False
        if step in self._manager.all_steps():
            self._manager.delete(step)
        record = dict(step=int(step), score=float(score), **self.rule._asdict())
        args = {
            _STATE_ITEM: ocp.args.StandardSave(state),
            _RECORD_ITEM: ocp.args.JsonSave(record),
        }
        try:
            self._manager.save(step, args=ocp.args.Composite(**args), force=True)
            self._manager.wait_until_finished()
        except Exception as e:  # a full disk: the previous best is intact
            self._manager.reload()
            intact = [s for s in self._manager.all_steps() if s != step]
            raise save_error(self.directory, step, e, sorted(intact), best=True) from e
        self.record = record
        return True

    def restore(self, template: Any) -> Any:
        """The best state, restored into ``template`` (its structure and shardings).

        Raises:
          FileNotFoundError: if there is no best checkpoint.
          CheckpointMismatchError: if it does not fit ``template``.
        """
        step = self.step
        if step is None:
            raise FileNotFoundError(f"No best checkpoint in {self.directory}.")
        saved = self._manager.item_metadata(step)[_STATE_ITEM]
        problems = describe_mismatch(getattr(saved, "tree", saved), template)
        if problems:
            raise CheckpointMismatchError(
                f"The best checkpoint (step {step}) in {self.directory} does not fit the "
                "model this config builds:\n  " + "\n  ".join(problems[:8])
            )
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{_STATE_ITEM: ocp.args.StandardRestore(abstract)})
        )
        return restored[_STATE_ITEM]

    def close(self) -> None:
        """Finishes pending saves and releases the manager."""
        self._manager.wait_until_finished()
        self._manager.close()


# What ``launch.evaluate --checkpoint`` and `evaluate_checkpoint` may score.
CHECKPOINTS = ("best", "last")


def restore_selected(
    workdir: str, state: Any, last_step: int, checkpoint: str = ""
) -> tuple[Any, int, str]:
    """The state to score: ``(state, step, which)``, ``which`` being ``"best"`` or
    ``"last"``.

    Args:
      workdir: the run's directory.
      state: the restored last state (also the template of the best one).
      last_step: its step.
      checkpoint: ``"best"``, ``"last"``, or ``""``: the best if the run has one, else
        the last.

    Raises:
      ValueError: for another ``checkpoint``.
      FileNotFoundError: for ``"best"`` in a workdir without a best checkpoint.
    """
    if checkpoint not in ("", *CHECKPOINTS):
        raise ValueError(
            f"checkpoint={checkpoint!r} is not one of {', '.join(CHECKPOINTS)} "
            "(--checkpoint=best|last; empty: the best if the run has one)."
        )
    record = read_best_record(workdir)
    if checkpoint == "last" or (not checkpoint and record is None):
        return state, last_step, "last"
    if record is None:
        raise FileNotFoundError(
            f"No best checkpoint in {best_directory(workdir)} (a run trained before model "
            "selection, or one that never finished an evaluation): pass --checkpoint=last."
        )
    best = BestCheckpoint(workdir)
    try:
        return best.restore(state), int(best.step), "best"
    finally:
        best.close()


def describe_selected(workdir: str, which: str, last_step: int) -> str:
    """Which checkpoint is scored, in a few words: ``"the last"``, or ``"the best by
    test_16 string_accuracy (max) 0.5000; the last is step 6"``."""
    if which == "last":
        return "the last"
    record = read_best_record(workdir) or {}
    rule = SelectionRule(record.get("split"), record.get("metric"), record.get("mode"))
    score = float(record.get("score", math.nan))
    return f"the best by {rule.describe()} {score:.4f}; the last is step {last_step}"
