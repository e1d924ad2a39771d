"""The CLRS configs and launch programs: the configs and their variants, smoke runs
through the training loop, the report (experiments/clrs/report.py: rows, table, figure),
the step profile (experiments/clrs/steps.py) and the diagnosis (experiments/clrs/diagnose.py)."""

import functools
import json
import os
import types

import numpy as np
import pytest

from configs import clrs as clrs_configs
from deq_jax import tasks
from deq_jax.models import clrs
from deq_jax.training import setup, train_and_evaluate
from deq_jax.training.run import writers
from experiments.clrs import diagnose as clrs_diagnose
from experiments.clrs import report as clrs_report
from experiments.clrs import report_plots as clrs_report_plots
from experiments.clrs import steps as clrs_steps
from experiments.clrs import tables as clrs_tables
from launch import flags as launch_flags


def test_the_per_split_tools_load_together():
    """`clrs_diagnose` and `clrs_steps` share one ``--splits`` flag (defining it twice
    would fail at import)."""
    launch_flags.define_splits_flag()  # again: a no-op
    assert clrs_diagnose.main is not clrs_steps.main
    assert launch_flags.flags.FLAGS[launch_flags.SPLITS_FLAG].default == []


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
    table = clrs_tables.markdown([row, diverged])
    assert (
        "| bellman_ford | deq | 90.0 | 50.0 | 96.4 | -46.4 | 10.0 / 14 | 20.0 / 30 | 12 |" in table
    )
    assert "| dfs | deq | diverged |" in table
    assert "every edge" not in table
    kruskal = clrs_report.report_row(
        "mst_kruskal", "deq", {"test_64": dict(splits["test_64"], all_edges_score=0.8213)}, 1.0
    )
    assert "mst_kruskal: predicting every edge scores 82.1 on the test_64 graphs." in (
        clrs_tables.markdown([kruskal])
    )
    prim_splits = {"test_64": dict(splits["test_64"], lightest_neighbour_score=0.6865)}
    prim = clrs_report.report_row("mst_prim", "deq", prim_splits, 1.0)
    assert (
        "mst_prim: pointing every node at its lightest neighbour scores 68.7 on the test_64 "
        "graphs." in clrs_tables.markdown([prim, row])
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
    table = clrs_tables.markdown([row, fixed, diverged])
    assert "| answer settled mean (16 / 64) | train s |" in table
    assert "| 10.0 / 14 | 9.0 / 30 | 6.5 / 21.2 | 12 |" in table
    assert "| - / - | - / - | - / - | 3 |" in table
    widths = {line.count("|") for line in table.splitlines() if line.startswith("|")}
    assert widths == {11}  # every row, the diverged one too, has the header's columns
    path = clrs_report_plots.write_figure([row, fixed, diverged], str(tmp_path / "a.png"))
    assert os.path.getsize(path) > 1000
    assert "answer settled" not in clrs_tables.markdown([fixed])


def _seed_report(root, algorithm_scores, seed, **settings):
    """A clrs_report.json as `run_report` writes it with ``--seeds=seed``."""
    rows = []
    for algorithm, (val, test) in algorithm_scores.items():
        splits = {
            "val": dict(nodes=16, score=val, nstep_mean=10.0, nstep_max=12.0, count=32),
            "test_64": dict(nodes=64, score=test, nstep_mean=14.0, nstep_max=20.0, count=32),
        }
        row = clrs_report.report_row(algorithm, "deq", splits, 100.0 + seed)
        rows.append(dict(row, seed=seed, scored_step=1500, checkpoint="best"))
    return clrs_report.write_clrs_report(
        str(root),
        rows,
        dict(seeds=[seed], steps=settings.get("steps", 0), smoke=False, overrides=[]),
        emit=lambda s: None,
    )


def test_combine_joins_seed_reports_without_training(tmp_path):
    _seed_report(tmp_path / "a", {"dijkstra": (0.97, 0.87), "bfs": (1.0, 1.0)}, 0)
    _seed_report(tmp_path / "b", {"dijkstra": (0.98, 0.89)}, 1)
    paths = [str(tmp_path / d / "clrs_report.json") for d in ("b", "a")]
    lines = []
    report = clrs_report.combine_reports(
        str(tmp_path / "all"), paths, modes=["deq"], emit=lines.append
    )
    assert [(r["algorithm"], r["seed"]) for r in report["rows"]] == [
        ("bfs", 0),
        ("dijkstra", 0),
        ("dijkstra", 1),
    ]  # the order of ALGORITHMS, then the seed
    (dijkstra,) = [r for r in report["summary"] if r["algorithm"] == "dijkstra"]
    assert dijkstra["test_score_mean"] == pytest.approx(0.88)
    assert dijkstra["test_score_std"] == pytest.approx(0.01)
    assert dijkstra["gap_mean"] == pytest.approx(88.0 - 78.8)
    assert report["seeds"] == [0, 1] and report["combined_from"] == paths
    with open(tmp_path / "all" / "clrs_report.json") as f:
        assert json.load(f)["summary"] == report["summary"]
    table = (tmp_path / "all" / "clrs_report.md").read_text()
    assert "| dijkstra | deq | 2/2 | 97.5 ± 0.5 | 88.0 ± 1.0 | 78.8 | +9.2 ± 1.0 |" in table
    assert lines[-1].startswith("Wrote ")
    only = clrs_report.combine_reports(str(tmp_path / "bfs"), paths, ["bfs"], emit=lines.append)
    assert [r["algorithm"] for r in only["rows"]] == ["bfs"]


def test_combine_refuses_what_does_not_combine(tmp_path):
    _seed_report(tmp_path / "a", {"dijkstra": (0.97, 0.87)}, 0)
    _seed_report(tmp_path / "again", {"dijkstra": (0.97, 0.86)}, 0)
    _seed_report(tmp_path / "longer", {"dijkstra": (0.97, 0.86)}, 1, steps=6000)
    path = {d: str(tmp_path / d / "clrs_report.json") for d in ("a", "again", "longer")}
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match="dijkstra/deq seed 0 is in both"):
        clrs_report.combine_reports(out, [path["a"], path["again"]], emit=lambda s: None)
    with pytest.raises(ValueError, match="steps=6000"):
        clrs_report.combine_reports(out, [path["a"], path["longer"]], emit=lambda s: None)
    with pytest.raises(ValueError, match="no row of"):
        clrs_report.combine_reports(out, [path["a"]], ["bfs"], emit=lambda s: None)
    with pytest.raises(FileNotFoundError, match="no report at"):
        clrs_report.combine_reports(out, [str(tmp_path / "nope.json")], emit=lambda s: None)
    unseeded = clrs_report.write_clrs_report(
        str(tmp_path / "one"), [], dict(seeds=[], steps=0, smoke=False, overrides=[]), print
    )
    assert unseeded["summary"] == []
    with pytest.raises(ValueError, match="not run with --seeds"):
        clrs_report.combine_reports(
            out, [str(tmp_path / "one" / "clrs_report.json")], emit=lambda s: None
        )


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
    records = writers.read_metrics(os.path.join(root, "bellman_ford", modes[0]))
    steps = clrs_report.run_config("bellman_ford", modes[0], smoke=True).train.steps
    periodic = {r["split"] for r in records if r["split"] != "train" and r["step"] < steps}
    assert periodic == {"val"}  # test is read once, by the final report
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


