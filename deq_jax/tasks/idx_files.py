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

Every check runs on the bytes read, before a caller writes anything: a missing
directory or file raises a `DataNotFoundError` (a FileNotFoundError); a wrong magic
number, a file shorter or longer than its header says, images and labels of different
counts and labels outside ``0..9`` raise a `DataFormatError` (a ValueError). Each names
the path and ends with ``fix``, how to get the files (`FASHION_MNIST_FIX`,
`MNIST_FIX`; by default the Fashion-MNIST one for `DEFAULT_FASHION_MNIST_DIR`, none
elsewhere).

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

from deq_jax.tasks.errors import DataFormatError, DataNotFoundError

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL_FASHION_MNIST = "apt-get install dataset-fashion-mnist"
FASHION_MNIST_FIX = (
    f"Install Fashion-MNIST with `{INSTALL_FASHION_MNIST}` (Debian; `--reinstall` "
    f"replaces damaged files): it puts the four files in {DEFAULT_FASHION_MNIST_DIR}, "
    "the default dir=."
)
MNIST_FIX = (
    "Download MNIST's four files from https://yann.lecun.com/exdb/mnist/ (or torchvision's "
    "mirror https://ossci-datasets.s3.amazonaws.com/mnist/) and pass their directory as dir=."
)
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
NUM_CLASSES = 10
# split -> (images file, labels file), without the optional ".gz".
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_NDIM = {IMAGES_MAGIC: 3, LABELS_MAGIC: 1}


def _bad(message: str, fix: str) -> DataFormatError:
    return DataFormatError(f"{message} {fix}".rstrip())


def _missing(message: str, fix: str) -> DataNotFoundError:
    return DataNotFoundError(f"{message} {fix}".rstrip())


def _fix_for(directory: str, fix: str | None) -> str:
    """``fix``, or by default `FASHION_MNIST_FIX` for `DEFAULT_FASHION_MNIST_DIR`."""
    if fix is not None:
        return fix
    return FASHION_MNIST_FIX if os.path.abspath(directory) == DEFAULT_FASHION_MNIST_DIR else ""


def _read(path: str, size: int = -1, fix: str = "") -> bytes:
    """The first ``size`` bytes of ``path`` (all with -1), gunzipped for ``.gz``."""
    try:
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
            return f.read(size)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise _bad(f"{path} is not a complete gzip file: {e}.", fix) from e


def _header(path: str, head: bytes, fix: str = "") -> tuple[int, tuple[int, ...]]:
    """The magic number and dimensions at the start of ``head`` (the file's first bytes)."""
    if len(head) < 4:
        raise _bad(f"{path} is truncated: {len(head)} bytes, not even a magic number.", fix)
    magic = int.from_bytes(head[:4], "big")
    if magic not in _NDIM:
        raise _bad(
            f"{path} is not an MNIST-format idx file of uint8 images or labels: magic number "
            f"0x{magic:08x}, expected 0x{IMAGES_MAGIC:08x} (images) or "
            f"0x{LABELS_MAGIC:08x} (labels).",
            fix,
        )
    ndim = _NDIM[magic]
    if len(head) < 4 + 4 * ndim:
        raise _bad(
            f"{path} is truncated: {len(head)} bytes, shorter than its {4 + 4 * ndim}-byte header.",
            fix,
        )
    dims = tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return magic, dims


def read_idx_header(path: str, *, fix: str = "") -> tuple[int, tuple[int, ...]]:
    """The magic number and dimensions of an idx file, reading only its header.

    Raises:
      DataFormatError: for a wrong magic number or a file shorter than its header
        (the message ends with ``fix``).
    """
    return _header(path, _read(path, 16, fix), fix)


def read_idx(path: str, *, fix: str = "") -> np.ndarray:
    """Reads one MNIST-format idx file, gzipped (``.gz``) or not.

    Args:
      path: an images (``0x00000803``) or labels (``0x00000801``) file.
      fix: how to get a good copy, the end of every error message.

    Returns:
      uint8 ``[N, rows, cols]`` for images, uint8 ``[N]`` for labels; read-only (a view
      of the bytes read).

    Raises:
      DataFormatError: naming the file, for a wrong magic number, a file shorter than
        its header says (truncated), longer (trailing bytes), or a damaged gzip stream.
    """
    raw = _read(path, fix=fix)
    _, dims = _header(path, raw, fix)
    offset = 4 + 4 * len(dims)
    expected = math.prod(dims)
    found = len(raw) - offset
    shape = "x".join(map(str, dims))
    if found < expected:
        raise _bad(
            f"{path} is truncated: its header announces {shape} = {expected} bytes of data, "
            f"the file holds {found}.",
            fix,
        )
    if found > expected:
        raise _bad(
            f"{path} has {found - expected} trailing bytes after the {shape} = {expected} "
            "bytes its header announces.",
            fix,
        )
    return np.frombuffer(raw, np.uint8, count=expected, offset=offset).reshape(dims)


