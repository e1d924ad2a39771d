"""Initial states of a DEQ: specs shaped like the input, and zeros/normal/mixed starts.

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (the mixed initialisation).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from deq_jax.nn.spec import Z_INITS


def float_dtype(dtype: Any) -> Any:
    """``dtype`` if it is a float dtype, else the default float dtype (for int inputs)."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.dtype(dtype)
    return jnp.dtype(jnp.result_type(float))


def state_like(x: jax.Array, features: int | None = None, dtype: Any = None) -> Any:
    """The spec of a state shaped like ``x`` with ``features`` channels on the last axis.

    Args:
      x: the input, ``[B, ..., C]``.
      features: the state's channels; ``None`` keeps ``C``.
      dtype: the state's dtype; ``None`` takes ``x``'s float dtype.

    Returns:
      A `jax.ShapeDtypeStruct` ``[B, ..., features]``, what a cell's ``state_spec``
      returns in the common case.
    """
    shape = x.shape if features is None else (*x.shape[:-1], features)
    return jax.ShapeDtypeStruct(shape, float_dtype(x.dtype) if dtype is None else dtype)


def _mixed_mask(key: jax.Array, batch: int) -> jax.Array:
    """``[B]`` bool, true for the samples that start from a Gaussian, false for zeros.

    Exactly ``B // 2`` samples start at zero (plus one more with probability 1/2 when
    ``B`` is odd), chosen at random, so each sample is zero with probability 1/2.
    """
    k_perm, k_coin = jax.random.split(key)
    n_zero = batch // 2 + (batch % 2) * jax.random.bernoulli(k_coin).astype(jnp.int32)
    return jax.random.permutation(k_perm, batch) >= n_zero


def initial_state(spec: Any, z_init: str, key: jax.Array | None) -> Any:
    """Builds an initial state for the spec (a pytree of shapes and dtypes).

    Args:
      spec: a pytree of `jax.ShapeDtypeStruct` (or arrays), each ``[B, ...]``.
      z_init: ``"zeros"``, ``"normal"`` (standard Gaussian) or ``"mixed"`` (each sample
        zeros or Gaussian with probability 1/2, exactly half the batch zeros).
      key: the rng key for ``"normal"`` and ``"mixed"``.

    Returns:
      A pytree of arrays like ``spec``.

    References:
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022 (the mixed initialisation).
    """
    if z_init not in Z_INITS:
        raise ValueError(f"z_init must be one of {', '.join(Z_INITS)}, got {z_init!r}.")
    leaves, treedef = jax.tree_util.tree_flatten(spec)
    if z_init == "zeros":
        return jax.tree_util.tree_unflatten(treedef, [jnp.zeros(s.shape, s.dtype) for s in leaves])
    k_mask, *keys = jax.random.split(key, len(leaves) + 1)
    noise = [jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves, strict=True)]
    if z_init == "mixed":
        batch = leaves[0].shape[0]
        keep = _mixed_mask(k_mask, batch)  # [B]
        noise = [jnp.where(keep.reshape((batch,) + (1,) * (z.ndim - 1)), z, 0) for z in noise]
    return jax.tree_util.tree_unflatten(treedef, noise)
