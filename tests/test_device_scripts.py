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


def test_precision_script_dry_run_prints_every_stage(tmp_path):
    done = _run_script("precision.sh", str(tmp_path / "out"), "/corpus", DRY_RUN="1")
    lines = done.stdout.splitlines()
    steps = [line for line in lines if "-m benchmarks.step_time" in line]
    assert len(steps) == 8  # lm and mdeq, two precisions, two rounds
    assert sum("--config.deq.precision=bfloat16" in line for line in steps) == 4
    assert all("--out" in line and "steps.jsonl" in line for line in steps)
    assert sum("--config.model.d_model=512" in line for line in steps) == 4
    assert sum("mdeq_cifar10.py:small" in line and "--batch 128" in line for line in steps) == 4
    twins = [line for line in lines if "lm_twin.py" in line or "mdeq_twin.py" in line]
    assert len(twins) == 4 and sum("--tf32" in line for line in twins) == 2
    assert all("TWIN_DEVICE=cuda" in line for line in twins)
    trains = [line for line in lines if "-m launch.main" in line]
    evals = [line for line in lines if "-m launch.evaluate" in line]
    assert len(trains) == len(evals) == 2
    assert all("--config.task.path=/corpus" in line for line in trains + evals)
    assert all("--checkpoint=last" in line for line in evals)
    assert any("-m benchmarks.solvers --loop_cost" in line for line in lines)


def test_precision_table_reads_the_records_and_judges_the_goals(tmp_path):
    from experiments.precision import gpu_table

    def record(tag, train_ms, nstep_max, tflops):
        summary = lambda v: {"median": v, "mean": v, "max": v}
        return dict(
            tag=tag,
            config={"deq": {"train_max_iter": 20}},
            train_ms=summary(train_ms),
            eval_ms=summary(train_ms / 3),
            f_eval_ms=summary(1.0),
            f_eval_tflops_per_s=tflops,
            f_eval_fraction_of_peak=None,
            train_fwd_nstep_mean=summary(nstep_max - 1),
            train_fwd_nstep_max=summary(nstep_max),
            train_bwd_nstep_mean=summary(6.0),
            eval_nstep_mean=summary(6.0),
        )

    records = [
        record("lm_default_1", 34.0, 9, 77.0),
        record("lm_bfloat16_1", 19.0, 8, 160.0),
        record("mdeq_default_1", 50.0, 12, 10.0),
        record("mdeq_bfloat16_1", 40.0, 20, 12.0),
    ]
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    for precision, bpc in (("default", 2.40), ("bfloat16", 2.43)):
        (tmp_path / f"eval_{precision}.json").write_text(
            json.dumps({"max_iter=20": {"valid": {"bpc": bpc}}})
        )
        (tmp_path / f"train_{precision}.log").write_text(
            "step 900/20000  loss 2 solver steps 7.5 (max 9)\n"
        )
        os.makedirs(tmp_path / f"train_{precision}")
        (tmp_path / f"train_{precision}" / "config.json").write_text(
            json.dumps({"deq": {"train_max_iter": 20}})
        )
    result = gpu_table.main(["gpu_table", str(tmp_path)])
    goals = result["goals"]
    assert goals["lm_bf16_step_ratio"] == [19.0 / 34.0, True]
    assert goals["mdeq_bf16_step_ratio"][1] is False
    assert goals["lm_bf16_f_tflops"] == [160.0, True]
    assert goals["mdeq_bf16_solves_end_by_tol_or_floor"] == [20, False]
    assert goals["bpc_bf16_minus_default"][1] is False  # 0.03 > 0.02
    assert goals["tpu_default_arithmetic_trains_without_burn"] == [7.5, True]
    assert (tmp_path / "table.md").read_text().count("|") > 50


