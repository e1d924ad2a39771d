"""Multi-host training rehearsed on one machine: two JAX processes as one job.

`launch.multiprocess` starts two processes of ``launch.main`` (coordinator on
127.0.0.1, a free port, gloo CPU collectives, one simulated CPU device each) that train
the prefix-sum smoke config with ``train.distributed=True`` into one shared workdir.
Every run is compared with one process holding the same two devices and the same
global batch. The default suite runs one short job; the checkpoint hand-overs between
one and two processes, a resumed two-process run and a killed process are ``slow``.
"""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import prefix_sum
from deq_jax.training import restore_trained
from deq_jax.training.run import sharding, writers
from launch import multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 900  # the machine is shared: a run of seconds may take minutes
STEPS = 4
OVERRIDES = {
    "train.steps": STEPS,
    "log.every_steps": 1,
    "eval.every_steps": 0,
    "eval.budget_multipliers": "(1,)",
    "eval.report_max_batches": 1,
    "task.test_lengths": "(16,)",
}


def _args(workdir, **extra) -> list[str]:
    overrides = {**OVERRIDES, **extra}
    return [
        "--config",
        "configs/prefix_sum.py:smoke",
        "--workdir",
        str(workdir),
        *(f"--config.{k}={v}" for k, v in overrides.items()),
    ]


def _config(**extra):
    """The config the command lines of `_args` describe."""
    config = prefix_sum.get_config("smoke")
    for key, value in {**OVERRIDES, **extra}.items():
        section, field = key.split(".")
        config[section][field] = eval(value) if isinstance(value, str) else value
    return config


def _env(devices: int) -> dict[str, str]:
    env = multiprocess.process_env(devices)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return proc.stdout


def single(workdir, devices=2, **extra) -> str:
    """One process with ``devices`` CPU devices; returns its output."""
    cmd = [sys.executable, "-m", "launch.main", *_args(workdir, **extra)]
    return _check(
        subprocess.run(
            cmd, cwd=ROOT, env=_env(devices), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    )


def two_processes(workdir, **extra) -> str:
    """Two processes of one device each, through the launcher; returns its output."""
    cmd = [sys.executable, "-m", "launch.multiprocess", "--num_processes=2", "--"]
    cmd += _args(workdir, **extra)
    return _check(
        subprocess.run(
            cmd, cwd=ROOT, env=_env(0), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    )


def train_losses(workdir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in writers.read_metrics(workdir) if r["split"] == "train"}


def event_records(path) -> int:
    """The number of records in a TensorBoard event file (TFRecord framing)."""
    count = 0
    with open(path, "rb") as f:
        while header := f.read(12):  # uint64 length, uint32 crc of the length
            length = int.from_bytes(header[:8], "little")
            f.seek(length + 4, os.SEEK_CUR)  # the record, the crc of the record
            count += 1
    return count


def restored_params(workdir):
    run = restore_trained(_config(), str(workdir), "to compare")
    return run.start_step, jax.device_get(run.state.params)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, two devices, the whole run."""
    workdir = tmp_path_factory.mktemp("one_process")
    single(workdir)
    return workdir


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Two processes, one device each, the whole run; returns (workdir, output)."""
    workdir = tmp_path_factory.mktemp("two_processes")
    return workdir, two_processes(workdir)


def test_two_processes_train_like_one(reference, job):
    workdir, output = job
    assert "[0] PrefixSumDEQ: 1152 parameters, 2 device(s)" in output
    assert "[1] PrefixSumDEQ: 1152 parameters, 2 device(s)" in output
    want, got = train_losses(reference), train_losses(workdir)
    assert sorted(want) == list(range(1, STEPS + 1))
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=0, atol=1e-5)


def test_only_process_zero_writes_metrics_and_events(job):
    workdir, _ = job
    records = writers.read_metrics(workdir)
    keys = [(r["step"], r["split"]) for r in records]
    assert len(keys) == len(set(keys)) == STEPS + 2  # train; the report; the final eval
    (events,) = os.listdir(workdir / writers.TENSORBOARD_DIR / "train")
    scalars = sum(len(r) - 2 for r in records if r["split"] == "train")
    assert event_records(workdir / writers.TENSORBOARD_DIR / "train" / events) == 1 + scalars


def test_two_process_checkpoint_restores_in_one_process(reference, job):
    workdir, _ = job
    step, params = restored_params(workdir)
    want_step, want = restored_params(reference)
    assert step == want_step == STEPS
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-5), params, want
    )


