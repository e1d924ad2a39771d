"""The CLRS report (launch/clrs_report.py): rows, table, figure, and a smoke run."""

import json
import os

import pytest

from launch import clrs_diagnose, clrs_report, clrs_report_plots, clrs_steps
from launch import main as launch_main


def test_the_per_split_tools_load_together():
    """`clrs_diagnose` and `clrs_steps` share one ``--splits`` flag (defining it twice
    would fail at import)."""
    launch_main.define_splits_flag()  # again: a no-op
    assert clrs_diagnose.main is not clrs_steps.main
    assert launch_main.flags.FLAGS[launch_main.SPLITS_FLAG].default == []


def test_run_config_and_scores():
    config = clrs_report.run_config("bfs", "fixed_steps", steps=50, smoke=True)
    assert config.model.mode == "fixed_steps" and config.train.steps == 50
    assert config.train.warmup_steps <= 5
    assert clrs_report.run_config("bellman_ford", "deq", smoke=True).task.extra_edge_rate == 1
    for mode in ("hint_propagation", "fixed_steps"):
        bf = clrs_report.run_config("bellman_ford", mode, smoke=True)
        assert bf.task.extra_edge_rate == (mode != "fixed_steps")  # hints only in fixed_steps
    kruskal = clrs_report.run_config("mst_kruskal", "fixed_steps", smoke=True)
    assert not kruskal.model.decode_edge_latents and kruskal.regularizer.jacobian_weight == 0
    assert clrs_report.run_config("mst_kruskal", "deq", smoke=True).model.decode_edge_latents
    assert clrs_report.run_config("mst_prim", "deq", smoke=True).model.edge_state == 8
    for mode in ("hint_propagation", "fixed_steps"):
        assert clrs_report.run_config("mst_prim", mode, smoke=True).model.edge_state == 0
    assert clrs_report.split_nodes(config, "val") == config.task.train_nodes
    assert clrs_report.split_nodes(config, "test_64") == 64
    # Kruskal's F1 comes from the combined counts: tp 2, fp 1, fn 1 -> 2/3.
    kruskal = dict(score=0.1, true_positives=2.0, false_positives=1.0, false_negatives=1.0)
    assert clrs_report.split_score(kruskal) == pytest.approx(2 / 3)
    assert clrs_report.split_score(dict(score=0.25)) == 0.25
    varied = clrs_report.run_config(
        "bfs", "deq", smoke=True, overrides=["regularizer.jacobian_weight=0.1"]
    )
    assert varied.regularizer.jacobian_weight == 0.1 and varied.model.mode == "deq"


def test_rows_table_and_figure(tmp_path):
    splits = {
        "val": dict(nodes=16, score=0.9, nstep_mean=10.0, nstep_max=14.0, count=32),
        "test_64": dict(nodes=64, score=0.5, nstep_mean=20.0, nstep_max=30.0, count=32),
    }
    row = clrs_report.report_row("bellman_ford", "deq", splits, 12.0)
    assert row["gap"] == pytest.approx(50.0 - 96.4)
    assert row["val_nstep_max"] == 14.0 and row["test_nstep_mean"] == 20.0
    diverged = dict(algorithm="dfs", mode="deq", goal=5.0, diverged="nan")
    table = clrs_report.markdown([row, diverged])
    assert (
        "| bellman_ford | deq | 90.0 | 50.0 | 96.4 | -46.4 | 10.0 / 14 | 20.0 / 30 | 12 |" in table
    )
    assert "| dfs | deq | diverged |" in table
    assert "every edge" not in table
    kruskal = clrs_report.report_row(
        "mst_kruskal", "deq", {"test_64": dict(splits["test_64"], all_edges_score=0.8213)}, 1.0
    )
    assert "mst_kruskal: predicting every edge scores 82.1 on the test_64 graphs." in (
        clrs_report.markdown([kruskal])
    )
    prim_splits = {"test_64": dict(splits["test_64"], lightest_neighbour_score=0.6865)}
    prim = clrs_report.report_row("mst_prim", "deq", prim_splits, 1.0)
    assert (
        "mst_prim: pointing every node at its lightest neighbour scores 68.7 on the test_64 "
        "graphs." in clrs_report.markdown([prim, row])
    )
    path = clrs_report_plots.write_figure([row, diverged], str(tmp_path / "f.png"))
    assert os.path.getsize(path) > 1000
    prim_splits["val"] = dict(splits["val"], lightest_neighbour_score=0.705)
    assert clrs_report_plots._reference_points([row, prim], "mst_prim") == [
        (16, 70.5),
        (64, 68.65),
    ]
    path = clrs_report_plots.write_figure([row, prim], str(tmp_path / "g.png"))
    assert os.path.getsize(path) > 1000


