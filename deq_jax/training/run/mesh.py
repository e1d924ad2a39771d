"""The run's device mesh: three named axes, ``data``, ``fsdp`` and ``tensor``.

``config.train.mesh`` gives each axis a size, ``-1`` for the devices left over (at most
one axis), e.g. ``{"data": -1, "fsdp": 1, "tensor": 1}`` (pure data parallelism, the
default) or ``--config.train.mesh.fsdp=8``. The three sizes multiply to the device
count of all hosts. What each axis splits:

* the batch (and every array with a batch axis: the DEQ's state, its solver history,
  the backward solve, a language model's segment memory) over ``data`` x ``fsdp``;
* the parameters and the optimiser state over ``fsdp`` (`deq_jax.training.run.partition`:
  along the largest axis the fsdp size divides, small ones replicated);
* the features a model's partition rules name over ``tensor`` (the language model's
  heads, feed-forward and vocabulary, MDEQ's channels).

The devices are laid out in `jax.devices` order with ``tensor`` varying fastest, so a
tensor group never spans two hosts when its size divides a host's device count (which
`check_mesh` demands), and each host feeds whole rows of the batch.

`mesh_sizes` checks a mesh section without devices (for `check_config`, before
anything runs); `resolve` and `check_mesh` check it against the devices once the
distributed runtime is up, before any data is generated or anything compiled. Both
raise `ConfigError`, one line each.

References:
  Xu et al., "GSPMD: General and Scalable Parallelization for ML Computation Graphs",
  2021 (the named mesh and sharding annotations jit partitions by).
  Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC 2020 (sharding parameters and optimiser state: FSDP).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA, FSDP, TENSOR = "data", "fsdp", "tensor"
AXES = (DATA, FSDP, TENSOR)
# The mesh axes a batch is split over, in this order (the partition spec of axis 0).
BATCH_AXES = (DATA, FSDP)
# ``config.train.mesh`` when a config has none: data parallelism over every device.
DEFAULT = {DATA: -1, FSDP: 1, TENSOR: 1}


class ConfigError(ValueError):
    """A config value the run cannot use; its message says which key, why and the fix."""


def mesh_sizes(section: Mapping[str, Any] | None) -> dict[str, int]:
    """The axis sizes of a ``config.train.mesh`` section, checked without devices.

    Args:
      section: ``{axis: size}``; ``None`` or a missing axis takes `DEFAULT`'s size.

    Returns:
      ``{"data": d, "fsdp": f, "tensor": t}``, ``-1`` kept for the axis that takes the
      devices left over.

    Raises:
      ConfigError: for an unknown axis name, a size that is not a positive integer or
        -1, or more than one -1.
    """
    given = dict(section or {})
    unknown = sorted(set(given) - set(AXES))
    if unknown:
        raise ConfigError(
            f"config.train.mesh has unknown axis {', '.join(map(repr, unknown))}: the mesh "
            f"axes are {', '.join(AXES)} (e.g. --config.train.mesh.fsdp=8)."
        )
    sizes = {axis: given.get(axis, DEFAULT[axis]) for axis in AXES}
    for axis, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int | np.integer):
            raise ConfigError(f"config.train.mesh.{axis}={size!r} must be an integer.")
        if size == 0 or size < -1:
            raise ConfigError(
                f"config.train.mesh.{axis}={size} must be a positive size or -1 (the devices "
                "left over)."
            )
    free = [axis for axis, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ConfigError(
            f"config.train.mesh: only one axis may be -1 (the devices left over); "
            f"{' and '.join(free)} both are."
        )
    return {axis: int(size) for axis, size in sizes.items()}


def describe(sizes: Mapping[str, int]) -> str:
    """``"data 2 x fsdp 4 x tensor 1"``."""
    return " x ".join(f"{axis} {sizes[axis]}" for axis in AXES)


def resolve(section: Mapping[str, Any] | None, device_count: int) -> dict[str, int]:
    """The axis sizes of ``section`` on ``device_count`` devices (the -1 filled in).

    Raises:
      ConfigError: where the sizes cannot multiply to ``device_count`` (`mesh_sizes`'
        errors too).
    """
    sizes = mesh_sizes(section)
    fixed = math.prod(size for size in sizes.values() if size != -1)
    free = [axis for axis, size in sizes.items() if size == -1]
    if free and device_count % fixed == 0:
        sizes[free[0]] = device_count // fixed
    if math.prod(sizes.values()) != device_count:
        shown = {a: ("-1" if a in free else str(s)) for a, s in sizes.items()}
        raise ConfigError(
            f"config.train.mesh ({', '.join(f'{a}={shown[a]}' for a in AXES)}) needs "
            f"{'a multiple of ' if free else ''}{fixed} devices, but this run has "
            f"{device_count}: make the sizes multiply to {device_count} (-1 takes the devices "
            "left over), e.g. --config.train.mesh.data=-1."
        )
    return sizes


def check_mesh(sizes: Mapping[str, int], local_device_count: int, process_count: int) -> None:
    """Checks resolved ``sizes`` against the hosts: a tensor group lies within one host.

    Raises:
      ConfigError: for a tensor size that does not divide a host's device count.
    """
    if process_count > 1 and local_device_count % sizes[TENSOR]:
        raise ConfigError(
            f"config.train.mesh.tensor={sizes[TENSOR]} must divide the devices of one host "
            f"({local_device_count}): a tensor group exchanges activations at every layer "
            "and stays within a host."
        )


def make_mesh(section: Mapping[str, Any] | None = None, devices: Any = None) -> Mesh:
    """The run's mesh over ``devices`` (default: all devices of all hosts).

    Args:
      section: ``config.train.mesh`` (``None``: `DEFAULT`, data parallelism).
      devices: the devices, in the order the mesh lays them out.

    Raises:
      ConfigError: for a section that does not fit the devices (`resolve`, `check_mesh`).
    """
    devices = jax.devices() if devices is None else list(devices)
    sizes = resolve(section, len(devices))
    check_mesh(sizes, jax.local_device_count(), jax.process_count())
    grid = np.asarray(devices).reshape(tuple(sizes[axis] for axis in AXES))
    return Mesh(grid, AXES)


def axis_size(mesh: Mesh, axis: str) -> int:
    """The size of ``axis`` in ``mesh`` (1 where the mesh lacks it)."""
    return int(dict(mesh.shape).get(axis, 1))


def batch_shards(mesh: Mesh) -> int:
    """How many parts a batch is split into: data x fsdp."""
    return math.prod(axis_size(mesh, axis) for axis in BATCH_AXES)


def batch_spec(mesh: Mesh) -> PartitionSpec:
    """The partition spec of an array with the batch axis first: axis 0 over
    data x fsdp (the axes ``mesh`` has)."""
    axes = tuple(axis for axis in BATCH_AXES if axis in mesh.axis_names)
    return PartitionSpec(axes if len(axes) != 1 else axes[0])


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of a batch (and of every array with the batch axis first)."""
    return NamedSharding(mesh, batch_spec(mesh))


