"""Stopping a run on request: SIGTERM or SIGINT ends training at a step every process
agrees on, after a checkpoint at that step.

A preemptible machine (a Cloud TPU, a spot GPU, a SLURM job at its time limit) is told
to stop with SIGTERM and killed a grace period later; a person stops a run with Ctrl-C
(SIGINT). While `StopRequests` is entered, neither signal interrupts anything: the run
finishes the step it is in (and an evaluation it is in), the training loop saves a
checkpoint at that step, says so in one line and returns; `launch.main` then exits with
`PREEMPTED_EXIT_STATUS`, and the same command resumes from that step.

After the first signal both signals get their default action back, so a second one
ends the process at once (status 143 or 130), even inside a save: orbax writes a
checkpoint into a temporary directory and renames it when complete, so a save cut short
leaves no checkpoint, only a temporary directory that the next start removes.

On several processes every process must save at the same step. The first signal on any
of them reaches JAX's preemption notifier (JAX's coordination service owns SIGTERM once
`jax.distributed.initialize` has run; SIGINT is forwarded to it as a SIGTERM to the same
process), which agrees on the next step past every process's current one
(`jax.experimental.multihost_utils.reached_preemption_sync_point`); `reached` asks it
once per step on every process. Where JAX's preemption service is off
(``jax_enable_preemption_service``), the processes exchange their requests at every step
instead.

References:
  JAX, ``multihost_utils.reached_preemption_sync_point``; Orbax,
  ``CheckpointManager.reached_preemption``.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

# The exit status of `launch.main` after a stop on request with a checkpoint saved
# (sysexits' EX_TEMPFAIL: the run is incomplete; run the same command again to resume).
PREEMPTED_EXIT_STATUS = 75

# The signals that ask a run to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _preemption_service() -> bool:
    """Whether JAX's preemption sync manager runs (several processes, service on)."""
    from jax._src import distributed  # the public API exposes no getter

    state = distributed.global_state
    return state.client is not None and state.preemption_sync_manager is not None


class StopRequests:
    """Turns SIGTERM and SIGINT into a request to stop at a step all processes agree on.

    A context manager: entering installs the handlers (in the main thread only:
    elsewhere signals cannot be handled and nothing is installed), leaving restores the
    previous ones. The training loop calls `reached` once per step on every process and
    `local` where a single process may stop on its own.

    Attributes:
      signal_name: the first signal received (``"SIGTERM"``), or ``None``.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._several = False
        self._service = False

    def __enter__(self) -> StopRequests:
        self._several = jax.process_count() > 1
        self._service = self._several and _preemption_service()
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in STOP_SIGNALS:
            if self._service and signum == signal.SIGTERM:
                continue  # JAX's preemption notifier handles it
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        self.signal_name = signal.Signals(signum).name
        if self._service:  # JAX's notifier starts the agreement; it keeps SIGTERM till then
            os.kill(os.getpid(), signal.SIGTERM)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        else:
            self.default_actions()

    def default_actions(self) -> None:
        """Gives both signals their default action back: a further one ends the process
        at once. Called on the first signal, or once the processes agree to stop."""
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)

    def local(self) -> bool:
        """Whether this process alone may stop now: a signal arrived and it is the only
        process (on several processes only `reached` decides)."""
        return self.signal_name is not None and not self._several

    def reached(self, step: int) -> bool:
        """Whether training stops after ``step``; called once per step, on every process
        with the same steps.

        One process: whether a signal has arrived. Several: whether JAX's preemption
        sync point is ``step`` (or, without the service, whether any process has a
        request, exchanged in a collective)."""
        if not self._several:
            stop = self.signal_name is not None
        elif self._service:
            stop = bool(multihost_utils.reached_preemption_sync_point(step))
        else:
            flags = multihost_utils.process_allgather(np.int32(self.signal_name is not None))
            stop = bool(np.any(flags))
        if stop:
            self.signal_name = self.signal_name or "SIGTERM"  # another process's, or JAX's
            self.default_actions()
        return stop
