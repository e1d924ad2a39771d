"""The accelerator scripts under ``launch/device/`` run end to end at their CPU sizes
(slow: each trains two or more tiny models), so a device session does not spend its
few minutes on a script that no longer matches the launches."""

import json
import os
import subprocess
import sys

import pytest
from test_lm_training import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_lm_jacobian_script_trains_both_runs_and_writes_the_table(tmp_path):
    corpus = write_corpus(tmp_path / "plays.txt")
    env = dict(os.environ, SIZE="smoke", STEPS="4", PYTHON=sys.executable)
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "launch/device/lm_jacobian.sh", str(out), corpus],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((out / "table.json").read_text())
    assert [row["name"] for row in rows] == ["DEQ", "DEQ + Jacobian (weight 0.1, p 0.4)"]
    assert all(row["seeds"] == 1 and row["valid"][0] > 0 for row in rows)