def test_fixed_steps_runs_without_the_training_graph_augmentations():
    assert clrs_report.run_config("mst_prim", "deq", smoke=True).task.weight_power == 4
    fixed = clrs_report.run_config("mst_prim", "fixed_steps", smoke=True)
    assert fixed.task.weight_power == 1
    assert fixed.task.extra_edge_rate == 0


# --- configs end to end ---------------------------------------------------------------


def _algorithm_config(algorithm):
    """``configs/clrs.py`` for one algorithm, as a module: ``get_config(arg)``."""
    return types.SimpleNamespace(get_config=functools.partial(clrs_configs.clrs_config, algorithm))


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_configs_are_documented(algorithm):
    module = _algorithm_config(algorithm)
    assert f"--config configs/clrs.py:{algorithm} --workdir" in clrs_configs.__doc__
    assert "--config configs/clrs.py:bfs,smoke --workdir" in clrs_configs.__doc__
    config, smoke = module.get_config(), module.get_config("smoke")
    assert config.task.algorithm == algorithm and config.model.mode == "deq"
    assert 64 in config.task.test_nodes and config.task.train_nodes == 16
    assert smoke.train.steps < config.train.steps and smoke.model.hidden < config.model.hidden
    # The MSTs' processor is the Triplet-GMPNN (Prim 64.0 vs 49.6 at 64 nodes), the rest
    # GMPNN; Kruskal decodes its edge latents (82.1 vs 74.9).
    mst = algorithm in ("mst_prim", "mst_kruskal")
    assert config.model.processor == ("triplet_mpnn" if mst else "gmpnn")
    assert config.model.decode_edge_latents == (algorithm == "mst_kruskal")
    # MST-Kruskal's Jacobian weight is 0.1 (74.9 vs 71.3 at 64 nodes), MST-Prim's 0.3
    # (68.4 vs 63.1 over seeds), the rest 1.
    weight = {"mst_kruskal": 0.1, "mst_prim": 0.3}.get(algorithm, 1.0)
    assert config.regularizer.jacobian_weight == weight
    # MST-Kruskal's loss weighs the non-tree edges 50x (84.7 / 88.7 / 87.6 vs 82.1 at 64).
    assert config.task.non_tree_edge_weight == (50.0 if algorithm == "mst_kruskal" else 1.0)
    # MST-Prim's Triplet-GMPNN keeps an edge state of width 8 (70.7 vs 68.4 over 3 seeds).
    assert config.model.edge_state == (8 if algorithm == "mst_prim" else 0)
    # MST-Prim's training weights are raised to a power in [1, 4] (the tree stays).
    assert config.task.weight_power == (4.0 if algorithm == "mst_prim" else 1.0)
    # The eval solve also stops once the answer settles (3 steps; Prim's pauses: 6).
    assert config.deq.settle_patience == (6 if algorithm == "mst_prim" else 3)
    assert config.deq.settle_tol == 1e-6  # ... and the answer, not the residual, decides
    tasks.get(**{**config.task.to_dict(), "data_dir": ""})  # the task accepts the section
    large = module.get_config("large")  # Bellman-Ford's goal recipe: 96.6 / 96.6 / 97.0 at 64
    assert (large.model.hidden, large.train.steps) == (128, 6000)
    large.model.hidden, large.train.steps = config.model.hidden, config.train.steps
    large.eval.every_steps = large.ckpt.every_steps = config.eval.every_steps
    assert large.to_dict() == config.to_dict()  # nothing else differs
    with pytest.raises(ValueError, match="smoke, large"):
        clrs_configs.clrs_config(algorithm, "huge")


