"""The path-independence study: its grid, the fit rule, the summary, the figures and
(slow) the smoke study end to end."""

import dataclasses
import json
import math
import os

import pytest

from deq_jax.training.run.writers import MetricWriter
from experiments.path_independence import plots as plots
from experiments.path_independence import runner as runner
from experiments.path_independence import study as study


def test_prefix_sum_grid_varies_every_factor():
    grid = study.prefix_sum_grid(study.CPU_SCALE.depths)
    assert len(grid) >= 16
    assert len({s.name for s in grid}) == len(grid)
    assert {s.learning_rate for s in grid} == {1e-2, 1e-3, 1e-4}
    assert {s.solver for s in grid} == {"fixed_point_iteration", "anderson"}
    assert {s.gradient for s in grid} == {"unrolled", "implicit"}
    assert {s.depth for s in grid} == set(study.CPU_SCALE.depths)
    assert {s.weight_norm for s in grid} == {False, True}
    assert len(study.maze_grid(study.CPU_SCALE.depths)) >= 8


def test_study_specs_put_interventions_after_their_base():
    specs = study.study_specs(study.CPU_SCALE)
    names = [s.name for s in specs]
    assert names[:4] == [
        "ub_fpi_d6_lr1e-03",
        "ub_fpi_d6_lr1e-03+mixed_init",
        "ub_fpi_d6_lr1e-03+random_depth",
        "ub_fpi_d6_lr1e-03+alignment",
    ]
    assert sum(s.task == "prefix_sum" and not s.intervention for s in specs) == 16
    assert sum(s.task == "mazes" and not s.intervention for s in specs) == 8
    gpu = study.study_specs(study.GPU_SCALE, ("prefix_sum",))
    assert sum(bool(s.intervention) for s in gpu) == 6  # two bases x three interventions
    assert len(study.study_specs(study.SMOKE_SCALE)) == 3


def test_run_spec_overrides():
    ub = study.RunSpec("prefix_sum", "unrolled", "anderson", 8, 1e-2, weight_norm=True)
    o = ub.overrides()
    assert o["deq.solver.full_budget"] and o["deq.backward.name"] == "unrolled"
    assert o["deq.solver.name"] == "anderson" and o["deq.train_max_iter"] == 8
    assert o["deq.eval_max_iter"] == 8 and o["model.weight_norm"] is True
    assert o["train.learning_rate"] == 1e-2 and o["deq.z_init"] == "zeros"
    ift = study.RunSpec("prefix_sum", "implicit", "fixed_point_iteration", 16, 1e-3)
    assert ift.overrides()["deq.backward.name"] == "ift"
    assert not ift.overrides()["deq.solver.full_budget"]
    with_ = lambda i: dataclasses.replace(ift, intervention=i).overrides()
    assert with_("mixed_init")["deq.z_init"] == "mixed"
    assert with_("random_depth")["path_independence.budget_min"] == 8
    assert with_("random_depth")["path_independence.budget_max"] == 32
    assert with_("alignment")["path_independence.alignment_weight"] == 1.0
    assert dataclasses.replace(ift, intervention="alignment").base == ift
    with pytest.raises(ValueError, match="valid: unrolled, implicit"):
        study.RunSpec("prefix_sum", "phantom", "anderson", 8, 1e-3)


def test_spec_config_sizes_and_fit_split(tmp_path):
    spec = study.study_specs(study.CPU_SCALE)[0]
    config = study.spec_config(spec, study.CPU_SCALE, str(tmp_path))
    assert tuple(config.task.test_lengths) == (12, 48) and config.task.train_length == 12
    assert tuple(config.eval.splits) == ("test_12",)
    assert config.train.steps == study.CPU_SCALE.cap_steps
    assert config.eval.every_steps == config.ckpt.every_steps == study.CPU_SCALE.chunk_steps
    assert config.model.norm == "" and config.model.width == 32
    assert config.task.data_dir == str(tmp_path)
    maze = study.maze_grid(study.CPU_SCALE.depths)[0]
    config = study.spec_config(maze, study.CPU_SCALE)
    assert tuple(config.task.test_maze_sizes) == (5, 9) and tuple(config.eval.splits) == ("test_5",)
    assert study.CPU_SCALE.target_split("mazes") == "test_9"


def test_fit_accuracy_reads_the_check_at_its_step(tmp_path):
    writer = MetricWriter(str(tmp_path), tensorboard=False)
    writer.write(400, "train", {"loss": 0.1})
    writer.write(400, "test_16", {"string_accuracy": 0.5})
    writer.write(800, "test_16", {"string_accuracy": 0.97})
    writer.close()
    read = lambda step: runner._fit_accuracy(str(tmp_path), "test_16", "string_accuracy", step)
    assert read(400) == 0.5 and read(800) == 0.97 and read(1200) is None


def _row(name, aa, accuracy, fit=True, intervention="", base=None, curve=None):
    return dict(
        task="prefix_sum",
        name=name,
        base=base or name,
        intervention=intervention,
        gradient="unrolled",
        fit=fit,
        steps=400,
        train_seconds=12.0,
        fit_accuracy=0.99 if fit else 0.2,
        aa=aa,
        attacked_aa=aa / 2,
        accuracy=accuracy,
        accuracy_by_budget={"test_64": curve or {"1x": accuracy, "8x": accuracy}},
        falls=False,
    )


