"""deq_jax.training.writers.write_json: a report is replaced whole or left as it was."""

import json
import os

import pytest

from deq_jax.training.writers import write_json


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
    # json.dump writes part of this before it meets the set: a plain open("w") would
    # leave a truncated report behind.
    with pytest.raises(TypeError, match="set"):
        write_json(path, {"a": "x" * 100_000, "z": {1, 2}})
    assert json.loads((tmp_path / "report.json").read_text()) == {"train_seconds": 12.5}
    assert os.listdir(tmp_path) == ["report.json"]


def test_the_file_keeps_the_permissions_a_plain_write_gives(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    write_json(str(tmp_path / "atomic.json"), {})
    assert os.stat(tmp_path / "atomic.json").st_mode == os.stat(plain).st_mode
