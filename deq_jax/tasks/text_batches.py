"""Language-model batches of one token stream, Transformer-XL style.

A split is one stream of token ids ``t[0..N)``; a model reads ``inputs = t[:-1]`` and
predicts ``targets = t[1:]`` (``N - 1`` targets).

* `train_batches` cuts the stream into ``batch_size`` contiguous rows of
  ``row_len = (N - 1) // batch_size`` tokens (the remainder dropped); step ``s`` of an
  epoch is the columns ``[s * L, (s + 1) * L)`` of every row, so row ``i`` of a batch
  continues row ``i`` of the previous one and a model's segment memory carries over.
  An epoch is ``row_len // L`` steps (the last partial segment is dropped); every epoch
  repeats the same order, and ``"reset"`` is True on an epoch's first segment. Global
  step ``s`` is a pure function of ``s``: ``start_step=s`` resumes exactly.
* `eval_batches` scores every target once: ``batch_size`` rows of
  ``ceil((N - 1) / batch_size)`` tokens (the end padded), cut into segments of ``L``
  columns (the last one padded); ``mask`` is False on padding, ``"reset"`` True on the
  first batch only.

Batches are ``{"inputs": int32 [b, L], "targets": int32 [b, L], "mask": bool [b, L],
"reset": np.bool_ []}``. ``batch_size`` is global: process ``p`` of ``P`` gets the rows
``[p * b, (p + 1) * b)`` with ``b = batch_size // P``, so the union over processes is
the single-process batch and every process sees the same number of batches.

A resumed run (``start_step > 0`` inside an epoch) gets ``reset=False`` as the
uninterrupted run did, but its model starts with empty memory: the training loop clears
memory on its first step after a restart (or checkpoints it).

References:
  Dai, Yang, Yang, Carbonell, Le, Salakhutdinov, "Transformer-XL: Attentive Language
  Models Beyond a Fixed-Length Context", ACL 2019 (segment-level recurrence, the
  ``batchify`` layout of the stream).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

Batch = dict[str, np.ndarray]


def _check(batch_size: int, seq_len: int, process_index: int, process_count: int) -> int:
    """Validates the batching arguments; returns the per-process batch size."""
    if not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if not isinstance(seq_len, int | np.integer) or seq_len < 1:
        raise ValueError(
            f"seq_len must be a positive integer (tokens per segment), got {seq_len!r}."
        )
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"Need 0 <= process_index < process_count, got {process_index} and {process_count}."
        )
    if batch_size % process_count:
        raise ValueError(
            f"The global batch_size {batch_size} must be divisible by process_count "
            f"{process_count}: change batch_size to a multiple of {process_count}."
        )
    return batch_size // process_count


def _targets(tokens: np.ndarray) -> int:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"A token stream is one-dimensional, got shape {tokens.shape}.")
    if len(tokens) < 2:
        raise ValueError(f"A token stream needs at least 2 tokens (1 target), got {len(tokens)}.")
    return len(tokens) - 1


def steps_per_epoch(num_tokens: int, batch_size: int, seq_len: int) -> int:
    """Training steps per epoch: ``((num_tokens - 1) // batch_size) // seq_len``."""
    return ((num_tokens - 1) // batch_size) // seq_len


def num_eval_batches(num_tokens: int, batch_size: int, seq_len: int) -> int:
    """Batches of one evaluation pass: ``ceil(ceil((num_tokens - 1) / batch_size) / seq_len)``."""
    row_len = -(-(num_tokens - 1) // batch_size)
    return -(-row_len // seq_len)


def train_batches(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    *,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[Batch]:
    """Endless Transformer-XL training batches of a token stream (see the module docstring).

    Args:
      tokens: ``int [N]``, the training split as one stream.
      batch_size: the global number of rows.
      seq_len: tokens per segment (``L``).
      start_step: the first global step to yield (0-based); resumes exactly.
      process_index: this process's index (``jax.process_index()``).
      process_count: number of processes (``jax.process_count()``).

    Returns:
      An endless iterator of ``{"inputs", "targets": int32 [b, L], "mask": bool [b, L]
      (all True), "reset": np.bool_}``, ``b = batch_size // process_count``.

    Raises:
      ValueError: for bad arguments, or a stream too short for one segment per row.
    """
    local = _check(batch_size, seq_len, process_index, process_count)
    n = _targets(tokens)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}.")
    steps = steps_per_epoch(n + 1, batch_size, seq_len)
    if steps == 0:
        raise ValueError(
            f"The training stream of {n + 1} tokens gives {batch_size} rows of {n // batch_size} "
            f"tokens, shorter than one segment of seq_len={seq_len}: lower batch_size or "
            f"seq_len (batch_size * seq_len must be at most {n}), or use a longer corpus."
        )
    row_len = n // batch_size
    rows = slice(process_index * local, (process_index + 1) * local)
    stream = np.asarray(tokens, np.int32)
    inputs = stream[: batch_size * row_len].reshape(batch_size, row_len)[rows]  # [b, row_len]
    targets = stream[1 : batch_size * row_len + 1].reshape(batch_size, row_len)[rows]
    mask = np.ones((local, seq_len), bool)

    def generate() -> Iterator[Batch]:
        step = start_step
        while True:
            k = step % steps
            cols = slice(k * seq_len, (k + 1) * seq_len)
            yield {
                "inputs": inputs[:, cols].copy(),
                "targets": targets[:, cols].copy(),
                "mask": mask.copy(),
                "reset": np.bool_(k == 0),
            }
            step += 1

    return generate()


def eval_batches(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    *,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[Batch]:
    """One ordered pass scoring every target of a token stream exactly once.

    Args:
      tokens: ``int [N]``, the split as one stream.
      batch_size: the global number of rows.
      seq_len: tokens per segment (``L``).
      process_index: this process's index.
      process_count: number of processes.

    Returns:
      An iterator of `num_eval_batches` batches ``{"inputs", "targets": int32 [b, L],
      "mask": bool [b, L], "reset": np.bool_}``; padding holds id 0 with ``mask``
      False. Over all processes and batches the masked-in targets, read row by row,
      are ``tokens[1:]``.
    """
    local = _check(batch_size, seq_len, process_index, process_count)
    n = _targets(tokens)
    num = num_eval_batches(n + 1, batch_size, seq_len)
    row_len = num * seq_len  # columns, padded to whole segments
    per_row = -(-n // batch_size)  # targets a row holds before column padding
    stream = np.asarray(tokens, np.int32)

    def grid(values: np.ndarray, fill) -> np.ndarray:
        out = np.full(batch_size * per_row, fill, values.dtype)
        out[:n] = values
        padded = np.full((batch_size, row_len), fill, values.dtype)
        padded[:, :per_row] = out.reshape(batch_size, per_row)
        return padded[process_index * local : (process_index + 1) * local]  # [b, row_len]

    inputs, targets = grid(stream[:-1], np.int32(0)), grid(stream[1:], np.int32(0))
    mask = grid(np.ones(n, bool), False)

    def generate() -> Iterator[Batch]:
        for k in range(num):
            cols = slice(k * seq_len, (k + 1) * seq_len)
            yield {
                "inputs": inputs[:, cols].copy(),
                "targets": targets[:, cols].copy(),
                "mask": mask[:, cols].copy(),
                "reset": np.bool_(k == 0),
            }

    return generate()
