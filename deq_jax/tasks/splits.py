"""The splits of a generated task, named and sized one way for every such task.

A generated task (prefix sums, mazes, edge copy, matrix inversion) has a training split,
a validation split for model selection and one test split per harder setting:
``("train", "valid", "test_...", ...)``; ``"valid"`` holds ``val_size`` new examples of
the training setting (none with ``val_size=0``). Its frozen config mixes in `SplitSizes`
(it has ``train_size``, ``val_size`` and ``test_size`` fields and names its test splits
in `SplitSizes.test_splits`); its task mixes in `HeldOutSplits`.
"""

from __future__ import annotations

import abc

TRAIN, VALID = "train", "valid"


class SplitSizes(abc.ABC):
    """Mixin of a generated task's config: its split names, checks and sizes.

    The config defines the fields ``train_size``, ``val_size`` and ``test_size`` and the
    property `test_splits`.
    """

    @property
    @abc.abstractmethod
    def test_splits(self) -> tuple[str, ...]:
        """The test splits, in the config's order."""

    @property
    def splits(self) -> tuple[str, ...]:
        """``("train", "valid", *test_splits)``; no ``"valid"`` if ``val_size`` is 0."""
        valid = (VALID,) if self.val_size else ()
        return (TRAIN, *valid, *self.test_splits)

    def check_split(self, split: str) -> None:
        """Raises a ValueError naming the valid splits if ``split`` is not one."""
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(self.splits)}.")

    def size(self, split: str) -> int:
        """Examples in ``split``."""
        self.check_split(split)
        return {TRAIN: self.train_size, VALID: self.val_size}.get(split, self.test_size)

    def scale(self, split: str, train_value: int) -> int:
        """The setting of a ``"test_{n}"``-named split, ``n``; ``train_value`` for the
        training and validation splits (both are drawn at the training setting)."""
        self.check_split(split)
        return train_value if split in (TRAIN, VALID) else int(split.removeprefix("test_"))


class HeldOutSplits:
    """Mixin of a generated task whose ``config`` is a `SplitSizes`: its test splits
    are the eval splits, ``"valid"`` (if any) the validation split."""

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """The config's test splits."""
        return self.config.test_splits

    @property
    def validation_split(self) -> str | None:
        """``"valid"``, or ``None`` with ``val_size=0``."""
        return VALID if self.config.val_size else None
