"""Keeps tfds quiet when it builds or opens the project's generated data sets."""

from __future__ import annotations

import contextlib
import logging

import tensorflow_datasets as tfds


@contextlib.contextmanager
def quiet():
    """Silences tfds' progress bars and its per-call "custom data configuration" warning.

    Generated data sets (prefix sums, mazes, ...) are built in seconds, and every split
    opened with a non-default builder config would otherwise log the same warning.
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    tfds.display_progress_bar(False)
    try:
        yield
    finally:
        logger.setLevel(level)