@pytest.mark.parametrize(
    "algorithm, mode",
    [
        pytest.param("bellman_ford", "deq", marks=pytest.mark.slow),
        pytest.param("bellman_ford", "hint_propagation", marks=pytest.mark.slow),
        # fixed_steps training also runs in the report's CI test below
        pytest.param("bellman_ford", "fixed_steps", marks=pytest.mark.slow),
        # the edge-mask output through the training loop (62 s)
        pytest.param("mst_kruskal", "deq", marks=pytest.mark.slow),
        # the edge state through the training loop (98 s; its model tests stay in CI)
        pytest.param("mst_prim", "deq", marks=pytest.mark.slow),
    ],
)
def test_smoke_config_trains_end_to_end(algorithm, mode, tmp_path):
    config = clrs_configs.clrs_config(algorithm, "smoke")
    config.model.mode = mode
    kruskal = algorithm == "mst_kruskal"
    if kruskal:
        config.task.non_tree_edge_weight = 5.0  # the weighted loss through the loop
    if mode == "fixed_steps":
        config.regularizer.jacobian_weight = 0.0  # no fixed point to regularise
        config.model.decode_edge_latents = False
        config.task.extra_edge_rate = 0.0  # the hints must be the graph's own
    if mode == "hint_propagation":  # output-preserving extra edges through the loop
        config.task.extra_edge_rate = 1.0
    if algorithm == "mst_prim":  # its step profile replays the residual-stop solves
        config.deq.settle_patience = 0
    result = train_and_evaluate(config, str(tmp_path), emit=lambda s: None)
    assert result.step == config.train.steps
    assert str(config.train.steps) in os.listdir(tmp_path / "checkpoints")
    for metrics in result.report["1x"].values():
        assert 0.0 <= metrics["score"] <= 1.0 and metrics["nstep_max"] >= 1
    records = writers.read_metrics(str(tmp_path))
    # The periodic evaluation reads val only; test is read once, by the final report.
    periodic = {r["split"] for r in records if r["split"] != "train" and r["step"] < result.step}
    assert periodic == {"val"} and set(result.report["1x"]) == {"val", "test_9"}
    train = [r for r in records if r["split"] == "train"]
    if mode == "fixed_steps":  # the hint loss enters the optimised loss
        last = train[-1]
        assert last["aux_loss"] > 0
        np.testing.assert_allclose(last["loss"], last["task_loss"] + last["aux_loss"], rtol=1e-5)
    else:
        assert all("aux_loss" not in r for r in train)
    if algorithm == "mst_prim":  # the step profile replays the run's solves
        lines = []
        profile = clrs_steps.profile_run(config, str(tmp_path), ["val", "test_9"], lines.append)
        budget = config.deq.eval_max_iter
        for split, nodes in (("val", 6), ("test_9", 9)):
            steps = profile[split]
            assert steps["nodes"] == nodes and steps["budget"] == budget
            reported = steps["solver_reported_mean"]  # the eval's own solves, replayed
            assert reported == pytest.approx(result.report["1x"][split]["nstep_mean"], abs=1e-6)
            assert reported == pytest.approx(steps["solver"]["mean"], abs=1.0)
            for key in clrs_steps.MEASURES:
                assert 1 <= steps[key]["mean"] <= steps[key]["max"] <= budget
        assert lines[0].startswith("val (6 nodes")
        run = setup(config, str(tmp_path))  # the report's form: counts merged into its splits
        run.checkpointer.close()
        splits = {"val": {"score": 0.5}, "test_9": {}}
        clrs_report.add_answer_steps(run, config, splits)
        assert splits["val"]["score"] == 0.5
        for split, counts in splits.items():
            for key in ("answer", "node"):
                assert counts[f"{key}_mean"] == profile[split][key]["mean"]
                assert counts[f"{key}_max"] == profile[split][key]["max"]
        figure = clrs_steps.write_figure(profile, str(tmp_path / "steps.png"))
        assert os.path.getsize(figure) > 1000
    if kruskal:  # the edge-mask breakdown of the trained run agrees with its score
        lines = []
        breakdown = clrs_diagnose.diagnose_run(config, str(tmp_path), ["val"], lines.append)
        val = breakdown["val"]
        assert val["score"] == pytest.approx(result.report["1x"]["val"]["score"], abs=1e-6)
        assert val["tree_edges"] == val["true_positives"] + val["false_negatives"]
        assert lines[0].startswith("val: F1")
        figure = clrs_diagnose.write_figure(breakdown, str(tmp_path / "diagnostics.png"))
        assert os.path.getsize(figure) > 1000


