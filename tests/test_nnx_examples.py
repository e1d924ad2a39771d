"""The NNX and Equinox examples run as a user runs them: ``examples/nnx_fashion_mnist.py
--smoke`` on small idx files (train, evaluate, save and restore with orbax) and
``examples/equinox_deq.py`` (gradients against unrolled autodiff, a few training steps)."""

import json
import os
import subprocess
import sys

import pytest
from test_tasks_idx import write_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_example(name, *args):
    """``python examples/<name> *args`` with this checkout first on the path; the JSON
    of its last line."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stdout


def test_nnx_fashion_mnist_smoke_trains_saves_and_restores(tmp_path):
    data_dir, workdir = str(tmp_path / "idx"), str(tmp_path / "run")
    write_dir(data_dir, size=28, n_train=160, n_test=64)  # 28x28: the model's input size
    report, stdout = _run_example(
        "nnx_fashion_mnist.py", "--smoke", "--data_dir", data_dir, "--workdir", workdir
    )
    assert stdout.startswith("epoch 1: loss ")
    assert report["epochs"] == 1 and 0 <= report["test_accuracy"] <= 1
    assert report["restored_test_accuracy"] == report["test_accuracy"]
    assert 1 <= report["mean_solver_steps"] <= 15  # the spec's training budget
    assert os.listdir(os.path.join(workdir, "state"))


def test_equinox_example_gradients_and_training():
    pytest.importorskip("equinox")
    report, _ = _run_example("equinox_deq.py")
    for mode in ("ift", "reversible"):
        assert report["gradient_relative_difference"][mode] < 1e-4
        training = report["training"][mode]
        assert training["loss_last"] < 0.5 * training["loss_first"]
    assert report["training"]["reversible"]["solver_steps"] == 25  # the whole budget