def nearest_multiples(value: int, step: int) -> tuple[int, ...]:
    """The multiples of ``step`` nearest ``value``: below (if positive) and above."""
    below, above = (value // step) * step, -(-value // step) * step
    return tuple(sorted({x for x in (below, above) if x > 0}))


def check_batch_size(batch_size: int, mesh: Mesh, what: str = "train.batch_size") -> None:
    """Fails unless the global ``batch_size`` splits evenly over data x fsdp.

    Raises:
      ConfigError: naming the config key, the split and the nearest valid sizes.
    """
    shards = batch_shards(mesh)
    if batch_size >= 1 and batch_size % shards == 0:
        return
    sizes = " or ".join(f"--config.{what}={n}" for n in nearest_multiples(batch_size, shards))
    raise ConfigError(
        f"config.{what}={batch_size} must be a multiple of data x fsdp = {shards} (the batch "
        f"is split over those mesh axes: {math.prod(dict(mesh.shape).values())} device(s), "
        f"{jax.process_count()} process(es)). The nearest valid sizes: {sizes}."
    )


def padded_batch_size(batch_size: int, mesh: Mesh) -> int:
    """``batch_size`` rounded up to a multiple of data x fsdp (an evaluation batch's
    rows once padded; the padding is masked out of every metric)."""
    shards = batch_shards(mesh)
    return -(-batch_size // shards) * shards
