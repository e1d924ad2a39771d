"""Image classification from the files users download: Fashion-MNIST, MNIST, CIFAR-10.

The registry's ``"fashion_mnist"``, ``"mnist"`` and ``"cifar10"`` tasks::

    task = tasks.get("fashion_mnist", data_dir=DIR)    # /usr/share/datasets/fashion-mnist
    task = tasks.get("mnist", dir=MNIST_DIR, data_dir=DIR)
    task = tasks.get("cifar10", dir=".../cifar-10-batches-py", data_dir=DIR)
    task = tasks.get("cifar10", data_dir=TFDS_DIR)     # dir="": a prepared tfds cifar10
    task.input_shape                 # (28, 28, 1) / (32, 32, 3)
    task.splits                      # ("train", "valid", "test"); without valid if valid_size=0

Sources. Fashion-MNIST and MNIST are directories of the four MNIST-format idx files
(`deq_jax.tasks.idx_files`); Debian's ``dataset-fashion-mnist`` package installs
Fashion-MNIST in `idx_files.DEFAULT_FASHION_MNIST_DIR`, the default ``dir``. MNIST has
no default. CIFAR-10 is either the ``cifar-10-batches-py`` directory of its python
batches (`deq_jax.tasks.cifar_files`; ``dir=``) or, with ``dir=""``, the tfds
``cifar10`` data set prepared under ``data_dir``
(`deq_jax.tasks.image_records.cifar10_source`).

Storage, splits and standardisation (`deq_jax.tasks.image_records`). ``prepare``
converts the files once into tfds ``array_record`` records under ``data_dir``, named by
a fingerprint of the files, ``valid_size`` and ``split_seed``; it checks every file
before writing anything. ``"valid"`` is a fixed random cut of ``valid_size`` training
images (from ``split_seed``), ``"train"`` the rest, ``"test"`` the official test files;
``eval_splits`` is ``("valid", "test")``, or ``("test",)`` with ``valid_size=0``.
Pixels are scaled to ``[0, 1]`` and standardised per channel with the *train* split's
mean and standard deviation, stored in the records' metadata. The tfds cifar10 path
cuts its validation images from tfds' train split the same way (`image_records.valid_cut`)
and keeps the usual CIFAR-10 statistics (`images.CIFAR10_MEAN`, `images.CIFAR10_STD`).

Batches are ``{"inputs": float32 [b, H, W, C], "targets": int32 [b], "mask": bool [b],
"index": int32 [b]}``; the metric is `images.classification_accuracy`.

Augmentation (training batches only, `image_augment.CropFlip`): a random crop of the
image padded with ``crop_padding`` black pixels per side, then a random horizontal flip
with ``flip``. Defaults: CIFAR-10 pads 4 of 32 pixels and flips, as He et al. and the
MDEQ paper train; Fashion-MNIST and MNIST pad 2 of 28 (their objects are centred and
MNIST's digits sit in a 20x20 box with a 4-pixel margin, so a 2-pixel shift moves an
object without cutting it off, about the 4/32 shift of CIFAR-10 in proportion);
Fashion-MNIST flips (a mirrored garment is the same garment), MNIST does not (a
mirrored digit is not a digit).

``image_size`` (0: accept what the files hold) checks the images' size before
anything is read in full: ``image_size=32`` on Fashion-MNIST raises "the config
expects 32x32 images but ... holds 28x28".

References:
  Xiao, Rasul, Vollgraf, "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine
  Learning Algorithms", arXiv:1708.07747, 2017.
  Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009.
  Bai, Koltun, Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deq_jax.tasks import cifar_files, idx_files, images
from deq_jax.tasks.image_augment import CropFlip
from deq_jax.tasks.image_records import (
    NUM_CLASSES,
    VALID,
    Arrays,
    FileFormat,
    ImageFilesData,
    check_image_size,
    cifar10_builder,
    cifar10_source,
    valid_cut,
)
from deq_jax.tasks.images import TEST, TRAIN, ImageTask


def _idx_format(fix: str) -> FileFormat:
    """MNIST-format idx files; ``fix`` (how to get them) ends every error message."""

    def load(directory: str) -> dict[str, Arrays]:
        loaded = idx_files.load_idx_dir(directory, fix=fix)
        return {split: (x[..., None], y) for split, (x, y) in loaded.items()}

    return FileFormat(
        paths=lambda d: [p for pair in idx_files.idx_paths(d, fix=fix).values() for p in pair],
        image_shape=lambda d: (*idx_files.idx_image_shape(d, fix=fix), 1),
        load=load,
        fix=fix,
    )


FASHION_MNIST_IDX = _idx_format(idx_files.FASHION_MNIST_FIX)
MNIST_IDX = _idx_format(idx_files.MNIST_FIX)


def _cifar10_shape(directory: str) -> tuple[int, int, int]:
    cifar_files.cifar10_paths(directory)  # raises for a missing directory or file
    return cifar_files.IMAGE_SHAPE


CIFAR10_PYTHON = FileFormat(
    paths=lambda d: [p for group in cifar_files.cifar10_paths(d).values() for p in group],
    image_shape=_cifar10_shape,
    load=cifar_files.load_cifar10_dir,
    fix=cifar_files.DOWNLOAD_HINT,
)


def _check_sizes(valid_size: int, image_size: int) -> None:
    for name, value in (("valid_size", valid_size), ("image_size", image_size)):
        if not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}.")


def _eval_splits(valid_size: int) -> tuple[str, ...]:
    return (VALID, TEST) if valid_size else (TEST,)


def files_task(
    name: str,
    directory: str,
    file_format: FileFormat,
    *,
    data_dir: str | None,
    valid_size: int,
    split_seed: int,
    crop_padding: int,
    flip: bool,
    image_size: int,
) -> ImageTask:
    """An `ImageTask` reading ``directory`` through tfds records (see the module docstring)."""
    _check_sizes(valid_size, image_size)
    files = ImageFilesData(
        name,
        directory,
        file_format,
        data_dir=data_dir,
        valid_size=valid_size,
        split_seed=split_seed,
        image_size=image_size,
    )
    return ImageTask(
        name,
        files.image_shape,
        files.source,
        files.prepare,
        NUM_CLASSES,
        eval_splits=_eval_splits(valid_size),
        augment=CropFlip(crop_padding, flip),
    )


def fashion_mnist(
    *,
    data_dir: str | None = None,
    dir: str = idx_files.DEFAULT_FASHION_MNIST_DIR,
    valid_size: int = 5000,
    split_seed: int = 0,
    crop_padding: int = 2,
    flip: bool = True,
    image_size: int = 0,
) -> ImageTask:
    """The Fashion-MNIST task; the registry's constructor (see the module docstring).

    Args:
      data_dir: where tfds stores the converted records (default ``~/tensorflow_datasets``).
      dir: the directory of the four idx files (``apt-get install dataset-fashion-mnist``
        fills the default).
      valid_size: training images cut out as ``"valid"`` (0: none).
      split_seed: seeds the cut.
      crop_padding: pixels of padding for the random training crops (0: none).
      flip: random horizontal flips of training images.
      image_size: the expected image side (0: any).
    """
    return files_task(
        "fashion_mnist",
        dir,
        FASHION_MNIST_IDX,
        data_dir=data_dir,
        valid_size=valid_size,
        split_seed=split_seed,
        crop_padding=crop_padding,
        flip=flip,
        image_size=image_size,
    )


def mnist(
    *,
    data_dir: str | None = None,
    dir: str = "",
    valid_size: int = 5000,
    split_seed: int = 0,
    crop_padding: int = 2,
    flip: bool = False,
    image_size: int = 0,
) -> ImageTask:
    """The MNIST task from its four idx files; the registry's constructor.

    Args as `fashion_mnist`; ``dir`` has no default (MNIST ships with no system package).

    Raises:
      ValueError: without ``dir``.
    """
    if not dir:
        names = ", ".join(f"{n}(.gz)" for pair in idx_files.IDX_FILES.values() for n in pair)
        raise ValueError(f"mnist needs dir=, a directory holding {names}.")
    return files_task(
        "mnist",
        dir,
        MNIST_IDX,
        data_dir=data_dir,
        valid_size=valid_size,
        split_seed=split_seed,
        crop_padding=crop_padding,
        flip=flip,
        image_size=image_size,
    )


def cifar10(
    *,
    data_dir: str | None = None,
    download: bool = False,
    dir: str = "",
    valid_size: int = 5000,
    split_seed: int = 0,
    crop_padding: int = 4,
    flip: bool = True,
    image_size: int = 0,
) -> ImageTask:
    """The CIFAR-10 task; the registry's constructor (see the module docstring).

    Args:
      data_dir: the tfds data directory: where the python batches' records are written
        (with ``dir``), or where tfds' ``cifar10`` is prepared (without).
      download: let `ImageTask.prepare` download and build tfds' ``cifar10`` when
        missing (needs a network, and TensorFlow to encode the images); not with ``dir``.
      dir: a ``cifar-10-batches-py`` directory; ``""`` reads tfds' ``cifar10`` instead.
      valid_size: training images cut out as ``"valid"`` (0: none).
      split_seed: seeds the cut.
      crop_padding: pixels of padding for the random training crops (0: none).
      flip: random horizontal flips of training images.
      image_size: the expected image side (0: any; CIFAR-10 images are 32x32).
    """
    if dir:
        if download:
            raise ValueError("download=True builds tfds' cifar10; with dir= the files are read.")
        return files_task(
            "cifar10",
            dir,
            CIFAR10_PYTHON,
            data_dir=data_dir,
            valid_size=valid_size,
            split_seed=split_seed,
            crop_padding=crop_padding,
            flip=flip,
            image_size=image_size,
        )
    _check_sizes(valid_size, image_size)
    check_image_size(image_size, cifar_files.IMAGE_SHAPE, "tfds' cifar10")

    def prepare() -> None:
        tfds_builder = cifar10_builder(data_dir)
        if download and not tfds_builder.is_prepared():
            tfds_builder.download_and_prepare(file_format="array_record")
        cifar10_source(TRAIN, data_dir)

    def source(split: str) -> Any:
        if split == TEST or not valid_size:
            return cifar10_source(split, data_dir)
        full = cifar10_source(TRAIN, data_dir)
        train, valid = valid_cut(len(full), valid_size, split_seed)
        return images.Subset(full, train if split == TRAIN else valid)

    return ImageTask(
        "cifar10",
        cifar_files.IMAGE_SHAPE,
        source,
        prepare,
        NUM_CLASSES,
        eval_splits=_eval_splits(valid_size),
        augment=CropFlip(crop_padding, flip),
    )
