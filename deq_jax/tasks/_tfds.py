"""Keeps tfds quiet when it builds or opens the records the image tasks convert."""

from __future__ import annotations

import contextlib
import io
import logging
import time
from typing import Any

import tensorflow_datasets as tfds


@contextlib.contextmanager
def quiet():
    """Silences tfds' progress bars and its per-call "custom data configuration" warning.

    The image tasks convert their files once into records, and every split opened with a
    non-default builder config would otherwise log the same warning.
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    tfds.display_progress_bar(False)
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
