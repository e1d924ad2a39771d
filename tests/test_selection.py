"""Model selection on validation: the rule, the best checkpoint (kept when a score is
worse, replaced when better, read back on resume), the training loop keeping and
reporting it, `evaluate_checkpoint` scoring it, and micro-F1 combined over batches on
the evaluation path every report uses."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_on_devices

from configs import synthetic_1d
from deq_jax import tasks
from deq_jax.models import clrs
from deq_jax.training import evaluate_checkpoint, setup, train_and_evaluate
from deq_jax.training.families import evaluate, metrics, steps
from deq_jax.training.run import selection, sharding, writers
from deq_jax.training.run.checkpoint import Checkpointer
from deq_jax.training.run.selection import BestCheckpoint, SelectionRule

quiet = lambda line: None


class _Task:
    """The attributes `SelectionRule.from_config` reads."""

    eval_splits = ("val", "test")
    splits = ("train", "val", "test")
    selection_metric = ("score", "max")


def test_rule_defaults_to_the_task_and_takes_the_config_keys():
    assert SelectionRule.from_config({}, _Task()) == SelectionRule("val", "score", "max")
    assert SelectionRule.from_config({"splits": ("test",)}, _Task()).split == "test"
    named = SelectionRule.from_config(
        dict(select_split="test", select_metric="loss", select_mode=""), _Task()
    )
    assert named == SelectionRule("test", "loss", "min")  # a loss is minimised
    assert SelectionRule.from_config(dict(select_metric="nstep_mean"), _Task()).mode == "max"
    assert SelectionRule.from_config(dict(select_mode="min"), _Task()).mode == "min"
    with pytest.raises(ValueError, match=r"eval.select_split='valid'.*train, val, test"):
        SelectionRule.from_config(dict(select_split="valid"), _Task())
    with pytest.raises(ValueError, match="eval.select_mode='up' must be one of max, min"):
        SelectionRule.from_config(dict(select_mode="up"), _Task())


class _TaskWithValidation(_Task):
    """A task whose validation split is not an eval split (prefix sums, mazes)."""

    eval_splits = ("test_16", "test_32")
    splits = ("train", "valid", "test_16", "test_32")
    validation_split = "valid"


def test_rule_defaults_to_the_validation_split_before_the_eval_splits():
    task = _TaskWithValidation()
    assert SelectionRule.from_config({"splits": ("test_16",)}, task).split == "valid"
    assert SelectionRule.from_config({}, task).split == "valid"
    assert SelectionRule.from_config(dict(select_split="test_32"), task).split == "test_32"
    for name, fields in (
        ("prefix_sum", dict(train_size=8, test_size=8, test_lengths=(16,), val_size=8)),
        ("mazes", dict(train_size=8, test_size=8, test_maze_sizes=(5,), val_size=8)),
        ("matrix_inversion", dict(train_size=8, test_size=8, val_size=8)),
        ("edge_copy", dict(train_size=8, test_size=8, val_size=8)),
        ("digits", {}),
        ("blurry_digits", {}),
    ):
        assert SelectionRule.from_config({}, tasks.get(name, **fields)).split == "valid", name


def test_task_defaults(tmp_path):
    (tmp_path / "text.txt").write_text("to be or not to be\n" * 50, encoding="utf-8")
    text = tasks.get("char_text", path=str(tmp_path / "text.txt"), data_dir=str(tmp_path))
    assert text.selection_metric == ("bpc", "min")

    ps = tasks.get("prefix_sum", train_size=8, test_size=8, test_lengths=(16,))
    assert ps.selection_metric == ("string_accuracy", "max")
    kruskal = clrs.ClrsTask(clrs.ClrsConfig("mst_kruskal", test_nodes=(12,), eval_size=4))
    assert kruskal.selection_metric == ("score", "max")
    syn = tasks.get("synthetic_1d", train_size=8, validation_size=8)
    assert syn.selection_metric == ("mse", "min")


def test_better_and_score():
    up, down = SelectionRule("val", "score", "max"), SelectionRule("val", "mse", "min")
    assert up.better(0.5, None) and up.better(0.6, 0.5)
    assert not up.better(0.5, 0.5) and not up.better(0.4, 0.5)  # ties keep the earlier
    assert down.better(0.1, 0.2) and not down.better(0.3, 0.2)
    assert not up.better(float("nan"), 0.1) and up.better(0.0, float("nan"))
    assert up.score({"score": 0.25, "count": 3}) == 0.25
    with pytest.raises(KeyError, match=r"by 'score'.*reports count, loss.*eval.select_metric"):
        up.score({"loss": 1.0, "count": 3})


def _state(value):
    return {"w": np.full((3,), value, np.float32), "step": np.asarray(0, np.int32)}


def test_best_checkpoint_kept_when_worse_replaced_when_better_and_read_back(tmp_path):
    rule = SelectionRule("val", "score", "max")
    best = BestCheckpoint(str(tmp_path), rule)
    assert best.step is None
    saved = [best.offer(s, _state(s), score) for s, score in [(2, 0.5), (4, 0.3), (6, 0.7)]]
    assert saved == [True, False, True]
    assert not best.offer(8, _state(8.0), 0.7)  # a tie keeps the earlier
    assert (best.step, best.score) == (6, 0.7)
    np.testing.assert_array_equal(best.restore(_state(0.0))["w"], np.full(3, 6.0))
    best.close()
    assert sorted(os.listdir(tmp_path / selection.BEST_DIR)) == ["6"]
    assert selection.read_best_record(str(tmp_path)) == dict(
        step=6, score=0.7, split="val", metric="score", mode="max"
    )
    resumed = BestCheckpoint(str(tmp_path), rule)  # a restart reads the best so far back
    assert (resumed.step, resumed.score) == (6, 0.7)
    assert not resumed.offer(10, _state(10.0), 0.6)
    assert resumed.offer(12, _state(12.0), 0.9) and resumed.step == 12
    resumed.close()
    lines = []
    other = BestCheckpoint(str(tmp_path), SelectionRule("val", "loss", "min"), lines.append)
    assert other.step is None  # selected by another rule: set aside, said once
    assert "was selected by val score (max); selecting by val loss (min)" in lines[0]
    assert other.offer(12, _state(-12.0), 3.0)  # the set-aside checkpoint's step: replaced
    np.testing.assert_array_equal(other.restore(_state(0.0))["w"], np.full(3, -12.0))
    other.close()


def test_restore_selected_defaults_to_the_best(tmp_path):
    last = _state(9.0)
    state, step, which = selection.restore_selected(str(tmp_path), last, 9)
    assert (step, which) == (9, "last")  # no best checkpoint: the last
    with pytest.raises(FileNotFoundError, match="--checkpoint=last"):
        selection.restore_selected(str(tmp_path), last, 9, "best")
    with pytest.raises(ValueError, match="best, last"):
        selection.restore_selected(str(tmp_path), last, 9, "first")
    best = BestCheckpoint(str(tmp_path), SelectionRule("val", "score", "max"))
    best.offer(4, _state(4.0), 0.5)
    best.close()
    state, step, which = selection.restore_selected(str(tmp_path), last, 9)
    assert (step, which, float(state["w"][0])) == (4, "best", 4.0)
    assert selection.restore_selected(str(tmp_path), last, 9, "last")[1:] == (9, "last")
    text = selection.describe_selected(str(tmp_path), "best", 9)
    assert text == "the best by val score (max) 0.5000; the last is step 9"


# Validation MSEs the training loop sees, by step (the smoke run evaluates every 2 of 6
# steps and scores the last state at the end): step 4 is the best, step 6 worse.
SCORES = {2: 0.5, 4: 0.2, 6: 0.9}


def _config():
    """The synthetic 1-D smoke run (the cheapest to compile), evaluated every 2 steps."""
    config = synthetic_1d.get_config("smoke")
    config.regularizer.update(dict(jacobian_weight=0.0, spectral_every=0))
    config.eval.update(dict(every_steps=2, budget_multipliers=(1,)))
    config.log.tensorboard = False
    return config


def _train(config, workdir, emit=quiet):
    """Trains with `SCORES` in place of each offer's validation score; returns the
    result and the real scores offered, by step."""
    real_offer, real = BestCheckpoint.offer, {}

    def offer(self, step, state, score):
        real[step] = score
        return real_offer(self, step, state, SCORES[step])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BestCheckpoint, "offer", offer)
        return train_and_evaluate(config, workdir, emit=emit), real


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(config, workdir, result, real scores, lines) of one controlled smoke run."""
    config, workdir, lines = _config(), str(tmp_path_factory.mktemp("run")), []
    result, real = _train(config, workdir, lines.append)
    return config, workdir, result, real, lines


