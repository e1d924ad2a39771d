"""Variational (weight-tied) dropout for NNX cells: one mask for every iteration of a solve.

Ordinary dropout draws a new mask each time it is called, so inside a fixed-point solve
the map ``z -> cell(z, x)`` would change from one iteration to the next and have no
fixed point. `VariationalDropout` draws no key of its own: `deq_jax.nnx.DEQ` draws one
key per solve from its ``"dropout"`` rng stream and hands it (`hand_keys`) to every
dropout layer of the cell before each evaluation, so the mask is fixed within a solve
and fresh across solves.

From that key a layer derives its mask key as the linen `deq_jax.nn.VariationalDropout`
at the same place of the linen twin of the cell does (flax's ``make_rng``: the layer's
linen path and its first draw folded into the key, `deq_jax.nnx.linen_path`). So the
NNX and linen layers, handed the same key, drop the same units.

References:
  Gal & Ghahramani, "A Theoretically Grounded Application of Dropout in Recurrent
  Neural Networks", NeurIPS 2016.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core.scope import LazyRng

from deq_jax.nnx.convert import linen_path


class VariationalDropout(nnx.Module):
    """Dropout whose mask depends only on a key, never on the call count.

    Inside a DEQ cell the key is the one its `deq_jax.nnx.DEQ` hands it for the solve in
    progress (a training solve with a ``"dropout"`` rng stream; none at evaluation).
    Called on its own, the layer takes the key as the ``key`` argument.

    Whether the layer drops: never with ``deterministic=True`` (the call argument if
    given, else the attribute, which ``model.eval()`` sets and ``model.train()``
    clears); otherwise exactly when it has a key. A layer called twice in one cell
    evaluation applies the same mask twice.

    Args:
      rate: the probability of dropping a unit, in ``[0, 1)``.
      broadcast_dims: axes along which the mask is shared (e.g. ``(1,)`` shares one
        mask across the positions of a ``[B, L, C]`` sequence, as in the DEQ paper).
      deterministic: if true, the layer is the identity.

    Raises:
      ValueError: if ``rate`` is outside ``[0, 1)``.

    References:
      Gal & Ghahramani, "A Theoretically Grounded Application of Dropout in
      Recurrent Neural Networks", NeurIPS 2016.
    """

    def __init__(
        self,
        rate: float,
        *,
        broadcast_dims: Sequence[int] = (),
        deterministic: bool | None = None,
    ):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"rate must lie in [0, 1), got {rate!r}.")
        self.rate = rate
        self.broadcast_dims = tuple(broadcast_dims)
        self.deterministic = deterministic
        self.key = nnx.data(None)  # the mask key a DEQ handed this layer (`hand_keys`)

    def __call__(
        self, x: jax.Array, *, deterministic: bool | None = None, key: jax.Array | None = None
    ) -> jax.Array:
        """Applies the mask to ``x``, scaling kept units by ``1 / (1 - rate)``.

        Args:
          x: any array.
          deterministic: overrides the attribute for this call.
          key: the mask's key (the key a DEQ handed the layer if ``None``).

        Returns:
          An array like ``x``.
        """
        if deterministic is None:
            deterministic = bool(self.deterministic)
        key = self.key if key is None else key
        if deterministic or self.rate == 0.0 or key is None:
            return x
        shape = list(x.shape)
        for axis in self.broadcast_dims:
            shape[axis] = 1
        keep = jax.random.bernoulli(key, 1.0 - self.rate, shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x))


def hand_keys(cell: nnx.Module, key: jax.Array | None) -> None:
    """Hands every `VariationalDropout` of ``cell`` its mask key derived from ``key``.

    Each layer gets the key that flax's ``make_rng`` would give the linen layer at the
    same linen path (`linen_path`) of a cell applied with ``rngs={"dropout": key}``;
    ``key=None`` takes the keys away (no dropout). Called by `deq_jax.nnx.DEQ` on the
    copies of the cell it evaluates, never on the model's own cell.

    Args:
      cell: the cell (a copy made by ``nnx.merge``).
      key: the solve's dropout key, or ``None``.
    """
    for path, module in nnx.iter_modules(cell):
        if isinstance(module, VariationalDropout):
            if key is None:
                module.key = None
            else:
                module.key = LazyRng.create(key, *linen_path(cell, path), 1).as_jax_rng()
