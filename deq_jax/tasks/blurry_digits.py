"""Blurry digits: classify lightly blurred digits, test zero-shot on heavily blurred ones.

Every image is blurred with ``scipy.ndimage.gaussian_filter`` (standard deviation
``sigma`` pixels along height and width, none across channels; ``mode="nearest"``).
Training images are blurred at ``train_sigma``; test split ``"test_sigma{s}"`` holds the
test images blurred at ``s``, one split per ``s`` in ``test_sigmas``. A model that
keeps iterating at test time may recover digits blurrier than any it was trained on.

Sources (``source=``):

* ``"digits"``: scikit-learn's 1,797 8x8 digits through `deq_jax.tasks.images.load_digits`
  (stratified split from ``seed``: 1,437 train less ``valid_size`` cut out as the
  validation split ``"valid"``, blurred at ``train_sigma``; 360 test; standardised with
  training statistics). The blur is applied to the standardised images; since the blur is linear
  and keeps constants, this equals standardising the blurred raw images.
* ``"mnist"``: tfds ``mnist`` read through ``as_data_source()`` (``array_record``; no
  TensorFlow). It must already be prepared under ``data_dir``, e.g. with
  ``tfds build mnist --file_format=array_record`` on a machine with TensorFlow and a
  network; otherwise a FileNotFoundError says so. Images are scaled to ``[0, 1]``,
  blurred and standardised with the usual MNIST mean 0.1307 and std 0.3081, per batch.
  No validation split (``valid_size`` 0): model selection scores the first test split
  unless ``eval.select_split`` names another.

Batches are ``{"inputs": float32 [b, H, W, 1], "targets": int32 [b], "mask": bool [b],
"index": int32 [b]}``; the metric is top-1 accuracy from logits ``[B, 10]``.

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (upwards generalisation: test inputs harder than any
  seen in training).
  LeCun et al., "Gradient-Based Learning Applied to Document Recognition", Proc. IEEE
  1998 (MNIST).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.ndimage import gaussian_filter

from deq_jax.tasks import _tfds, images
from deq_jax.tasks.base import Task

TRAIN, VALID, _TEST = "train", "valid", "test"
SOURCES = ("digits", "mnist")
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def blur(images_: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of ``[N, H, W, C]`` images over ``H`` and ``W``; float32, same shape."""
    x = np.asarray(images_, np.float32)
    if sigma == 0:
        return x.copy()
    return gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest").astype(np.float32)


def split_name(sigma: float) -> str:
    """The test split of blur ``sigma``, e.g. ``"test_sigma1.5"``."""
    return f"test_sigma{sigma:g}"


class BlurredRecords:
    """A tfds image source, blurred and standardised per example on access.

    Maps ``{"image": uint8 [H, W, C], "label": int}`` to ``{"inputs": float32 [H, W, C],
    "targets": int32 []}``; random access as `deq_jax.tasks.data` expects.

    Args:
      source: a random-access tfds source (``as_data_source()`` of one split).
      sigma: the blur.
      mean: mean of the ``[0, 1]``-scaled pixels.
      std: their standard deviation.
    """

    def __init__(self, source: Any, sigma: float, mean: float, std: float):
        self.source, self.sigma, self.mean, self.std = source, sigma, mean, std

    def __len__(self) -> int:
        return len(self.source)

    def _convert(self, record: dict[str, Any]) -> dict[str, np.ndarray]:
        image = np.asarray(record["image"], np.float32)[None] / 255.0  # [1, H, W, C]
        return {
            "inputs": (blur(image, self.sigma)[0] - self.mean) / self.std,
            "targets": np.asarray(record["label"], np.int32),
        }

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self._convert(self.source[index])

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [self._convert(r) for r in self.source.__getitems__(list(indices))]


def mnist_source(split: str, data_dir: str | None = None) -> Any:
    """The raw tfds ``mnist`` source of ``"train"`` or ``"test"``.

    Raises:
      DataNotFoundError: if mnist is not prepared under ``data_dir``.
      DataFormatError: if it is prepared in a format without random access.
    """
    otherwise = " on a machine with TensorFlow and a network, or use source='digits'"
    builder = _tfds.prepared("mnist", data_dir, otherwise)
    return builder.as_data_source(split=split)


