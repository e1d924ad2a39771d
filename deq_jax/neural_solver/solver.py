"""`neural_solver`: HyperAnderson iterations with trained weights, a `Solver` like any other.

The solver is a frozen, hashable dataclass: its hyper-parameters and its trained
weights (held by value in a `FrozenParams`, hashed by content). It therefore passes
through `deq_jax.fixed_point`, the ``custom_vjp`` of `deq_jax.backward.ift` (as a
non-differentiable argument), ``jax.jit`` (as a closed-over constant or a static
argument) and `deq_jax.nn.DEQ` exactly like `deq_jax.solvers.anderson`; the weights are
constants of the compiled solve. It shares the loop, per-sample stopping and statistics
of every solver (`deq_jax.solvers.loop`).

The learned initialiser ``h_phi`` is not part of the solver (a solver only sees
``z0``): compute ``z0 = initializer.apply(init_params, x)`` and pass it as ``z0`` to
`deq_jax.fixed_point` or to a `deq_jax.nn.DEQ` call.

The backward linear system of `deq_jax.backward.ift` differs from the forward problem
the network was trained on; give ``ift`` its own classic solver, e.g.
``ift(solver=anderson(tol=1e-6))``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax.neural_solver.hyper_anderson import (
    ALPHA_MODES,
    EXTRA_FEATURES,
    LS_RIDGE,
    POOLS,
    HyperAndersonNet,
    HyperAndersonState,
    hyper_anderson_init,
    hyper_anderson_step,
)
from deq_jax.neural_solver.params import FrozenParams, leaf_specs
from deq_jax.neural_solver.state_shape import (
    StateShape,
    check_state_shape,
    is_multiscale,
    pooled_channels,
)
from deq_jax.solvers.anderson import AndersonState, anderson, update_gram
from deq_jax.solvers.base import Solver
from deq_jax.solvers.combinators import sequence


@dataclasses.dataclass(frozen=True, kw_only=True)
class neural_solver(Solver):  # noqa: N801 - registry name is the constructor name
    """A HyperAnderson solver with trained weights.

    Build an untrained one with `init_neural_solver`, train it with
    `deq_jax.training.train_neural_solver`, then use it as any solver::

        sol = dj.fixed_point(f, z0, args, solver=trained,
                             backward=dj.backward.ift(solver=dj.solvers.anderson(tol=1e-6)))

    Attributes:
      params: the `HyperAndersonNet` variables; a pytree of concrete arrays is wrapped
        in a `FrozenParams` on construction.
      state_shape: the per-sample state shape, channels last: ``(D,)``, ``(L, C)`` or
        ``(H, W, C)``, for a solve whose state is one array ``[B, *state_shape]`` (any
        pytree state of that total size is accepted with ``state_shape=(D,)``); or a
        tuple of such shapes, one per array of a multiscale state (a tuple of arrays,
        each pooled on its own; `deq_jax.neural_solver.state_shape`).
      m: history size is ``m + 1`` (the current iterate and ``m`` past ones).
      hidden: channels of the network's temporal convolutions.
      kernel_size: width of the temporal convolutions.
      pool: how a residual is compressed per sample: ``"mean"`` (global average over
        the non-channel axes) or ``"last"`` (the last token of a sequence).
      alpha_mode: ``"learned"`` (HyperAnderson) or ``"least_squares"`` (Anderson's
        alpha with the network's beta, an ablation).
      anderson_after: hand over to plain Anderson (least-squares alpha on the same
        history, ``beta = 1``) after this many learned steps, e.g. the ``K`` the
        network was trained on: the learned steps cut the early residual, Anderson
        keeps its fast convergence in the tail, where the network was never trained.
        The solve is then `handed_over`, i.e. ``sequence((learned, K),
        anderson(m=m + 1))`` with the learned solver's history handed to Anderson;
        `step` (the training unroll) stays the learned step. ``None`` (default):
        learned steps throughout.
      beta: ``None`` (default): the network predicts the damping ``beta`` per sample, as
        in the paper; a number in ``(0, 1]``: a fixed ``beta`` and no ``beta`` head.
        ``1.0`` takes the undamped update ``sum_i alpha_i f(z_i)``, which skips a pass
        over the stored residuals every step (the learned ``beta`` of the prefix-sum and
        maze solvers settled at 0.99-1.0; fixing it made a 16-step prefix-sum solve 16%
        faster for the same accuracy).
        The least-squares ablation (``alpha_mode="least_squares"``) learns its ``beta``.
      tol, max_iter, stop_mode: see `Solver`.

    References:
      Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
    """

    params: Any
    state_shape: StateShape
    m: int = 5
    hidden: int = 32
    kernel_size: int = 3
    pool: str = "mean"
    alpha_mode: str = "learned"
    anderson_after: int | None = None
    beta: float | None = None

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "state_shape", _check_hyper(self))
        params = FrozenParams(self.params)
        expected = leaf_specs(
            init_params(
                jax.random.PRNGKey(0),
                m=self.m,
                hidden=self.hidden,
                kernel_size=self.kernel_size,
                channels=pooled_channels(self.state_shape),
                predict_beta=self.beta is None,
                abstract=True,
            )
        )
        if params.specs != expected:
            raise ValueError(
                "params do not match the network of this solver (hidden, kernel_size, "
                f"the pooled state channels, beta): expected {expected}, got {params.specs}."
            )
        object.__setattr__(self, "params", params)

    @property
    def net(self) -> HyperAndersonNet:
        """The network whose variables are ``params``."""
        return HyperAndersonNet(
            hidden=self.hidden, kernel_size=self.kernel_size, predict_beta=self.beta is None
        )

    @property
    def variables(self) -> Any:
        """The network's variables as a pytree of arrays."""
        return self.params.tree

    def with_params(self, params: Any) -> neural_solver:
        """A copy with other (e.g. freshly trained) network variables."""
        return dataclasses.replace(self, params=params)

    @property
    def handed_over(self) -> sequence | None:
        """``sequence((learned, anderson_after), anderson(m=m + 1))``; ``None`` without."""
        if self.anderson_after is None:
            return None
        learned = dataclasses.replace(self, anderson_after=None)
        budget = {k: getattr(self, k) for k in ("tol", "max_iter", "stop_mode", "full_budget")}
        tail = anderson(m=self.m + 1, beta=1.0, lam=LS_RIDGE, **budget)
        return sequence((learned, self.anderson_after), tail, **budget)

    def learned_init(self, z0):
        """The learned steps' state (`HyperAndersonState`) for ``z0 [B, D]``."""
        return hyper_anderson_init(z0, self.m, pooled_channels(self.state_shape))

    def init(self, z0):
        if self.anderson_after is not None:
            return self.handed_over.init(z0)
        return self.learned_init(z0)

    def propose(self, aux, z, fz, k):
        if self.anderson_after is not None:
            return self.handed_over.propose(aux, z, fz, k)
        return self.step(self.variables, aux, z, fz, k)[:2]

    def path(self, aux, k):
        return None if self.anderson_after is None else self.handed_over.path(aux, k)

    def phases(self):
        """The hand-over's stretches (learned steps, then Anderson), each in a loop of
        its own, so that no step switches between the two parts (on the language model
        the switch cost 189 against 132 ms per 12-step batch; BUILD_NOTES)."""
        return None if self.anderson_after is None else self.handed_over.phases()

    def hand_over(self, aux, to, k):
        """The history as Anderson's when ``to`` is an `anderson` of memory ``m + 1``.

        Anderson then continues on the same ring of images and residuals (the same
        slots and count), as the hand-over of ``anderson_after`` always did. The
        learned steps keep no Gram matrix; it is built here row by row in the order
        the residuals were booked, so it holds the very numbers Anderson would have.
        """
        if not (isinstance(to, anderson) and to.m == self.m + 1) or self.anderson_after:
            return None
        if self.alpha_mode == "least_squares":
            return AndersonState(fs=aux.fs, gs=aux.gs, gram=aux.gram)
        n, gram = self.m + 1, aux.gram
        for j in range(n):  # the evaluations k - n + 1 .. k, oldest first
            booked = k - n + 1 + j
            slot = (booked - 1) % n
            row = update_gram(gram, aux.gs, jnp.take(aux.gs, slot, axis=1), slot)
            gram = jnp.where(booked >= 1, row, gram)
        return AndersonState(fs=aux.fs, gs=aux.gs, gram=gram)

    def step(self, params, aux, z, fz, k):
        """The learned `HyperAndersonStep` with explicit (possibly traced) ``params``.

        Without the Anderson hand-over, whatever ``anderson_after``: the training
        unroll (`deq_jax.neural_solver.unroll`) trains the learned steps. ``aux`` is a
        `learned_init` state, or an `init` state of the hand-over (its learned part).
        """
        if not isinstance(aux, HyperAndersonState):
            aux = aux[0]
        return hyper_anderson_step(
            self.net,
            params,
            aux,
            z,
            fz,
            k,
            self.state_shape,
            self.pool,
            self.alpha_mode,
            self.beta,
        )


def _check_hyper(hyper: Any) -> StateShape:
    """Validates the network hyper-parameters; returns ``state_shape`` as tuples."""
    shape = check_state_shape(hyper.state_shape)
    for name in ("m", "hidden", "kernel_size"):
        value = getattr(hyper, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    if hyper.pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {hyper.pool!r}.")
    if hyper.alpha_mode not in ALPHA_MODES:
        raise ValueError(
            f"alpha_mode must be one of {', '.join(ALPHA_MODES)}, got {hyper.alpha_mode!r}."
        )
    after = hyper.anderson_after
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
        raise ValueError(f"anderson_after must be None or an integer >= 0, got {after!r}.")
    if hyper.pool == "last" and (is_multiscale(shape) or len(shape) != 2):
        raise ValueError(f"pool='last' needs a sequence state (L, C), got {shape}.")
    beta = hyper.beta
    if beta is not None:
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 < beta <= 1:
            raise ValueError(f"beta must be None (learned) or a number in (0, 1], got {beta!r}.")
        if hyper.alpha_mode == "least_squares":
            raise ValueError(
                "alpha_mode='least_squares' learns beta (the 'least-squares alpha, learned "
                "beta' ablation); leave beta=None."
            )
    return shape


def init_params(
    key: jax.Array,
    *,
    m: int,
    hidden: int,
    kernel_size: int,
    channels: int,
    predict_beta: bool = True,
    abstract: bool = False,
) -> Any:
    """Fresh `HyperAndersonNet` variables.

    Args:
      key: PRNG key.
      m: history size minus one.
      hidden: channels of the temporal convolutions.
      kernel_size: width of the temporal convolutions.
      channels: the pooled residual size (`pooled_channels` of the state shape).
      predict_beta: with the ``beta`` head (a solver whose ``beta`` is ``None``).
      abstract: return shape structs only (no computation).
    """
    net = HyperAndersonNet(hidden=hidden, kernel_size=kernel_size, predict_beta=predict_beta)
    n = m + 1
    x = jnp.zeros((1, n, channels + EXTRA_FEATURES))
    valid = jnp.ones((n,), bool)
    if abstract:
        return jax.eval_shape(net.init, key, x, valid)
    return net.init(key, x, valid)


def init_neural_solver(key: jax.Array, state_shape: StateShape, **hyper: Any) -> neural_solver:
    """An untrained `neural_solver` (uniform mixing, ``beta = 1/2`` unless fixed).

    Args:
      key: PRNG key of the network's initialisation.
      state_shape: the per-sample state shape, channels last (a tuple of shapes for a
        multiscale state).
      **hyper: the other `neural_solver` fields (``m``, ``hidden``, ``kernel_size``,
        ``pool``, ``alpha_mode``, ``anderson_after``, ``beta``, ``tol``, ``max_iter``,
        ``stop_mode``).

    Returns:
      A `neural_solver` with freshly initialised weights.

    Raises:
      ValueError: on an unknown keyword (the valid ones are listed) or a bad value.
    """
    fields = {f.name: f for f in dataclasses.fields(neural_solver)}
    names = sorted(set(fields) - {"params", "state_shape"})
    unknown = sorted(set(hyper) - set(names))
    if unknown:
        raise ValueError(f"Unknown neural_solver keyword(s) {unknown}; valid: {', '.join(names)}.")
    merged = {name: hyper.get(name, fields[name].default) for name in names}
    shape = _check_hyper(SimpleNamespace(state_shape=state_shape, **merged))
    params = init_params(
        key,
        m=merged["m"],
        hidden=merged["hidden"],
        kernel_size=merged["kernel_size"],
        channels=pooled_channels(shape),
        predict_beta=merged["beta"] is None,
    )
    return neural_solver(params=params, state_shape=shape, **hyper)