def test_answer_steps_in_the_table_and_figure(tmp_path):
    splits = {
        "val": dict(nodes=16, score=0.9, nstep_mean=10.0, nstep_max=14.0, answer_mean=6.5),
        "test_64": dict(nodes=64, score=0.5, nstep_mean=9.0, nstep_max=30.0, answer_mean=21.25),
    }
    row = clrs_report.report_row("dijkstra", "deq", splits, 12.0)
    assert (row["val_answer_mean"], row["test_answer_mean"]) == (6.5, 21.25)
    fixed = clrs_report.report_row("dijkstra", "fixed_steps", {}, 3.0)  # no replay there
    diverged = dict(algorithm="dfs", mode="deq", goal=5.0, diverged="nan")
    table = clrs_report.markdown([row, fixed, diverged])
    assert "| answer settled mean (16 / 64) | train s |" in table
    assert "| 10.0 / 14 | 9.0 / 30 | 6.5 / 21.2 | 12 |" in table
    assert "| - / - | - / - | - / - | 3 |" in table
    widths = {line.count("|") for line in table.splitlines() if line.startswith("|")}
    assert widths == {11}  # every row, the diverged one too, has the header's columns
    path = clrs_report_plots.write_figure([row, fixed, diverged], str(tmp_path / "a.png"))
    assert os.path.getsize(path) > 1000
    assert "answer settled" not in clrs_report.markdown([fixed])


@pytest.mark.parametrize(
    "modes",
    [
        ("fixed_steps",),  # CI: one training run (each smoke run compiles for ~1 minute)
        pytest.param(("deq", "fixed_steps"), marks=pytest.mark.slow),
    ],
)
def test_smoke_report_end_to_end(modes, tmp_path):
    root = str(tmp_path)
    report = clrs_report.run_report(
        root, ["bellman_ford"], list(modes), smoke=True, answer_steps=True, emit=lambda s: None
    )
    for ext in ("json", "md", "png"):
        assert os.path.exists(os.path.join(root, f"clrs_report.{ext}"))
    with open(os.path.join(root, "clrs_report.json")) as f:
        saved = json.load(f)
    assert [r["mode"] for r in saved["rows"]] == list(modes)
    for row in report["rows"]:
        assert set(row["splits"]) == {"val", "test_9"}  # the smoke config's sizes
        assert 0.0 <= row["val_score"] <= 1.0 and row["val_nstep_max"] >= 1
        assert row["train_seconds"] > 0
        replayed = row["mode"] == "deq"  # answer_steps replays the deq runs only
        assert (row["val_answer_mean"] is not None) == replayed
        if replayed:
            for split in row["splits"].values():
                assert 1 <= split["answer_mean"] <= split["answer_max"]
                assert 1 <= split["node_mean"] <= split["node_max"]
    # A second report loads the finished runs instead of training them again.
    again = clrs_report.run_report(
        root, ["bellman_ford"], [modes[0]], smoke=True, emit=lambda s: None
    )
    assert again["rows"][0]["train_seconds"] == report["rows"][0]["train_seconds"]
    assert again["rows"][0]["val_score"] == pytest.approx(report["rows"][0]["val_score"])
    # The error breakdown of the trained run agrees with the report's score.
    run_dir = os.path.join(root, "bellman_ford", modes[0])
    config = clrs_report.run_config("bellman_ford", modes[0], smoke=True)
    lines = []
    breakdown = clrs_diagnose.diagnose_run(config, run_dir, ["val"], emit=lines.append)
    assert breakdown["val"]["accuracy"] == pytest.approx(report["rows"][0]["val_score"], abs=1e-6)
    assert sum(b["nodes"] for b in breakdown["val"]["by_depth"]) == breakdown["val"]["nodes"]
    assert "excess_median" in breakdown["val"] and lines[0].startswith("val: score")
    figure = clrs_diagnose.write_figure(breakdown, os.path.join(root, "diagnostics.png"))
    assert os.path.getsize(figure) > 1000
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        clrs_diagnose.diagnose_run(config, os.path.join(root, "empty"))


def test_fixed_steps_runs_without_the_training_graph_augmentations(monkeypatch):
    from configs import clrs_common

    monkeypatch.setitem(clrs_common.WEIGHT_POWERS, "mst_prim", 4.0)
    assert clrs_report.run_config("mst_prim", "deq", smoke=True).task.weight_power == 4
    fixed = clrs_report.run_config("mst_prim", "fixed_steps", smoke=True)
    assert fixed.task.weight_power == 1 and fixed.task.reroot_rate == 0
    assert fixed.task.extra_edge_rate == 0
