"""The command line: override validation, and (slow) the real train + evaluate commands."""

import json
import os

import pytest
from conftest import run_module

from configs import prefix_sum
from launch import flags as launch_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_override_keys_of_every_flag_form():
    argv = [
        "--config",
        "c.py",
        "--config.train.steps=3",
        "--config.deq.solver.name",
        "broyden",
        "--noconfig.train.distributed",
        "-config.model.width=8",
        "--workdir=/tmp/x",
    ]
    assert launch_flags.override_keys(argv) == [
        "train.steps",
        "deq.solver.name",
        "train.distributed",
        "model.width",
    ]
    assert launch_flags._flag_value(argv, "config") == "c.py"
    assert launch_flags._flag_value(["--config=a.py:smoke"], "config") == "a.py:smoke"


def test_load_config_file_with_argument():
    config = launch_flags.load_config_file(os.path.join(ROOT, "configs/prefix_sum.py:smoke"))
    assert config == prefix_sum.get_config("smoke")
    with pytest.raises(FileNotFoundError, match="nope.py"):
        launch_flags.load_config_file("nope.py")


def test_known_overrides_pass():
    launch_flags.check_overrides(
        prefix_sum.get_config(),
        ["train.steps", "deq.solver.anderson.m", "deq.backward.ift.solver", "deq.z_init"],
    )


@pytest.mark.parametrize(
    "key,message",
    [
        (
            "train.stepz",
            "config.train has no field 'stepz'. Valid fields of config.train: b1, b2, batch_size,",
        ),
        ("trainz.steps", "config has no field 'trainz'. Valid fields of config: ckpt, deq, eval,"),
        ("deq.solver.anderson.mm", "Valid fields of config.deq.solver.anderson: beta, lam, m."),
        (
            "solver.anderson.m",
            "--config.solver.anderson.m has moved to --config.deq.solver.anderson.m",
        ),
        ("model.z_init", "--config.model.z_init has moved to --config.deq.z_init"),
        ("eval.settle_tol", "--config.eval.settle_tol has moved to --config.deq.settle_tol"),
        (
            "neural_solver.max_iter",
            "--config.neural_solver.max_iter has moved to --config.deq.neural_solver.max_iter",
        ),
        ("train.steps.x", "config.train.steps is not a section."),
    ],
)
def test_unknown_override_names_valid_fields(key, message):
    with pytest.raises(launch_flags.UnknownOverrideError) as info:
        launch_flags.check_overrides(prefix_sum.get_config(), [key])
    assert message in str(info.value)


def test_unknown_override_fails_at_once_on_the_command_line(tmp_path):
    proc = run_module(
        "launch.main",
        "--config",
        "configs/prefix_sum.py:smoke",
        "--workdir",
        str(tmp_path / "w"),
        "--config.train.stepz=3",
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Unknown config override --config.train.stepz" in proc.stderr
    assert "Valid fields of config.train:" in proc.stderr and "steps" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_missing_workdir_is_a_usage_error():
    proc = run_module("launch.main", "--config", "configs/prefix_sum.py:smoke", timeout=120)
    assert proc.returncode != 0 and "workdir" in proc.stderr


@pytest.mark.slow
def test_train_then_evaluate_commands(tmp_path):
    workdir = str(tmp_path / "run")
    common = [
        "--config",
        "configs/prefix_sum.py:smoke",
        "--workdir",
        workdir,
        f"--config.task.data_dir={tmp_path / 'data'}",
    ]
    proc = run_module("launch.main", *common, "--config.deq.solver.name=broyden")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 6/6" in proc.stdout and "Per-length accuracy" in proc.stdout
    for name in ("metrics.jsonl", "length_generalization.json", "config.json"):
        assert os.path.exists(os.path.join(workdir, name))
    proc = run_module(
        "launch.evaluate",
        *common,
        "--config.deq.solver.name=broyden",
        "--splits=test_32",
        "--max_iters=3,12",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(workdir, "evaluation.json")) as f:
        report = json.load(f)
    assert set(report) == {"max_iter=3", "max_iter=12"}
    assert set(report["max_iter=12"]) == {"test_32"}
