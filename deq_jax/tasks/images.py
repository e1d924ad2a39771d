"""Image classification: scikit-learn's 8x8 digits, tfds' CIFAR-10, and `ImageTask`.

* ``"digits"``: the 1,797 8x8 handwritten digits that ship with scikit-learn (no
  download). A stratified split from ``seed`` keeps 1,437 for training and 360 for
  testing. Pixels (0..16) are scaled to ``[0, 1]`` and standardised with the training
  split's mean and standard deviation.
* tfds' ``cifar10``, read as `ImageRecords` (``as_data_source()`` of a split, random
  access to ``array_record`` files decoded with PIL; TensorFlow is never imported) by
  `deq_jax.tasks.image_records.cifar10_source`, which needs the data prepared under
  ``data_dir``. Images are decoded per batch, scaled to ``[0, 1]`` and standardised
  per channel with the usual CIFAR-10 statistics (`CIFAR10_MEAN`, `CIFAR10_STD`). The
  registry's ``"cifar10"`` task reads it with ``dir=""``; that task and the ones read
  from downloaded files (Fashion-MNIST, MNIST, CIFAR-10's python batches) are built in
  `deq_jax.tasks.image_files`.

This module imports no tensorflow-datasets: tfds is loaded only where records are read
or written (`deq_jax.tasks.image_records`, through `deq_jax.tasks._tfds.load`).

`ImageTask` puts a data set behind the task interface: its splits (``"train"`` and
``eval_splits``), sources built once per split, and training batches augmented with
random crops and flips (`deq_jax.tasks.image_augment`) where asked. Batches are
``{"inputs": float32 [b, H, W, C], "targets": int32 [b], "mask": bool [b], "index":
int32 [b]}``; `ImageTask.metrics` takes logits ``[B, 10]`` and returns the accuracy.

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Jacobian-regularised multiscale DEQs on CIFAR-10).
  Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from deq_jax.tasks import data
from deq_jax.tasks.base import Task
from deq_jax.tasks.image_augment import CropFlip

TRAIN, VALID, TEST = "train", "valid", "test"
SPLITS = (TRAIN, TEST)
DIGITS_TEST_SIZE = 360
DIGITS_VALID_SIZE = 180  # cut from the 1,437 training images: 1,257 train, 180 valid
CIFAR10_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
CIFAR10_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)


def check_split(split: str) -> None:
    """Raises a ValueError listing the valid splits for an unknown one."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(SPLITS)}.")


