"""The accelerator scripts under ``experiments/gpu/`` run end to end at their CPU sizes
(slow: each trains two or more tiny models), so a device session does not spend its
few minutes on a script that no longer matches the launches."""

import json
import os
import re
import subprocess
import sys

import pytest
from test_lm_training import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_script(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``bash experiments/gpu/{name} args`` from the repository root, with ``env`` added
    (and this interpreter as ``PYTHON``); fails the test unless it exits 0."""
    done = subprocess.run(
        ["bash", f"experiments/gpu/{name}", *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHON=sys.executable, **env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_lm_jacobian_script_trains_both_runs_and_writes_the_table(tmp_path):
    corpus = write_corpus(tmp_path / "plays.txt")
    out = tmp_path / "out"
    _run_script("lm_jacobian.sh", str(out), corpus, SIZE="smoke", STEPS="4")
    rows = json.loads((out / "table.json").read_text())
    assert [row["name"] for row in rows] == ["DEQ", "DEQ + Jacobian (weight 0.1, p 0.4)"]
    assert all(row["seeds"] == 1 and row["valid"][0] > 0 for row in rows)


@pytest.mark.slow
def test_mazes_benchmark_script_fits_steps_trains_three_seeds_and_reports(tmp_path):
    out = tmp_path / "out"
    done = _run_script(
        "mazes_benchmark.sh",
        str(out),
        "20",
        CONFIG="configs/mazes.py:benchmark,smoke",
        SPLITS="test_5,test_7",
        MAX_ITERS="4,8",
        EXTRA="--config.task.train_size=48",
        EVALS="4",
    )
    (steps,) = re.findall(r"3 seeds of (\d+) steps each", done.stdout)
    assert int(steps) >= 20  # the floor of the fit
    report = json.loads((out / "seed_report.json").read_text())
    assert report["seeds"] == [0, 1, 2] and report["checkpoint"] == "best"
    cells = {(row["split"], row["budget"]) for row in report["summary"]}
    assert cells == {(s, f"max_iter={b}") for s in ("test_5", "test_7") for b in (4, 8)}
    assert all(row["maze_accuracy_n"] == 3 for row in report["summary"])
    for seed in range(3):
        config = json.loads((out / f"seed{seed}" / "config.json").read_text())
        assert config["train"]["steps"] == int(steps) and config["train"]["seed"] == seed
        assert config["task"]["train_size"] == 48  # EXTRA reaches every run
        assert config["eval"]["every_steps"] == int(steps) // 4  # EVALS validations
