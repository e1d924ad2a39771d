"""`DEQTransformerLM`: the DEQ-Transformer language model and its explicit baselines.

Tokens ``[B, L]`` are embedded (`AdaptiveIO`, adaptive input), dropped out
(``dropouti``, one mask per row and feature) and mapped to the injection
``u [B, L, 3 H D_h]``. The state ``z [B, L, d_model]`` then goes through the
`DEQTransformerCell` (relative self-attention over ``[memory, z]`` with ``u`` added to
q, k, v, and a feed-forward block) in one of four modes:

* ``"deq"``: ``z* = cell(z*, x)`` solved by `deq_jax.nn.DEQ` with ``x = {"injection":
  u, "memory": Memory}``; everything of the `DEQSpec` (solver, backward mode, initial
  state, budgets, penalty terms) applies.
* ``"weight_tied"``: the same cell, with the same parameters, applied ``n_layer``
  times from ``z = 0`` (locuslab's pre-training steps: ``model.clone(mode=
  "weight_tied")`` warms up a ``"deq"`` model on the same parameters).
* ``"untied"``: ``n_layer`` blocks with their own parameters (a Transformer-XL).
* ``"unrolled"``: in training, ``unroll_steps`` applications of the cell with plain
  backpropagation and the fixed-point correction loss of TorchDEQ: the nll read out at
  ``correction_states`` evenly spaced states of the trajectory, the last one the final
  state, weighted by ``correction_gamma ** (states from the end)``. In evaluation it
  solves with the DEQ like ``"deq"``.

The readout applies output dropout (``dropout``, one mask per row and feature) and the
adaptive softmax, tied to the embedding. Memory (Transformer-XL's recurrence, as in
locuslab/deq) holds the last ``mem_len`` fixed points and their injections, without
gradient; the injection is added to q, k, v of ``[memory, segment]``, so memory
positions need theirs. JAX needs fixed shapes: the memory is always ``mem_len`` long,
right-aligned, with a per-row count of valid slots; the others are masked out.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019.
  Baevski & Auli, "Adaptive Input Representations for Neural Language Modeling",
  ICLR 2019.
  Grave et al., "Efficient softmax approximation for GPUs", ICML 2017.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (pre-LN).
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023 (the
  fixed-point correction).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from deq_jax.models.language.adaptive import AdaptiveIO, check_cutoffs
from deq_jax.models.language.cell import DEQTransformerCell, Memory
from deq_jax.models.language.stack import correction_steps, correction_weights, run_tied, run_untied
from deq_jax.nn.deq import DEQ
from deq_jax.nn.dropout import VariationalDropout
from deq_jax.nn.spec import DEQSpec
from deq_jax.solvers.base import SolverStats

MODES = ("deq", "weight_tied", "untied", "unrolled")


class LMOutput(NamedTuple):
    """What `DEQTransformerLM` returns.

    Attributes:
      nll: ``[B, L]``, ``-log p(target)`` per position (``None`` without targets).
      log_probs: ``[B, L, V]`` log-probabilities (only without targets, for sampling).
      mems: the `Memory` for the next segment (no gradient).
      z_star: the final state ``[B, L, d_model]`` (the fixed point in the DEQ modes).
      stats: per-row `deq_jax.SolverStats` (for the explicit modes: ``nstep`` the depth,
        the residual ``||z_n - z_{n-1}||`` of the last step, converged true).
      correction_nll: ``[S, B, L]``, mode ``"unrolled"`` in training with targets: the
        weighted nll at the correction states, ``correction_nll[-1] == nll``; the
        training loss is its sum over ``S`` (else ``None``).
    """

    nll: jax.Array | None
    log_probs: jax.Array | None
    mems: Memory
    z_star: jax.Array
    stats: SolverStats
    correction_nll: jax.Array | None


def _concrete(x: jax.Array) -> np.ndarray | None:
    """``x`` as a NumPy array, or ``None`` when it is traced (under ``jit``)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