def classification_accuracy(logits, targets, mask=None) -> dict:
    """Top-1 accuracy of one label per example; numpy or jax arrays, jittable.

    Args:
      logits: ``[B, C]`` class scores.
      targets: ``[B]`` integer labels.
      mask: optional ``[B]`` bool, which examples count (padding is False).

    Returns:
      ``{"accuracy": fraction of counted examples classified right, "count": number of
      counted examples}``; combine batches with `deq_jax.tasks.data.weighted_mean`.
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"Expected logits [B, C] and targets [B], got {logits.shape} and {targets.shape}."
        )
    correct = jnp.argmax(logits, axis=-1) == targets  # [B]
    weight = jnp.ones(correct.shape[0]) if mask is None else jnp.asarray(mask, jnp.float32)
    count = jnp.sum(weight)
    return {"accuracy": jnp.sum(weight * correct) / jnp.maximum(count, 1.0), "count": count}


def load_digits(
    seed: int = 0, valid_size: int = DIGITS_VALID_SIZE
) -> dict[str, dict[str, np.ndarray]]:
    """scikit-learn's digits, split and standardised.

    Args:
      seed: seeds the stratified train/test split and the validation cut.
      valid_size: images cut (stratified) from the 1,437 training ones as ``"valid"``;
        0: no validation split. The test images do not depend on it.

    Returns:
      ``{split: {"inputs": float32 [N, 8, 8, 1], "targets": int32 [N]}}``: ``"train"``
      (``1437 - valid_size``), ``"valid"`` (unless 0) and ``"test"`` (360); the
      standardisation uses training statistics only.
    """
    # Imported here: scikit-learn is slow to import and only this task needs it.
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., None]  # [1797, 8, 8, 1]
    labels = bunch.target.astype(np.int32)  # [1797]
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=DIGITS_TEST_SIZE, random_state=seed, stratify=labels
    )
    if not 0 <= valid_size < len(x_train):
        raise ValueError(
            f"valid_size must be in [0, {len(x_train)}) (digits' training images), got "
            f"{valid_size}."
        )
    splits = {TEST: (x_test, y_test)}
    if valid_size:
        x_train, x_valid, y_train, y_valid = train_test_split(
            x_train, y_train, test_size=valid_size, random_state=seed, stratify=y_train
        )
        splits[VALID] = (x_valid, y_valid)
    splits[TRAIN] = (x_train, y_train)
    mean, std = x_train.mean(), x_train.std()
    scale = lambda x: ((x - mean) / std).astype(np.float32)
    return {split: {"inputs": scale(x), "targets": y} for split, (x, y) in splits.items()}


class ImageRecords:
    """A tfds record source seen as model-ready examples, decoded lazily.

    Maps each record ``{"image": uint8 [H, W, C], "label": int, ...}`` to
    ``{"inputs": float32 [H, W, C] standardised, "targets": int32 []}``; random access
    (``len``, ``[i]``, ``__getitems__``) as `deq_jax.tasks.data` expects.

    Args:
      source: a random-access tfds source (``as_data_source()`` of one split).
      mean: ``[C]`` per-channel mean of the ``[0, 1]``-scaled pixels.
      std: ``[C]`` per-channel standard deviation.
    """

    def __init__(self, source: Any, mean: np.ndarray, std: np.ndarray):
        self.source, self.mean, self.std = source, mean, std

    def __len__(self) -> int:
        return len(self.source)

    def _convert(self, record: dict[str, Any]) -> dict[str, np.ndarray]:
        image = np.asarray(record["image"], np.float32) / 255.0  # [H, W, C]
        return {
            "inputs": (image - self.mean) / self.std,
            "targets": np.asarray(record["label"], np.int32),
        }

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self._convert(self.source[index])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self._convert(r) for r in self.source.__getitems__(list(indices))]


class Subset:
    """The examples ``indices`` of a random-access source, as a source of their own.

    Keeps the source's standardisation statistics ``mean`` and ``std`` (an
    `ImageRecords` has them), which the crop of `ImageTask.augment_train_batch` reads.

    Args:
      source: a random-access source (``len``, ``[i]``, ``__getitems__``).
      indices: ``[M]`` positions in ``source``; example ``i`` here is ``indices[i]`` there.
    """

    def __init__(self, source: Any, indices: np.ndarray):
        self.source, self.indices = source, np.asarray(indices, np.int64)
        self.mean, self.std = source.mean, source.std

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.source[int(self.indices[index])]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return self.source.__getitems__([int(i) for i in self.indices[list(indices)]])


class ImageTask(Task):
    """An image classification task behind the uniform task interface.

    Args:
      name: the registry name (``"digits"``, ``"cifar10"``, ``"fashion_mnist"``, ...).
      input_shape: one image's shape ``(H, W, C)``, or a function returning it (called
        once, when first asked: file-backed tasks read it from the files' headers).
      sources: ``split -> source`` (a dict of arrays or a record source), built once.
      prepare_fn: makes the data available (a no-op for generated ones).
      num_classes: the number of labels.
      eval_splits: the evaluation splits, ``("test",)`` or ``("valid", "test")``.
      augment: how training batches are augmented (`image_augment.CropFlip`; None
        changes nothing). An augmenting task's training source has ``mean`` and
        ``std`` (as `ImageRecords` and the file tasks' sources do): the crop's black
        padding is ``-mean / std`` in standardised pixels.
    """

    train_split = TRAIN

    def __init__(
        self,
        name: str,
        input_shape: tuple[int, int, int] | Callable[[], tuple[int, int, int]],
        sources: Callable[[str], Any],
        prepare_fn: Callable[[], None],
        num_classes: int = 10,
        *,
        eval_splits: tuple[str, ...] = (TEST,),
        augment: CropFlip | None = None,
    ):
        self.name, self._input_shape, self.num_classes = name, input_shape, num_classes
        self._make_source, self._prepare = sources, prepare_fn
        self._eval_splits, self.augment = tuple(eval_splits), augment or CropFlip()
        self._sources: dict[str, Any] = {}

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """The evaluation splits."""
        return self._eval_splits

    @property
    def validation_split(self) -> str | None:
        """``"valid"`` when it is one of the eval splits, else ``None``."""
        return VALID if VALID in self._eval_splits else None

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One image's shape ``(H, W, C)``."""
        if callable(self._input_shape):
            self._input_shape = tuple(self._input_shape())
        return self._input_shape

    def check_split(self, split: str) -> None:
        """Raises a ValueError listing the valid splits for an unknown one."""
        if split not in self.splits:
            raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(self.splits)}.")

    def prepare(self) -> None:
        """Makes the data available (see the module docstring)."""
        self._prepare()

    def source(self, split: str) -> Any:
        """The model-ready source of ``split``, built once."""
        self.check_split(split)
        if split not in self._sources:
            self._sources[split] = self._make_source(split)
        return self._sources[split]

    @property
    def augments_training(self) -> bool:
        """True with a crop or flips (`augment`)."""
        return self.augment.active

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
        """``batch`` with its images cropped and flipped (`image_augment.CropFlip`).

        Each image's crop and flip are a pure function of ``(seed, step, its row in the
        global batch)``; labels, mask and index are unchanged.
        """
        train = self.source(self.train_split)
        pad_value = -np.asarray(train.mean, np.float32) / np.asarray(train.std, np.float32)
        inputs = self.augment(
            batch["inputs"],
            seed=seed,
            step=step,
            batch_size=batch_size,
            process_index=process_index,
            process_count=process_count,
            pad_value=pad_value,
        )
        return {**batch, "inputs": inputs}

    @staticmethod
    def metrics(logits, targets, mask=None) -> dict:
        """``{"accuracy", "count"}``; see `classification_accuracy`."""
        return classification_accuracy(logits, targets, mask)


def digits(
    *, seed: int = 0, valid_size: int = DIGITS_VALID_SIZE, data_dir: str | None = None
) -> ImageTask:
    """The 8x8 digits task; the registry's constructor (splits: see `load_digits`).

    ``data_dir`` is accepted for a uniform call signature and unused (the data ship
    with scikit-learn).
    """
    del data_dir  # Loaded from scikit-learn's package data.
    arrays: dict[str, dict[str, np.ndarray]] = {}

    def source(split: str) -> dict[str, np.ndarray]:
        if not arrays:
            arrays.update(load_digits(seed, valid_size))
        return arrays[split]

    eval_splits = (VALID, TEST) if valid_size else (TEST,)
    return ImageTask("digits", (8, 8, 1), source, lambda: None, eval_splits=eval_splits)
