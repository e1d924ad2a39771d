"""Checkpoints written by the two training loops before they became one (commit 1f5c51c)
restore in the one loop, and the resumed run continues them exactly.

``tests/data/checkpoints_1f5c51c/`` holds, per family, a mid-run checkpoint of a smoke
run of that commit (prefix sums at step 4 of 6; the language model at step 2 of 4, the
end of its weight-tied warm-up, with its segment memory), the run's ``config.json``,
and ``expected.json``: the train loss that run logged at every step.
"""

import json
import os
import shutil

import numpy as np
from ml_collections import ConfigDict

from deq_jax.training import train_and_evaluate
from deq_jax.training.run import writers

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "checkpoints_1f5c51c")


def _saved_run(name, tmp_path):
    """A workdir holding the saved checkpoint and the config it was trained with, and
    the losses its uninterrupted run logged."""
    source, workdir = os.path.join(DATA, name), str(tmp_path / name)
    shutil.copytree(os.path.join(source, "checkpoints"), os.path.join(workdir, "checkpoints"))
    if os.path.exists(os.path.join(source, "vocab.json")):
        shutil.copy(os.path.join(source, "vocab.json"), workdir)
    with open(os.path.join(source, "config.json")) as f:
        config = ConfigDict(json.load(f))
    with open(os.path.join(source, "expected.json")) as f:
        expected = {int(k): v for k, v in json.load(f)["train_loss"].items()}
    config.task.data_dir = str(tmp_path / "data")
    config.log.tensorboard = False
    return config, workdir, expected


def _resumed_losses(config, workdir):
    lines = []
    result = train_and_evaluate(config, workdir, emit=lines.append)
    assert result.step == config.train.steps
    assert any("resuming from step" in line for line in lines[:2])
    train = [r for r in writers.read_metrics(workdir) if r["split"] == "train"]
    return result, {r["step"]: r["loss"] for r in train}


def test_a_task_checkpoint_of_the_old_loop_resumes_exactly(tmp_path):
    config, workdir, expected = _saved_run("prefix_sum", tmp_path)
    result, losses = _resumed_losses(config, workdir)
    assert sorted(losses) == [5, 6]  # resumed at the saved step 4
    np.testing.assert_allclose([losses[5], losses[6]], [expected[5], expected[6]], rtol=1e-6)
    assert set(result.report) == {"1x", "2x"}


def test_a_language_model_checkpoint_of_the_old_loop_resumes_with_its_memory(tmp_path):
    config, workdir, expected = _saved_run("lm", tmp_path)
    config.task.path = os.path.join(DATA, "lm", "plays.txt")
    result, losses = _resumed_losses(config, workdir)
    assert sorted(losses) == [3, 4]  # the DEQ steps after the saved warm-up
    np.testing.assert_allclose([losses[3], losses[4]], [expected[3], expected[4]], rtol=1e-6)
    assert result.carry is not None and set(result.report) == {"valid", "test"}
