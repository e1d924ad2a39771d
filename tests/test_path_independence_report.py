"""The path-independence report: its pieces, and (slow) a smoke run end to end."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from experiments.path_independence import analysis as analysis
from experiments.path_independence import plots as plots
from experiments.path_independence import report as report


def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    y = np.round(x + rng.normal(scale=0.5, size=12), 1)
    y[3] = y[4]  # a tie
    assert analysis.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert analysis.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(analysis.spearman([1, 2, 3], [5, 5, 5]))


def test_task_config_applies_overrides():
    config = analysis.task_config("prefix_sum", dict(report.PATH_DEPENDENT), smoke=True)
    assert config.deq.z_init == "zeros" and config.deq.backward.name == "unrolled"
    assert config.deq.solver.name == "fixed_point_iteration"
    assert tuple(config.task.test_lengths) == (32, 64, 128)
    assert config.deq.train_max_iter == 8 and config.model.norm == ""
    assert analysis._budgets(config) == [4, 8, 16, 32, 64]


def _fake_report():
    curve = [
        dict(split=s, max_iter=n, string_accuracy=a)
        for s in ("test_32", "test_64")
        for n, a in ((15, 0.5), (30, 0.9), (60, 1.0))
    ]
    section = {
        v: dict(
            table=dict(aa=0.99, accuracy=0.9, split="test_64"),
            test_time=curve,
            aa={"test_64": dict(per_instance=[0.9, 0.99, 0.2], correct=[True, True, False])},
        )
        for v in plots.MAIN_VARIANTS
    }
    runs = [
        dict(task="prefix_sum", variant=v, aa=a, accuracy=b)
        for v, a, b in (("path_independent", 0.99, 0.9), ("path_dependent", 0.5, 0.1))
    ]
    return {"tasks": {"prefix_sum": section}, "runs": runs, "spearman": 1.0}


def test_figures_are_written(tmp_path):
    paths = plots.write_figures(_fake_report(), str(tmp_path))
    assert len(paths) == 3
    for path in paths:
        assert os.path.getsize(path) > 1000


@pytest.mark.slow
def test_smoke_report_end_to_end(tmp_path):
    out = report.run_report(
        str(tmp_path), ["prefix_sum"], sweep=1, sweep_steps=4, smoke=True, emit=lambda s: None
    )
    saved = json.load(open(tmp_path / report.REPORT_FILE))
    assert len(saved["runs"]) == 3
    table = out["tasks"]["prefix_sum"]["path_independent"]["table"]
    assert {"aa", "accuracy", "attacked_aa", "attacked_accuracy"} <= set(table)
    assert out["tasks"]["prefix_sum"]["aa_cost"]["ratio"] > 0