def test_training_keeps_the_best_and_reports_it(finished):
    config, workdir, result, real, lines = finished
    assert sorted(real) == [2, 4, 6]
    record = selection.read_best_record(workdir)
    assert record == dict(step=4, score=0.2, split="validation", metric="mse", mode="min")
    assert sorted(os.listdir(os.path.join(workdir, selection.BEST_DIR))) == ["4"]
    # The real score offered at a periodic evaluation is that evaluation's metric.
    logged = {r["step"]: r for r in writers.read_metrics(workdir) if r["split"] == "validation"}
    for step in (2, 4):
        assert real[step] == logged[step]["mse"]
    # The best state is step 4's: the regular checkpoint of that step holds the same.
    run = setup(config, workdir)
    run.checkpointer.close()
    assert run.start_step == 6
    best = BestCheckpoint(workdir)
    chex.assert_trees_all_close(
        jax.device_get(best.restore(run.state).params), _regular(run.state, workdir, 4)
    )
    best.close()
    with open(os.path.join(workdir, evaluate.REPORT_FILE)) as f:
        report = json.load(f)
    assert report["step"] == 6 and report["best"]["step"] == 4
    chex.assert_trees_all_close(result.report, report["report"])
    final = "Final evaluation at step 6 of the best checkpoint, step 4 (validation mse (min) 0.2"
    assert any(line.startswith(final) for line in lines)


