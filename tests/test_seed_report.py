"""`launch.seed_report`: a run per train seed, each evaluated, and the mean and standard
deviation over seeds, on the synthetic 1-D smoke config (two seeds)."""

import json
import os

import numpy as np
import pytest

from configs import synthetic_1d
from launch import seed_report


def _config():
    config = synthetic_1d.get_config("smoke")
    config.log.tensorboard = False
    return config


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("seeds"))
    lines = []
    out = seed_report.run_report(_config(), root, [0, 3], max_iters=[4, 8], emit=lines.append)
    return root, out, lines


def test_one_run_per_seed_each_evaluated_and_summarised(report):
    root, out, lines = report
    assert sorted(os.listdir(root)) == ["seed0", "seed3", "seed_report.json", "seed_report.md"]
    for seed in (0, 3):  # each seed's run trained with its own train.seed
        with open(os.path.join(root, f"seed{seed}", "config.json")) as f:
            assert json.load(f)["train"]["seed"] == seed
    rows = out["rows"]
    assert {(r["seed"], r["split"], r["budget"]) for r in rows} == {
        (s, "validation", b) for s in (0, 3) for b in ("max_iter=4", "max_iter=8")
    }
    # Different seeds, different models; the summary is their mean and population std.
    first, second = (
        [r for r in rows if r["seed"] == s and r["budget"] == "max_iter=8"][0] for s in (0, 3)
    )
    assert first["mse"] != second["mse"]
    group = next(g for g in out["summary"] if g["budget"] == "max_iter=8")
    np.testing.assert_allclose(group["mse_mean"], (first["mse"] + second["mse"]) / 2)
    np.testing.assert_allclose(group["mse_std"], abs(first["mse"] - second["mse"]) / 2)
    assert group["seeds"] == [0, 3] and group["mse_n"] == 2
    with open(os.path.join(root, "seed_report.md")) as f:
        table = f.read()
    assert "| split | budget | seed 0 | seed 3 | mean ± std |" in table
    assert "mse:" in table and "nstep_mean:" in table  # the task's metric, the steps
    assert any(line.startswith("Wrote ") for line in lines)


def test_a_second_report_loads_the_runs_and_scores_the_same(report):
    root, out, _ = report
    lines = []
    again = seed_report.run_report(_config(), root, [0, 3], max_iters=[4, 8], emit=lines.append)
    assert again["rows"] == out["rows"]
    assert not any(line.startswith("step ") for line in lines)  # nothing trained again
    last = seed_report.run_report(
        _config(), root, [0], max_iters=[8], checkpoint="last", metrics=["mse"], emit=lines.append
    )
    assert last["checkpoint"] == "last" and last["rows"][0]["step"] == _config().train.steps
    with pytest.raises(
        ValueError, match=r"--metrics \['accuracy'\] are not reported; valid: .*mse"
    ):
        seed_report.run_report(_config(), root, [0], max_iters=[8], metrics=["accuracy"])
