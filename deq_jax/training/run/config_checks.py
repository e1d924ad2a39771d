"""The ranges of the config's numbers, checked before anything is created or generated.

`check_ranges` reads ``config.train``, ``eval``, ``ckpt`` and ``log`` against `RANGES`
(one row per numeric field: its lowest and highest valid value) plus the rules that
tie two fields together (the warm-up within the steps), and ``config.train.mesh``
against the devices it cannot see yet (`check_mesh_section`: the axis names, the sizes,
a tensor size the model's heads or channels allow, a batch data x fsdp divides when
both sizes are given). Each failure is one `ConfigError` naming the key, the value,
the valid range and a fix; ``launch.main`` prints it as one ``FATAL config error:``
line and exits with status 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from deq_jax.training.run.mesh import BATCH_AXES, TENSOR, ConfigError, mesh_sizes, nearest_multiples
from deq_jax.training.run.optim import OPTIMIZERS, SCHEDULES
from deq_jax.training.run.partition import check_tensor_sizes


class Range(NamedTuple):
    """A numeric field's valid values: ``low <= x`` (``low < x`` with ``open_low``) and
    ``x < high`` (``None``: unbounded), with a word on what the field does."""

    key: str
    low: float
    high: float | None = None
    open_low: bool = False
    note: str = ""


RANGES = (
    Range("train.steps", 1),
    Range("train.batch_size", 1),
    Range("train.learning_rate", 0.0, open_low=True, note="the peak of the schedule"),
    Range("train.weight_decay", 0.0),
    Range("train.b1", 0.0, 1.0, note="Adam's first-moment decay"),
    Range("train.b2", 0.0, 1.0, note="Adam's second-moment decay"),
    Range("train.momentum", 0.0, 1.0),
    Range("train.end_lr_factor", 0.0, note="the cosine's end as a fraction of the peak"),
    Range("train.grad_clip_norm", 0.0, note="0 turns clipping off"),
    Range("train.stop_at_step", 0, note="0: run to train.steps"),
    Range("train.max_nonfinite_steps", 1),
    Range("train.ema_decay", 0.0, 1.0, note="0 turns weight averaging off"),
    Range("train.heartbeat_timeout_s", 1),
    Range("train.num_processes", 0, note="0: auto-detected"),
    Range("train.process_id", -1, note="-1: auto-detected"),
    Range("train.fsdp_min_size", 0, note="arrays smaller than this stay replicated"),
    Range("train.seq_len", 1),
    Range("eval.batch_size", 1),
    Range("eval.every_steps", 0, note="0: no periodic evaluation"),
    Range("eval.max_batches", 0, note="0: every batch"),
    Range("eval.report_max_batches", 0, note="0: every batch"),
    Range("eval.seq_len", 0, note="0: train.seq_len"),
    Range("ckpt.every_steps", 1),
    Range("ckpt.keep", 1),
    Range("log.every_steps", 1),
)


def _describe(r: Range) -> str:
    if r.high is not None:
        return f"must lie in [{r.low}, {r.high})"
    if r.open_low:
        return f"must be above {r.low}"
    return f"must be at least {r.low}"


def _get(config: Any, key: str) -> Any:
    section, _, field = key.partition(".")
    part = config.get(section, None)
    return None if part is None else part.get(field, None)


def check_range(r: Range, value: Any) -> None:
    """Raises `ConfigError` for a ``value`` of ``r.key`` outside its range."""
    low_ok = value > r.low if r.open_low else value >= r.low
    if low_ok and (r.high is None or value < r.high) and not math.isnan(value):
        return
    note = f" ({r.note})" if r.note else ""
    raise ConfigError(f"config.{r.key}={value} {_describe(r)}{note}: set --config.{r.key}=...")


def check_ranges(config: Any) -> None:
    """Checks every field of `RANGES` the config has, the choices of optimiser and
    schedule, the warm-ups within ``train.steps`` and the evaluation's budget
    multipliers.

    Raises:
      ConfigError: one line: the key, its value, the valid range and the fix.
    """
    for r in RANGES:
        value = _get(config, r.key)
        if value is not None and not isinstance(value, bool | str):
            check_range(r, value)
    tc = config.get("train", {})
    for key, valid in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES)):
        if key in tc and tc[key] not in valid:
            raise ConfigError(
                f"config.train.{key}={tc[key]!r} is not one of {', '.join(valid)} "
                f"(--config.train.{key}={valid[0]})."
            )
    steps = tc.get("steps", 1)
    for key, what in (
        ("warmup_steps", "the learning rate rises from 0 over these steps"),
        ("pretrain_steps", "the weight-tied warm-up's steps"),
    ):
        value = tc.get(key, 0)
        if not 0 <= value <= steps:
            raise ConfigError(
                f"config.train.{key}={value} must lie in [0, config.train.steps={steps}] "
                f"({what}): lower it (--config.train.{key}={min(max(value, 0), steps)}) or "
                "raise --config.train.steps."
            )
    for m in config.get("eval", {}).get("budget_multipliers", ()):
        if not m > 0:
            raise ConfigError(
                f"config.eval.budget_multipliers={tuple(config.eval.budget_multipliers)}: "
                f"each multiplier of the train budget must be above 0, got {m}."
            )


def check_mesh_section(config: Any) -> None:
    """Checks ``config.train.mesh`` as far as it can be without devices: axis names and
    sizes (`deq_jax.training.run.mesh.mesh_sizes`), a tensor size that divides the model's
    heads or channels, and a ``train.batch_size`` that data x fsdp divide where both
    are given (not -1).

    Raises:
      ConfigError: one line naming the key and the fix.
    """
    tc = config.get("train", {})
    section = tc.get("mesh", None)
    sizes = mesh_sizes(section.to_dict() if hasattr(section, "to_dict") else section)
    if sizes[TENSOR] > 1:
        check_tensor_sizes(model_section(config), sizes[TENSOR])
    shards = [sizes[axis] for axis in BATCH_AXES]
    batch = tc.get("batch_size", 1)
    if -1 not in shards and batch % math.prod(shards):
        split = math.prod(shards)
        valid = " or ".join(
            f"--config.train.batch_size={n}" for n in nearest_multiples(batch, split)
        )
        raise ConfigError(
            f"config.train.batch_size={batch} must be a multiple of data x fsdp = {split} "
            f"(config.train.mesh splits the batch over them). The nearest valid sizes: {valid}."
        )


def model_section(config: Any) -> Mapping[str, Any]:
    """``config.model`` as a plain mapping."""
    model = config.get("model", {})
    return model.to_dict() if hasattr(model, "to_dict") else dict(model)
