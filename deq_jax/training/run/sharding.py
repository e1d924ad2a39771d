"""Placing a run on its mesh, and the multi-host runtime.

The train step is a plain `jax.jit` whose inputs carry `NamedSharding`s: the state is
placed by the partition rules (`place_state`: parameters and optimiser state over
``fsdp`` and ``tensor``, `deq_jax.training.run.partition`; replicated with the default
mesh) and the batch split along its leading axis over data x fsdp (`shard_batch`,
`deq_jax.training.run.mesh`). XLA's SPMD partitioner then runs each device on its slice,
gathers the parameters where a layer needs them and reduces the gradients, so the step
is written as if for one device. On several hosts (a TPU pod slice),
`initialize_distributed` must run first; each process then feeds its own rows of the
global batch and `shard_batch` assembles the global array. An evaluation batch that
data x fsdp does not divide is padded with masked rows (`pad_rows`).

References:
  JAX documentation, "Distributed arrays and automatic parallelization".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from deq_jax.nn.deq import with_spec
from deq_jax.training.run.mesh import (  # noqa: F401 (re-exported: the run's placement in one place)
    DATA,
    batch_sharding,
    check_batch_size,
    make_mesh,
    padded_batch_size,
)
from deq_jax.training.run.partition import MIN_SIZE, Rule, state_shardings

DATA_AXIS = DATA


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
    devices, which is why `deq_jax.training.families.setup` calls it first.

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


def replicated(mesh: Mesh) -> NamedSharding:
    """A full copy on every device (scalars, metrics; the state of a replicated run)."""
    return NamedSharding(mesh, PartitionSpec())


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Places every array of ``tree`` on all devices of ``mesh``."""
    return jax.device_put(tree, replicated(mesh))


def place_state(tree: Any, mesh: Mesh, rules: Sequence[Rule] = (), min_size: int = MIN_SIZE):
    """Places a train state (or any pytree of parameters) by the partition rules
    (`deq_jax.training.run.partition.state_shardings`): over ``fsdp`` and ``tensor``,
    replicated over ``data``."""
    return jax.device_put(tree, state_shardings(tree, mesh, rules, min_size))


def place_solve(model: Any, mesh: Mesh) -> Any:
    """``model`` whose DEQ keeps its state, solver history and backward solve sharded
    like the activations: the rows over data x fsdp (`deq_jax.nn.DEQSpec.state_sharding`,
    the batch's sharding), each device iterating on its own rows. The features stay
    whole over ``tensor``: the cells' tensor split (heads, inner channels) lives inside
    the cell, whose output is the reduced (row-parallel) state. A model without a DEQ
    is returned unchanged.
    """
    return with_spec(model, state_sharding=batch_sharding(mesh))


def shardings_of(tree: Any) -> Any:
    """The `jax.sharding.Sharding` of every array of ``tree`` (a placed state)."""
    return jax.tree_util.tree_map(lambda x: x.sharding, tree)


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles global arrays from this process's rows of the batch.

    Args:
      batch: numpy arrays whose leading axis holds this process's share of the
        global batch (all of it on a single host).
      mesh: the run's mesh.

    Returns:
      The same keys, as `jax.Array`s of the global batch split along axis 0 over
      data x fsdp (`deq_jax.training.run.mesh.batch_sharding`).
    """
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()
    }


def pad_rows(batch: dict[str, Any], rows: int, mask_keys: Sequence[str] = ("mask",)) -> dict:
    """``batch`` with ``rows`` rows: extra rows repeat row 0 with every ``mask_keys``
    array False, so they count in no metric (an evaluation batch padded to a multiple of
    data x fsdp). Keys that are not arrays with a batch axis pass through."""
    n = next(len(v) for k, v in batch.items() if k in mask_keys)
    if rows == n:
        return batch
    out = {}
    for key, value in batch.items():
        if np.ndim(value) == 0 or len(value) != n:
            out[key] = value
            continue
        value = np.asarray(value)
        extra = np.zeros_like(value[:1]) if key in mask_keys else value[:1]
        out[key] = np.concatenate([value, np.repeat(extra, rows - n, axis=0)], axis=0)
    return out


def local_padded_rows(batch_size: int, mesh: Mesh) -> int:
    """The rows of this process's part of an evaluation batch of ``batch_size`` once
    padded to a multiple of data x fsdp (`pad_rows`)."""
    return padded_batch_size(batch_size, mesh) // jax.process_count()