class BlurryDigitsTask(Task):
    """The blurry-digits task behind the uniform task interface (see `deq_jax.tasks`).

    Args:
      source: ``"digits"`` or ``"mnist"``.
      data_dir: the tfds data directory for mnist (unused for digits).
      seed: seeds the digits train/test split (mnist has fixed splits).
      train_sigma: blur of the training (and validation) images.
      test_sigmas: one test split per blur.
      valid_size: digits' training images cut out as ``"valid"`` (0: none; ``None``:
        `deq_jax.tasks.images.DIGITS_VALID_SIZE` for digits, 0 for mnist, which has no
        validation split).
    """

    name = "blurry_digits"
    num_classes = 10
    train_split = TRAIN

    def __init__(
        self,
        source: str = "digits",
        *,
        data_dir: str | None = None,
        seed: int = 0,
        train_sigma: float = 0.5,
        test_sigmas: tuple[float, ...] = (0.5, 1.0, 1.5),
        valid_size: int | None = None,
    ):
        if source not in SOURCES:
            raise ValueError(f"Unknown source {source!r}. Valid sources: {', '.join(SOURCES)}.")
        test_sigmas = tuple(float(s) for s in test_sigmas)
        if not test_sigmas or min(test_sigmas + (float(train_sigma),)) < 0:
            raise ValueError(
                f"Blur sigmas must be >= 0 and test_sigmas non-empty, got train_sigma="
                f"{train_sigma} and test_sigmas={test_sigmas}."
            )
        if len({split_name(s) for s in test_sigmas}) != len(test_sigmas):
            raise ValueError(f"test_sigmas must be distinct, got {test_sigmas}.")
        if valid_size is None:
            valid_size = images.DIGITS_VALID_SIZE if source == "digits" else 0
        if source == "mnist" and valid_size:
            raise ValueError(
                "blurry_digits with source='mnist' has no validation split; set "
                "--config.task.valid_size=0 (and eval.select_split to choose one)."
            )
        self.source_name, self.data_dir, self.seed = source, data_dir, seed
        self.train_sigma, self.test_sigmas = float(train_sigma), test_sigmas
        self.valid_size = int(valid_size)
        self._sigma = {TRAIN: self.train_sigma} | {split_name(s): s for s in test_sigmas}
        if self.valid_size:
            self._sigma[VALID] = self.train_sigma
        self._sources: dict[str, Any] = {}
        self._digits: dict[str, dict[str, np.ndarray]] = {}

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """``("test_sigma0.5", "test_sigma1", "test_sigma1.5")`` by default."""
        return tuple(split_name(s) for s in self.test_sigmas)

    @property
    def validation_split(self) -> str | None:
        """``"valid"`` (digits at ``train_sigma``), or ``None`` with ``valid_size=0``."""
        return VALID if self.valid_size else None

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One image's shape: ``(8, 8, 1)`` for digits, ``(28, 28, 1)`` for mnist."""
        return (8, 8, 1) if self.source_name == "digits" else (28, 28, 1)

    def check_split(self, split: str) -> None:
        """Raises a ValueError naming the valid splits if ``split`` is not one."""
        if split not in self._sigma:
            raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(self.splits)}.")

    def sigma(self, split: str) -> float:
        """The blur of ``split``."""
        self.check_split(split)
        return self._sigma[split]

    def source(self, split: str) -> Any:
        """The model-ready source of ``split``, built once.

        Digits: ``{"inputs": float32 [N, 8, 8, 1], "targets": int32 [N]}``; mnist: a
        lazily blurred `BlurredRecords`.
        """
        sigma = self.sigma(split)
        if split not in self._sources:
            base = split if split in (TRAIN, VALID) else _TEST
            if self.source_name == "digits":
                if not self._digits:
                    self._digits.update(images.load_digits(self.seed, self.valid_size))
                raw = self._digits[base]
                self._sources[split] = {
                    "inputs": blur(raw["inputs"], sigma),
                    "targets": raw["targets"],
                }
            else:
                raw = mnist_source(base, self.data_dir)
                self._sources[split] = BlurredRecords(raw, sigma, MNIST_MEAN, MNIST_STD)
        return self._sources[split]

    @staticmethod
    def metrics(logits, targets, mask=None) -> dict:
        """``{"accuracy", "count"}``; see `deq_jax.tasks.images.classification_accuracy`."""
        return images.classification_accuracy(logits, targets, mask)


def blurry_digits(
    *,
    source: str = "digits",
    data_dir: str | None = None,
    seed: int = 0,
    train_sigma: float = 0.5,
    test_sigmas: tuple[float, ...] = (0.5, 1.0, 1.5),
    valid_size: int | None = None,
) -> BlurryDigitsTask:
    """Builds the blurry-digits task; the registry's constructor (see `BlurryDigitsTask`)."""
    return BlurryDigitsTask(
        source,
        data_dir=data_dir,
        seed=seed,
        train_sigma=train_sigma,
        test_sigmas=tuple(test_sigmas),
        valid_size=valid_size,
    )
