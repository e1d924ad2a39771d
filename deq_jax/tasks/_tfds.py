"""Where the tasks meet tensorflow-datasets: imported on first use, and kept quiet.

tensorflow-datasets (and array_record, which it loads to read records) comes with the
``[train]`` extra and is imported only where a task reads or writes tfds records, in
its ``prepare()`` and ``source()``: `load` is that import, on its first call. Building
a task, reading its ``input_shape``, ``num_classes``, ``metrics`` or augmentation, and
timing a model on synthetic data (`benchmarks.step_time`) import neither
(``tests/test_optional_packages.py``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import time
from typing import Any

from deq_jax.tasks.errors import DataFormatError, DataNotFoundError


@functools.cache
def load() -> Any:
    """The ``tensorflow_datasets`` module, imported on the first call.

    Raises:
      ModuleNotFoundError: naming the ``[train]`` extra when it is not installed.
    """
    try:
        import tensorflow_datasets  # the [train] extra's: only where records are used
    except ModuleNotFoundError as error:
        hint = f"Reading or writing tfds records needs {error.name!r}: pip install 'deq_jax[train]'"
        raise ModuleNotFoundError(hint, name=error.name) from error
    return tensorflow_datasets


@contextlib.contextmanager
def quiet():
    """Silences tfds' progress bars and its per-call "custom data configuration" warning.

    The image tasks convert their files once into records, and every split opened with a
    non-default builder config would otherwise log the same warning.
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    load().display_progress_bar(False)
    try:
        yield
    finally:
        logger.setLevel(level)


def prepare(builder: Any) -> None:
    """Builds ``builder``'s data unless it is already there, saying so in two lines.

    tfds prints "Downloading and preparing dataset Unknown size ..." to stdout for any
    build; nothing is downloaded here (the project converts files it was given), so
    that line and tfds' "downloaded and prepared" line are dropped and replaced by
    ours, which name the directory and the time the build took.
    """
    with quiet():  # is_prepared() warns about the variant folder it has not made yet
        if builder.is_prepared():
            return
    print(
        f"Generating the {builder.name} data in {builder.data_dir} (once: later runs reuse it)...",
        flush=True,
    )
    began = time.perf_counter()
    with quiet(), contextlib.redirect_stdout(io.StringIO()):
        builder.download_and_prepare()
    print(f"Generated the {builder.name} data in {time.perf_counter() - began:.0f} s.", flush=True)


def prepared(name: str, data_dir: str | None, otherwise: str) -> Any:
    """tfds' builder of the data set ``name`` under ``data_dir``, prepared as array_record.

    Args:
      name: a tfds data set (``"cifar10"``, ``"mnist"``).
      data_dir: the tfds data directory (None: tfds' default).
      otherwise: ends the not-prepared message after the ``tfds build`` command (e.g.
        ``" or use source='digits'"``).

    Raises:
      DataNotFoundError: if the data are not prepared under ``data_dir``.
      DataFormatError: if they are prepared in a format without random access.
    """
    tfds = load()
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        raise DataNotFoundError(
            f"{name} is not prepared under {builder.data_dir}. Build it with "
            f"`tfds build {name} --file_format=array_record --data_dir=...`{otherwise}."
        )
    if builder.info.file_format != tfds.core.file_adapters.FileFormat.ARRAY_RECORD:
        raise DataFormatError(
            f"{name} under {builder.data_dir} is stored as {builder.info.file_format}; "
            "random access needs array_record (`tfds convert_format` can convert it)."
        )
    return builder
