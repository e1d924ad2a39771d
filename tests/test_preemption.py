"""Stopping on request (issue 72): SIGTERM and SIGINT save at the step they arrive in,
SIGKILL loses at most ``ckpt.every_steps``, and every resumed run ends with the
uninterrupted run's parameters bit for bit (`benchmarks.fault_matrix`).

The default suite runs SIGTERM mid-step (which also skips an evaluation the resumed run
catches up), SIGINT mid-evaluation and SIGKILL mid-save, and the real command line under
SIGTERM; the rest of the matrix, a second signal and two processes are ``slow``.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import fault_matrix
from deq_jax.training import (
    PREEMPTED_EXIT_STATUS,
    StopRequests,
    read_metrics,
    train_and_evaluate,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trained(workdir) -> list[int]:
    """The steps whose train metrics ``workdir`` holds (none before its first line)."""
    if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        return []
    return [r["step"] for r in read_metrics(str(workdir)) if r["split"] == "train"]


FAST = {("SIGTERM", "step"), ("SIGINT", "eval"), ("SIGKILL", "save")}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """The uninterrupted run's final parameters and its metrics."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    result = train_and_evaluate(fault_matrix.config(data_dir), workdir, emit=lambda line: None)
    return fault_matrix.params(result), read_metrics(workdir)


def _cases():
    for name in fault_matrix.SIGNALS:
        for point in fault_matrix.POINTS:
            for saves in ("async", "sync") if name == "SIGKILL" else ("async",):
                fast = (name, point) in FAST and saves == "async"
                marks = () if fast else (pytest.mark.slow,)
                yield pytest.param(name, point, saves, marks=marks, id=f"{name}-{point}-{saves}")


@pytest.mark.parametrize("name, point, saves", _cases())
def test_a_stopped_run_resumes_to_the_uninterrupted_parameters(
    name, point, saves, reference, tmp_path, data_dir
):
    case = fault_matrix.run_case(name, point, str(tmp_path), data_dir, saves == "async")
    got = fault_matrix.params(case["result"])
    assert fault_matrix.identical(got, reference[0])
    if name == "SIGKILL":
        assert case["exit_status"] == -signal.SIGKILL
        # The checkpoints on disk when the kill came: with background writes, the one
        # being written is lost too.
        bound = fault_matrix.CKPT_EVERY * (2 if saves == "async" else 1)
        assert 0 <= case["steps_lost"] <= bound
    else:
        assert case["stopped_by"] == name
        assert case["last_trained"] == case["resumed_from"] == fault_matrix.POINTS[point]
        assert case["steps_lost"] == 0
    # Every periodic evaluation is there once, as in the uninterrupted run (a stop at
    # step 6 skipped its evaluation; the resumed run caught it up).
    evals = sorted((r["step"], r["split"]) for r in read_metrics(str(tmp_path)))
    assert evals == sorted((r["step"], r["split"]) for r in reference[1])
    assert not os.path.exists(tmp_path / "run.lock")
    assert not [d for d in os.listdir(tmp_path / "checkpoints") if "tmp" in d]


def _command(workdir, data_dir, *extra):
    overrides = {
        "task.data_dir": data_dir,
        "train.steps": 2000,
        "ckpt.every_steps": 1000,
        "log.every_steps": 1,
        "eval.every_steps": 0,
    }
    return [
        sys.executable,
        "-m",
        "launch.main",
        "--config=configs/prefix_sum.py:smoke",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in overrides.items()),
        *extra,
    ]


def _start_and_signal(workdir, data_dir, signals, after_steps=3):
    """Starts the command, waits until it has logged ``after_steps`` steps, sends
    ``signals`` (one after another, 0.2 s apart); returns the finished process."""
    proc = subprocess.Popen(
        _command(workdir, data_dir),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if len(_trained(workdir)) >= after_steps:
            break
        time.sleep(0.2)
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def test_sigterm_on_the_command_line_saves_says_so_and_exits_75(tmp_path, data_dir):
    status, out, err = _start_and_signal(tmp_path / "w", data_dir, [signal.SIGTERM])
    assert status == PREEMPTED_EXIT_STATUS == 75, err[-3000:]
    stopped = [line for line in out.splitlines() if line.startswith("Stopped by SIGTERM")]
    assert len(stopped) == 1 and "Traceback" not in err
    step = int(stopped[0].split("after step ")[1].split(":")[0])
    assert f"saved a checkpoint at step {step}" in stopped[0]
    assert os.path.isdir(tmp_path / "w" / "checkpoints" / str(step))
    assert max(_trained(tmp_path / "w")) == step  # no step lost
    assert not os.path.exists(tmp_path / "w" / "run.lock")


@pytest.mark.slow
def test_a_second_signal_in_the_save_ends_the_process_and_corrupts_nothing(
    reference, tmp_path, data_dir
):
    """SIGINT as the save of step 4 begins, SIGTERM inside orbax's commit of it: the
    process dies at once (-SIGTERM), step 4 is no checkpoint, and the rerun takes the
    dead run's lock over and ends with the uninterrupted parameters."""
    case = fault_matrix.run_case("SIGINT:save,SIGTERM:commit", "", str(tmp_path), data_dir)
    assert case["exit_status"] == -signal.SIGTERM and case["resumed_from"] == 0
    assert fault_matrix.identical(fault_matrix.params(case["result"]), reference[0])
    assert not [d for d in os.listdir(tmp_path / "checkpoints") if "tmp" in d]


def test_stop_requests_outside_the_main_thread_install_nothing():
    import threading

    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def enter():
        with StopRequests() as stop:
            seen.append((signal.getsignal(signal.SIGTERM), stop.reached(1)))

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [(before, False)]


def test_stop_requests_stop_after_a_signal_and_restore_the_handlers():
    before = signal.getsignal(signal.SIGINT)
    with StopRequests() as stop:
        assert not stop.reached(1) and not stop.local()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal_name == "SIGINT" and stop.local() and stop.reached(2)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one kills
        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) == before


@pytest.mark.slow
def test_two_processes_stop_at_the_same_step_when_one_is_told(tmp_path, data_dir):
    """SIGTERM to process 1 only: JAX's preemption sync point makes both save at one
    step and exit 75; rerun, the job resumes there."""
    workdir = tmp_path / "w"
    command = [
        sys.executable,
        "-m",
        "launch.multiprocess",
        "--num_processes=2",
        "--devices_per_process=1",
        "--grace_s=60",
        "--",
        *_command(workdir, data_dir)[3:],
        "--config.train.batch_size=16",
    ]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    deadline = time.time() + 600
    while time.time() < deadline:
        if len(_trained(workdir)) >= 3:
            break
        time.sleep(0.2)
    victim = subprocess.run(
        ["pgrep", "-f", f"workdir={workdir} .*process_id=1"], capture_output=True, text=True
    ).stdout.split()
    assert len(victim) == 1
    os.kill(int(victim[0]), signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == PREEMPTED_EXIT_STATUS, out[-3000:]
    stopped = sorted(line.split("] ", 1)[1] for line in out.splitlines() if "Stopped by" in line)
    assert len(stopped) == 2 and "all 2 processes" in stopped[0], out[-3000:]
    step = int(stopped[0].split("after step ")[1].split(":")[0])
    assert all(f"after step {step}:" in line for line in stopped)
    assert os.path.isdir(workdir / "checkpoints" / str(step))