class DEQTransformerLM(nn.Module):
    """The DEQ-Transformer language model (module docstring).

    Attributes:
      vocab_size: ``V``.
      d_model: the state and embedding width.
      n_head: attention heads ``H``.
      d_head: width ``D_h`` of a head; the injection is ``3 H D_h`` wide.
      d_inner: the feed-forward hidden width.
      mem_len: memory slots ``M`` (0: no memory).
      dropout: variational dropout inside the cell and on the output.
      dropatt: dropout of the attention probabilities.
      dropouti: variational dropout of the embeddings.
      ln_placement: ``"post"`` (locuslab) or ``"pre"`` (torchdeq's deq-lm).
      weight_norm: weight-normalise the cell's projections.
      tie_weights: tie the softmax to the embedding (tables and projections).
      cutoffs: the adaptive clusters' boundaries (``()``: one cluster).
      div_val: the width ratio of successive clusters' embeddings.
      d_embed: the head cluster's embedding width (``None``: ``d_model``).
      mode: ``"deq"``, ``"weight_tied"``, ``"untied"`` or ``"unrolled"`` (``"untied"``
        has parameters of its own; ``model.clone(mode=...)`` runs the others on the
        same parameters).
      n_layer: the depth of the explicit modes.
      unroll_steps: cell steps of mode ``"unrolled"`` in training.
      correction_states: states of the trajectory in the correction loss.
      correction_gamma: the correction loss's decay per state from the end.
      dtype: parameter and computation dtype.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`).

    References:
      Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
      Dai et al., "Transformer-XL", ACL 2019.
    """

    vocab_size: int
    d_model: int = 128
    n_head: int = 4
    d_head: int = 32
    d_inner: int = 512
    mem_len: int = 0
    dropout: float = 0.0
    dropatt: float = 0.0
    dropouti: float = 0.0
    ln_placement: str = "post"
    weight_norm: bool = True
    tie_weights: bool = True
    cutoffs: tuple[int, ...] = ()
    div_val: int = 1
    d_embed: int | None = None
    mode: str = "deq"
    n_layer: int = 2
    unroll_steps: int = 6
    correction_states: int = 2
    correction_gamma: float = 0.8
    dtype: Any = jnp.float32
    deq: DEQSpec = DEQSpec()

    def __post_init__(self):
        object.__setattr__(self, "cutoffs", tuple(self.cutoffs))
        check_cutoffs(self.vocab_size, self.cutoffs, self.div_val)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (sinusoidal positions), got {self.d_model}.")
        for name in ("mem_len", "n_layer", "unroll_steps", "correction_states"):
            value = getattr(self, name)
            low = 0 if name == "mem_len" else 1
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
        super().__post_init__()

    @property
    def injection_width(self) -> int:
        """``3 H D_h``: the width of the injection added to q, k, v."""
        return 3 * self.n_head * self.d_head

    def init_mems(self, batch_size: int) -> Memory:
        """An empty memory for ``batch_size`` rows: zeros, ``count == 0``."""
        return Memory(
            z=jnp.zeros((batch_size, self.mem_len, self.d_model), self.dtype),
            injection=jnp.zeros((batch_size, self.mem_len, self.injection_width), self.dtype),
            count=jnp.zeros((batch_size,), jnp.int32),
        )

    def _cell(self, name: str) -> DEQTransformerCell:
        return DEQTransformerCell(
            self.d_model,
            self.n_head,
            self.d_head,
            self.d_inner,
            dropout=self.dropout,
            dropatt=self.dropatt,
            ln_placement=self.ln_placement,
            weight_norm=self.weight_norm,
            dtype=self.dtype,
            name=name,
        )

    def _check(self, tokens, targets, mems) -> Memory:
        """Validates the call's inputs; returns the memory (an empty one for ``None``)."""
        if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer) or jnp.ndim(tokens) != 2:
            raise ValueError(
                f"tokens must be an integer array [B, L], got {jnp.result_type(tokens)} of shape "
                f"{jnp.shape(tokens)}."
            )
        b, q_len = tokens.shape
        if q_len < 1:
            raise ValueError("tokens must hold at least one position (L >= 1).")
        for name, ids in (("tokens", tokens), ("targets", targets)):
            if ids is None:
                continue
            if name == "targets" and (
                jnp.shape(ids) != (b, q_len)
                or not jnp.issubdtype(jnp.result_type(ids), jnp.integer)
            ):
                raise ValueError(f"targets must be integers shaped like tokens {(b, q_len)}.")
            values = _concrete(ids)
            if (
                values is not None
                and values.size
                and (values.min() < 0 or values.max() >= self.vocab_size)
            ):
                raise ValueError(
                    f"{name} must lie in [0, vocab_size={self.vocab_size}); got ids in "
                    f"[{values.min()}, {values.max()}]."
                )
        if mems is None:
            return self.init_mems(b)
        expected = jax.tree_util.tree_map(jnp.shape, self.init_mems(b))
        if not isinstance(mems, Memory) or jax.tree_util.tree_map(jnp.shape, mems) != expected:
            raise ValueError(
                f"mems must be a Memory shaped like model.init_mems({b}), {expected}; got "
                f"{jax.tree_util.tree_map(jnp.shape, mems)}."
            )
        return Memory(
            jax.lax.stop_gradient(mems.z.astype(self.dtype)),
            jax.lax.stop_gradient(mems.injection.astype(self.dtype)),
            mems.count.astype(jnp.int32),
        )

    def _new_mems(self, memory: Memory, z: jax.Array, u: jax.Array) -> Memory:
        """The last ``mem_len`` positions of ``[memory, segment]``, without gradient."""
        m = self.mem_len
        keep = lambda old, new: jax.lax.stop_gradient(jnp.concatenate([old, new], 1)[:, -m:])
        if m == 0:
            return memory
        count = jnp.minimum(memory.count + z.shape[1], m).astype(jnp.int32)
        return Memory(keep(memory.z, z), keep(memory.injection, u), count)

    def _io(self) -> AdaptiveIO:
        return AdaptiveIO(
            self.vocab_size,
            self.d_model,
            self.cutoffs,
            self.div_val,
            self.tie_weights,
            self.d_embed,
            self.dtype,
            name="io",
        )

    def _drop(self, rate: float, name: str, train: bool) -> VariationalDropout:
        """Variational dropout with one mask per row and feature."""
        return VariationalDropout(rate, broadcast_dims=(1,), deterministic=not train, name=name)

    def _solve(self, x: dict, z0, targets, train: bool, max_iter, stats_probe):
        """The state ``z [B, L, d_model]`` of the ``mode``, its stats and (mode
        ``"unrolled"`` in training, with targets) the correction states."""
        mode = self.mode
        if mode == "deq" or (mode == "unrolled" and not train):
            deq = DEQ(self._cell("cell"), spec=self.deq, name="deq")
            z, stats = deq(x, z0, train=train, max_iter=max_iter, stats_probe=stats_probe)
            return z, stats, None
        b, q_len = x["injection"].shape[:2]
        start = jnp.zeros((b, q_len, self.d_model), self.dtype) if z0 is None else z0
        key = self.make_rng("dropout") if train and self.has_rng("dropout") else None
        if mode == "untied":
            cells = [self._cell(f"block_{i}") for i in range(self.n_layer)]
            z, stats = run_untied(self, cells, x, start, key)
            return z, stats, None
        steps = self.n_layer if mode == "weight_tied" else self.unroll_steps
        keep = ()
        if mode == "unrolled" and targets is not None:
            keep = correction_steps(steps, self.correction_states)
        return run_tied(self, self._cell("cell"), steps, x, start, key, keep)

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        *,
        train: bool,
        mems: Memory | None = None,
        targets: jax.Array | None = None,
        max_iter: int | None = None,
        z0: jax.Array | None = None,
        stats_probe: jax.Array | None = None,
    ) -> LMOutput:
        """Runs one segment ``tokens [B, L]`` in the model's ``mode`` (see `LMOutput`).

        Args:
          tokens: int ``[B, L]``.
          train: training mode (dropout with the ``"dropout"`` rng, ``train_max_iter``,
            mode ``"unrolled"`` unrolls).
          mems: the previous segment's `Memory` (``None``: an empty one).
          targets: int ``[B, L]``; with them the output has ``nll``, without them
            ``log_probs``.
          max_iter: the DEQ's budget for this call (ignored by the explicit modes).
          z0: the initial state ``[B, L, d_model]`` (``None``: the spec's ``z_init``
            for the DEQ, zeros for the explicit modes).
          stats_probe: the backward-statistics probe handed to the `DEQ` (the
            explicit modes leave it without gradient).

        Raises:
          ValueError: for non-integer or (called outside ``jit``) out-of-range ids,
            targets not shaped like tokens, a ``mems`` not shaped like
            ``init_mems(B)``, or a ``z0`` not ``[B, L, d_model]``. Under ``jit`` the
            ids are the caller's to check (the training loop checks every batch on the
            host: `deq_jax.training.families.lm_evaluate.check_token_ids`).
        """
        memory = self._check(tokens, targets, mems)
        b, q_len = tokens.shape
        if z0 is not None and jnp.shape(z0) != (b, q_len, self.d_model):
            raise ValueError(f"z0 must be [B, L, d_model] = {(b, q_len, self.d_model)}.")
        io = self._io()
        emb = self._drop(self.dropouti, "drop_in", train)(io.embed(tokens))  # [B, L, d]
        u = nn.Dense(self.injection_width, param_dtype=self.dtype, dtype=self.dtype, name="inject")(
            emb
        )  # [B, L, 3HD]
        x = {"injection": u, "memory": memory}
        z, stats, states = self._solve(x, z0, targets, train, max_iter, stats_probe)
        # one output-dropout mask for the final and the correction states
        out_mask = self._drop(self.dropout, "drop_out", train)(jnp.ones_like(z))  # [B, L, d]
        nll = log_probs = correction = None
        if targets is not None:
            nll = io.nll(z * out_mask, targets)  # [B, L]
            if states:
                weights = correction_weights(len(states), self.correction_gamma)
                correction = jnp.stack(
                    [
                        w * io.nll(h * out_mask, targets)
                        for w, h in zip(weights, states, strict=True)
                    ]
                )  # [S, B, L]
        else:
            log_probs = io.log_probs(z * out_mask)  # [B, L, V]
        new_mems = self._new_mems(memory, z, u)
        return LMOutput(nll, log_probs, new_mems, z, stats, correction)
