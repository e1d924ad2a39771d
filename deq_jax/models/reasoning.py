"""Models of the reasoning tasks of the path-independence suite: graphs and matrices.

Called like the models of `deq_jax.models` (``model.apply(variables, inputs,
train=..., max_iter=None, **deq_options) -> (outputs, stats)``); `EdgeCopyDEQ` also
takes the graph's ``adjacency`` keyword, which the training steps hand over because
the edge-copy task lists it in ``batch_extras``.

* `EdgeCopyDEQ` (registered as ``edge_copy_deq``): a DEQ over edge states, one state
  vector per edge, updated from the edges that share an endpoint (`EdgeCell`). The
  same parameters run on graphs of any size.
* `MatrixInversionDEQ` (``matrix_inversion_deq``): a flattened ``d x d`` matrix
  injected into an `MLPCell`, read out as a ``d x d`` matrix.

The blurry-digits task reuses `deq_jax.models.vision.DigitsDEQ`.

References:
  Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
  Minimization", ICML 2022 (edge copy and matrix inversion).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.cells import MLPCell
from deq_jax.nn.deq import DEQ
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.spec import DEQSpec
from deq_jax.nn.state import float_dtype, state_like
from deq_jax.solvers.base import SolverStats

# The z -> z' kernels start small (spectral radius about 1/2), so a fresh cell is
# close to contractive, as in `deq_jax.nn.cells`.
_RECURRENT_INIT = nn.initializers.variance_scaling(0.25, "fan_in", "normal")


def complete_graph(batch: int, nodes: int, dtype: Any = jnp.float32) -> jax.Array:
    """The adjacency ``[batch, nodes, nodes]`` of complete graphs without self-loops."""
    eye = jnp.eye(nodes, dtype=dtype)
    return jnp.broadcast_to(1 - eye, (batch, nodes, nodes))


def edge_neighbourhood(z: jax.Array, adjacency: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The adjacency-masked means of the edges that share an endpoint with each edge.

    Args:
      z: edge states ``[B, n, n, F]``, ``z[:, i, j]`` on edge ``(i, j)``.
      adjacency: ``[B, n, n]`` 0/1.

    Returns:
      ``(out_mean, in_mean)``, each ``[B, n, n, F]``: ``out_mean[:, i, j]`` is the mean
      of ``z[:, i, k]`` over the edges ``(i, k)`` and ``in_mean[:, i, j]`` the mean of
      ``z[:, k, j]`` over the edges ``(k, j)`` (zero at an isolated node).
    """
    a = adjacency.astype(z.dtype)[..., None]  # [B, n, n, 1]
    out_deg = jnp.maximum(jnp.sum(a, axis=2, keepdims=True), 1.0)  # [B, n, 1, 1]
    in_deg = jnp.maximum(jnp.sum(a, axis=1, keepdims=True), 1.0)  # [B, 1, n, 1]
    out_mean = jnp.sum(a * z, axis=2, keepdims=True) / out_deg  # [B, n, 1, F]
    in_mean = jnp.sum(a * z, axis=1, keepdims=True) / in_deg  # [B, 1, n, F]
    return jnp.broadcast_to(out_mean, z.shape), jnp.broadcast_to(in_mean, z.shape)


class EdgeCell(nn.Module):
    """An edge-state cell: ``z'_ij = A_ij LN(W2 relu(W1 [z_ij, z_ji, o_i, m_j] + U u_ij))``.

    ``o_i`` is the mean state of the edges leaving node ``i``, ``m_j`` that of the edges
    entering node ``j`` (`edge_neighbourhood`), ``u_ij`` the injected edge input and
    ``LN`` a layer norm over the feature axis, which keeps the state bounded on every
    graph size (a fresh cell need not be contractive; training from mixed initial
    states, as in ``configs/edge_copy.py``, made it converge in a few Anderson steps on
    10- to 40-node graphs). Every term is a per-edge map or a degree-normalised mean, so
    the cell is equivariant to relabelling the nodes and works for any node count.
    Non-edges (``A_ij = 0``) stay exactly zero.

    The cell is called as ``cell(z, (u, adjacency))`` with ``u [B, n, n, C]`` and
    ``adjacency [B, n, n]``.

    Attributes:
      features: the state size per edge.
      hidden: the hidden width of the update MLP.
      dropout_rate: `VariationalDropout` rate applied to the incoming state.
      recurrent_init: initialiser of the recurrent kernels ``W1`` and ``W2``.
      param_dtype: dtype of the parameters.

    References:
      Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
      Minimization", ICML 2022.
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
    """

    features: int
    hidden: int = 64
    dropout_rate: float = 0.0
    recurrent_init: Any = _RECURRENT_INIT
    param_dtype: Any = jnp.float32

    def state_spec(self, x: tuple[jax.Array, jax.Array]) -> jax.ShapeDtypeStruct:
        """``[B, n, n, features]`` in the promoted dtype of ``u`` and the parameters."""
        u, _ = x
        dtype = jnp.promote_types(float_dtype(u.dtype), self.param_dtype)
        return state_like(u, self.features, dtype)

    @nn.compact
    def __call__(self, z: jax.Array, x: tuple[jax.Array, jax.Array]) -> jax.Array:
        """``z [B, n, n, features], (u [B, n, n, C], adjacency [B, n, n]) -> z'``."""
        u, adjacency = x
        if z.ndim != 4 or u.shape[:3] != z.shape[:3] or adjacency.shape != z.shape[:3]:
            raise ValueError(
                "EdgeCell expects z [B, n, n, F], u [B, n, n, C] and adjacency [B, n, n]; got "
                f"z {z.shape}, u {u.shape} and adjacency {adjacency.shape}."
            )
        a = adjacency.astype(z.dtype)[..., None]  # [B, n, n, 1]
        z = VariationalDropout(self.dropout_rate)(z)
        out_mean, in_mean = edge_neighbourhood(z, adjacency)
        h = jnp.concatenate([z, jnp.swapaxes(z, 1, 2), out_mean, in_mean], axis=-1)
        dense = lambda features, name: nn.Dense(
            features, kernel_init=self.recurrent_init, param_dtype=self.param_dtype, name=name
        )
        h = dense(self.hidden, "recurrent")(h)  # [B, n, n, hidden]
        inject = nn.Dense(self.hidden, use_bias=False, param_dtype=self.param_dtype, name="inject")
        h = nn.relu(h + inject(u.astype(z.dtype)))
        h = dense(self.features, "out")(h)  # [B, n, n, features]
        return nn.LayerNorm(param_dtype=self.param_dtype)(h) * a


