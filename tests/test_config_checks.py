"""Config-time errors fail at once, clearly, before any data or directory (issue 36)."""

import os
import subprocess
import sys

import pytest
from conftest import run_module
from jax.sharding import AbstractMesh

from configs import clrs as clrs_configs
from configs import prefix_sum
from deq_jax.training import evaluate_checkpoint, train_and_evaluate
from deq_jax.training.families.setup import check_config
from deq_jax.training.run import mesh
from launch import flags as launch_flags
from launch import multiprocess

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
        ({"train__learning_rate": -1.0}, "config.train.learning_rate=-1.0 must be above 0"),
        ({"train__steps": 1}, "config.train.warmup_steps=2 must lie in [0, config.train.steps=1]"),
        ({"train__mesh__fsdp": 0}, "config.train.mesh.fsdp=0 must be a positive size or -1"),
        ({"train__mesh__fsdp": 3, "train__mesh__data": 1}, "batch_size=16 must be a multiple"),
        ({"log__every_steps": 0}, "config.log.every_steps=0 must be at least 1"),
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


def _shipped_configs():
    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if name.endswith(".py") and name != "__init__.py":
            spec = os.path.join(ROOT, "configs", name)
            algorithms = clrs_configs.ALGORITHMS if name == "clrs.py" else ()
            yield from [f"{spec}:{a}" for a in algorithms] or [spec]


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_every_shipped_config_trains_on_a_hosts_device_count(devices):
    """The defaults of every config split their train batch over 1, 2, 4 and 8 devices
    (data parallel, the default mesh); the eval batches are padded instead."""
    for spec in _shipped_configs():
        config = launch_flags.load_config_file(spec)
        sizes = mesh.resolve(config.train.mesh.to_dict(), devices)
        abstract = AbstractMesh(tuple(sizes[a] for a in mesh.AXES), mesh.AXES)
        mesh.check_batch_size(config.train.batch_size, abstract)


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
        # issue 80: below the warm-up, a negative learning rate
        (("--config.train.steps=1",), "FATAL config error: config.train.warmup_steps=2 must"),
        pytest.param(
            ("--config.train.learning_rate=-1",),
            "FATAL config error: config.train.learning_rate=-1.0 must be above 0",
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


def test_mesh_that_does_not_fit_eight_devices_is_one_line(tmp_path):
    """On 8 devices (as on an 8-GPU host): a mesh of 3 x ... fails in one line, exit
    status 2, before the workdir or any data exists."""
    workdir = tmp_path / "w"
    env = multiprocess.process_env(8)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = ["--config", "configs/prefix_sum.py:smoke", f"--workdir={workdir}"]
    proc = subprocess.run(
        [sys.executable, "-m", "launch.main", *args, "--config.train.mesh.fsdp=3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("FATAL config error: config.train.mesh (data=-1, fsdp=3, tensor=1)")
    assert "needs a multiple of 3 devices, but this run has 8" in lines[0]
    assert not workdir.exists()
