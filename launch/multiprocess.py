"""Runs one training job as several JAX processes on this machine (a multi-host rehearsal).

Usage::

    python -m launch.multiprocess --num_processes=2 --devices_per_process=1 -- \\
        --config configs/prefix_sum.py:smoke --workdir /tmp/ps_2proc

Everything after ``--`` goes to ``launch.main`` (``--module`` picks another entry point
with the same flags). Process ``i`` gets ``--config.train.distributed=True``, the
coordinator ``127.0.0.1:PORT`` (a free port unless ``--port`` names one),
``--config.train.num_processes=N`` and ``--config.train.process_id=i``, and
``XLA_FLAGS=--xla_force_host_platform_device_count=D`` with ``JAX_PLATFORMS=cpu``
(``--devices_per_process=0`` leaves the platform and devices alone). The processes
form one JAX job: the CPU collectives between them are gloo over TCP (JAX's default
``jax_cpu_collectives_implementation``), the workdir is shared, process 0 writes the
metrics and TensorBoard events and all of them write the orbax checkpoint.

Each output line is prefixed with ``[i]``. The launcher exits with the first non-zero
exit status; once a process has failed, the others get ``--grace_s`` seconds to fail
on their own (JAX's heartbeat, ``train.heartbeat_timeout_s``) before they are killed.

On a real cluster no launcher is needed: run ``launch.main`` with
``--config.train.distributed=True`` once per host (``srun`` on SLURM, every worker of a
TPU pod slice with ``gcloud compute tpus tpu-vm ssh --worker=all``); JAX finds the
coordinator itself (README, "Multi-host").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from absl import app, flags

_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 2, "How many JAX processes to start.")
_DEVICES = flags.DEFINE_integer(
    "devices_per_process",
    1,
    "Simulated CPU devices per process (0: leave JAX_PLATFORMS and XLA_FLAGS alone).",
)
_PORT = flags.DEFINE_integer("port", 0, "The coordinator's port on 127.0.0.1 (0: a free one).")
_MODULE = flags.DEFINE_string("module", "launch.main", "The entry point each process runs.")
_GRACE = flags.DEFINE_float(
    "grace_s",
    180.0,
    "Seconds the other processes get to exit once one has failed, before they are killed.",
)

# The train fields the launcher sets on every process's command line.
_DISTRIBUTED_FIELDS = ("distributed", "coordinator_address", "num_processes", "process_id")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_command(
    module: str, args: Sequence[str], process_id: int, num_processes: int, port: int
) -> list[str]:
    """The command line of process ``process_id``: ``module`` with ``args`` and the
    distributed overrides that make it one process of the job."""
    prefix = "--config.train."
    return [
        sys.executable,
        "-m",
        module,
        *args,
        f"{prefix}distributed=True",
        f"{prefix}coordinator_address=127.0.0.1:{port}",
        f"{prefix}num_processes={num_processes}",
        f"{prefix}process_id={process_id}",
    ]


def process_env(devices: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process: ``devices`` simulated CPU devices (0: as is)."""
    env = dict(os.environ if base is None else base)
    if devices:
        flag = f"--xla_force_host_platform_device_count={devices}"
        kept = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
        env["XLA_FLAGS"] = " ".join([*kept, flag])
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _relay(index: int, stream, emit: Callable[[str], None]) -> None:
    for line in stream:
        emit(f"[{index}] {line.rstrip()}")


def launch(
    args: Sequence[str],
    *,
    num_processes: int,
    devices_per_process: int = 1,
    port: int = 0,
    module: str = "launch.main",
    grace_s: float = 180.0,
    emit: Callable[[str], None] = print,
) -> int:
    """Starts ``num_processes`` processes of ``module`` as one JAX job and waits for them.

    Args:
      args: the arguments of ``module`` (``--config ... --workdir ...``).
      num_processes: how many processes.
      devices_per_process: simulated CPU devices per process (0: leave them alone).
      port: the coordinator's port on 127.0.0.1 (0: a free one).
      module: the entry point (``launch.main`` takes the config overrides).
      grace_s: once a process has failed, how long the others may take to exit before
        they are killed.
      emit: receives every output line, prefixed with its process index.

    Returns:
      0 if every process succeeded, else the first non-zero exit status.

    Raises:
      ValueError: for fewer than one process or a distributed override in ``args``.
    """
    if num_processes < 1:
        raise ValueError(f"--num_processes must be >= 1, got {num_processes}.")
    taken = [a for a in args if a.split("=", 1)[0].lstrip("-").startswith("config.train.")]
    taken = [a for a in taken if a.split("=", 1)[0].rsplit(".", 1)[-1] in _DISTRIBUTED_FIELDS]
    if taken:
        raise ValueError(
            f"{' '.join(taken)}: the launcher sets train.distributed, coordinator_address, "
            "num_processes and process_id itself; remove them from the arguments."
        )
    port = port or free_port()
    env = process_env(devices_per_process)
    procs, relays = [], []
    for i in range(num_processes):
        proc = subprocess.Popen(
            process_command(module, args, i, num_processes, port),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        relay = threading.Thread(target=_relay, args=(i, proc.stdout, emit), daemon=True)
        relay.start()
        procs.append(proc)
        relays.append(relay)
    status, failed_at, killed = 0, None, set()
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            if p.returncode and not status:
                status, failed_at = p.returncode, time.monotonic()
                emit(f"[launcher] process {i} exited with status {p.returncode}")
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            for i, p in enumerate(procs):
                if p.poll() is None and i not in killed:
                    emit(f"[launcher] killing process {i}: still running {grace_s:.0f} s later")
                    p.kill()
                    killed.add(i)
        time.sleep(0.2)
    for relay in relays:
        relay.join()
    return status or next((p.returncode for p in procs if p.returncode), 0)


def main(argv: Sequence[str]) -> None:
    status = launch(
        argv[1:],
        num_processes=_NUM_PROCESSES.value,
        devices_per_process=_DEVICES.value,
        port=_PORT.value,
        module=_MODULE.value,
        grace_s=_GRACE.value,
        emit=lambda line: print(line, flush=True),
    )
    sys.exit(status)


if __name__ == "__main__":
    app.run(main)
