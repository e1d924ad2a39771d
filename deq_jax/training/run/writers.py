"""Where metrics go: a progress line, JSON lines and TensorBoard event files.

`MetricWriter` appends one JSON object per call to ``{workdir}/metrics.jsonl`` (each
tagged with its ``step`` and ``split``) and writes the same scalars to TensorBoard with
tensorboardX (no TensorFlow needed) under ``{workdir}/tensorboard``, one subdirectory
per split so that curves of different splits overlay. tensorboardX comes with the
``[train]`` extra; without it a run asking for TensorBoard events says so in one line
and writes ``metrics.jsonl`` alone. A record whose step and split
the file already holds (written by an earlier invocation in the same workdir: a run
resumed from an older checkpoint repeats the steps after it) is not written again, to
either place. `ProgressLogger` turns train metrics into a human line with steps/s and
ETA. Only the lead process (index 0) writes. `write_text` and `write_json` write a file
(a report, a config, a vocabulary) whole or not at all, so that a run killed while
writing never leaves half a file for the next one to resume from.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

try:  # the [train] extra's: without it, metrics.jsonl alone (MetricWriter says so)
    from tensorboardX import SummaryWriter
except ImportError:
    SummaryWriter = None

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def write_text(path: str, content: str | bytes) -> str:
    """Writes ``content`` (text as UTF-8, or bytes) to ``path`` atomically; returns ``path``.

    The content goes to ``{path}.{pid}.tmp`` beside it first and then replaces ``path``
    (`os.replace`, atomic on POSIX), so a reader, or a run resumed after a kill, sees
    either the old file or the new one, never a truncated one. The temporary file is
    removed if the write fails; ``path`` is then unchanged.
    """
    data = content.encode("utf-8") if isinstance(content, str) else content
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_json(path: str, obj: Any, **dump_kwargs: Any) -> str:
    """Writes ``obj`` as JSON to ``path`` atomically (`write_text`); returns ``path``.

    ``dump_kwargs`` go to `json.dumps` (``indent``, ``sort_keys``, ``default``). An
    ``obj`` that cannot be serialised raises before anything is written: ``path`` is
    unchanged and nothing is left beside it.
    """
    return write_text(path, json.dumps(obj, **dump_kwargs))


def to_python(metrics: Mapping[str, Any]) -> dict[str, float | int]:
    """Scalars (numpy, jax or Python) as plain Python numbers; NaN/inf kept as floats."""
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        v = np.asarray(value)
        if v.size != 1:
            raise ValueError(f"Metric {key!r} is not a scalar (shape {v.shape}).")
        out[key] = int(v) if np.issubdtype(v.dtype, np.integer) else float(v)
    return out


class MetricWriter:
    """Appends metrics to ``metrics.jsonl`` and TensorBoard event files in the workdir.

    Args:
      workdir: the run's directory.
      tensorboard: whether to write TensorBoard events too (when tensorboardX is
        installed; else ``emit`` receives one line saying the events are not written).
      enabled: ``False`` on every process but the lead one, making all calls no-ops.
      emit: receives that line.
    """

    def __init__(
        self,
        workdir: str,
        *,
        tensorboard: bool = True,
        enabled: bool = True,
        emit: Callable[[str], None] = print,
    ):
        self.enabled = enabled
        self.path = os.path.join(workdir, METRICS_FILE)
        self._tb_root = os.path.join(workdir, TENSORBOARD_DIR)
        self._tensorboard = tensorboard and enabled and SummaryWriter is not None
        if tensorboard and enabled and SummaryWriter is None:
            emit(
                "No TensorBoard events: tensorboardX is not installed (pip install tensorboardX, "
                "or log.tensorboard=False to silence this); metrics go to metrics.jsonl."
            )
        self._tb: dict[str, Any] = {}
        # (step, split) of the records earlier invocations wrote: never written twice.
        self._written_before: set[tuple[int, str]] = set()
        if enabled and os.path.exists(self.path):
            self._written_before = {(r["step"], r["split"]) for r in read_metrics(workdir)}

    def _board(self, split: str) -> Any:
        if split not in self._tb:
            self._tb[split] = SummaryWriter(os.path.join(self._tb_root, split))
        return self._tb[split]

    def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Records scalar ``metrics`` of ``split`` at ``step`` (unless an earlier
        invocation recorded that step and split); returns the JSON record."""
        record = {"step": int(step), "split": split, **to_python(metrics)}
        if not self.enabled or (record["step"], split) in self._written_before:
            return record
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tensorboard:
            board = self._board(split)
            for key, value in record.items():
                if key not in ("step", "split") and math.isfinite(value):
                    board.add_scalar(key, value, global_step=int(step))
            board.flush()
        return record

    def close(self) -> None:
        """Flushes and closes the TensorBoard writers."""
        for board in self._tb.values():
            board.close()
        self._tb.clear()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    """Every record of ``{workdir}/metrics.jsonl``, in order."""
    with open(os.path.join(workdir, METRICS_FILE)) as f:
        return [json.loads(line) for line in f if line.strip()]


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class ProgressLogger:
    """Formats a progress line: step, steps/s, ETA, loss, accuracy (or mse, or bits per
    token) and solver steps.

    Args:
      total_steps: the step the run ends at (for the ETA).
      start_step: the step the run (re)started from.
      emit: where lines go (``print`` by default; pass `absl.logging.info` to log).
      clock: the time source, for tests.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        emit: Callable[[str], None] = print,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total_steps = total_steps
        self._emit = emit
        self._clock = clock
        self._last_step = start_step
        self._last_time = clock()

    def restart_clock(self, step: int) -> None:
        """Starts timing from ``step`` now (e.g. after compilation or an evaluation)."""
        self._last_step, self._last_time = step, self._clock()

    def line(self, step: int, metrics: Mapping[str, Any]) -> str:
        """The progress line for ``step``; also emits it and restarts the clock."""
        now = self._clock()
        rate = (step - self._last_step) / max(now - self._last_time, 1e-9)
        eta = (self.total_steps - step) / rate if rate > 0 else float("inf")
        m = to_python(metrics)
        score = next((k for k in ("accuracy", "mse", "bpt") if k in m), "accuracy")
        value = m.get(score, float("nan"))
        text = (
            f"step {step}/{self.total_steps}  {rate:.2f} steps/s  ETA {_duration(eta)}  "
            f"loss {m.get('loss', float('nan')):.4f}  {score[:3]} {value:.4f}  "
            f"solver steps {m.get('nstep_mean', float('nan')):.1f} "
            f"(max {m.get('nstep_max', float('nan')):.0f})"
        )
        self._emit(text)
        self._last_step, self._last_time = step, now
        return text
