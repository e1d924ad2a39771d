"""Batching and metrics shared by every task: deterministic, resumable, shardable.

A *source* is either a mapping of numpy arrays with a common leading dimension
(``{"inputs": [N, ...], "targets": [N, ...]}``) or any random-access record source
(``len(source)`` and ``source[i] -> dict``, e.g. a tfds ``as_data_source()`` split).

* `train_batches` yields an endless stream of shuffled, fixed-size batches. Epoch ``e``
  visits the examples in the order ``epoch_permutation(N, seed, e)`` and drops the
  remainder, so global step ``s`` is a pure function of ``(seed, s)``: starting at
  ``start_step=s`` yields exactly what an uninterrupted run yields from step ``s`` on.
* `eval_batches` makes one ordered pass; the last batch is padded to full size by
  repeating example 0 with ``mask=False``, so every example is seen exactly once.

Both add ``"mask"`` (bool ``[b]``) and ``"index"`` (int32 ``[b]``, the example's
position in the source) to every batch.

Multi-host: ``batch_size`` is always the *global* batch size. Process ``p`` of ``P``
receives rows ``[p * b, (p + 1) * b)`` of each global batch, where
``b = batch_size // P`` (``batch_size`` must be divisible by ``P``). Every process
computes the same permutation from the same seed, so the union over processes of step
``s`` equals the single-process batch of step ``s``, and every process sees the same
number of evaluation batches (as collectives require).

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

Batch = dict[str, np.ndarray]
_ADDED_KEYS = ("mask", "index")


def num_examples(source: Any) -> int:
    """Number of examples in a source (mapping of arrays or record source)."""
    if isinstance(source, Mapping):
        sizes = {len(v) for v in source.values()}
        if len(sizes) != 1:
            raise ValueError(f"Arrays in a source must share their leading dimension, got {sizes}.")
        return sizes.pop()
    return len(source)


def to_arrays(source: Any) -> Batch:
    """Reads a whole record source into a dict of stacked numpy arrays.

    Args:
      source: a random-access record source (``len`` and ``__getitem__`` returning a
        dict of arrays per example), e.g. a tfds ``as_data_source()`` split; a mapping
        of arrays is returned unchanged.

    Returns:
      ``{key: [N, ...]}``, one array per feature.
    """
    if isinstance(source, Mapping):
        return dict(source)
    return _take(source, np.arange(len(source)))


def _take(source: Any, indices: np.ndarray) -> Batch:
    """Gathers the examples ``indices`` of a source into stacked arrays."""
    if isinstance(source, Mapping):
        return {k: np.asarray(v)[indices] for k, v in source.items()}
    keys = [int(i) for i in indices]
    if hasattr(source, "__getitems__"):
        records = source.__getitems__(keys)
    else:
        records = [source[i] for i in keys]
    if not records:
        raise ValueError("Cannot stack an empty selection of records.")
    return {k: np.stack([np.asarray(r[k]) for r in records]) for k in records[0]}


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` visits ``n`` examples; a function of (seed, epoch)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
    return rng.permutation(n)


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Training steps per epoch (the last partial batch is dropped)."""
    return n // batch_size


def num_eval_batches(n: int, batch_size: int) -> int:
    """Evaluation batches for one full pass (the last one padded)."""
    return -(-n // batch_size)


def _local_batch_size(batch_size: int, process_index: int, process_count: int) -> int:
    """Validates the sharding arguments; returns the per-process batch size."""
    if not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"Need 0 <= process_index < process_count, got {process_index} and {process_count}."
        )
    if batch_size % process_count:
        raise ValueError(
            f"The global batch_size {batch_size} must be divisible by "
            f"process_count {process_count}."
        )
    return batch_size // process_count


def _check_keys(source: Any) -> None:
    if isinstance(source, Mapping) and set(_ADDED_KEYS) & set(source):
        raise ValueError(f"A source may not define {_ADDED_KEYS}; the iterators add them.")


def _batch(source: Any, indices: np.ndarray, mask: np.ndarray) -> Batch:
    batch = _take(source, indices)
    batch["mask"] = mask
    batch["index"] = indices.astype(np.int32)
    return batch


