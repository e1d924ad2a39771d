"""deq_jax.training.run.writers.write_text, write_json: a file is replaced whole or left
as it was."""

import json
import os

import pytest

from deq_jax.training.run.writers import write_json, write_text


def test_writes_the_json_with_the_dump_options_and_no_temporary_file(tmp_path):
    path = str(tmp_path / "report.json")
    assert write_json(path, {"b": 1, "a": [1, 2]}, indent=2, sort_keys=True) == path
    text = (tmp_path / "report.json").read_text()
    assert text == json.dumps({"a": [1, 2], "b": 1}, indent=2, sort_keys=True)
    assert os.listdir(tmp_path) == ["report.json"]


def test_replaces_an_existing_file(tmp_path):
    path = str(tmp_path / "report.json")
    write_json(path, {"step": 1})
    write_json(path, {"step": 2})
    assert json.loads((tmp_path / "report.json").read_text()) == {"step": 2}


def test_an_object_that_cannot_be_written_leaves_the_old_file_and_no_debris(tmp_path):
    path = str(tmp_path / "report.json")
    write_json(path, {"train_seconds": 12.5})
    # json.dump into an open("w") file would write part of this before it meets the
    # set and leave a truncated report behind.
    with pytest.raises(TypeError, match="set"):
        write_json(path, {"a": "x" * 100_000, "z": {1, 2}})
    assert json.loads((tmp_path / "report.json").read_text()) == {"train_seconds": 12.5}
    assert os.listdir(tmp_path) == ["report.json"]


def test_the_file_keeps_the_permissions_a_plain_write_gives(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    write_json(str(tmp_path / "atomic.json"), {})
    assert os.stat(tmp_path / "atomic.json").st_mode == os.stat(plain).st_mode


def test_write_text_writes_text_as_utf8_and_bytes_as_they_are(tmp_path):
    text_path, bytes_path = str(tmp_path / "a.md"), str(tmp_path / "b.bin")
    assert write_text(text_path, "| é |\n") == text_path
    assert write_text(bytes_path, b"\x00\xff") == bytes_path
    assert (tmp_path / "a.md").read_bytes() == "| é |\n".encode()
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert sorted(os.listdir(tmp_path)) == ["a.md", "b.bin"]


def test_a_failed_write_text_removes_its_temporary_file(tmp_path):
    path = str(tmp_path / "table.md")
    write_text(path, "old")
    with pytest.raises(TypeError):
        write_text(path, 5)  # fails inside the open temporary file
    assert (tmp_path / "table.md").read_text() == "old"
    assert os.listdir(tmp_path) == ["table.md"]
