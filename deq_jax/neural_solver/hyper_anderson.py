"""HyperAnderson: Anderson mixing whose weights ``alpha`` and damping ``beta`` are predicted.

Like Anderson acceleration, a HyperAnderson step keeps the last ``n = m + 1`` images
``f(z_i)`` and residuals ``g_i = f(z_i) - z_i`` and returns

    z_{k+1} = beta * sum_i alpha_i f(z_i) + (1 - beta) * sum_i alpha_i z_i,

but instead of solving the least-squares problem ``min ||G alpha||`` it reads ``alpha``
and ``beta`` off a small network (`HyperAndersonNet`) that looks at a compressed history
of residuals: each residual is pooled per sample to a ``C``-vector (global average over
the spatial or sequence axes, or the last token of a sequence), scaled to unit size over
the history, and passed, oldest first, through a two-layer temporal convolution.

``beta`` may also be fixed instead of predicted (``beta=1.0``, the undamped update
``sum_i alpha_i f(z_i)``): the network then has no ``beta`` head and the update reads
the image history only, not the residual history, which saves a pass over ``m + 1``
stored states per step.

The kernels here are pure functions on the flat ``[B, D]`` arrays of
`deq_jax.solvers.loop`; `deq_jax.neural_solver.neural_solver` wires them into a `Solver`
and `deq_jax.neural_solver.loss` unrolls them differentiably for training.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4).
  Anderson, "Iterative procedures for nonlinear integral equations", J. ACM 1965.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.neural_solver.state_shape import StateShape, is_multiscale, state_size
from deq_jax.nn.conv import Conv
from deq_jax.solvers.anderson import anderson_step, anderson_weights, update_gram

POOLS = ("mean", "last")

# Where alpha comes from: the network, or Anderson's least squares (the network then
# predicts beta only; the "LS alpha + learned beta" ablation of Bai et al. 2022).
ALPHA_MODES = ("learned", "least_squares")

# Relative ridge of the least-squares alpha (as `deq_jax.solvers.anderson`'s default).
LS_RIDGE = 1e-4

# Extra per-slot features next to the pooled residual: log relative norm, valid flag.
EXTRA_FEATURES = 2

# Bounds the log relative residual norms fed to the network.
_LOG_NORM_CLIP = 20.0


class HyperAndersonState(NamedTuple):
    """Ring buffers of images and residuals, and the chronological compressed history."""

    fs: jax.Array  # [B, n, D] past images f(z_i), ring order (slot (k - 1) % n)
    gs: jax.Array  # [B, n, D] past residuals g_i, ring order
    feats: jax.Array  # [B, n, C] pooled residuals, oldest first (newest at n - 1)
    norms: jax.Array  # [B, n] ||g_i||, oldest first
    gram: jax.Array  # [B, n, n] <g_i, g_j> in ring order (kept only when least squares run)


class HyperAndersonStep(NamedTuple):
    """One HyperAnderson step with the quantities the training loss needs."""

    z_next: jax.Array  # [B, D]
    state: HyperAndersonState
    alpha: jax.Array  # [B, n] mixing weights in ring order, zero on empty slots
    beta: jax.Array  # [B] damping in (0, 1), or the fixed beta
    mixed_residual: jax.Array  # [B, D] G alpha = sum_i alpha_i g_i


class HyperAndersonNet(nn.Module):
    """Predicts raw mixing scores ``a [B, n]`` and damping ``beta [B]`` from the history.

    Two temporal convolutions (over the history axis, ``SAME`` padding, ReLU) followed by
    a per-slot linear head for ``a`` and a pooled linear head with a sigmoid for
    ``beta``. Both heads start at zero weight: an untrained network mixes the history
    uniformly with ``beta = sigmoid(beta_bias_init)``.

    Attributes:
      hidden: channels of the temporal convolutions.
      kernel_size: width of the temporal convolutions.
      beta_bias_init: initial logit of ``beta``.
      predict_beta: whether the network has the ``beta`` head; without it (a solver
        with a fixed ``beta``) it returns ``beta = None``.

    References:
      Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
    """

    hidden: int = 32
    kernel_size: int = 3
    beta_bias_init: float = 0.0
    predict_beta: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """``x [B, n, F]`` (zero on empty slots), ``valid [n]`` -> ``(a [B, n], beta [B])``."""
        h = nn.relu(Conv(self.hidden, (self.kernel_size,), padding="SAME")(x))
        h = nn.relu(Conv(self.hidden, (self.kernel_size,), padding="SAME")(h))  # [B, n, H]
        h = h * valid[None, :, None]
        a = nn.Dense(1, kernel_init=nn.initializers.zeros)(h)[..., 0]  # [B, n]
        if not self.predict_beta:
            return a, None
        pooled = jnp.sum(h, axis=1) / jnp.maximum(jnp.sum(valid), 1)  # [B, H]
        logit = nn.Dense(
            1,
            kernel_init=nn.initializers.zeros,
            bias_init=nn.initializers.constant(self.beta_bias_init),
        )(pooled)[..., 0]
        return a, nn.sigmoid(logit)


def normalize_alpha(a: jax.Array, valid: jax.Array) -> jax.Array:
    """Shifts raw scores to weights that sum to one over the valid slots.

    ``alpha = a + (1 - 1^T a) / m_k`` on the ``m_k`` valid slots and zero elsewhere (the
    normalisation of Bai et al. 2022): unlike a softmax it keeps negative weights, which
    Anderson mixing needs.

    Args:
      a: raw scores ``[B, n]``.
      valid: which slots hold history, ``[n]`` bool (at least one true).

    Returns:
      ``[B, n]`` weights with ``sum_i alpha_i = 1``.
    """
    a = jnp.where(valid, a, 0.0)
    m_k = jnp.maximum(jnp.sum(valid), 1).astype(a.dtype)
    shift = (1.0 - jnp.sum(a, axis=-1, keepdims=True)) / m_k
    return jnp.where(valid, a + shift, 0.0)


def hyper_anderson_update(
    fs: jax.Array, gs: jax.Array, alpha: jax.Array, beta: jax.Array | float
) -> jax.Array:
    """``beta * sum_i alpha_i f(z_i) + (1 - beta) * sum_i alpha_i z_i`` with per-sample beta.

    Anderson's update (`deq_jax.solvers.anderson_step`) with the predicted weights.

    Args:
      fs: images ``[B, n, D]``.
      gs: residuals ``[B, n, D]`` (``z_i = f(z_i) - g_i``).
      alpha: weights ``[B, n]``.
      beta: damping ``[B]`` (or a scalar). A Python ``1.0`` gives
        ``sum_i alpha_i f(z_i)`` without reading ``gs``.

    Returns:
      The next iterate ``[B, D]``.
    """
    return anderson_step(fs, gs, alpha, beta)


def pool_residual(g: jax.Array, state_shape: StateShape, pool: str) -> jax.Array:
    """Compresses flat residuals ``g [B, D]`` to ``[B, C]`` (`pooled_channels`).

    The pooled vector depends on the channels only, so a solver built for sequences of
    one length (or images of one size) runs on any other: a one-array state with
    spatial axes may hold any number of positions. A multiscale state (a tuple of
    shapes, see `deq_jax.neural_solver.state_shape`) is pooled per resolution, channel
    by channel, and the means are concatenated; its sizes must match exactly.

    Args:
      g: residuals, one flattened state per row.
      state_shape: the per-sample state shape, channels last: ``(D,)`` for vectors,
        ``(L, C)`` for sequences, ``(H, W, C)`` for images (for the last two, the
        spatial sizes may differ at run time), or a tuple of such shapes.
      pool: ``"mean"`` averages over every position (the vector itself for ``(D,)``);
        ``"last"`` takes the last token of a sequence.

    Raises:
      ValueError: if ``D`` does not fit ``state_shape`` (the size of a vector state, a
        multiple of the channels for one array with positions, the exact size of a
        multiscale state), or ``pool`` is unknown or ``"last"`` with a state that is
        not a sequence.
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}.")
    batch, size = g.shape
    if is_multiscale(state_shape):
        if pool != "mean":
            raise ValueError(f"pool={pool!r} needs a sequence state (L, C), got {state_shape}.")
        if size != state_size(state_shape):
            raise ValueError(
                f"The neural solver was built for states of shapes {state_shape} "
                f"({state_size(state_shape)} values per sample) but the solve has {size}."
            )
        pooled, start = [], 0
        for shape in state_shape:  # the flattening order of the state's leaves
            n = math.prod(shape)
            leaf = jnp.reshape(g[:, start : start + n], (batch, n // shape[-1], shape[-1]))
            pooled.append(jnp.mean(leaf, axis=1))  # [B, C_i]
            start += n
        return jnp.concatenate(pooled, axis=-1)  # [B, sum_i C_i]
    channels = state_shape[-1]
    fits = size == channels if len(state_shape) == 1 else size % channels == 0
    if not fits:
        what = f"{channels}" if len(state_shape) == 1 else f"a multiple of {channels}"
        raise ValueError(
            f"The neural solver was built for states of shape {state_shape} ({what} "
            f"values per sample) but the solve has {size} values per sample."
        )
    x = jnp.reshape(g, (batch, size // channels, channels))  # [B, positions, C]
    if pool == "mean":
        return jnp.mean(x, axis=1)
    if len(state_shape) != 2:
        raise ValueError(f"pool='last' needs a sequence state (L, C), got {state_shape}.")
    return x[:, -1, :]


def history_features(feats: jax.Array, norms: jax.Array, valid: jax.Array) -> jax.Array:
    """The network input ``[B, n, C + 2]`` from the chronological compressed history.

    Pooled residuals are divided by the largest pooled norm in memory, so the network
    sees the same input at every scale; the log norm of each residual relative to the
    newest one and the valid flag are appended. Empty slots are zero.
    """
    tiny = jnp.sqrt(jnp.finfo(feats.dtype).tiny)
    feats = jnp.where(valid[None, :, None], feats, 0.0)
    scale = jnp.max(jnp.linalg.norm(feats, axis=-1), axis=1)  # [B]
    unit = feats / (scale[:, None, None] + tiny)
    rel = jnp.log((norms + tiny) / (norms[:, -1:] + tiny))
    rel = jnp.where(valid, jnp.clip(rel, -_LOG_NORM_CLIP, _LOG_NORM_CLIP), 0.0)  # [B, n]
    flag = jnp.broadcast_to(valid.astype(feats.dtype), rel.shape)
    return jnp.concatenate([unit, rel[..., None], flag[..., None]], axis=-1)


def hyper_anderson_init(z0: jax.Array, m: int, channels: int) -> HyperAndersonState:
    """Empty buffers for ``z0 [B, D]`` with memory ``n = m + 1``."""
    b, d = z0.shape
    n = m + 1
    return HyperAndersonState(
        fs=jnp.zeros((b, n, d), z0.dtype),
        gs=jnp.zeros((b, n, d), z0.dtype),
        feats=jnp.zeros((b, n, channels), z0.dtype),
        norms=jnp.zeros((b, n), z0.dtype),
        gram=jnp.zeros((b, n, n), z0.dtype),
    )


def hyper_anderson_step(
    net: HyperAndersonNet,
    params: Any,
    state: HyperAndersonState,
    z: jax.Array,
    fz: jax.Array,
    k: jax.Array,
    state_shape: StateShape,
    pool: str,
    alpha_mode: str = "learned",
    beta: float | None = None,
) -> HyperAndersonStep:
    """Books ``(z, f(z))`` (the ``k``-th evaluation, ``k >= 1``) and proposes the next iterate.

    Args:
      net: the `HyperAndersonNet` describing the network.
      params: its variables (concrete or traced).
      state: the buffers (`hyper_anderson_init`).
      z: the current iterate ``[B, D]``; ``fz`` its image.
      k: evaluations of ``f`` made so far (an int scalar, may be traced).
      state_shape: per-sample state shape (see `pool_residual`).
      pool: ``"mean"`` or ``"last"``.
      alpha_mode: ``"learned"`` (the network's alpha) or ``"least_squares"`` (Anderson's
        ``argmin ||G alpha||`` with ``sum alpha = 1``; the network's beta is kept).
      beta: ``None``: the network predicts ``beta``; a number: this fixed ``beta`` (the
        network then has no ``beta`` head, see `HyperAndersonNet`).

    Returns:
      A `HyperAndersonStep`.
    """
    n = state.fs.shape[1]
    slot = (k - 1) % n
    g = fz - z
    fs = jax.lax.dynamic_update_index_in_dim(state.fs, fz, slot, axis=1)
    gs = jax.lax.dynamic_update_index_in_dim(state.gs, g, slot, axis=1)
    pooled = pool_residual(g, state_shape, pool).astype(z.dtype)  # [B, C]
    feats = jnp.concatenate([state.feats[:, 1:], pooled[:, None]], axis=1)
    norms = jnp.concatenate([state.norms[:, 1:], jnp.linalg.norm(g, axis=-1)[:, None]], axis=1)
    valid = jnp.arange(n) >= n - jnp.minimum(k, n)  # [n], oldest first
    gram = state.gram
    if alpha_mode == "least_squares":
        gram = update_gram(gram, gs, g, slot)
    batch = z.shape[0]
    a, net_beta = net.apply(params, history_features(feats, norms, valid), valid)
    if beta == 1.0:  # the undamped update: no pass over the residuals
        step_beta = 1.0
    elif beta is None:
        step_beta = net_beta.astype(z.dtype)
    else:
        step_beta = jnp.full((batch,), beta, z.dtype)
    if alpha_mode == "least_squares":
        ring_valid = jnp.arange(n) < jnp.minimum(k, n)  # slots written so far
        alpha = anderson_weights(gram, ring_valid, LS_RIDGE).astype(z.dtype)
    else:
        alpha_chron = normalize_alpha(a.astype(z.dtype), valid)
        # Ring slot r holds the chronological position (r - slot - 1) % n.
        alpha = jnp.take(alpha_chron, (jnp.arange(n) - slot - 1) % n, axis=1)
    return HyperAndersonStep(
        z_next=hyper_anderson_update(fs, gs, alpha, step_beta),
        state=HyperAndersonState(fs, gs, feats, norms, gram),
        alpha=alpha,
        beta=jnp.broadcast_to(jnp.asarray(step_beta, z.dtype), (batch,)),
        mixed_residual=jnp.einsum("bm,bmd->bd", alpha, gs),
    )
