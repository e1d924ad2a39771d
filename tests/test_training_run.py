"""End-to-end: the smoke prefix-sum run, resuming, refusing a wrong checkpoint, NaN stops,
rerunning a finished run."""

import json
import os
import shutil
import time

import chex
import jax
import numpy as np
import pytest

from configs import prefix_sum
from deq_jax.training import evaluate_checkpoint, setup, train_and_evaluate
from deq_jax.training.loop.train import NonFiniteLossError
from deq_jax.training.run import build, selection, writers
from deq_jax.training.run.checkpoint import CheckpointMismatchError

quiet = lambda line: None


def smoke_config(data_dir):
    config = prefix_sum.get_config("smoke")
    config.task.data_dir = str(data_dir)
    return config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """An uninterrupted smoke run: (config, workdir, RunResult)."""
    workdir = str(tmp_path_factory.mktemp("run"))
    config = smoke_config(data_dir)
    lines = []
    result = train_and_evaluate(config, workdir, emit=lines.append)
    return config, workdir, result, lines


def _snapshot(directory):
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = (os.path.getmtime(path), f.read())
    return out


def test_smoke_run_writes_everything(finished):
    config, workdir, result, lines = finished
    assert result.step == config.train.steps
    ckpt_dir = os.path.join(workdir, "checkpoints")
    assert sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit()) == [4, 6]
    records = writers.read_metrics(workdir)
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4, 6]
    for key in (
        "loss",
        "accuracy",
        "nstep_mean",
        "nstep_max",
        "rel_residual",
        "grad_norm",
        "param_norm",
        "learning_rate",
    ):
        assert np.isfinite(train[-1][key]), key
    assert {r["split"] for r in records} >= {"test_16", "test_32"}
    for split in ("train", "test_16"):
        events = os.listdir(os.path.join(workdir, "tensorboard", split))
        assert any(e.startswith("events.out.tfevents") for e in events)
    with open(os.path.join(workdir, "length_generalization.json")) as f:
        report = json.load(f)
    assert report["budgets"] == {"1x": 6, "2x": 12}
    for budget in ("1x", "2x"):
        for split in ("test_16", "test_32"):
            metrics = report["report"][budget][split]
            assert 0 <= metrics["string_accuracy"] <= metrics["bit_accuracy"] <= 1
    assert any(
        line.startswith("step 6/6") and "steps/s" in line and "ETA" in line for line in lines
    )
    assert any("Per-length accuracy" in line for line in lines)
    # Model selection scores the validation split (new 16-bit strings), not a test split.
    record = selection.read_best_record(workdir)
    assert (record["split"], record["metric"], record["mode"]) == (
        "valid",
        "string_accuracy",
        "max",
    )
    assert record["step"] in (4, 6)


def test_resume_gives_the_uninterrupted_parameters(finished, tmp_path, data_dir):
    config, _, uninterrupted, _ = finished
    stopped = smoke_config(data_dir)
    stopped.train.stop_at_step = 3
    first = train_and_evaluate(stopped, str(tmp_path), emit=quiet)
    assert first.step == 3 and first.report == {}
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [2, 3]
    lines = []
    resumed = train_and_evaluate(config, str(tmp_path), emit=lines.append)
    assert "resuming from step 3" in lines[0]
    assert int(resumed.state.step) == config.train.steps
    chex.assert_trees_all_close(
        jax.device_get(resumed.state.params),
        jax.device_get(uninterrupted.state.params),
        atol=1e-6,
        rtol=1e-6,
    )
    train = [r for r in writers.read_metrics(str(tmp_path)) if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 3, 4, 6]


def test_mismatched_checkpoint_is_refused_and_left_untouched(finished):
    config, workdir, _, _ = finished
    before = _snapshot(os.path.join(workdir, "checkpoints"))
    wider = smoke_config(config.task.data_dir)
    wider.model.width = 2 * config.model.width
    with pytest.raises(CheckpointMismatchError, match=r"does not fit the model.*\n.*cell/"):
        setup(wider, workdir)
    assert _snapshot(os.path.join(workdir, "checkpoints")) == before
    run = setup(config, workdir)
    run.checkpointer.close()
    assert run.start_step == config.train.steps


class _NaNInputsAt:
    """A task whose training batches number ``steps`` (1-based) have NaN inputs."""

    def __init__(self, task, *steps):
        self._task, self._steps = task, steps

    def __getattr__(self, name):
        return getattr(self._task, name)

    def train_iterator(self, batch_size, *, start_step=0, **kwargs):
        it = self._task.train_iterator(batch_size, start_step=start_step, **kwargs)
        for step, batch in enumerate(it, start=start_step + 1):
            if step in self._steps:
                batch = dict(batch, inputs=np.full_like(batch["inputs"], np.nan))
            yield batch


def test_non_finite_steps_in_a_row_stop_and_keep_the_last_good_checkpoint(
    tmp_path, data_dir, monkeypatch
):
    real = build.build_task
    monkeypatch.setattr(build, "build_task", lambda *a: _NaNInputsAt(real(*a), 3, 4))
    config = smoke_config(data_dir)
    config.train.max_nonfinite_steps = 2
    lines = []
    with pytest.raises(
        NonFiniteLossError,
        match=r"at step 4, 2 step\(s\) in a row \(steps 3 to 4.*last good checkpoint is step 2",
    ):
        train_and_evaluate(config, str(tmp_path), emit=lines.append)
    assert any(line.startswith("Non-finite training loss") and "step 3" in line for line in lines)
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [2]
    monkeypatch.setattr(build, "build_task", real)
    run = setup(config, str(tmp_path))
    run.checkpointer.close()
    assert run.start_step == 2
    chex.assert_tree_all_finite(run.state.params)