def test_step_profile_needs_a_trained_deq_mode_run(tmp_path):
    config = clrs_configs.clrs_config("bfs", "smoke")
    config.model.mode = "fixed_steps"
    with pytest.raises(ValueError, match="replays a deq-mode solve"):
        clrs_steps.profile_run(config, str(tmp_path))
    config.model.mode = "deq"
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        clrs_steps.profile_run(config, str(tmp_path))


def test_extra_edges_refuse_the_hint_supervised_mode(tmp_path):
    """The extra edges change the algorithm's steps, so their batches carry no hints and
    fixed_steps, which trains on them, stops with the model's error."""
    config = clrs_configs.clrs_config("bellman_ford", "smoke")
    config.model.mode, config.regularizer.jacobian_weight = "fixed_steps", 0.0
    config.task.extra_edge_rate = 0.5
    with pytest.raises(ValueError, match="needs hint_"):
        train_and_evaluate(config, str(tmp_path), emit=lambda s: None)


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_mode_variants_set_what_the_mode_needs_and_combine_with_sizes(algorithm):
    module = _algorithm_config(algorithm)
    config = module.get_config()
    fixed = module.get_config("fixed_steps")
    assert fixed.model.mode == "fixed_steps" and fixed.regularizer.jacobian_weight == 0
    assert not fixed.model.decode_edge_latents and fixed.model.edge_state == 0
    assert fixed.task.extra_edge_rate == 0 and fixed.task.weight_power == 1
    hint = module.get_config("hint_propagation")
    assert hint.model.mode == "hint_propagation" and hint.model.edge_state == 0
    assert hint.regularizer.jacobian_weight == config.regularizer.jacobian_weight
    assert hint.task.extra_edge_rate == config.task.extra_edge_rate
    assert hint.task.weight_power == config.task.weight_power
    both = module.get_config("fixed_steps,smoke")
    assert both.to_dict() == module.get_config("smoke,fixed_steps").to_dict()
    smoke = module.get_config("smoke")
    assert both.model.hidden == smoke.model.hidden and both.train.steps == smoke.train.steps
    assert both.model.mode == "fixed_steps" and both.regularizer.jacobian_weight == 0
    for mode in ("deq", "hint_propagation", "fixed_steps"):  # the report's runs are variants
        for smoke_run in (False, True):
            names = ([] if mode == "deq" else [mode]) + (["smoke"] if smoke_run else [])
            want = module.get_config(",".join(names)).to_dict()
            assert clrs_report.run_config(algorithm, mode, smoke=smoke_run).to_dict() == want
    for bad, match in (
        ("fixed_steps,huge", "Unknown config argument 'huge'"),
        ("smoke,smoke", "repeats"),
        ("smoke,large", "more than one size"),
        ("fixed_steps,hint_propagation", "more than one mode"),
    ):
        with pytest.raises(ValueError, match=match):
            module.get_config(bad)
