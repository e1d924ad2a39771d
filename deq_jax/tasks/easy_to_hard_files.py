"""Readers for easy-to-hard-data's ``.npy`` files (mazes and prefix sums), into our layout.

Users of deep-thinking (aks2203/deep-thinking) train and test on the files of
easy-to-hard-data (aks2203/easy-to-hard-data), which its dataset classes download. These
readers take those files as they are and hand back arrays in this project's layout,
checking shapes and value ranges and naming the file when one is off.

Mazes (``MazeDataset`` in ``easy_to_hard_data.py``; written by ``make_mazes.py``): one
folder per split and size, ``{root}/maze_data_{train|test}_{S}/``, holding
``inputs.npy``, float ``[N, 3, H, W]`` (NCHW: ``make_mazes.py`` transposes its NHWC
images before ``np.save``) with values in {0, 1}, and ``solutions.npy``, ``[N, H, W]``
in {0, 1} (1 on the path). ``H = W = 2S + 6``: the ``(S + 2) x (S + 2)`` grid upscaled
2x in a 1-pixel zero frame. `maze_image_chunks` reads them as float32 ``[b, H, W, 3]``
(NHWC) and int32 ``[b, H, W]``.

Prefix sums (``PrefixSumDataset``; written by ``make_prefixsums.py``): the released files
are torch pickles, ``{root}/prefix_sums_data/{L}_data.pth`` and ``{L}_targets.pth``,
float ``[N, L]`` in {0, 1}; the dataset class centres the inputs and adds a channel,
``torch.load(...).unsqueeze(1) - 0.5``: ``[N, 1, L]`` in {-0.5, 0.5}. This reader takes
the ``.npy`` twins, ``{L}_data.npy`` (``[N, L]`` or ``[N, 1, L]``, bits in {0, 1} or
centred in {-0.5, 0.5}) and ``{L}_targets.npy`` (``[N, L]`` in {0, 1}), and returns
uint8 bits ``[N, L]``. Torch pickles are not read (no torch dependency); a folder with
only ``.pth`` files gets an error with the one-line conversion.

A missing file raises a `DataNotFoundError` (a FileNotFoundError), a file of another
shape, length or values a `DataFormatError` (a ValueError); each names the file and
where its folder is downloaded from.

References:
  Schwarzschild et al., "Datasets for Studying Generalization from Easy to Hard
  Examples", arXiv:2108.06011, 2021.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from deq_jax.tasks.errors import DataFormatError, DataNotFoundError

MAZE_INPUTS, MAZE_SOLUTIONS = "inputs.npy", "solutions.npy"
_DOWNLOADS = "https://cs.umd.edu/~tomg/download/Easy_to_Hard_Datav2"
PREFIX_SUMS_DOWNLOAD = (
    f"easy-to-hard-data's PrefixSumDataset downloads {_DOWNLOADS}/prefix_sums_data.tar.gz "
    "(torch .pth files: convert each to .npy)."
)
_CHUNK_BYTES = 32 << 20  # stored input bytes converted at a time (2,427 float64 9x9 mazes)


def maze_folder(root: str, *, train: bool, size: int) -> str:
    """``{root}/maze_data_{train|test}_{size}``, as ``MazeDataset`` names its folders."""
    return os.path.join(root, f"maze_data_{'train' if train else 'test'}_{size}")


def maze_download_hint(folder: str) -> str:
    """Where the maze folder ``folder`` is downloaded from, as a sentence."""
    return (
        f"Download {_DOWNLOADS}/{os.path.basename(os.path.normpath(folder))}.tar.gz and "
        "unpack it there (easy-to-hard-data's MazeDataset does the same)."
    )


def _load(path: str, hint: str) -> np.ndarray:
    """``np.load(path)`` memory-mapped; a `DataNotFoundError` naming ``path`` and ``hint``
    if it is missing, a `DataFormatError` if it is not a ``.npy`` file."""
    if not os.path.exists(path):
        raise DataNotFoundError(f"{path} not found. {hint}")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as e:
        raise DataFormatError(f"{path} is not a .npy array file ({e}). {hint}") from e


def _check_values(
    values: np.ndarray, path: str, rows: str, hint: str, what: str = "in {0, 1}"
) -> None:
    """Raises a `DataFormatError` naming ``path`` if ``values`` holds anything but 0 and 1."""
    bad = ~np.isin(values, (0, 1))
    if bad.any():
        first = values[bad].flat[0].item()
        raise DataFormatError(f"{path} ({rows}) holds {first!r}; its values must be {what}. {hint}")


def maze_image_chunks(
    folder: str, count: int, side: int, *, start: int = 0
) -> Iterator[dict[str, np.ndarray]]:
    """Mazes ``[start, start + count)`` of an easy-to-hard maze folder, in our layout,
    by chunks.

    Args:
      folder: a ``maze_data_{train|test}_{S}`` folder (see `maze_folder`).
      count: how many mazes to read.
      side: the expected image side ``H = W`` (``2S + 6``).
      start: the first row read (0: the files' first maze).

    Yields:
      ``{"inputs": float32 [b, H, W, 3], "targets": int32 [b, H, W]}``, consecutive
      chunks of at most 32 MB of stored inputs each (at least one maze), ``count`` in all.

    Raises:
      DataNotFoundError: naming a missing file and where the folder is downloaded from.
      DataFormatError: naming the file whose shape, length or values are not the format's.
    """
    hint = maze_download_hint(folder)
    paths = [os.path.join(folder, MAZE_INPUTS), os.path.join(folder, MAZE_SOLUTIONS)]
    inputs, solutions = (_load(path, hint) for path in paths)
    layouts = [((3, side, side), "NCHW images"), ((side, side), "path masks")]
    for path, array, (shape, what) in zip(paths, (inputs, solutions), layouts, strict=True):
        if array.shape[1:] != shape:
            raise DataFormatError(
                f"{path} has shape {array.shape}; easy-to-hard {what} of this maze size are "
                f"[N, {', '.join(map(str, shape))}]. {hint}"
            )
        if len(array) < start + count:
            asked = f"the {count} asked for" + (f" after row {start}" if start else "")
            raise DataFormatError(
                f"{path} holds {len(array)} mazes, fewer than {asked} (lower "
                "train_size, val_size or test_size)."
            )
    chunk = max(1, _CHUNK_BYTES // (inputs[0].nbytes if len(inputs) else 1))
    for first in range(start, start + count, chunk):
        last = min(first + chunk, start + count)
        rows = f"mazes {first} to {last - 1}"
        x, y = np.asarray(inputs[first:last]), np.asarray(solutions[first:last])
        _check_values(x, paths[0], rows, hint)
        _check_values(y, paths[1], rows, hint)
        yield {
            "inputs": x.transpose(0, 2, 3, 1).astype(np.float32),  # NCHW -> [b, H, W, 3]
            "targets": y.astype(np.int32),  # [b, H, W]
        }


def read_prefix_sum_files(
    folder: str, length: int, *, start: int, count: int
) -> dict[str, np.ndarray]:
    """Rows ``[start, start + count)`` of an easy-to-hard prefix-sum pair, as bits.

    Args:
      folder: the folder of ``{length}_data.npy`` and ``{length}_targets.npy`` (the
        ``prefix_sums_data`` folder of easy-to-hard-data, converted to ``.npy``).
      length: bits per string ``L``.
      start: first row to read.
      count: rows to read.

    Returns:
      ``{"inputs": uint8 [count, L], "targets": uint8 [count, L]}`` in {0, 1}; centred
      inputs (``bits - 0.5``) are shifted back.

    Raises:
      DataNotFoundError: naming the missing file (and the conversion, for ``.pth``, or
        where the files are downloaded from).
      DataFormatError: naming the file whose shape, length or values are not the format's.
    """
    arrays = {}
    for key, suffix in (("inputs", "data"), ("targets", "targets")):
        path = os.path.join(folder, f"{length}_{suffix}.npy")
        pth = path.removesuffix(".npy") + ".pth"
        hint = (
            f"{pth} is a torch pickle, which deq_jax does not read; convert it once with "
            f"python -c \"import numpy, torch; numpy.save('{path}', torch.load('{pth}').numpy())\"."
            if os.path.exists(pth)
            else f"Expected easy-to-hard-data's {length}-bit prefix sums saved as .npy: "
            + PREFIX_SUMS_DOWNLOAD
        )
        array = _load(path, hint)
        if key == "inputs" and array.ndim == 3 and array.shape[1] == 1:
            array = array[:, 0]  # [N, 1, L], as PrefixSumDataset hands them out
        if array.ndim != 2 or array.shape[1] != length:
            layouts = "[N, L] or [N, 1, L]" if key == "inputs" else "[N, L]"
            raise DataFormatError(
                f"{path} has shape {array.shape}; expected {layouts} with L = {length}. "
                + PREFIX_SUMS_DOWNLOAD
            )
        if len(array) < start + count:
            raise DataFormatError(
                f"{path} holds {len(array)} strings; rows {start} to {start + count - 1} were "
                "asked for (lower train_size or test_size)."
            )
        rows = np.asarray(array[start : start + count], np.float64)
        what = "in {0, 1}"
        if key == "inputs":
            what = "bits in {0, 1}, or centred bits in {-0.5, 0.5} (all of them)"
            if rows.size and np.isin(rows, (-0.5, 0.5)).all():
                rows = rows + 0.5  # centred bits, bits - 0.5
        _check_values(
            rows, path, f"rows {start} to {start + count - 1}", PREFIX_SUMS_DOWNLOAD, what
        )
        arrays[key] = rows.astype(np.uint8)
    return arrays
