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


def test_the_smallest_budget_meeting_the_target_counts_with_its_own_time():
    noisy = dict(TABLE, anderson=_rows((0.732, 0.881, 0.878, 0.882), (8.7, 15.0, 12.0, 31.1)))
    summary = summarize(noisy, {}, unroll=10)
    assert summary["anderson"]["budget_to_metric"] == 8  # not 12, timed faster by noise
    assert summary["anderson"]["seconds_to_metric"] == pytest.approx(15.0 / 1e3)


def test_margin_for_lower_is_better_metrics():
    assert metric_target("bpc", 2.0, higher=False, margin=0.01) == pytest.approx(2.01)
    assert metric_target("mse", 2.0, higher=False, margin=0.01) == pytest.approx(2.02)
    assert metric_target("accuracy", 0.9, higher=True, margin=0.01) == pytest.approx(0.89)


def test_ablation_table_summarises_each_seed_again(tmp_path, capsys):
    import json

    from experiments.neural_solver.ablation_table import main

    noisy = dict(TABLE, anderson=_rows((0.732, 0.881, 0.878, 0.882), (8.7, 15.0, 12.0, 31.1)))
    for seed in (0, 1):
        where = tmp_path / "paper" / f"s{seed}"
        where.mkdir(parents=True)
        fit = dict(spec=dict(seed=seed), fit_seconds=dict(hyper_anderson=5.0))
        fit.update(target_seconds=2.0, time_fraction=0.1)
        stale = {"summary": "written by an earlier summarize"}
        sweep = dict(stale, table=noisy, residual_curves={}, unroll_steps=10, margin=0.005)
        (where / "neural_solver.json").write_text(json.dumps(fit))
        (where / "solver_pareto.json").write_text(json.dumps(sweep))
    rows = main(["ablation_table", str(tmp_path)])
    assert rows["paper"]["anderson_budget"] == [8, 8]
    assert rows["paper"]["budget"] == [12, 12]
    assert rows["paper"]["evals_ratio"] == pytest.approx([8 / 12, 8 / 12])
    assert "| paper | 2 | 8 ± 0 | 12, 12 |" in capsys.readouterr().out
    assert (tmp_path / "ablations.json").exists()
    assert main(["ablation_table", str(tmp_path)]).keys() == {"paper"}  # a second time
