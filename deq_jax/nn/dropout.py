"""Variational (weight-tied) dropout: one mask for every iteration of a solve.

Ordinary dropout draws a new mask each time it is called, so inside a fixed-point
solve the map ``z -> cell(z, x)`` would change from one iteration to the next and
have no fixed point. Variational dropout draws the mask once per forward pass and
reuses it, as for the recurrent connections of an RNN.

References:
  Gal & Ghahramani, "A Theoretically Grounded Application of Dropout in Recurrent
  Neural Networks", NeurIPS 2016.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class VariationalDropout(nn.Module):
    """Dropout whose mask depends only on the rng key, never on the call count.

    The mask is a function of the ``rng_collection`` key handed to the enclosing
    ``apply`` and of this layer's path, so every application of a cell under one key
    uses the same mask. `deq_jax.nn.DEQ` draws one key per forward pass and hands it
    to every cell evaluation of the solve: the mask is fixed within a solve and fresh
    across forward passes.

    Whether the layer is active: the ``deterministic`` call argument if given, else
    the attribute, else it is active exactly when a ``rng_collection`` rng is
    available. Inside a DEQ cell leave both unset: the DEQ passes a ``"dropout"`` rng
    to the cell only when called with ``train=True``.

    Attributes:
      rate: the probability of dropping a unit, in ``[0, 1)``.
      broadcast_dims: axes along which the mask is shared (e.g. ``(1,)`` shares one
        mask across the positions of a ``[B, L, C]`` sequence, as in the DEQ paper).
      deterministic: if true, the layer is the identity.
      rng_collection: the rng stream the mask is drawn from.

    References:
      Gal & Ghahramani, "A Theoretically Grounded Application of Dropout in
      Recurrent Neural Networks", NeurIPS 2016.
    """

    rate: float
    broadcast_dims: Sequence[int] = ()
    deterministic: bool | None = None
    rng_collection: str = "dropout"

    def __post_init__(self):
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"rate must lie in [0, 1), got {self.rate!r}.")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool | None = None) -> jax.Array:
        """Applies the mask to ``x``, scaling kept units by ``1 / (1 - rate)``.

        Args:
          x: any array.
          deterministic: overrides the attribute for this call.

        Returns:
          An array like ``x``.
        """
        if deterministic is None:
            deterministic = self.deterministic
        if deterministic is None:
            deterministic = not self.has_rng(self.rng_collection)
        if deterministic or self.rate == 0.0:
            return x
        key = self.make_rng(self.rng_collection)
        shape = list(x.shape)
        for axis in self.broadcast_dims:
            shape[axis] = 1
        keep = jax.random.bernoulli(key, 1.0 - self.rate, shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x))
