"""MNIST-format idx files: the reader behind the ``"fashion_mnist"`` and ``"mnist"`` tasks.

The format (LeCun et al.'s MNIST page): a 4-byte big-endian magic number, whose third
byte is the element type (``0x08``: unsigned byte) and fourth the number of
dimensions, then one big-endian uint32 per dimension, then the elements in row-major
order. Images are ``0x00000803`` (uint8 ``[N, rows, cols]``), labels ``0x00000801``
(uint8 ``[N]``); no other kind is read. A file may be gzipped (its name ends ``.gz``).

A data set is a directory of the four files `IDX_FILES` (each raw or ``.gz``; the raw
file is read where both are present). Fashion-MNIST and MNIST share the format and the
file names; Debian's ``dataset-fashion-mnist`` package puts Fashion-MNIST in
`DEFAULT_FASHION_MNIST_DIR`.

Every check runs on the bytes read, before a caller writes anything: a wrong magic
number, a file shorter or longer than its header says, images and labels of different
counts and labels outside ``0..9`` raise a ValueError naming the file.

References:
  LeCun, Bottou, Bengio, Haffner, "Gradient-Based Learning Applied to Document
  Recognition", Proc. IEEE 1998 (MNIST; the idx format is described on its web page).
  Xiao, Rasul, Vollgraf, "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine
  Learning Algorithms", arXiv:1708.07747, 2017.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib

import numpy as np

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL_FASHION_MNIST = "apt-get install dataset-fashion-mnist"
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
NUM_CLASSES = 10
# split -> (images file, labels file), without the optional ".gz".
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_NDIM = {IMAGES_MAGIC: 3, LABELS_MAGIC: 1}


def _read(path: str, size: int = -1) -> bytes:
    """The first ``size`` bytes of ``path`` (all with -1), gunzipped for ``.gz``."""
    try:
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
            return f.read(size)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path} is not a complete gzip file: {e}") from e


def _header(path: str, head: bytes) -> tuple[int, tuple[int, ...]]:
    """The magic number and dimensions at the start of ``head`` (the file's first bytes)."""
    if len(head) < 4:
        raise ValueError(f"{path} is truncated: {len(head)} bytes, not even a magic number.")
    magic = int.from_bytes(head[:4], "big")
    if magic not in _NDIM:
        raise ValueError(
            f"{path} is not an MNIST-format idx file of uint8 images or labels: magic number "
            f"0x{magic:08x}, expected 0x{IMAGES_MAGIC:08x} (images) or "
            f"0x{LABELS_MAGIC:08x} (labels)."
        )
    ndim = _NDIM[magic]
    if len(head) < 4 + 4 * ndim:
        raise ValueError(
            f"{path} is truncated: {len(head)} bytes, shorter than its {4 + 4 * ndim}-byte header."
        )
    dims = tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return magic, dims


def read_idx_header(path: str) -> tuple[int, tuple[int, ...]]:
    """The magic number and dimensions of an idx file, reading only its header.

    Raises:
      ValueError: for a wrong magic number or a file shorter than its header.
    """
    return _header(path, _read(path, 16))


def read_idx(path: str) -> np.ndarray:
    """Reads one MNIST-format idx file, gzipped (``.gz``) or not.

    Args:
      path: an images (``0x00000803``) or labels (``0x00000801``) file.

    Returns:
      uint8 ``[N, rows, cols]`` for images, uint8 ``[N]`` for labels; read-only (a view
      of the bytes read).

    Raises:
      ValueError: naming the file, for a wrong magic number, a file shorter than its
        header says (truncated), longer (trailing bytes), or a damaged gzip stream.
    """
    raw = _read(path)
    _, dims = _header(path, raw)
    offset = 4 + 4 * len(dims)
    expected = math.prod(dims)
    found = len(raw) - offset
    shape = "x".join(map(str, dims))
    if found < expected:
        raise ValueError(
            f"{path} is truncated: its header announces {shape} = {expected} bytes of data, "
            f"the file holds {found}."
        )
    if found > expected:
        raise ValueError(
            f"{path} has {found - expected} trailing bytes after the {shape} = {expected} "
            "bytes its header announces."
        )
    return np.frombuffer(raw, np.uint8, count=expected, offset=offset).reshape(dims)


def _missing_dir_message(directory: str) -> str:
    names = ", ".join(f"{name}(.gz)" for pair in IDX_FILES.values() for name in pair)
    message = f"No directory {directory}: an MNIST-format data set is a directory holding {names}."
    if os.path.abspath(directory) == DEFAULT_FASHION_MNIST_DIR:
        message += f" Install Fashion-MNIST there with `{INSTALL_FASHION_MNIST}`."
    return message


def idx_paths(directory: str) -> dict[str, tuple[str, str]]:
    """The four idx files of ``directory``: ``{"train": (images, labels), "test": ...}``.

    Each name of `IDX_FILES` is found raw or with ``.gz``; the raw file wins where both
    exist.

    Raises:
      FileNotFoundError: if the directory or one of the files is missing (named; for
        `DEFAULT_FASHION_MNIST_DIR`, the message gives the apt-get command).
    """
    if not directory:
        raise FileNotFoundError(
            "No directory given: pass dir= a directory holding the four MNIST-format files."
        )
    if not os.path.isdir(directory):
        raise FileNotFoundError(_missing_dir_message(directory))
    out = {}
    for split, names in IDX_FILES.items():
        found = []
        for name in names:
            candidates = [os.path.join(directory, name + ext) for ext in ("", ".gz")]
            present = [p for p in candidates if os.path.isfile(p)]
            if not present:
                raise FileNotFoundError(
                    f"{directory} has no {name} (nor {name}.gz); an MNIST-format data set "
                    f"holds {', '.join(n for pair in IDX_FILES.values() for n in pair)}."
                )
            found.append(present[0])
        out[split] = tuple(found)
    return out


def idx_image_shape(directory: str) -> tuple[int, int]:
    """``(rows, cols)`` of the training images of ``directory``, from their header alone.

    Raises:
      FileNotFoundError: as `idx_paths`.
      ValueError: if the training-images file is not an images file.
    """
    path = idx_paths(directory)["train"][0]
    magic, dims = read_idx_header(path)
    if magic != IMAGES_MAGIC:
        raise ValueError(f"{path} holds labels (magic 0x{magic:08x}), not images.")
    return dims[1], dims[2]


def load_idx_dir(directory: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reads and checks the four idx files of an MNIST-format directory.

    Args:
      directory: holds `IDX_FILES`, each raw or gzipped.

    Returns:
      ``{"train": (images, labels), "test": (images, labels)}``: images uint8
      ``[N, rows, cols]``, labels uint8 ``[N]`` in ``0..9``.

    Raises:
      FileNotFoundError: as `idx_paths`.
      ValueError: for a malformed file (`read_idx`), an images file holding labels or
        the reverse, images and labels of different counts, labels outside ``0..9``,
        or test images of another size than the training images.
    """
    out = {}
    for split, (images_path, labels_path) in idx_paths(directory).items():
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3:
            raise ValueError(f"{images_path} holds labels, not images.")
        if labels.ndim != 1:
            raise ValueError(f"{labels_path} holds images, not labels.")
        if len(images) != len(labels):
            raise ValueError(
                f"{images_path} holds {len(images)} images but {labels_path} holds "
                f"{len(labels)} labels."
            )
        if len(labels) and labels.max() >= NUM_CLASSES:
            raise ValueError(
                f"{labels_path} holds label {int(labels.max())}; labels must lie in "
                f"0..{NUM_CLASSES - 1}."
            )
        out[split] = (images, labels)
    if out["train"][0].shape[1:] != out["test"][0].shape[1:]:
        raise ValueError(
            f"{directory}: the training images are {out['train'][0].shape[1:]}, the test "
            f"images {out['test'][0].shape[1:]}."
        )
    return out
