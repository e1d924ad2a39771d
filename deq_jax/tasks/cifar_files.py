"""CIFAR-10's python batches: the reader behind ``tasks.get("cifar10", dir=...)``.

The "CIFAR-10 python version" (``cifar-10-python.tar.gz`` from Krizhevsky's page)
unpacks to a directory ``cifar-10-batches-py`` of pickle files `TRAIN_BATCHES`
(``data_batch_1`` .. ``data_batch_5``) and `TEST_BATCH` (``test_batch``). Each holds a
dict with ``b"data"``: uint8 ``[N, 3072]``, one image per row as three 32x32 planes
(red, green, blue; row-major), and ``b"labels"``: ``N`` integers in ``0..9``. The files
are read with ``pickle.load(f, encoding="bytes")``, as the page says; unpickling runs
code a file chooses, so read only files you trust.

Every check runs before a caller writes anything: a missing directory or batch file
raises a `DataNotFoundError` (a FileNotFoundError) naming it; a file that does not
unpickle, lacks a key, or holds data of another shape, dtype or count than its labels
raises a `DataFormatError` (a ValueError) naming the file. Each message ends with
`DOWNLOAD_HINT`, how to get the files.

References:
  Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from deq_jax.tasks.errors import DataFormatError, DataNotFoundError

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
IMAGE_SHAPE = (32, 32, 3)  # [H, W, C]
NUM_CLASSES = 10
SOURCE_NAME = "cifar-10-batches-py"
DOWNLOAD_HINT = (
    "Download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, unpack it "
    f"(tar xzf) and pass the {SOURCE_NAME} directory it holds as dir=."
)


def _bad(message: str) -> DataFormatError:
    return DataFormatError(f"{message} {DOWNLOAD_HINT}")


def cifar10_paths(directory: str) -> dict[str, tuple[str, ...]]:
    """The batch files of ``directory``: ``{"train": (5 paths), "test": (1 path,)}``.

    Raises:
      DataNotFoundError: if the directory or a batch file is missing (named).
    """
    if not os.path.isdir(directory):
        raise DataNotFoundError(f"No directory {directory!r}. {DOWNLOAD_HINT}")
    out = {"train": TRAIN_BATCHES, "test": (TEST_BATCH,)}
    for split, names in out.items():
        for name in names:
            if not os.path.isfile(os.path.join(directory, name)):
                inner = os.path.join(directory, SOURCE_NAME)
                where = f" (did you mean {inner}?)" if os.path.isdir(inner) else ""
                raise DataNotFoundError(
                    f"{directory} has no CIFAR-10 batch file {name}{where}. A "
                    f"{SOURCE_NAME} directory holds {', '.join(TRAIN_BATCHES)} and "
                    f"{TEST_BATCH}. {DOWNLOAD_HINT}"
                )
        out[split] = tuple(os.path.join(directory, name) for name in names)
    return out


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One python batch file as ``(images uint8 [N, 32, 32, 3], labels uint8 [N])``.

    Raises:
      DataFormatError: naming the file, for one that does not unpickle to a dict with
        ``b"data"`` uint8 ``[N, 3072]`` and ``N`` ``b"labels"`` in ``0..9``.
    """
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as e:
        raise _bad(f"{path} is not a CIFAR-10 python batch (it does not unpickle: {e}).") from e
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise _bad(
            f"{path} is not a CIFAR-10 python batch: expected a dict with b'data' and "
            f"b'labels', found {keys}."
        )
    data = batch[b"data"]
    size = int(np.prod(IMAGE_SHAPE))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.shape[1:] != (size,):
        found = (data.dtype, data.shape) if isinstance(data, np.ndarray) else type(data).__name__
        raise _bad(f"{path}: b'data' must be uint8 [N, {size}], found {found}.")
    labels = np.asarray(batch[b"labels"])
    if labels.ndim != 1 or len(labels) != len(data):
        raise _bad(
            f"{path} holds {len(data)} images but {labels.size} labels (shape {labels.shape})."
        )
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise _bad(f"{path}: b'labels' must be integers, found {labels.dtype}.")
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise _bad(f"{path} holds labels outside 0..{NUM_CLASSES - 1}.")
    planes = data.reshape(len(data), IMAGE_SHAPE[2], *IMAGE_SHAPE[:2])  # [N, C, H, W]
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels.astype(np.uint8)


def load_cifar10_dir(directory: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reads and checks the six batch files of a ``cifar-10-batches-py`` directory.

    Args:
      directory: holds `TRAIN_BATCHES` and `TEST_BATCH`.

    Returns:
      ``{"train": (images, labels), "test": (images, labels)}``: images uint8
      ``[N, 32, 32, 3]`` (HWC), labels uint8 ``[N]`` in ``0..9``; the training batches
      concatenated in order.

    Raises:
      DataNotFoundError: as `cifar10_paths`.
      DataFormatError: as `read_batch`.
    """
    out = {}
    for split, paths in cifar10_paths(directory).items():
        batches = [read_batch(path) for path in paths]
        out[split] = tuple(np.concatenate(parts) for parts in zip(*batches, strict=True))
    return out