def test_a_non_finite_step_is_skipped_counted_and_logged(tmp_path, data_dir, monkeypatch):
    real = build.build_task
    monkeypatch.setattr(build, "build_task", lambda *a: _NaNInputsAt(real(*a), 3))
    config = smoke_config(data_dir)
    config.train.stop_at_step = 4
    lines = []
    result = train_and_evaluate(config, str(tmp_path), emit=lines.append)
    assert result.step == 4 and int(result.state.step) == 4
    chex.assert_tree_all_finite(result.state.params)
    skips = [line for line in lines if line.startswith("Non-finite training loss")]
    assert len(skips) == 1 and "at step 3: update skipped" in skips[0]
    train = {r["step"]: r for r in writers.read_metrics(str(tmp_path)) if r["split"] == "train"}
    assert train[2]["skipped_steps"] == 0 and train[4]["skipped_steps"] == 1
    assert np.isfinite(train[4]["loss"]) and np.isfinite(train[4]["grad_norm"])
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [2, 4]


def test_evaluate_checkpoint_on_any_split_and_budget(finished):
    config, workdir, _, _ = finished
    lines = []
    report = evaluate_checkpoint(
        config, workdir, ("test_32",), (3, 12), emit=lines.append, checkpoint="last"
    )  # the default, the best checkpoint: tests/test_selection.py
    assert set(report) == {"max_iter=3", "max_iter=12"}
    metrics = report["max_iter=3"]["test_32"]
    assert metrics["count"] == config.task.test_size and metrics["nstep_max"] <= 3
    assert "Checkpoint step 6" in lines[0]


def test_evaluate_checkpoint_needs_a_checkpoint(tmp_path, data_dir):
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        evaluate_checkpoint(smoke_config(data_dir), str(tmp_path), emit=quiet)


def _tree(directory):
    """Every file (with its mtime and bytes) and every directory under ``directory``."""
    dirs = sorted(os.path.relpath(root, directory) for root, _, _ in os.walk(directory))
    return dirs, _snapshot(directory)


def test_final_evaluation_prints_a_short_line_per_split_before_the_report(finished):
    _, _, _, lines = finished
    start = next(i for i, line in enumerate(lines) if line.startswith("Final evaluation at step 6"))
    table = next(i for i, line in enumerate(lines) if line.startswith("Per-length accuracy"))
    assert lines[start - 1].startswith("step 6/6")
    progress = lines[start + 1 : table]
    assert [line.split(":")[0].strip() for line in progress] == [
        "1x (6 iterations) test_16",
        "1x (6 iterations) test_32",
        "2x (12 iterations) test_16",
        "2x (12 iterations) test_32",
    ]
    assert all("bit_accuracy" in line and "nstep_mean" in line for line in progress)
    assert not any(line.startswith("eval step") for line in lines[table:])
    for line in lines:
        if line.startswith("eval step") or line in progress:
            assert len(line) <= 105, line


def test_rerunning_a_finished_run_says_so_and_writes_nothing(finished):
    config, workdir, result, _ = finished
    before = _tree(workdir)
    lines = []
    again = train_and_evaluate(config, workdir, emit=lines.append)
    assert len(lines) == 1
    assert f"The run in {workdir} is finished (step 6, train.steps=6)" in lines[0]
    assert "Raise --config.train.steps to train further" in lines[0]
    assert _tree(workdir) == before
    assert again.step == 6 and set(again.report) == set(result.report)
    chex.assert_trees_all_close(again.report, result.report, rtol=1e-6)
    chex.assert_trees_all_close(again.eval_metrics, result.eval_metrics, rtol=1e-6)


def test_earlier_report_is_the_one_written_at_or_before_the_restored_step(tmp_path):
    from deq_jax.training.loop.train import earlier_report

    assert earlier_report(str(tmp_path), "report.json", 6) is None  # no report
    (tmp_path / "report.json").write_text(json.dumps({"step": 6, "train_seconds": 5.0}))
    assert earlier_report(str(tmp_path), "report.json", 6)["train_seconds"] == 5.0
    assert earlier_report(str(tmp_path), "report.json", 8)["step"] == 6  # continued
    assert earlier_report(str(tmp_path), "report.json", 4) is None  # a later run's report
    assert earlier_report(str(tmp_path), "report.json", 0) is None  # training from scratch


@pytest.mark.slow  # resuming is in CI (test_resume_gives_the_uninterrupted_parameters)
def test_a_larger_train_steps_continues_without_duplicates_and_keeps_the_time(finished, tmp_path):
    config, workdir, _, _ = finished
    run_dir = tmp_path / "run"
    shutil.copytree(workdir, run_dir)
    report_path = run_dir / "length_generalization.json"
    saved = json.loads(report_path.read_text())
    saved["train_seconds"] = 1000.0  # a known earlier training time
    report_path.write_text(json.dumps(saved))
    longer = smoke_config(config.task.data_dir)
    longer.train.steps = 8
    lines = []
    began = time.perf_counter()
    result = train_and_evaluate(longer, str(run_dir), emit=lines.append)
    wall = time.perf_counter() - began
    assert "resuming from step 6" in lines[0] and result.step == 8
    report = json.loads(report_path.read_text())
    assert report["step"] == 8
    assert 1000.0 < report["train_seconds"] < 1000.0 + wall
    keys = [(r["step"], r["split"]) for r in writers.read_metrics(str(run_dir))]
    assert len(keys) == len(set(keys))
    assert {(6, "test_16_1x"), (8, "test_16_1x"), (8, "train")} <= set(keys)
    lines = []
    train_and_evaluate(longer, str(run_dir), emit=lines.append)
    assert len(lines) == 1 and "is finished (step 8, train.steps=8)" in lines[0]
