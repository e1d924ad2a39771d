"""`launch.compare_runs`: two runs' metrics, record by record, wall-clock keys ignored."""

import json

import pytest

from launch import compare_runs


def _write(path, records):
    path.mkdir()
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


def test_identical_runs_agree_and_wall_clock_is_ignored(tmp_path):
    a = _write(tmp_path / "a", [{"step": 2, "loss": 0.5, "steps_per_sec": 3.0}])
    b = _write(tmp_path / "b", [{"step": 2, "loss": 0.5, "steps_per_sec": 9.0}])
    assert (
        compare_runs.differences(compare_runs.read_records(a), compare_runs.read_records(b)) == []
    )


def test_differences_are_named(tmp_path):
    a = [{"step": 2, "split": "test_16", "loss": 0.5, "acc": float("nan")}]
    b = [{"step": 2, "split": "test_16", "loss": 0.5000001, "acc": float("nan")}, {"step": 4}]
    diffs = compare_runs.differences(a, b)
    assert diffs == ["records: 1 != 2", "record 0 (test_16, step 2): loss 0.5 != 0.5000001"]
    assert compare_runs.differences(a, b[:1], rtol=1e-5) == []


def test_missing_workdir_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl not found"):
        compare_runs.read_records(str(tmp_path / "nope"))