def _rows():
    return [
        _row("a", 0.5, 0.1),
        _row("a+mixed_init", 0.95, 0.6, intervention="mixed_init", base="a"),
        _row("b", 0.8, 0.3),
        _row("c", 0.99, 0.2),
        _row("d", 0.999, 0.9),
        _row("e", 0.3, 0.99, fit=False),  # left out of the correlation
    ]


def test_summarise_counts_and_correlates_fitted_runs_only():
    summary = runner.summarise(_rows())["prefix_sum"]
    # AA ranks 1,3,2,4,5 (0.5, 0.95, 0.8, 0.99, 0.999) against accuracy ranks 1,4,3,2,5:
    # d = 0,-1,-1,2,0, rho = 1 - 6 * 6 / (5 * 24) = 0.7.
    assert summary["spearman"] == pytest.approx(0.7)
    # With e: AA ranks 2,4,3,5,6,1 against accuracy ranks 1,4,3,2,5,6: d = 1,0,0,3,1,-5,
    # rho = 1 - 6 * 36 / (6 * 35).
    assert summary["spearman_all"] == pytest.approx(1 - 6 * 36 / 210)
    assert summary["fit"] == 5 and summary["runs"] == 6
    assert summary["fit_aa_below"] == 2  # a (0.5) and b (0.8); e did not fit
    (effect,) = summary["interventions"]
    assert effect["aa"] == [0.5, 0.95] and effect["accuracy"] == [0.1, 0.6]
    assert effect["together"] is True


def test_markdown_lists_every_run_and_the_summary():
    rows = _rows()
    text = runner.markdown(rows, runner.summarise(rows), study.CPU_SCALE)
    for row in rows:
        assert f"| {row['name']} |" in text
    assert "over the 5 runs that fit: 0.700 (over all 6 runs: -0.029)" in text
    assert "| a | mixed_init | 0.500 -> 0.950 | 0.100 -> 0.600 |" in text


def test_probit_and_study_figures(tmp_path):
    assert plots.probit(0.5) == pytest.approx(0.0, abs=1e-12)
    assert plots.probit(0.975) == pytest.approx(1.959964, abs=1e-5)
    assert plots.probit(1.0) == plots.probit(1 - plots.PROBIT_EPS)
    rows = _rows()
    paths = plots.write_study_figures(rows, runner.summarise(rows), str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["study_probit.png", "study_interventions.png"]
    for path in paths:
        assert os.path.getsize(path) > 1000


def test_run_study_resumes_without_retraining(tmp_path):
    specs = study.study_specs(study.SMOKE_SCALE)
    rows = [
        {
            **_row(s.name, 0.9 + i / 100, 0.5 + i / 10, base=s.base.name),
            "intervention": s.intervention,
        }
        for i, s in enumerate(specs)
    ]
    with open(tmp_path / runner.ROWS_FILE, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = runner.run_study(str(tmp_path), study.SMOKE_SCALE, ("prefix_sum",), emit=lambda s: None)
    assert out["rows"] == rows
    assert not os.path.exists(tmp_path / "prefix_sum")  # nothing was trained
    saved = json.load(open(tmp_path / runner.SUMMARY_FILE))
    assert saved["prefix_sum"]["fit"] == 3 and math.isclose(saved["prefix_sum"]["spearman"], 1.0)
    assert (tmp_path / runner.TABLE_FILE).read_text().startswith("### prefix_sum")


@pytest.mark.slow
def test_train_until_fit_stops_at_the_threshold_or_the_cap(tmp_path):
    spec = study.study_specs(study.SMOKE_SCALE)[0]
    scale = study.SMOKE_SCALE
    kwargs = dict(split="test_8", metric="string_accuracy", chunk_steps=2)
    fits = runner.train_until_fit(
        study.spec_config(spec, scale), str(tmp_path / "fits"), threshold=0.0, **kwargs
    )
    assert fits["fit"] and fits["steps"] == 2 and len(fits["history"]) == 1
    capped = runner.train_until_fit(
        study.spec_config(spec, scale), str(tmp_path / "capped"), threshold=1.01, **kwargs
    )
    assert not capped["fit"] and capped["steps"] == 4 and len(capped["history"]) == 2
    again = runner.train_until_fit(
        study.spec_config(spec, scale), str(tmp_path / "capped"), threshold=1.01, **kwargs
    )
    assert again == capped  # finished: not trained again


@pytest.mark.slow
def test_smoke_study_end_to_end(tmp_path):
    out = runner.run_study(str(tmp_path), study.SMOKE_SCALE, ("prefix_sum",), emit=lambda s: None)
    assert len(out["rows"]) == 3
    row = out["rows"][0]
    assert {"aa", "attacked_aa", "accuracy", "accuracy_by_budget", "falls"} <= set(row)
    assert set(row["accuracy_by_budget"]["test_16"]) == {"1x", "2x"}
    assert len(out["summary"]["prefix_sum"]["interventions"]) == 1
    for path in out["figures"]:
        assert os.path.getsize(path) > 1000