@pytest.mark.slow
def test_checkpoints_pass_between_one_and_two_processes(reference, tmp_path):
    """Steps 1-2 in one process, step 3 in two (a single-process checkpoint restored
    there, and a resumed two-process run), step 4 in one again (a two-process checkpoint
    restored): the losses and parameters of the uninterrupted run."""
    single(tmp_path, **{"train.stop_at_step": 2, "ckpt.every_steps": 1})
    output = two_processes(tmp_path, **{"train.stop_at_step": 3, "ckpt.every_steps": 1})
    assert "[1] PrefixSumDEQ: 1152 parameters, 2 device(s), resuming from step 2" in output
    output = single(tmp_path, **{"ckpt.every_steps": 1})
    assert "resuming from step 3" in output
    want, got = train_losses(reference), train_losses(tmp_path)
    np.testing.assert_allclose([got[s] for s in want], list(want.values()), rtol=0, atol=1e-5)
    _, params = restored_params(tmp_path)
    _, want_params = restored_params(reference)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-5), params, want_params
    )


KILL_HEARTBEAT_S = 10
# Measured bound: the survivor must exit within the heartbeat timeout plus this margin
# (the time to notice and unwind on a loaded 2-core machine).
KILL_BOUND_S = KILL_HEARTBEAT_S + 110


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_killing_one_process_fails_the_other(tmp_path, victim):
    port = multiprocess.free_port()
    args = _args(
        tmp_path,
        **{
            "train.steps": 100_000,
            "train.heartbeat_timeout_s": KILL_HEARTBEAT_S,
            "ckpt.every_steps": 100_000,
        },
    )
    procs = [
        subprocess.Popen(
            multiprocess.process_command("launch.main", args, i, 2, port),
            cwd=ROOT,
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while 3 not in _losses_so_far(tmp_path):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.5)
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        survivor = procs[1 - victim]
        output, _ = survivor.communicate(timeout=KILL_BOUND_S)
        waited = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    print(f"survivor of killed process {victim} exited after {waited:.1f} s")
    assert survivor.returncode != 0
    assert waited < KILL_BOUND_S
    assert "PeerProcessError: Process" in output
    assert "Another process of this job has most likely died" in output


def _losses_so_far(workdir) -> dict[int, float]:
    try:
        return train_losses(workdir)
    except (FileNotFoundError, ValueError):
        return {}


def test_peer_failure_is_explained_on_several_processes_only():
    gloo = ValueError("UNKNOWN: Gloo all-reduce failed: Connection closed by peer [127.0.0.1]")
    with pytest.raises(sharding.PeerProcessError, match="Another process of this job") as info:
        with sharding.explain_peer_failure(process_count=2):
            raise gloo
    assert info.value.__cause__ is gloo and "of 2: a collective" in str(info.value)
    with pytest.raises(ValueError, match="Gloo"):  # one process: nothing to explain
        with sharding.explain_peer_failure(process_count=1):
            raise gloo
    with pytest.raises(KeyError):  # not a collective's failure
        with sharding.explain_peer_failure(process_count=2):
            raise KeyError("inputs")


def test_launcher_commands_and_environment():
    cmd = multiprocess.process_command("launch.main", ["--workdir", "/w"], 1, 2, 1234)
    assert cmd[1:5] == ["-m", "launch.main", "--workdir", "/w"]
    assert cmd[5:] == [
        "--config.train.distributed=True",
        "--config.train.coordinator_address=127.0.0.1:1234",
        "--config.train.num_processes=2",
        "--config.train.process_id=1",
    ]
    base = {
        "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=8"
    }
    env = multiprocess.process_env(3, base)
    assert env["XLA_FLAGS"] == (
        "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=3"
    )
    assert env["JAX_PLATFORMS"] == "cpu"
    assert multiprocess.process_env(0, base) == base
    with pytest.raises(ValueError, match="sets train.distributed.*itself"):
        multiprocess.launch(["--config.train.process_id=0"], num_processes=2)
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        multiprocess.launch([], num_processes=0)


def test_launcher_returns_the_first_failure_and_relays_output():
    lines = []
    status = multiprocess.launch(
        [],
        num_processes=2,
        devices_per_process=0,
        module="this_module_does_not_exist",
        emit=lines.append,
    )
    assert status == 1  # python -m of a missing module exits 1 in both processes
    assert sum("No module named this_module_does_not_exist" in line for line in lines) == 2
    assert {line[:3] for line in lines if "No module" in line} == {"[0]", "[1]"}


def test_launcher_kills_a_survivor_after_the_grace_period():
    lines = []
    began = time.monotonic()
    status = multiprocess.launch(
        [],
        num_processes=2,
        devices_per_process=0,
        module="tests.multiprocess_probe",
        grace_s=1.0,
        emit=lines.append,
    )
    assert status == 3
    assert time.monotonic() - began < 60  # not the probe's ten minutes
    assert "[launcher] process 0 exited with status 3" in lines
    assert lines.count("[launcher] killing process 1: still running 1 s later") == 1