def test_evaluate_checkpoint_scores_the_best_and_names_its_step(finished):
    config, workdir, _, _, _ = finished
    with open(os.path.join(workdir, evaluate.REPORT_FILE)) as f:
        reported = json.load(f)["report"]["1x"]["validation"]
    said = []
    scored = evaluate_checkpoint(config, workdir, ("validation",), (6,), emit=said.append)
    assert said[0].startswith("Checkpoint step 4 of ")
    assert "(the best by validation mse (min) 0.2000; the last is step 6)" in said[0]
    chex.assert_trees_all_close(scored["max_iter=6"]["validation"], reported)  # the same state
    said = []
    last = evaluate_checkpoint(
        config, workdir, ("validation",), (6,), emit=said.append, checkpoint="last"
    )
    assert said[0].startswith("Checkpoint step 6 of ") and "(the last)" in said[0]
    assert last["max_iter=6"]["validation"]["mse"] != reported["mse"]
    first = evaluate_checkpoint(
        config, workdir, ("validation",), (6, 8), emit=said.append, max_batches=1
    )
    for budget in ("max_iter=6", "max_iter=8"):
        assert first[budget]["validation"]["count"] == config.eval.batch_size
    assert reported["count"] > config.eval.batch_size


def _regular(template, workdir, step):
    """The parameters of the regular checkpoint ``step`` of ``workdir``."""
    ckpt = Checkpointer(workdir, every_steps=1, keep=10)
    state = ckpt._restore(step, template)
    ckpt.close()
    return jax.device_get(state.params)


