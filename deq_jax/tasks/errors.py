"""The errors of data a user supplies: missing files, and files that are not the format.

Every loader of files a user downloads or installs (the idx files of Fashion-MNIST and
MNIST, CIFAR-10's python batches, a prepared tfds data set, a text corpus,
easy-to-hard-data's ``.npy`` files) raises one of these, with a message that names the
path, what is missing or wrong, and how to get the data. They subclass the built-in
types the loaders raised before (`FileNotFoundError`, `ValueError`), so existing
``except`` clauses still catch them; `DataError` catches both, which is how
``launch`` turns them into one line for the user.
"""

from __future__ import annotations


class DataError(Exception):
    """Data a user supplies is missing or malformed; the message says how to get it."""


class DataNotFoundError(DataError, FileNotFoundError):
    """A data directory or file is missing (or a tfds data set is not prepared)."""


class DataFormatError(DataError, ValueError):
    """A data file exists but is not in the format its loader reads."""
