"""Pytree states <-> the flat ``[B, D]`` arrays that solvers work on.

A batched state is a pytree whose leaves all share a leading batch axis of size ``B``;
it flattens to ``[B, D]`` with ``D`` the per-sample size summed over leaves. An unbatched
state flattens to ``[1, D]``. Leaves keep their own dtypes on the way back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Layout(NamedTuple):
    """How to turn a ``[B, D]`` array back into the original pytree (static)."""

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # per-leaf shapes, batch axis excluded
    dtypes: tuple[Any, ...]
    batched: bool
    batch_size: int
    dtype: Any  # the common dtype of the flat array


def describe(tree: Any) -> str:
    """A short 'float32[4,3]' description of a pytree's leaves, for error messages."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    parts = [f"{jnp.dtype(x.dtype).name}{list(np.shape(x))}".replace(" ", "") for x in leaves]
    if treedef.num_leaves == 1 and jax.tree_util.treedef_is_leaf(treedef):
        return parts[0]
    return f"{treedef} with leaves ({', '.join(parts)})"


def same_specs(a: Any, b: Any) -> bool:
    """Whether two pytrees of arrays (or shape structs) have equal structure, shapes, dtypes."""
    return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
        np.shape(u) == np.shape(v) and jnp.result_type(u) == jnp.result_type(v)
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


def infer_batched(z0: Any) -> bool:
    """A state is batched along axis 0 unless one of its leaves is a scalar."""
    return all(np.ndim(x) >= 1 for x in jax.tree_util.tree_leaves(z0))


def layout_of(z0: Any, batched: bool) -> Layout:
    """The `Layout` of a state ``z0``; checks that it can be flattened."""
    leaves, treedef = jax.tree_util.tree_flatten(z0)
    if not leaves:
        raise ValueError("The state z0 has no array leaves.")
    for x in leaves:
        if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            raise ValueError(f"Every leaf of z0 must be a float array; got {describe(z0)}.")
    if batched:
        sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
        if None in sizes or len(sizes) != 1:
            raise ValueError(
                "A batched state needs a common leading batch axis on every leaf; "
                f"got {describe(z0)}. Pass batched=False for an unbatched state."
            )
        batch_size = sizes.pop()
        shapes = tuple(tuple(np.shape(x)[1:]) for x in leaves)
    else:
        batch_size = 1
        shapes = tuple(tuple(np.shape(x)) for x in leaves)
    dtypes = tuple(jnp.result_type(x) for x in leaves)
    return Layout(treedef, shapes, dtypes, batched, batch_size, jnp.result_type(*dtypes))


def flatten(tree: Any, layout: Layout) -> jax.Array:
    """Pytree -> ``[B, D]`` in the layout's common dtype."""
    leaves = jax.tree_util.tree_leaves(tree)
    rows = [jnp.reshape(jnp.asarray(x, layout.dtype), (layout.batch_size, -1)) for x in leaves]
    return rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=1)


def unflatten(flat: jax.Array, layout: Layout) -> Any:
    """``[B, D]`` -> pytree with the original leaf shapes and dtypes."""
    sizes = [math.prod(s) for s in layout.shapes]
    splits = np.cumsum(sizes)[:-1].tolist()
    parts = jnp.split(flat, splits, axis=1) if len(sizes) > 1 else [flat]
    leaves = []
    for part, shape, dtype in zip(parts, layout.shapes, layout.dtypes, strict=True):
        full = (layout.batch_size, *shape) if layout.batched else shape
        leaves.append(jnp.reshape(part, full).astype(dtype))
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)


def unbatch_stats(x: jax.Array, layout: Layout) -> jax.Array:
    """Drops the batch axis of a per-sample statistic for an unbatched state."""
    return x if layout.batched else x[0]


def flat_fn(f: Callable[..., Any], layout: Layout, *extra: Any) -> Callable[[jax.Array], Any]:
    """``z [B, D] -> f(unflatten(z), *extra)`` flattened again."""
    return lambda z: flatten(f(unflatten(z, layout), *extra), layout)


def per_sample_cosine(a: Any, b: Any, eps: float = 1e-12) -> jax.Array:
    """Cosine similarity of two batched pytrees, per sample (``[B]``).

    Each sample's leaves are flattened and concatenated before the comparison.
    """
    flat = lambda t: jnp.concatenate(
        [jnp.reshape(x, (x.shape[0], -1)) for x in jax.tree_util.tree_leaves(t)], axis=1
    )
    u, v = flat(a), flat(b)
    dot = jnp.sum(u * v, axis=1)
    return dot / (jnp.linalg.norm(u, axis=1) * jnp.linalg.norm(v, axis=1) + eps)
