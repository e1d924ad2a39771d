"""Raw text corpora: find, fingerprint, read, validate and split them into token streams.

Everything here runs before any data are written, so bad input fails with a clear
error and leaves no half-built data directory behind (see `deq_jax.tasks.text`).

* Character level (`char_corpus`): one UTF-8 text file, split into contiguous blocks
  of characters: train the first 90%, valid the next 5%, test the last 5%
  (`split_chars`); the vocabulary comes from the train block (`char_vocabulary`).
* Word level (`word_corpus`): WikiText's ``wiki.{train,valid,test}.tokens``; the
  vocabulary comes from the train file (`word_vocabulary`).

Line breaks ``"\\r\\n"`` and ``"\\r"`` are read as ``"\\n"`` (as Python's text files
read them); the fingerprint is of the bytes on disk.

A missing corpus raises a `DataNotFoundError` (a FileNotFoundError), a file that is not
UTF-8, is empty or too short a `DataFormatError` (a ValueError); each names the path
and how to get a corpus (`PREPARE_SHAKESPEARE`, `WIKITEXT_HINT`).

References:
  Merity, Xiong, Bradbury, Socher, "Pointer Sentinel Mixture Models", 2016 (WikiText).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence

import numpy as np

from deq_jax.tasks.errors import DataFormatError, DataNotFoundError
from deq_jax.tasks.text_vocab import Vocabulary, char_vocabulary, word_vocabulary

TRAIN, VALID, TEST = "train", "valid", "test"
SPLITS = (TRAIN, VALID, TEST)
SOURCE_FILE = "SOURCE.txt"  # provenance written by launch.prepare_data, not corpus text
WIKITEXT_FILES = {split: f"wiki.{split}.tokens" for split in SPLITS}
PREPARE_SHAKESPEARE = "python -m launch.prepare_data shakespeare --out {out}"
WIKITEXT_HINT = (
    "WikiText (Merity et al. 2016) is not downloaded by this project: put its "
    f"{', '.join(WIKITEXT_FILES.values())} in one directory and pass that as path=."
)

Corpus = tuple[Vocabulary, dict[str, np.ndarray]]


def check_split(split: str) -> None:
    """Raises a ValueError listing the valid splits for an unknown one."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(SPLITS)}.")


def fingerprint(paths: Sequence[str]) -> str:
    """The first 16 hex digits of the sha256 of the files' bytes, in order."""
    digest = hashlib.sha256()
    for path in paths:
        file_digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                file_digest.update(block)
        digest.update(file_digest.digest())
    return digest.hexdigest()[:16]


def safe_name(text: str) -> str:
    """``text`` with every run of characters other than ``[A-Za-z0-9_]`` turned into ``_``."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "corpus"


def char_corpus_file(path: str) -> str:
    """The corpus file a character-level ``path`` names.

    Args:
      path: a text file, or a directory holding exactly one ``*.txt`` besides
        ``SOURCE.txt`` (as ``launch.prepare_data`` writes it).

    Raises:
      DataNotFoundError: if ``path`` does not exist or the directory holds no corpus;
        the message gives the command that prepares the default corpus.
      DataFormatError: if the directory holds several candidate files.
    """
    path = os.path.expanduser(path)
    out = os.path.dirname(path) or "." if path.endswith(".txt") else path
    hint = (
        f"Prepare the default corpus (Shakespeare) with: {PREPARE_SHAKESPEARE.format(out=out)} "
        "and pass that directory as the path."
    )

    if not os.path.exists(path):
        raise DataNotFoundError(f"Character-level corpus {path!r} does not exist. {hint}")
    if not os.path.isdir(path):
        return path
    names = sorted(n for n in os.listdir(path) if n.endswith(".txt") and n != SOURCE_FILE)
    if not names:
        raise DataNotFoundError(f"No corpus *.txt file in the directory {path!r}. {hint}")
    if len(names) > 1:
        raise DataFormatError(
            f"The directory {path!r} holds several *.txt files ({', '.join(names)}); "
            "pass the path of the one to use."
        )
    return os.path.join(path, names[0])


def wikitext_files(path: str) -> dict[str, str]:
    """``{split: path}`` of the three WikiText files in the directory ``path``.

    Raises:
      DataNotFoundError: naming the first missing file.
    """
    path = os.path.expanduser(path)
    if not os.path.isdir(path):
        raise DataNotFoundError(f"WikiText directory {path!r} does not exist. {WIKITEXT_HINT}")
    files = {split: os.path.join(path, name) for split, name in WIKITEXT_FILES.items()}
    for file in files.values():
        if not os.path.isfile(file):
            raise DataNotFoundError(f"WikiText file {file} is missing. {WIKITEXT_HINT}")
    return files


def read_text(path: str) -> str:
    """The UTF-8 text of a file, line breaks read as ``"\\n"``.

    Raises:
      DataFormatError: if the file is not UTF-8 (naming the file and the byte offset of
        the first bad byte) or is empty.
    """
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFormatError(
            f"{path} is not UTF-8 text: invalid byte {raw[e.start]:#04x} at byte offset "
            f"{e.start} ({e.reason}). Convert it (iconv -t UTF-8) or pass another corpus."
        ) from None
    if not text:
        raise DataFormatError(f"{path} is empty: a corpus needs text; pass another file.")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_bounds(n: int) -> tuple[int, int]:
    """Where valid and test start among ``n`` characters: ``(9n // 10, 19n // 20)``."""
    return 9 * n // 10, 19 * n // 20


def split_chars(text: str) -> dict[str, str]:
    """Contiguous 90/5/5 blocks of ``text``: ``train + valid + test == text``."""
    a, b = split_bounds(len(text))
    return {TRAIN: text[:a], VALID: text[a:b], TEST: text[b:]}


def _check_lengths(streams: dict[str, np.ndarray], where: dict[str, str]) -> None:
    for split, ids in streams.items():
        if len(ids) < 2:
            raise DataFormatError(
                f"The {split} split of {where[split]} would hold {len(ids)} token(s); a "
                "split needs at least 2 (one target). Use a longer corpus."
            )


def char_corpus(path: str) -> Corpus:
    """Reads, validates and encodes a character-level corpus file.

    Returns:
      The `Vocabulary` of the train block and ``{split: int32 [N]}``.

    Raises:
      ValueError: for a non-UTF-8 or empty file, or one too short to give every split
        2 characters (the message names the file).
    """
    blocks = split_chars(read_text(path))
    vocab = char_vocabulary(blocks[TRAIN], (blocks[VALID], blocks[TEST]))
    streams = {split: vocab.encode(block) for split, block in blocks.items()}
    _check_lengths(streams, dict.fromkeys(SPLITS, path))
    return vocab, streams


def word_corpus(files: dict[str, str]) -> Corpus:
    """Reads, validates and encodes the three WikiText files of `wikitext_files`.

    Returns:
      The word `Vocabulary` of the train file and ``{split: int32 [N]}``.

    Raises:
      ValueError: for a non-UTF-8 or empty file, or one giving fewer than 2 tokens.
    """
    texts = {split: read_text(files[split]) for split in SPLITS}
    vocab = word_vocabulary(texts[TRAIN])
    streams = {}
    for split, text in texts.items():
        try:
            streams[split] = vocab.encode(text)
        except ValueError as e:
            raise DataFormatError(f"{files[split]}: {e}") from None
    _check_lengths(streams, files)
    return vocab, streams
