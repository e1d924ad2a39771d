"""The workdir of a training run: created with clear errors, and held by one live run.

`ensure_workdir` creates the directory, and says in one sentence what to do when it
cannot (a file of that name, a directory without write permission).

`WorkdirLock` makes a workdir hold one live run: a resubmitted job while the old one
still runs, or two hosts given the same path, would otherwise write into the same
checkpoints and metrics. The run writes ``{workdir}/run.lock`` (host, process id, start
time and the command) when it starts and removes it when it ends; a second start finds
it and is refused with `WorkdirLockedError`, naming the other run. A lock whose run is
gone is taken over with one line saying so:

- on the same host, when its process no longer exists (or the process id now belongs
  to a process started later);
- from another host, when its heartbeat is stale: a live run touches the lock every
  `HEARTBEAT_S` seconds from a background thread, and a lock untouched for
  ``stale_after_s`` (default `STALE_AFTER_S`) is taken to be a dead run's.

On several processes only process 0 takes the lock, and every process learns its
outcome, so that all of them stop when it is refused.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

LOCK_FILE = "run.lock"
# How often a live run touches its lock.
HEARTBEAT_S = 30.0
# A lock untouched for this long belongs to a dead run (checked for other hosts' locks).
STALE_AFTER_S = 600.0


class WorkdirError(OSError):
    """The workdir cannot be created or written."""


class WorkdirLockedError(RuntimeError):
    """Another live run holds the workdir."""


def ensure_workdir(workdir: str) -> str:
    """Creates ``workdir`` (and its parents) if missing; returns its absolute path.

    Raises:
      WorkdirError: if a file is in the way, or the directory cannot be created or
        written; the message names the path and what to do.
    """
    path = os.path.abspath(workdir)
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = path
        while blocker and not os.path.exists(blocker):
            blocker = os.path.dirname(blocker)
        raise WorkdirError(
            errno.ENOTDIR,
            f"--workdir {workdir} cannot be a directory: {blocker} is a file. Name a "
            "directory (it is created if missing).",
        ) from None
    except PermissionError:
        raise WorkdirError(
            errno.EACCES,
            f"--workdir {workdir} cannot be created: no permission to write in its parent. "
            "Name a directory you can write to.",
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise WorkdirError(
            errno.EACCES,
            f"--workdir {workdir} is not writable by this user. Name a directory you can "
            "write to, or change its permissions.",
        )
    return path


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (``/proc``'s clock ticks since boot, with the boot
    id), or ``None`` where unknown: tells a reused process id from the original."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}:{fields[19]}"


def _alive(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` on this host exists and is the one that started at
    ``started`` (where both are known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    now = _process_start(pid)
    return started is None or now is None or now == started


def describe_holder(holder: dict[str, Any]) -> str:
    """``process 123 on host-a, started 2026-12-02 06:40:01 UTC (python -m ...)``."""
    command = holder.get("command", "")
    return (
        f"process {holder.get('pid')} on {holder.get('host')}, started "
        f"{holder.get('started', '?')}" + (f" ({command})" if command else "")
    )


class WorkdirLock:
    """``{workdir}/run.lock``: held from `acquire` to `release` by one run.

    Args:
      workdir: the run's directory (it must exist).
      emit: receives the line said when a dead run's lock is taken over.
      stale_after_s: how long another host's lock may go untouched before it counts
        as a dead run's.
      heartbeat_s: how often the holder touches the lock (0: never).
    """

    def __init__(
        self,
        workdir: str,
        emit: Callable[[str], None] = print,
        *,
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_s: float = HEARTBEAT_S,
    ):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.emit = emit
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.record: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _read(self) -> tuple[dict[str, Any] | None, float | None]:
        """The lock's record (``{}`` if unreadable) and modification time, or
        ``(None, None)`` when there is no lock."""
        try:
            mtime = os.stat(self.path).st_mtime
            with open(self.path) as f:
                return json.load(f), mtime
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError):
            return {}, mtime

    def _stale(self, holder: dict[str, Any], mtime: float) -> str | None:
        """Why ``holder``'s run is dead (a phrase), or ``None`` if it may be alive."""
        if not holder:
            return "its lock file is unreadable"
        if holder.get("host") == socket.gethostname():
            if not _alive(int(holder.get("pid", -1)), holder.get("process_start")):
                return f"process {holder.get('pid')} no longer runs"
            return None
        age = time.time() - mtime
        if age > self.stale_after_s:
            return f"its heartbeat stopped {age:.0f} s ago"
        return None

    def _create(self) -> bool:
        """Writes our record to the lock path unless a lock is there (atomic: the
        record is written beside it, then hard-linked in)."""
        tmp = f"{self.path}.{socket.gethostname()}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.record, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(tmp)

    def _take_over(self, holder: dict[str, Any]) -> bool:
        """Moves a dead run's lock away, if it is still that run's; returns whether it
        did (another starter may have been faster)."""
        moved = f"{self.path}.dead.{socket.gethostname()}.{os.getpid()}"
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return False
        with open(moved) as f:
            try:
                current = json.load(f)
            except ValueError:
                current = {}
        if current != holder:  # a live run's lock replaced the dead one meanwhile
            try:
                os.link(moved, self.path)
            except FileExistsError:
                pass
            os.remove(moved)
            return False
        os.remove(moved)
        return True

    def acquire(self) -> WorkdirLock:
        """Takes the lock; returns ``self``.

        Raises:
          WorkdirLockedError: naming the live run that holds it.
        """
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "process_start": _process_start(os.getpid()),
            "started": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S UTC"
            ),
            "command": " ".join(sys.argv)[:300],
        }
        for _ in range(5):
            if self._create():
                self._start_heartbeat()
                return self
            holder, mtime = self._read()
            if holder is None:
                continue  # released meanwhile
            why = self._stale(holder, mtime)
            if why is None:
                raise WorkdirLockedError(
                    f"The workdir {os.path.dirname(self.path)} is in use by another run: "
                    f"{describe_holder(holder)}. Wait for it to end or stop it, or use another "
                    f"--workdir. If that run is gone, delete {self.path}."
                )
            if self._take_over(holder):
                self.emit(
                    f"Took over the workdir lock of a run that is gone ({why}): "
                    f"{describe_holder(holder) if holder else self.path}."
                )
        raise WorkdirLockedError(
            f"Could not take the lock {self.path}: other runs keep starting in this workdir."
        )

    def _start_heartbeat(self) -> None:
        if self.heartbeat_s <= 0:
            return

        def beat():
            while not self._stop.wait(self.heartbeat_s):
                try:
                    os.utime(self.path)
                except OSError:
                    pass  # a full or unreachable disk: the run itself will say so

        self._beat = threading.Thread(target=beat, name="deq_jax-workdir-lock", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Removes the lock if it is still this run's."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        holder, _ = self._read()
        if self.record is not None and holder == self.record:
            os.remove(self.path)
        self.record = None


def lock_workdir(workdir: str, emit: Callable[[str], None] = print) -> WorkdirLock | None:
    """Creates ``workdir`` and takes its lock on process 0; every process learns the
    outcome (a refusal raises on all of them). Returns the lock (``None`` on the other
    processes).

    Raises:
      WorkdirError: if the workdir cannot be created or written.
      WorkdirLockedError: if another live run holds it.
    """
    lead = jax.process_index() == 0
    lock, failure = None, None
    if lead:
        try:
            ensure_workdir(workdir)
            lock = WorkdirLock(workdir, emit).acquire()
        except (WorkdirError, WorkdirLockedError) as e:
            if jax.process_count() == 1:
                raise
            failure = e
    if jax.process_count() > 1:
        refused = multihost_utils.broadcast_one_to_all(np.int32(failure is not None))
        if int(refused):
            if failure is not None:
                raise failure
            raise WorkdirLockedError(
                f"Process 0 could not take the workdir {workdir}; its log says why."
            )
    return lock
