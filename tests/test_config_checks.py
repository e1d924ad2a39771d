"""Config-time errors fail at once, clearly, before any data or directory (issue 36)."""

import os

import pytest
from conftest import run_module

from configs import clrs as clrs_configs
from configs import prefix_sum
from deq_jax.training import evaluate_checkpoint, train_and_evaluate
from deq_jax.training.setup import check_config
from launch import flags as launch_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**fields):
    config = prefix_sum.get_config("smoke")
    for dotted, value in fields.items():
        section, _, key = dotted.rpartition("__")
        node = config
        for part in section.split("__"):
            node = node[part]
        node[key] = value
    return config


@pytest.mark.parametrize(
    "fields,message",
    [
        (
            {"deq__solver__name": "andersn"},
            # a prefix: tests may register solvers of their own after these
            "Unknown solver 'andersn'. Valid solvers: anderson, broyden, fallback, "
            "fixed_point_iteration,",
        ),
        ({"deq__backward__name": "ifft"}, "ifft"),
        ({"train__batch_size": 0}, "config.train.batch_size=0 must be at least 1"),
        ({"eval__batch_size": 0}, "config.eval.batch_size=0 must be at least 1"),
        ({"ckpt__keep": 0}, "config.ckpt.keep=0 must be at least 1"),
    ],
)
def test_config_errors_come_before_any_data_or_directory(tmp_path, fields, message):
    workdir = tmp_path / "w"
    with pytest.raises(ValueError) as info:
        train_and_evaluate(_config(**fields), str(workdir), emit=lambda line: None)
    assert message in str(info.value)
    assert not workdir.exists()


def test_empty_workdir_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="--workdir is empty"):
        train_and_evaluate(_config(), "", emit=lambda line: None)
    assert os.listdir(tmp_path) == []


def test_every_shipped_config_passes_the_check():
    specs = []
    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if not name.endswith(".py") or name in ("__init__.py", "default.py"):
            continue
        spec = os.path.join(ROOT, "configs", name)
        # configs/clrs.py takes the algorithm as its argument
        algorithms = clrs_configs.ALGORITHMS if name == "clrs.py" else ()
        specs += [f"{spec}:{a}" for a in algorithms] or [spec]
    for spec in specs:
        check_config(launch_flags.load_config_file(spec), "/tmp/unused")
    assert len(specs) >= 20


def test_evaluate_without_a_checkpoint_creates_and_generates_nothing(tmp_path):
    workdir = tmp_path / "w"
    with pytest.raises(FileNotFoundError, match=r"No checkpoint in .*w/checkpoints to evaluate"):
        evaluate_checkpoint(_config(), str(workdir), emit=lambda line: None)
    assert not workdir.exists()
    workdir.mkdir()
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        evaluate_checkpoint(_config(), str(workdir), emit=lambda line: None)
    assert os.listdir(workdir) == []


@pytest.mark.parametrize(
    "args,message",
    [
        (("--config.deq.solver.name=andersn",), "FATAL config error: Unknown solver 'andersn'"),
        # slow: each starts a process; the same checks run in-process above
        pytest.param(
            ("--config.solver.name=andersn",),
            "has moved to --config.deq.solver.name",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ("--config.train.batch_size=0",),
            "FATAL config error: config.train.batch_size=0",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_command_line_config_errors_are_one_line_and_fast(tmp_path, args, message):
    workdir = tmp_path / "w"
    proc = run_module(
        "launch.main", "--config", "configs/prefix_sum.py:smoke", f"--workdir={workdir}", *args
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "Generating" not in proc.stdout
    assert not workdir.exists()


def test_command_line_empty_workdir_and_evaluate_without_checkpoint(tmp_path):
    proc = run_module("launch.main", "--config", "configs/prefix_sum.py:smoke", "--workdir=")
    assert proc.returncode == 2 and "FATAL config error: --workdir is empty" in proc.stderr
    assert "Traceback" not in proc.stderr
    workdir = tmp_path / "w"
    proc = run_module(
        "launch.evaluate", "--config", "configs/prefix_sum.py:smoke", f"--workdir={workdir}"
    )
    assert proc.returncode == 2 and f"No checkpoint in {workdir}/checkpoints" in proc.stderr
    assert "Traceback" not in proc.stderr and "Generating" not in proc.stdout
    assert not workdir.exists()
