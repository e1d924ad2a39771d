"""`Task`: the plumbing every task shares, built on one method, ``source(split)``.

A task names its splits, returns the data of a split as a *source* (a mapping of
arrays or a random-access record source, see `deq_jax.tasks.data`) and scores
predictions. Everything else -- sizes, resumable training batches, padded evaluation
passes, multi-host sharding -- follows from ``source`` and lives here once. A task that
changes a piece (training noise drawn per step, a cheaper example count) overrides that
method alone; one that changes its training batches step by step (input noise, extra
edges) overrides `Task.augment_train_batch`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from deq_jax.tasks import data

TRAIN = "train"


class Task(abc.ABC):
    """Base class of the tasks (see the `deq_jax.tasks` docstring for the interface).

    Subclasses define ``name``, ``input_shape``, ``eval_splits``, ``source`` and
    ``metrics``; classification tasks set ``num_classes``, regression tasks set
    ``num_classes = None`` and ``num_outputs``.
    """

    name: str
    train_split: str = TRAIN
    # Batch keys besides inputs/targets/mask that the train and eval steps hand to the
    # model and to ``metrics`` as keywords (e.g. ``("adjacency",)`` for graphs).
    batch_extras: tuple[str, ...] = ()
    # The held-out split that model selection scores by default (``"valid"``, CLRS's
    # ``"val"``), drawn from the training distribution and disjoint from the training
    # and test data; ``None``: the task has none, and selection falls back to its first
    # eval split (`deq_jax.training.run.selection.SelectionRule`).
    validation_split: str | None = None

    @property
    @abc.abstractmethod
    def eval_splits(self) -> tuple[str, ...]:
        """The evaluation splits."""

    @abc.abstractmethod
    def source(self, split: str) -> Any:
        """The data of ``split``: a mapping of arrays or a random-access record source."""

    @property
    def splits(self) -> tuple[str, ...]:
        """The training split, the `validation_split` unless it is an eval split
        already, then `eval_splits`."""
        valid = self.validation_split
        extra = (valid,) if valid and valid not in self.eval_splits else ()
        return (self.train_split, *extra, *self.eval_splits)

    def prepare(self) -> None:
        """Builds (or loads) the training data, so the first step does not wait for it."""
        self.source(self.train_split)

    def num_examples(self, split: str) -> int:
        """Examples in ``split``."""
        return data.num_examples(self.source(split))

    def steps_per_epoch(self, batch_size: int) -> int:
        """Training steps per epoch at a global ``batch_size`` (remainder dropped)."""
        return data.steps_per_epoch(self.num_examples(self.train_split), batch_size)

    def train_iterator(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        start_step: int = 0,
        process_index: int = 0,
        process_count: int = 1,
        augment: bool = True,
    ) -> Iterator[data.Batch]:
        """Endless shuffled training batches, resumable at ``start_step``.

        See `deq_jax.tasks.data.train_batches`; ``batch_size`` is global. Where the task
        augments its training batches (`augments_training`) and ``augment`` is true,
        each batch goes through `augment_train_batch` with its global step;
        ``augment=False`` gives the training examples as evaluation sees its own (a
        neural solver's fit to a trained model).
        """
        batches = data.train_batches(
            self.source(self.train_split),
            batch_size,
            seed=seed,
            start_step=start_step,
            process_index=process_index,
            process_count=process_count,
        )
        if not (augment and self.augments_training):
            return batches
        return (
            self.augment_train_batch(
                batch,
                seed=seed,
                step=step,
                batch_size=batch_size,
                process_index=process_index,
                process_count=process_count,
            )
            for step, batch in enumerate(batches, start=start_step)
        )

    @property
    def augments_training(self) -> bool:
        """Whether `train_iterator` passes its batches through `augment_train_batch`."""
        return False

    def augment_train_batch(
        self,
        batch: data.Batch,
        *,
        seed: int,
        step: int,
        batch_size: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> data.Batch:
        """This process's training batch of global ``step``, changed for that step.

        The identity here. A task that overrides it (and `augments_training`) must keep
        the change a pure function of ``(seed, step, the example's row in the global
        batch)``: then a resumed run draws what the uninterrupted one did, and the draws
        do not depend on the number of processes. This process's rows of the global
        batch of ``batch_size`` start at ``process_index * batch_size // process_count``.
        """
        del seed, step, batch_size, process_index, process_count
        return batch

    @property
    def selection_metric(self) -> tuple[str, str]:
        """``(metric, "max" | "min")``: the eval metric that picks a run's best
        checkpoint on the validation split, and whether higher or lower is better
        (`deq_jax.training.run.selection`). Here ``("accuracy", "max")`` for a classifier
        and ``("mse", "min")`` for a regression (``num_classes`` is ``None``); a task
        whose headline metric is another overrides it."""
        if getattr(self, "num_classes", None) is None:
            return ("mse", "min")
        return ("accuracy", "max")

    def combine_metrics(self, combined: dict[str, float]) -> dict[str, float]:
        """A split's metrics from their count-weighted means over its batches
        (`deq_jax.training.families.metrics.combine`). A task whose score is not a mean over
        examples recomputes it here from combined counts (CLRS's micro-F1), so the
        score does not depend on the eval batch size. The default keeps them."""
        return combined

    def eval_iterator(
        self, split: str, batch_size: int, *, process_index: int = 0, process_count: int = 1
    ) -> Iterator[data.Batch]:
        """One ordered pass over ``split``, the last batch padded with ``mask=False``."""
        return data.eval_batches(
            self.source(split),
            batch_size,
            process_index=process_index,
            process_count=process_count,
        )