@pytest.mark.slow  # two invocations; BestCheckpoint's read-back is tested above
def test_resume_keeps_the_best_so_far(tmp_path):
    config, workdir = _config(), str(tmp_path)
    config.train.stop_at_step = 4
    _train(config, workdir)
    assert selection.read_best_record(workdir)["step"] == 4
    config.train.stop_at_step = 0
    lines = []
    result, real = _train(config, workdir, lines.append)
    assert "resuming from step 4" in lines[0] and sorted(real) == [6]
    # Step 6 scored 0.9: worse than the 0.2 read back, so step 4 stays the best.
    assert selection.read_best_record(workdir)["step"] == 4
    assert sorted(os.listdir(os.path.join(workdir, selection.BEST_DIR))) == ["4"]
    with open(os.path.join(workdir, evaluate.REPORT_FILE)) as f:
        assert json.load(f)["best"]["step"] == 4
    assert result.step == 6


class _AllEdgesStep:
    """An eval step that predicts every edge of each graph (its adjacency, no self-loops),
    scored by the task's own metrics: the split's F1 is `ClrsTask.all_edges_score`."""

    def __init__(self, task):
        self.task = task

    def __call__(self, state, batch):
        adjacency = batch["inputs"]  # [b, n, n], self-loops included
        edges = (adjacency > 0) & ~jnp.eye(adjacency.shape[-1], dtype=bool)
        logits = jnp.stack([jnp.zeros(edges.shape), jnp.where(edges, 1.0, -1.0)], -1)
        out = self.task.metrics(logits, batch["targets"], batch["mask"])
        return dict(out, loss=jnp.zeros(()), nstep_mean=jnp.ones(()), nstep_max=jnp.ones(()))


def test_the_evaluator_combines_micro_f1_from_counts_at_any_batch_size(monkeypatch):
    """Training's periodic and final evaluation, `evaluate_checkpoint`, the CLRS report,
    the Jacobian report and the neural-solver evaluation all score a split through
    `Evaluator.evaluate`: its F1 must be the whole split's, not a mean over batches."""
    task = clrs.ClrsTask(clrs.ClrsConfig("mst_kruskal", test_nodes=(12,), eval_size=20))
    monkeypatch.setattr(
        steps, "make_eval_step", lambda model, fn, mesh, *a, **k: _AllEdgesStep(task)
    )
    expected = task.all_edges_score("test_12")
    mesh = sharding.make_mesh()
    per_batch = []
    for batch_size in (20, 8, 3):
        evaluator = evaluate.Evaluator(None, task, mesh, batch_size)
        got = evaluator.evaluate(None, "test_12")
        assert got["score"] == pytest.approx(expected, rel=1e-6), batch_size
        assert got["count"] == 20
        per_batch = [
            _AllEdgesStep(task)(None, evaluate.device_batch(b, mesh, task.batch_extras))
            for b in task.eval_iterator("test_12", batch_size)
        ]
    # At 3 graphs a batch, the mean of the batches' F1s differs: the check can fail.
    mean_of_f1 = metrics.combine(jax.device_get(per_batch))["score"]
    assert mean_of_f1 != pytest.approx(expected, rel=1e-4)


_DEVICES_SCRIPT = """
import json, sys
sys.path.insert(0, "tests")
import test_selection
report, _ = test_selection._train(test_selection._config(), sys.argv[1])
print("RESULT " + json.dumps({"best": test_selection.selection.read_best_record(sys.argv[1]),
                              "report": report.report}))
"""


def _on_devices(devices, workdir):
    return run_on_devices(_DEVICES_SCRIPT, workdir, devices=devices)


@pytest.mark.slow  # two subprocesses; the 1-vs-8 device losses are in CI
def test_same_selection_and_report_on_one_and_eight_devices(tmp_path):
    one, eight = _on_devices(1, tmp_path / "one"), _on_devices(8, tmp_path / "eight")
    assert one["best"] == eight["best"] and one["best"]["step"] == 4
    chex.assert_trees_all_close(eight["report"], one["report"], atol=1e-5, rtol=0)