class EdgeCopyDEQ(nn.Module):
    """A graph DEQ over edge states for per-edge regression (the edge-copy task).

    ``x [B, n, n, C]`` (edge features, zero off the edges) is projected per edge to
    ``[B, n, n, width]``, injected with the adjacency into an `EdgeCell`, and the fixed
    point ``z* [B, n, n, width]`` is read out per edge by one dense layer to ``C``
    outputs, zero off the edges. Parameters do not depend on ``n``: train on small
    graphs and test on larger ones.

    Attributes:
      width: the state size per edge.
      hidden: the hidden width of the cell's update MLP.
      dropout_rate: the cell's variational dropout rate.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`: solver, backward mode,
        initial state, train and eval budgets).

    References:
      Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
      Minimization", ICML 2022.
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    width: int = 32
    hidden: int = 64
    dropout_rate: float = 0.0
    deq: DEQSpec = DEQSpec()

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        adjacency: jax.Array | None = None,
        *,
        train: bool,
        max_iter: int | None = None,
        **deq_options: Any,
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, n, n, C], adjacency [B, n, n] -> (outputs [B, n, n, C], stats)``.

        ``adjacency=None`` means the complete graph without self-loops (enough to
        initialise the parameters, which do not depend on it); ``deq_options`` go to
        the `DEQ` call.
        """
        if x.ndim != 4 or x.shape[1] != x.shape[2]:
            raise ValueError(f"EdgeCopyDEQ expects inputs [B, n, n, C], got shape {x.shape}.")
        if adjacency is None:
            adjacency = complete_graph(x.shape[0], x.shape[1])
        if adjacency.shape != x.shape[:3]:
            raise ValueError(
                f"EdgeCopyDEQ expects adjacency {x.shape[:3]} for inputs {x.shape}, got "
                f"{adjacency.shape}."
            )
        a = adjacency.astype(float_dtype(x.dtype))
        u = nn.Dense(self.width, name="project")(x) * a[..., None]  # [B, n, n, width]
        cell = EdgeCell(self.width, hidden=self.hidden, dropout_rate=self.dropout_rate, name="cell")
        z, stats = DEQ(cell, spec=self.deq, name="deq")(
            (u, a), train=train, max_iter=max_iter, **deq_options
        )
        outputs = nn.Dense(x.shape[-1], name="head")(z) * a[..., None]  # [B, n, n, C]
        return outputs, stats


class MatrixInversionDEQ(nn.Module):
    """A DEQ regressor from a ``d x d`` matrix to a ``d x d`` matrix (its inverse).

    ``x [B, d, d]`` is flattened to ``d * d``, projected by a dense layer to ``width``,
    injected into an `MLPCell` (``z' = tanh(W2 relu(W1 z + U u + b1) + b2)`` with
    ``hidden`` units) and the fixed point ``z* [B, width]`` is read out by a dense layer
    to ``d * d`` entries, reshaped to ``[B, d, d]``.

    Attributes:
      width: the projection and state size.
      hidden: the hidden width of the cell.
      weight_norm: weight-normalise the cell's recurrent layers.
      dropout_rate: the cell's variational dropout rate.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`: solver, backward mode,
        initial state, train and eval budgets).

    References:
      Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
      Minimization", ICML 2022 (matrix inversion).
      Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
      Computation", NeurIPS 2022.
    """

    width: int = 128
    hidden: int = 256
    weight_norm: bool = False
    dropout_rate: float = 0.0
    deq: DEQSpec = DEQSpec()

    @nn.compact
    def __call__(
        self, x: jax.Array, *, train: bool, max_iter: int | None = None, **deq_options: Any
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, d, d] -> (outputs [B, d, d], stats)``; ``deq_options`` go to the `DEQ`
        call."""
        if x.ndim != 3 or x.shape[1] != x.shape[2]:
            raise ValueError(f"MatrixInversionDEQ expects inputs [B, d, d], got shape {x.shape}.")
        batch, dim = x.shape[0], x.shape[1]
        flat = x.reshape(batch, dim * dim).astype(float_dtype(x.dtype))  # [B, d * d]
        u = nn.Dense(self.width, name="project")(flat)  # [B, width]
        cell = MLPCell(
            self.width,
            hidden=self.hidden,
            weight_norm=self.weight_norm,
            dropout_rate=self.dropout_rate,
            name="cell",
        )
        z, stats = DEQ(cell, spec=self.deq, name="deq")(
            u, train=train, max_iter=max_iter, **deq_options
        )  # [B, width]
        outputs = nn.Dense(dim * dim, name="head")(z)  # [B, d * d]
        return outputs.reshape(batch, dim, dim), stats
