"""experiments.neural_solver.pareto.summarize: the budget and time at which each solver reaches
Anderson's metric less the margin, on a hand-made table (no model, no compile)."""

import pytest

from experiments.neural_solver.pareto import METRIC_MARGIN, metric_target, summarize


def _rows(accuracies, ms):
    return [
        dict(budget=b, accuracy=a, seconds=t / 1e3, rel_residual=0.1 / b)
        for b, a, t in zip((4, 8, 12, 18), accuracies, ms, strict=True)
    ]


# Accuracies and ms per batch of the H100 MDEQ-TINY sweep (BUILD_NOTES).
TABLE = {
    "anderson": _rows((0.732, 0.881, 0.878, 0.882), (8.7, 15.0, 21.4, 31.1)),
    "hyper_anderson": _rows((0.830, 0.873, 0.878, 0.882), (8.9, 15.6, 22.8, 32.6)),
    "init_only": _rows((0.859, 0.879, 0.879, 0.879), (8.9, 15.3, 21.7, 31.4)),
}


def test_default_margin_is_half_a_point_of_accuracy():
    summary = summarize(TABLE, {}, unroll=10)
    assert summary["metric_target"] == pytest.approx(0.882 - METRIC_MARGIN)
    assert summary["anderson"]["budget_to_metric"] == 8
    assert summary["hyper_anderson"]["budget_to_metric"] == 12
    assert summary["init_only"]["budget_to_metric"] == 8
    assert summary["hyper_anderson"]["speedup_metric_vs_anderson"] == pytest.approx(15.0 / 22.8)
    assert summary["hyper_anderson"]["evals_ratio_metric_vs_anderson"] == pytest.approx(8 / 12)


def test_a_tenth_of_a_point_asks_for_more_steps_or_none():
    summary = summarize(TABLE, {}, unroll=10, margin=0.001)
    assert summary["metric_target"] == pytest.approx(0.881)
    assert summary["anderson"]["budget_to_metric"] == 8
    assert summary["hyper_anderson"]["budget_to_metric"] == 18
    assert summary["init_only"]["budget_to_metric"] is None
    assert summary["init_only"]["speedup_metric_vs_anderson"] is None


def test_margin_for_lower_is_better_metrics():
    assert metric_target("bpc", 2.0, higher=False, margin=0.01) == pytest.approx(2.01)
    assert metric_target("mse", 2.0, higher=False, margin=0.01) == pytest.approx(2.02)
    assert metric_target("accuracy", 0.9, higher=True, margin=0.01) == pytest.approx(0.89)
