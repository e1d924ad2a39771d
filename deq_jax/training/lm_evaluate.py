"""Evaluating a language model on whole splits, the segment memory carried across
segments (`StreamEvaluator`).

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019 (evaluation over the whole stream with the memory).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from deq_jax.training import sharding
from deq_jax.training.lm_steps import LM_KEYS, make_lm_eval_step, place_memory
from deq_jax.training.state import TrainState


def lm_device_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """The global, sharded token arrays of this process's rows of ``batch``."""
    return sharding.shard_batch({k: batch[k] for k in LM_KEYS}, mesh)


class StreamEvaluator:
    """Evaluates a language model on whole splits, carrying the memory across segments.

    Args:
      model: the language model.
      task: the text task (``eval_iterator``, ``summarize``).
      mesh: the data-parallel mesh.
      batch_size: the global eval batch size (rows of the stream).
      seq_len: tokens per segment.
      max_batches: evaluate at most this many segments per split (0: the whole split).
    """

    def __init__(self, model, task, mesh, batch_size: int, seq_len: int, max_batches: int = 0):
        sharding.check_batch_size(batch_size, mesh, "eval.batch_size")
        self.model, self.task, self.mesh = model, task, mesh
        self.batch_size, self.seq_len, self.max_batches = batch_size, seq_len, max_batches
        self._template = jax.tree_util.tree_map(np.asarray, model.init_mems(batch_size))
        self._steps: dict[tuple[int | None, str | None], Callable[..., Any]] = {}

    def _step(self, max_iter: int | None, mode: str | None):
        key = (max_iter, mode)
        if key not in self._steps:
            self._steps[key] = make_lm_eval_step(
                self.model, self.mesh, self._template, max_iter=max_iter, mode=mode
            )
        return self._steps[key]

    def evaluate(
        self, state: TrainState, split: str, *, max_iter: int | None = None, mode: str | None = None
    ) -> dict[str, float]:
        """Streams ``split`` (the first ``max_batches`` segments; 0: all of it).

        Returns:
          The task's summary (``bpc`` or ``ppl``, ``nll``, ``tokens``) plus the solver's
          ``nstep_mean`` (steps per segment row), ``nstep_max``, ``converged`` (the
          fraction of row-segments that met the tolerance), ``rel_residual`` (their
          mean final relative residual), ``seconds`` and
          ``tokens_per_second`` (wall time of the steps, the first compile excluded).
        """
        step = self._step(max_iter, mode)
        mems = place_memory(self._template, self.mesh, self.batch_size)
        totals: dict[str, float] = {}
        seconds, timed_tokens = 0.0, 0.0
        batches = self.task.eval_iterator(
            split,
            self.batch_size,
            self.seq_len,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        for i, batch in enumerate(batches):
            if self.max_batches and i >= self.max_batches:
                break
            began = time.perf_counter()
            mems, sums = step(state, mems, lm_device_batch(batch, self.mesh))
            sums = jax.device_get(sums)
            if i:  # the first segment compiles
                seconds += time.perf_counter() - began
                timed_tokens += float(sums["count"])
            for k, v in sums.items():
                v = float(v)
                totals[k] = (
                    max(totals.get(k, 0.0), v) if k.endswith("_max") else totals.get(k, 0.0) + v
                )
        if not totals.get("count"):
            raise ValueError(f"Split {split!r} has no tokens to evaluate.")
        metrics = dict(self.task.summarize(totals["nll_sum"], totals["count"]))
        rows = max(totals["rows"], 1.0)
        metrics.update(
            nstep_mean=totals["nstep_sum"] / rows,
            nstep_max=totals["nstep_max"],
            converged=totals["converged_sum"] / rows,
            rel_residual=totals["rel_residual_sum"] / rows,
            seconds=seconds,
            tokens_per_second=timed_tokens / seconds if seconds else float("nan"),
        )
        return metrics
