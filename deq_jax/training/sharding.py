"""Data parallelism: one mesh axis over every device, batch sharded, parameters replicated.

The train step is a plain `jax.jit` whose inputs carry `NamedSharding`s: the state is
replicated (``P()``) and the batch split along its leading axis (``P("data")``). XLA's
SPMD partitioner then runs each device on its slice and inserts the all-reduce that
averages the gradients, so the step is written as if for one device. On several hosts
(a TPU pod slice), `initialize_distributed` must run first; each process then feeds its
own rows of the global batch and `shard_batch` assembles the global array.

References:
  JAX documentation, "Distributed arrays and automatic parallelization".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def initialize_distributed(
    enabled: bool,
    coordinator_address: str = "",
    num_processes: int = 0,
    process_id: int = -1,
    heartbeat_timeout_s: int = 100,
) -> None:
    """Calls `jax.distributed.initialize` once when ``enabled`` (multi-host runs).

    On Cloud TPU pods, SLURM and Open MPI clusters the coordinator address, process
    count and process id are discovered automatically; elsewhere give them here (or set
    ``JAX_COORDINATOR_ADDRESS``). It must run before any other JAX call touches the
    devices, which is why `deq_jax.training.setup` calls it first.

    Args:
      enabled: whether to initialise at all (``config.train.distributed``).
      coordinator_address: ``"host:port"`` of process 0; ``""`` auto-detects.
      num_processes: the number of processes; ``0`` auto-detects.
      process_id: this process's index; ``-1`` auto-detects.
      heartbeat_timeout_s: how long the coordinator waits for a silent process (and
        a process for a silent coordinator) before declaring it dead and failing every
        other process; this bounds how long the survivors of a crashed process wait.
    """
    if not enabled or jax.distributed.is_initialized():
        return
    jax.distributed.initialize(
        coordinator_address=coordinator_address or None,
        num_processes=num_processes or None,
        process_id=None if process_id < 0 else process_id,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )


def lead_first(fn: Callable[[], Any], name: str) -> Any:
    """Runs ``fn`` on process 0, then, once it has returned, on every other process.

    For work on a shared directory that must happen once (generating a data set into
    ``{workdir}/data``): the other processes then find it done and only read it. With a
    single process it is just ``fn()``.

    Args:
      fn: the work, without arguments; its result is returned on every process.
      name: the barrier's name (the same on every process).
    """
    if jax.process_count() == 1:
        return fn()
    result = fn() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices(name)
    return result if jax.process_index() == 0 else fn()


class PeerProcessError(RuntimeError):
    """A collective failed because another process of a multi-process job went away."""


# What JAX's errors say when a peer process has died: gloo's TCP pairs and the
# coordination service's heartbeat and barriers.
_PEER_FAILURE_MARKS = (
    "Gloo",
    "Connection closed by peer",
    "Connection reset by peer",
    "heartbeat timeout",
    "CoordinationServiceError",
)


@contextlib.contextmanager
def explain_peer_failure(process_count: int | None = None) -> Iterator[None]:
    """Re-raises a collective's failure in a multi-process job as `PeerProcessError`.

    When a process dies, the others fail in their next collective with a low-level
    message (``Gloo all-reduce failed: Connection closed by peer``) or, at the latest
    after ``train.heartbeat_timeout_s``, with the coordinator's heartbeat error. This
    says what that means and where to look. Any other error passes through unchanged.

    Args:
      process_count: the job's process count (default: ``jax.process_count()``); with
        one process nothing is translated.
    """
    try:
        yield
    except Exception as e:
        count = jax.process_count() if process_count is None else process_count
        text = str(e)
        if count < 2 or not any(mark in text for mark in _PEER_FAILURE_MARKS):
            raise
        raise PeerProcessError(
            f"Process {jax.process_index()} of {count}: a collective with the other "
            f"processes failed ({text.splitlines()[0] if text else type(e).__name__}). "
            "Another process of this job has most likely died or been killed: see its "
            "log for the first error, then restart every process (the run resumes from "
            "the last checkpoint)."
        ) from e


def make_mesh(devices: Any = None) -> Mesh:
    """A 1-D mesh named ``"data"`` over ``devices`` (default: all devices of all hosts)."""
    devices = jax.devices() if devices is None else devices
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding of parameters and optimiser state: a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of a batch: split along the leading (example) axis."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def check_batch_size(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    """Fails unless the global ``batch_size`` splits evenly over the mesh's devices.

    Raises:
      ValueError: naming the config field, the batch size and the device count.
    """
    n = mesh.devices.size
    if batch_size < 1 or batch_size % n:
        raise ValueError(
            f"{what}={batch_size} must be a positive multiple of the number of devices "
            f"({n}, {jax.process_count()} process(es)): the batch is split evenly across "
            f"devices. Use e.g. {what}={max(n, batch_size - batch_size % n)}."
        )


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Places every array of ``tree`` on all devices of ``mesh``."""
    return jax.device_put(tree, replicated(mesh))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles global arrays from this process's rows of the batch.

    Args:
      batch: numpy arrays whose leading axis holds this process's share of the
        global batch (all of it on a single host).
      mesh: the data-parallel mesh.

    Returns:
      The same keys, as `jax.Array`s of the global batch sharded along axis 0.
    """
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()
    }