def train_batches(
    source: Any,
    batch_size: int,
    *,
    seed: int,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[Batch]:
    """Endless shuffled training batches, deterministic in (seed, step) and resumable.

    Args:
      source: a mapping of arrays or a random-access record source.
      batch_size: the global batch size; the remainder of each epoch is dropped.
      seed: seeds the per-epoch permutations (`epoch_permutation`).
      start_step: the first global step to yield (resume from a checkpoint).
      process_index: this process's index (``jax.process_index()``).
      process_count: number of processes (``jax.process_count()``).

    Returns:
      An iterator of ``{**features, "mask": bool [b], "index": int32 [b]}`` with
      ``b = batch_size // process_count``; ``mask`` is all True.
    """
    local = _local_batch_size(batch_size, process_index, process_count)
    _check_keys(source)
    n = num_examples(source)
    steps = steps_per_epoch(n, batch_size)
    if steps == 0:
        raise ValueError(f"batch_size {batch_size} exceeds the {n} training examples.")
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}.")

    def generate() -> Iterator[Batch]:
        step = start_step
        while True:
            epoch, offset = divmod(step, steps)
            order = epoch_permutation(n, seed, epoch)
            for position in range(offset, steps):
                start = position * batch_size + process_index * local
                indices = order[start : start + local]
                yield _batch(source, indices, np.ones(local, dtype=bool))
            step = (epoch + 1) * steps

    return generate()


def eval_batches(
    source: Any,
    batch_size: int,
    *,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[Batch]:
    """One ordered pass over a source; the last batch is padded and masked.

    Args:
      source: a mapping of arrays or a random-access record source.
      batch_size: the global batch size.
      process_index: this process's index (``jax.process_index()``).
      process_count: number of processes (``jax.process_count()``).

    Returns:
      An iterator of ``num_eval_batches(N, batch_size)`` batches of
      ``{**features, "mask": bool [b], "index": int32 [b]}``; padding rows repeat
      example 0 with ``mask=False``. Over all processes and batches, the rows with
      ``mask=True`` are each example exactly once.
    """
    local = _local_batch_size(batch_size, process_index, process_count)
    _check_keys(source)
    n = num_examples(source)
    total = num_eval_batches(n, batch_size) * batch_size
    order = np.arange(total)
    valid = order < n
    order = np.where(valid, order, 0)

    def generate() -> Iterator[Batch]:
        for start in range(process_index * local, total, batch_size):
            rows = slice(start, start + local)
            yield _batch(source, order[rows], valid[rows])

    return generate()


def sequence_accuracy(
    logits: jnp.ndarray, targets: jnp.ndarray, mask: jnp.ndarray | None = None
) -> dict[str, jnp.ndarray]:
    """Per-position and whole-sequence accuracy of a per-position classifier.

    Works on numpy or jax arrays and under ``jit``.

    Args:
      logits: ``[B, ..., C]`` class scores for every position.
      targets: ``[B, ...]`` integer labels.
      mask: optional ``[B]`` bool, which examples count (padding is False).

    Returns:
      ``{"bit_accuracy": mean over counted positions, "string_accuracy": fraction of
      counted examples with every position right, "count": number of counted
      examples}``. Combine batches with `weighted_mean`.

    References:
      Schwarzschild et al. 2021 and Anil et al. 2022 report both accuracies for
      prefix sums and mazes.
    """
    if targets.ndim < 2 or logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"Expected logits [B, ..., C] and targets [B, ...], got {logits.shape} and "
            f"{targets.shape}."
        )
    correct = jnp.argmax(logits, axis=-1) == targets  # [B, ...]
    axes = tuple(range(1, correct.ndim))
    per_position = jnp.mean(correct, axis=axes)  # [B]
    whole = jnp.all(correct, axis=axes)  # [B]
    weight = jnp.ones(correct.shape[0]) if mask is None else jnp.asarray(mask, jnp.float32)
    count = jnp.sum(weight)
    denom = jnp.maximum(count, 1.0)
    return {
        "bit_accuracy": jnp.sum(weight * per_position) / denom,
        "string_accuracy": jnp.sum(weight * whole) / denom,
        "count": count,
    }


def weighted_mean(metrics: Sequence[Mapping[str, Any]], weight_key: str = "count") -> dict:
    """Averages per-batch metric dicts, weighting each batch by ``weight_key``.

    Args:
      metrics: per-batch dicts of scalars, each with a ``weight_key`` entry.
      weight_key: the entry holding each batch's weight; it is summed, not averaged.

    Returns:
      A dict of Python floats with the same keys.
    """
    if not metrics:
        raise ValueError("weighted_mean needs at least one metrics dict.")
    weights = np.array([float(m[weight_key]) for m in metrics])
    total = weights.sum()
    out = {weight_key: float(total)}
    for key in metrics[0]:
        if key != weight_key:
            values = np.array([float(m[key]) for m in metrics])
            out[key] = float((weights * values).sum() / max(total, 1.0))
    return out