def idx_paths(directory: str, *, fix: str | None = None) -> dict[str, tuple[str, str]]:
    """The four idx files of ``directory``: ``{"train": (images, labels), "test": ...}``.

    Each name of `IDX_FILES` is found raw or with ``.gz``; the raw file wins where both
    exist.

    Args:
      directory: the data set's directory.
      fix: how to get the files, the end of every error message (default:
        `FASHION_MNIST_FIX` for `DEFAULT_FASHION_MNIST_DIR`, nothing elsewhere).

    Raises:
      DataNotFoundError: if the directory or one of the files is missing (named).
    """
    fix = _fix_for(directory, fix)
    names = ", ".join(f"{name}(.gz)" for pair in IDX_FILES.values() for name in pair)
    if not directory:
        raise _missing(f"No directory given: pass dir= a directory holding {names}.", fix)
    if not os.path.isdir(directory):
        raise _missing(
            f"No directory {directory}: an MNIST-format data set is a directory holding {names}.",
            fix,
        )
    out = {}
    for split, pair in IDX_FILES.items():
        found = []
        for name in pair:
            candidates = [os.path.join(directory, name + ext) for ext in ("", ".gz")]
            present = [p for p in candidates if os.path.isfile(p)]
            if not present:
                raise _missing(
                    f"{directory} has no {name} (nor {name}.gz); an MNIST-format data set "
                    f"holds {names}.",
                    fix,
                )
            found.append(present[0])
        out[split] = tuple(found)
    return out


def idx_image_shape(directory: str, *, fix: str | None = None) -> tuple[int, int]:
    """``(rows, cols)`` of the training images of ``directory``, from their header alone.

    Raises:
      DataNotFoundError: as `idx_paths`.
      DataFormatError: if the training-images file is not an images file.
    """
    fix = _fix_for(directory, fix)
    path = idx_paths(directory, fix=fix)["train"][0]
    magic, dims = read_idx_header(path, fix=fix)
    if magic != IMAGES_MAGIC:
        raise _bad(f"{path} holds labels (magic 0x{magic:08x}), not images.", fix)
    return dims[1], dims[2]


def _check_pair(images_path: str, labels_path: str, fix: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's images and labels, read and checked against each other."""
    images, labels = read_idx(images_path, fix=fix), read_idx(labels_path, fix=fix)
    if images.ndim != 3:
        raise _bad(f"{images_path} holds labels, not images.", fix)
    if labels.ndim != 1:
        raise _bad(f"{labels_path} holds images, not labels.", fix)
    if len(images) != len(labels):
        raise _bad(
            f"{images_path} holds {len(images)} images but {labels_path} holds "
            f"{len(labels)} labels.",
            fix,
        )
    if len(labels) and labels.max() >= NUM_CLASSES:
        raise _bad(
            f"{labels_path} holds label {int(labels.max())}; labels must lie in "
            f"0..{NUM_CLASSES - 1}.",
            fix,
        )
    return images, labels


def load_idx_dir(
    directory: str, *, fix: str | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reads and checks the four idx files of an MNIST-format directory.

    Args:
      directory: holds `IDX_FILES`, each raw or gzipped.
      fix: as `idx_paths`.

    Returns:
      ``{"train": (images, labels), "test": (images, labels)}``: images uint8
      ``[N, rows, cols]``, labels uint8 ``[N]`` in ``0..9``.

    Raises:
      DataNotFoundError: as `idx_paths`.
      DataFormatError: for a malformed file (`read_idx`), an images file holding labels
        or the reverse, images and labels of different counts, labels outside ``0..9``,
        or test images of another size than the training images.
    """
    fix = _fix_for(directory, fix)
    out = {split: _check_pair(*pair, fix) for split, pair in idx_paths(directory, fix=fix).items()}
    if out["train"][0].shape[1:] != out["test"][0].shape[1:]:
        raise _bad(
            f"{directory}: the training images are {out['train'][0].shape[1:]}, the test "
            f"images {out['test'][0].shape[1:]}.",
            fix,
        )
    return out
