"""Train seeds in the reports: launch/seeds.py (parsing, mean and standard deviation) and
experiments.clrs.report --seeds (a workdir per seed, per-seed rows, the mean +- std row),
against numbers computed by hand."""

import json
import math
import os
import shutil

import pytest

from experiments.clrs import report as clrs_report
from experiments.clrs import tables as clrs_tables
from launch import seeds


def test_parse_seeds():
    assert seeds.parse_seeds(["0", "1", " 2"]) == [0, 1, 2]
    assert seeds.parse_seeds([3]) == [3]
    with pytest.raises(ValueError, match="--seeds is empty"):
        seeds.parse_seeds([])
    with pytest.raises(ValueError, match="--seeds='a'"):
        seeds.parse_seeds(["0", "a"])
    with pytest.raises(ValueError, match="-1"):
        seeds.parse_seeds(["-1"])
    with pytest.raises(ValueError, match="repeats a seed"):
        seeds.parse_seeds(["1", "1"])
    assert seeds.seeds_or_count([], 3) == [0, 1, 2]
    assert seeds.seeds_or_count(["4", "5"]) == [4, 5]
    assert seeds.seeds_or_count([]) == [0]
    with pytest.raises(ValueError, match="not both"):
        seeds.seeds_or_count(["1"], 2)
    assert seeds.seed_workdir("/r/bfs/deq", 2) == "/r/bfs/deq/seed2"


def test_mean_std_by_hand():
    # 0.5 and 0.7: mean 0.6, population std sqrt(((0.1)^2 + (0.1)^2) / 2) = 0.1.
    got = seeds.mean_std([0.5, None, 0.7, float("nan")])
    assert got["n"] == 2
    assert got["mean"] == pytest.approx(0.6) and got["std"] == pytest.approx(0.1)
    # 1, 2, 6: mean 3, variance (4 + 1 + 9) / 3 = 14 / 3.
    got = seeds.mean_std([1.0, 2.0, 6.0])
    assert got["mean"] == 3.0 and got["std"] == pytest.approx(math.sqrt(14 / 3))
    assert seeds.mean_std([0.25]) == {"mean": 0.25, "std": 0.0, "n": 1}
    assert seeds.mean_std([None]) == {"mean": None, "std": None, "n": 0}
    assert seeds.mean_std([1.0, float("inf")])["mean"] == float("inf")  # a blow-up shows


def _splits(val, test):
    return {
        "val": dict(nodes=16, score=val, nstep_mean=10.0, nstep_max=12.0, count=32),
        "test_64": dict(nodes=64, score=test, nstep_mean=20.0, nstep_max=30.0, count=32),
    }


def test_summary_rows_and_table_by_hand():
    rows = []
    for seed, (val, test, seconds) in enumerate([(0.9, 0.5, 10.0), (0.8, 0.7, 30.0)]):
        row = clrs_report.report_row("bellman_ford", "deq", _splits(val, test), seconds)
        rows.append(dict(row, seed=seed))
    rows.append(dict(algorithm="bellman_ford", mode="deq", goal=96.4, diverged="nan", seed=2))
    (summary,) = clrs_tables.summary_rows(rows)
    assert summary["seeds"] == [0, 1, 2] and summary["test_score_n"] == 2
    assert summary["val_score_mean"] == pytest.approx(0.85)
    assert summary["val_score_std"] == pytest.approx(0.05)
    assert summary["test_score_mean"] == pytest.approx(0.6)
    assert summary["test_score_std"] == pytest.approx(0.1)
    # gaps 50 - 96.4 = -46.4 and 70 - 96.4 = -26.4: mean -36.4, std 10.
    assert summary["gap_mean"] == pytest.approx(-36.4) and summary["gap_std"] == pytest.approx(10)
    assert summary["train_seconds_mean"] == 20.0 and summary["train_seconds_std"] == 10.0
    table = clrs_tables.summary_markdown([summary])
    assert (
        "| bellman_ford | deq | 2/3 | 85.0 ± 5.0 | 60.0 ± 10.0 | 96.4 | -36.4 ± 10.0 | "
        "10.0 ± 0.0 | 20.0 ± 0.0 | 20 ± 10 |" in table
    )
    per_seed = clrs_tables.markdown(rows)
    assert "| bellman_ford | deq (seed 1) | 80.0 | 70.0 |" in per_seed
    assert "| bellman_ford | deq (seed 2) | diverged |" in per_seed


class _Run:
    """What `run_report` reads of a trained run when `evaluate_run` is replaced."""