@pytest.mark.slow
def test_precision_script_runs_its_smoke_size_and_writes_the_table(tmp_path):
    corpus = write_corpus(tmp_path / "plays.txt")
    out = tmp_path / "out"
    _run_script(
        "precision.sh",
        str(out),
        os.path.dirname(corpus),
        SIZE="smoke",
        ROUNDS="1",
        TRAIN_SECONDS="60",
        EVAL_BATCHES="2",
        STAGES="lm train",
    )
    table = json.loads((out / "table.json").read_text())
    assert [(r["model"], r["precision"]) for r in table["steps"]] == [
        ("lm", "default"),
        ("lm", "bfloat16"),
    ]
    assert table["steps"][1]["floor"] is not None and table["steps"][0]["floor"] is None
    assert set(table["training"]) == {"default", "bfloat16"}
    assert all(run["valid_bpc"] > 0 for run in table["training"].values())


def test_neural_solver_script_dry_run_prints_every_stage(tmp_path):
    out = tmp_path / "out"
    done = _run_script("neural_solver.sh", str(out), "/fm", DRY_RUN="1")
    lines = done.stdout.splitlines()
    assert len(lines) == 4  # mdeq, fit, sweep, diagnose; nothing run
    mdeq, fit, sweep, diagnose = lines
    assert "configs/mdeq_fashion_mnist.py:jacobian" in mdeq and "--config.train.steps=1900" in mdeq
    assert "configs/mdeq_fashion_mnist_hypersolver.py:jacobian " in fit
    assert f"--config.neural_solver.deq_workdir={out}/mdeq" in fit
    assert "--config.neural_solver.ablations=False" in fit
    assert "-m experiments.neural_solver.pareto" in sweep
    assert "--budgets=4,5,6,7,8,9,10,11,12" in sweep and "--split=test" in sweep
    assert "--max_batches=10" in sweep and "--config.eval.batch_size=500" in sweep  # 5,000
    assert "--solvers=anderson,hyper_anderson,init_only" in sweep
    assert "-m experiments.neural_solver.diagnose" in diagnose
    assert all("--config.task.dir=/fm" in line for line in lines)
    assert not (out / "solver").exists()


@pytest.mark.slow
def test_neural_solver_script_runs_its_smoke_size(tmp_path):
    out = tmp_path / "out"
    done = _run_script("neural_solver.sh", str(out), SIZE="smoke")
    report = json.loads((out / "solver" / "solver_pareto.json").read_text())
    assert report["budgets"] == [2, 3] and report["split"] == "test"
    assert set(report["table"]) == {"anderson", "hyper_anderson", "init_only"}
    fit = json.loads((out / "solver" / "neural_solver.json").read_text())
    assert fit["spec"]["l2"] == 0.02 and fit["spec"]["fresh_batches"]
    assert (out / "solver" / "diagnose.json").exists()
    assert re.search(r"hyper_anderson: budget .*goal >= 1.6x (met|not met)", done.stdout)


def test_shared_run_helper_times_out_reports_and_carries_on(tmp_path):
    """experiments/gpu/lib.sh: `run` says a stage's exit status (124 past its limit),
    keeps its output in the log, tails it on request, returns 0; DRY_RUN prints only."""
    script = f"""
source experiments/gpu/lib.sh
run 5 {tmp_path}/fail.log sh -c 'echo one; echo two; exit 3'
run 1 {tmp_path}/slow.log sleep 30
RUN_TAIL=1 run 5 {tmp_path}/tail.log sh -c 'echo first; echo last'
DRY_RUN=1 run 5 {tmp_path}/dry.log touch {tmp_path}/made
echo done $?
"""
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "done 0", done.stdout + done.stderr
    exits = [line.split("exit ")[1] for line in lines if "] exit " in line]
    assert exits == ["3", "124", "0"], lines
    assert (tmp_path / "fail.log").read_text() == "one\ntwo\n"
    assert "last" in lines and "first" not in lines
    assert f"touch {tmp_path}/made" in lines and not (tmp_path / "made").exists()
