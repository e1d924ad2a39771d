"""Random bit strings: distinct draws that avoid given strings, and prefix parities.

The numpy pieces behind the prefix-sum data (`deq_jax.tasks.prefix_sum`): `random_strings`
draws distinct strings (exactly, without replacement, up to 20 bits; by rejection above),
`cumulative_parity` computes the prefix-sum targets.
"""

from __future__ import annotations

import numpy as np

_ENUMERATE_MAX_LENGTH = 20  # up to 2**20 candidates: sample without replacement exactly


def cumulative_parity(bits: np.ndarray) -> np.ndarray:
    """Prefix-sum targets: ``out[..., i] = sum(bits[..., :i + 1]) mod 2``, same dtype."""
    return (np.cumsum(bits, axis=-1) % 2).astype(bits.dtype)


def _to_bits(values: np.ndarray, length: int) -> np.ndarray:
    """Integers ``[N]`` to their big-endian bits ``[N, length]`` (uint8)."""
    shifts = np.arange(length - 1, -1, -1, dtype=np.int64)
    return ((values[:, None].astype(np.int64) >> shifts) & 1).astype(np.uint8)


def _to_ints(bits: np.ndarray) -> np.ndarray:
    """Big-endian bits ``[N, L]`` (L <= 62) to integers ``[N]``."""
    weights = 2 ** np.arange(bits.shape[1] - 1, -1, -1, dtype=np.int64)
    return bits.astype(np.int64) @ weights


def random_strings(
    length: int, size: int, rng: np.random.Generator, *, exclude: np.ndarray | None = None
) -> np.ndarray:
    """Draws ``size`` distinct random bit strings, none of them in ``exclude``.

    Args:
      length: bits per string.
      size: number of strings.
      rng: the source of randomness; the result is a function of its state.
      exclude: optional ``[M, length]`` strings that must not be drawn.

    Returns:
      ``[size, length]`` uint8 array of 0/1, rows distinct, in draw order.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}.")
    exclude = np.zeros((0, length), np.uint8) if exclude is None else np.asarray(exclude)
    if exclude.ndim != 2 or exclude.shape[1] != length:
        raise ValueError(f"exclude must be [M, {length}], got shape {exclude.shape}.")
    if length <= _ENUMERATE_MAX_LENGTH:
        pool = np.setdiff1d(np.arange(2**length), _to_ints(exclude))
        if size > len(pool):
            raise ValueError(f"Only {len(pool)} {length}-bit strings are available, not {size}.")
        return _to_bits(rng.choice(pool, size=size, replace=False), length)
    seen = {row.tobytes() for row in np.packbits(exclude.astype(np.uint8), axis=-1)}
    if size > 2**length - len(seen):
        raise ValueError(f"Only {2**length - len(seen)} {length}-bit strings are available.")
    rows = []
    while len(rows) < size:
        candidates = rng.integers(0, 2, size=(size - len(rows), length), dtype=np.uint8)
        for row, key in zip(candidates, np.packbits(candidates, axis=-1), strict=True):
            if key.tobytes() not in seen:
                seen.add(key.tobytes())
                rows.append(row)
    return np.stack(rows) if rows else np.zeros((0, length), np.uint8)