def test_run_report_trains_each_seed_in_its_own_workdir(tmp_path, monkeypatch):
    scores = {0: (0.9, 0.5), 1: (0.8, 0.7)}
    trained = []

    def best_run(config, workdir, emit):
        trained.append((config.train.seed, workdir))
        run = _Run()
        run.seed = config.train.seed
        return run, 10 + config.train.seed, "best"

    monkeypatch.setattr(clrs_report, "best_run", best_run)
    monkeypatch.setattr(clrs_report, "evaluate_run", lambda run, config: _splits(*scores[run.seed]))
    root = str(tmp_path)
    report = clrs_report.run_report(
        root, ["bellman_ford"], ["deq"], smoke=True, train_seeds=[0, 1], emit=lambda s: None
    )
    assert trained == [
        (0, os.path.join(root, "bellman_ford", "deq", "seed0")),
        (1, os.path.join(root, "bellman_ford", "deq", "seed1")),
    ]
    assert [(r["seed"], r["scored_step"], r["checkpoint"]) for r in report["rows"]] == [
        (0, 10, "best"),
        (1, 11, "best"),
    ]
    with open(os.path.join(root, "clrs_report.json")) as f:
        saved = json.load(f)
    assert saved["seeds"] == [0, 1]
    (summary,) = saved["summary"]
    assert summary["test_score_mean"] == pytest.approx(0.6)
    assert summary["test_score_std"] == pytest.approx(0.1)
    with open(os.path.join(root, "clrs_report.md")) as f:
        text = f.read()
    assert "Mean ± std over train seeds [0, 1]:" in text
    assert "| bellman_ford | deq | 2/2 | 85.0 ± 5.0 | 60.0 ± 10.0 |" in text
    # Without seeds: one run in <algorithm>/<mode>, no summary.
    trained.clear()
    monkeypatch.setattr(clrs_report, "evaluate_run", lambda run, config: _splits(0.9, 0.5))
    report = clrs_report.run_report(root, ["bellman_ford"], ["deq"], smoke=True, emit=print)
    assert trained == [(0, os.path.join(root, "bellman_ford", "deq"))]
    assert report["summary"] == [] and "seed" not in report["rows"][0]


def test_run_report_keeps_the_rows_of_earlier_invocations(tmp_path, monkeypatch):
    scores = {("bellman_ford", 0): (0.9, 0.5), ("bfs", 0): (1.0, 0.9), ("bfs", 1): (0.8, 0.7)}

    def best_run(config, workdir, emit):
        os.makedirs(workdir, exist_ok=True)
        run = _Run()
        run.key = (config.task.algorithm, config.train.seed)
        return run, 10, "best"

    monkeypatch.setattr(clrs_report, "best_run", best_run)
    monkeypatch.setattr(clrs_report, "evaluate_run", lambda run, config: _splits(*scores[run.key]))
    root, lines = str(tmp_path), []
    for algorithm, seed in (("bfs", 0), ("bellman_ford", 0), ("bfs", 1)):
        report = clrs_report.run_report(
            root, [algorithm], ["deq"], smoke=True, train_seeds=[seed], emit=lines.append
        )
    assert "Keeping 2 rows of the earlier report" in "\n".join(lines)
    # One report over all three runs, in the order of ALGORITHMS, then the seed.
    with open(os.path.join(root, "clrs_report.json")) as f:
        saved = json.load(f)
    assert [(r["algorithm"], r["seed"]) for r in saved["rows"]] == [
        ("bellman_ford", 0),
        ("bfs", 0),
        ("bfs", 1),
    ]
    assert saved["seeds"] == [0, 1] and report["seeds"] == [0, 1]
    (bfs,) = [r for r in saved["summary"] if r["algorithm"] == "bfs"]
    assert bfs["test_score_mean"] == pytest.approx(0.8) and bfs["test_score_n"] == 2
    # Rerunning a row replaces it; other settings replace the whole report.
    scores[("bfs", 1)] = (0.8, 0.3)
    report = clrs_report.run_report(
        root, ["bfs"], ["deq"], smoke=True, train_seeds=[1], emit=lines.append
    )
    assert [r["test_score"] for r in report["rows"]] == pytest.approx([0.5, 0.9, 0.3])
    # A row whose run directory was removed (a run to redo) is not kept.
    shutil.rmtree(os.path.join(root, "bellman_ford", "deq", "seed0"))
    report = clrs_report.run_report(
        root, ["bfs"], ["deq"], smoke=True, train_seeds=[1], emit=lines.append
    )
    assert [(r["algorithm"], r["seed"]) for r in report["rows"]] == [("bfs", 0), ("bfs", 1)]
    report = clrs_report.run_report(
        root, ["bfs"], ["deq"], steps=7, train_seeds=[1], emit=lines.append
    )
    assert [(r["algorithm"], r["seed"]) for r in report["rows"]] == [("bfs", 1)]
    assert any("it was run with other steps, smoke." in line for line in lines)
