"""One live run per workdir (issue 72): a second start is refused naming the first, a
dead run's lock is taken over with a line saying so, and the workdir's own problems
(a file in its place, no write permission) are one clear error."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from deq_jax.training import train_and_evaluate
from deq_jax.training.run.workdir import (
    LOCK_FILE,
    WorkdirError,
    WorkdirLock,
    WorkdirLockedError,
    ensure_workdir,
)


def _write_lock(workdir, **fields):
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": "then", **fields}
    with open(os.path.join(workdir, LOCK_FILE), "w") as f:
        json.dump(record, f)
    return record


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    first = WorkdirLock(str(tmp_path), heartbeat_s=0).acquire()
    with pytest.raises(WorkdirLockedError) as raised:
        WorkdirLock(str(tmp_path), heartbeat_s=0).acquire()
    message = str(raised.value)
    assert f"process {os.getpid()} on {socket.gethostname()}, started " in message
    assert first.record["started"] in message and "use another --workdir" in message
    first.release()
    assert not os.path.exists(tmp_path / LOCK_FILE)
    WorkdirLock(str(tmp_path), heartbeat_s=0).acquire().release()


def test_a_dead_process_lock_on_this_host_is_taken_over(tmp_path):
    holder = _write_lock(tmp_path, pid=_dead_pid())
    lines = []
    lock = WorkdirLock(str(tmp_path), lines.append, heartbeat_s=0).acquire()
    assert lines == [
        f"Took over the workdir lock of a run that is gone (process {holder['pid']} no longer "
        f"runs): process {holder['pid']} on {holder['host']}, started then."
    ]
    with open(tmp_path / LOCK_FILE) as f:
        assert json.load(f)["pid"] == os.getpid()
    lock.release()


def test_a_reused_process_id_is_not_the_old_run(tmp_path):
    _write_lock(tmp_path, process_start="another-boot:1")  # our pid, another process start
    lines = []
    WorkdirLock(str(tmp_path), lines.append, heartbeat_s=0).acquire().release()
    assert lines and "no longer runs" in lines[0]


def test_another_hosts_lock_is_live_until_its_heartbeat_is_stale(tmp_path):
    _write_lock(tmp_path, host="elsewhere", pid=1)
    with pytest.raises(WorkdirLockedError, match="process 1 on elsewhere"):
        WorkdirLock(str(tmp_path), heartbeat_s=0, stale_after_s=60).acquire()
    old = time.time() - 120
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lines = []
    WorkdirLock(str(tmp_path), lines.append, heartbeat_s=0, stale_after_s=60).acquire().release()
    assert lines and "its heartbeat stopped 12" in lines[0] and "elsewhere" in lines[0]


def test_an_unreadable_lock_is_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text('{"host": ')  # a writer killed mid-write
    lines = []
    WorkdirLock(str(tmp_path), lines.append, heartbeat_s=0).acquire().release()
    assert lines and "unreadable" in lines[0]


def test_the_heartbeat_touches_the_lock_and_release_leaves_others_locks(tmp_path):
    lock = WorkdirLock(str(tmp_path), heartbeat_s=0.05).acquire()
    old = time.time() - 1000
    os.utime(tmp_path / LOCK_FILE, (old, old))
    time.sleep(0.3)
    assert time.time() - os.stat(tmp_path / LOCK_FILE).st_mtime < 5
    _write_lock(tmp_path, pid=12345)  # someone replaced it (deleted and restarted)
    lock.release()
    assert os.path.exists(tmp_path / LOCK_FILE)


def test_workdir_problems_are_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WorkdirError, match=f"{blocker} is a file"):
        ensure_workdir(str(blocker))
    with pytest.raises(WorkdirError, match=f"{blocker} is a file"):
        ensure_workdir(str(blocker / "a" / "b"))
    assert ensure_workdir(str(tmp_path / "new" / "run")) == str(tmp_path / "new" / "run")


def test_training_refuses_a_held_workdir_before_writing_anything(tmp_path):
    from configs import prefix_sum

    workdir = tmp_path / "w"
    workdir.mkdir()
    _write_lock(workdir)  # this live process holds it
    config = prefix_sum.get_config("smoke")
    config.task.data_dir = str(tmp_path / "data")
    with pytest.raises(WorkdirLockedError, match="in use by another run"):
        train_and_evaluate(config, str(workdir), emit=lambda line: None)
    assert os.listdir(workdir) == [LOCK_FILE]
    assert not os.path.exists(tmp_path / "data")


@pytest.mark.slow
def test_every_process_of_a_job_stops_when_process_zero_is_refused(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    _write_lock(workdir)  # this live process holds it
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "launch.multiprocess", "--num_processes=2"),
            *("--devices_per_process=1", "--grace_s=60", "--"),
            *("--config=configs/prefix_sum.py:smoke", f"--workdir={workdir}"),
            f"--config.task.data_dir={tmp_path / 'data'}",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "[0] FATAL workdir error: The workdir" in out and "in use by another run" in out
    assert "[1] FATAL workdir error: Process 0 could not take the workdir" in out
    assert "Traceback" not in out
    assert sorted(os.listdir(workdir)) == [LOCK_FILE]
