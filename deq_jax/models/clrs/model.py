"""`ClrsModel`: encode-process-decode for CLRS algorithms, run to a fixed point or not.

The model of the CLRS DEQ study: linear encoders per feature (`FeatureEncoder`), a
processor cell (`deq_jax.models.clrs.processors`) over node states ``z [B, n, H]`` and
decoders per feature (`FeatureDecoder`) reading ``[x_node, z]``. ``mode`` chooses how
the processor runs:

* ``"deq"``: ``z* = P(z*, x)`` from the configured solver, with the configured backward
  mode (implicit gradients by default), through `deq_jax.nn.DEQ`: the model decides
  itself when to stop. Jacobian regularisation, the spectral radius and the alignment
  penalty come from the library.
* ``"hint_propagation"``: ``z_{t+1} = P(z_t, x)`` iterated per sample until the
  solver's residual test passes (``solver.tol``, ``solver.stop_mode``, the train or
  eval budget), backpropagating through every step (`unroll_to_fixed_point`).
* ``"fixed_steps"``: CLRS's baseline: exactly ``max(length - 1, 1)`` steps per example
  (its true number of steps), the hints encoded at every step (the ground truth at
  step 0, then the model's own decoded hints, or the ground truth with probability
  ``teacher_forcing`` in training), decoded after every step and supervised.

Options of the study: ``step_penalty`` (adds ``w sum_t ||z_{t+1} - z_t||^2`` per
example; in ``"deq"`` mode, where no trajectory is differentiated, the residual ``w
||P(z*) - z*||^2`` at the fixed point) and ``gumbel_hints`` (fed-back categorical hints
as straight-through Gumbel-softmax samples in training, one-hot argmaxes in
evaluation). Hint and step losses are sown per example as ``"aux_loss"``
into ``"intermediates"``, which the train step adds to the task loss.

Call: ``model.apply(variables, adjacency [B, n, n], train=..., lengths=int32 [B],
input_<name>=..., hint_<name>=[B, T, ...], **deq_options) -> (outputs, stats)``:
``outputs`` are the output feature's logits, ``[B, n, n]`` for a node pointer (a
softmax over parents per node) and ``[B, n, n, 2]`` for an edge mask (logits ``[0,
l]``, so a softmax cross-entropy is the binary one), and ``stats`` per-sample
`deq_jax.SolverStats` (``nstep``: processor steps). Missing features are zeros at
initialisation only.

References:
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.models.clrs.decoders import FeatureDecoder
from deq_jax.models.clrs.encoders import (
    FeatureEncoder,
    FeatureSpec,
    dense_value,
    feature_shape,
    of_stage,
    parse_spec,
)
from deq_jax.models.clrs.loops import (
    ClrsStep,
    per_sample_norm,
    run_fixed_steps,
    unroll_to_fixed_point,
)
from deq_jax.models.clrs.processors import ProcessorInputs, make_processor
from deq_jax.nn.deq import DEQ, sow_terms
from deq_jax.nn.spec import DEQSpec
from deq_jax.nn.state import initial_state
from deq_jax.regularizers.terms import Alignment
from deq_jax.solvers.base import SolverStats

MODES = ("deq", "hint_propagation", "fixed_steps")
AUX_LOSS = "aux_loss"


class ClrsModel(nn.Module):
    """The CLRS encode-process-decode model, in one of three modes (module docstring).

    Attributes:
      spec: the algorithm's features, rows ``(name, stage, location, type,
        categories)`` (see `deq_jax.models.clrs.encoders.FeatureSpec`; one output feature, a
        node pointer or an edge mask; the ``adj`` input is the call's first argument).
      processor: ``"mpnn"``, ``"gmpnn"`` (gated) or ``"triplet_mpnn"``.
      hidden: the width ``H`` of embeddings and node states.
      triplet_features: the Triplet-MPNN's triplet width.
      edge_state: the width of the Triplet-MPNN's persistent edge state (0: none; see
        `deq_jax.models.clrs.processors`); mode ``"deq"`` only, whose solver takes the
        state pair.
      mode: ``"deq"``, ``"hint_propagation"`` or ``"fixed_steps"``.
      step_penalty: the weight of the step penalty (0: off).
      hint_loss_weight: the weight of the hint loss in ``fixed_steps``.
      teacher_forcing: the probability, per example and step, of feeding the true hint
        instead of the predicted one in ``fixed_steps`` training.
      gumbel_hints: feed back categorical hints as straight-through Gumbel samples.
      gumbel_tau: the Gumbel-softmax temperature.
      decode_edge_latents: decode the output from the input edge embeddings and the
        triplet edge latents of one more processor step at the final state (CLRS's
        Triplet-GMPNN decoders; ``processor="triplet_mpnn"``, not in ``fixed_steps``).
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`): the forward solver
        (``"deq"``; its ``tol`` and ``stop_mode`` also stop ``"hint_propagation"``),
        the backward mode (``"deq"``), the initial state, the train and eval
        iteration budgets (``None``: the solver's) and the penalty terms.

    References:
      Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
      Xhonneux et al., "Deep Equilibrium Models for Algorithmic Reasoning", ICLR 2024
      blog post track.
    """

    spec: tuple[tuple[Any, ...], ...] = ()
    processor: str = "mpnn"
    hidden: int = 64
    triplet_features: int = 8
    edge_state: int = 0
    mode: str = "deq"
    step_penalty: float = 0.0
    hint_loss_weight: float = 1.0
    teacher_forcing: float = 0.0
    gumbel_hints: bool = False
    gumbel_tau: float = 1.0
    decode_edge_latents: bool = False
    deq: DEQSpec = DEQSpec()

    def __post_init__(self):
        object.__setattr__(self, "spec", parse_spec(self.spec))
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        outputs = of_stage(self.spec, "output")
        if len(outputs) != 1 or (outputs[0].type, outputs[0].location) not in (
            ("pointer", "node"),
            ("mask", "edge"),
        ):
            raise ValueError(
                f"ClrsModel needs one node-pointer or edge-mask output, got {outputs}."
            )
        if self.step_penalty < 0 or self.hint_loss_weight < 0 or self.gumbel_tau <= 0:
            raise ValueError("step_penalty and hint_loss_weight must be >= 0, gumbel_tau > 0.")
        if self.decode_edge_latents and (
            self.processor != "triplet_mpnn" or self.mode == "fixed_steps"
        ):
            raise ValueError(
                "decode_edge_latents needs processor='triplet_mpnn' (the only one with edge "
                f"latents) and mode 'deq' or 'hint_propagation'; got {self.processor!r}, "
                f"{self.mode!r}."
            )
        if self.edge_state and (
            self.processor != "triplet_mpnn" or self.mode != "deq" or self.step_penalty
        ):
            raise ValueError(
                "edge_state needs processor='triplet_mpnn', mode 'deq' and no step_penalty "
                f"(the others run on node states only); got {self.processor!r}, {self.mode!r}, "
                f"step_penalty={self.step_penalty}."
            )
        if not 0.0 <= self.teacher_forcing <= 1.0:
            raise ValueError(f"teacher_forcing must lie in [0, 1], got {self.teacher_forcing}.")
        super().__post_init__()

    def _processor_kwargs(self) -> tuple[tuple[str, Any], ...]:
        kwargs = dict(hidden=self.hidden)
        if self.processor == "triplet_mpnn":
            kwargs["triplet_features"] = self.triplet_features
            if self.edge_state:
                kwargs["edge_state"] = self.edge_state
        return tuple(kwargs.items())

    def _budget(self, train: bool, max_iter: int | None) -> int:
        return self.deq.budget(train, max_iter or None)

    def _start(self, spec: Any, z0: Any) -> jax.Array:
        if z0 is not None:
            return z0
        return initial_state(
            spec, self.deq.z_init, None if self.deq.z_init == "zeros" else self.make_rng("z0")
        )

    def _features(self, features: dict[str, Any], adjacency: jax.Array, init: bool):
        """The input values and the hint trajectories by feature name."""
        b, n = adjacency.shape[:2]
        inputs = [f for f in of_stage(self.spec, "input") if f.name != "adj"]
        hints = of_stage(self.spec, "hint")
        keys = [f"input_{f.name}" for f in inputs] + [f"hint_{f.name}" for f in hints]
        unknown = sorted(set(features) - set(keys))
        if unknown:
            raise ValueError(f"Unknown ClrsModel features {unknown}. Valid: {', '.join(keys)}.")
        need_hints = self.mode == "fixed_steps"

        def read(prefix: str, f: FeatureSpec, steps: tuple[int, ...], needed: bool) -> jax.Array:
            value = features.get(f"{prefix}{f.name}")
            if value is None and needed and not init:
                raise ValueError(
                    f"ClrsModel in mode {self.mode!r} needs {prefix}{f.name}; a ClrsTask "
                    "with extra_edge_rate or weight_power carries no hints (set them to 0, 1)."
                )
            if value is None:
                dtype = jnp.int32 if f.type == "pointer" else jnp.float32
                value = jnp.zeros((b, *steps, *feature_shape(f, n)), dtype)
            return value

        values = {f.name: read("input_", f, (), True) for f in inputs}
        values["adj"] = adjacency
        trajectories = {f.name: read("hint_", f, (2,), need_hints) for f in hints}
        return values, trajectories

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        *,
        train: bool,
        max_iter: int | None = None,
        lengths: jax.Array | None = None,
        z0: Any = None,
        stats_probe: jax.Array | None = None,
        **features: jax.Array,
    ) -> tuple[jax.Array, SolverStats]:
        """``adjacency [B, n, n]`` and features -> ``(output logits, stats)`` (module docstring).

        ``max_iter`` overrides the iteration budget (ignored by ``fixed_steps``, which
        takes ``lengths``); ``z0`` and ``stats_probe`` are the `DEQ` options. The
        penalty terms of ``deq.terms`` are sown in ``deq`` mode by the `DEQ`, in
        ``hint_propagation`` at its last iterate (all but the alignment penalty);
        ``fixed_steps`` has no fixed point for them.
        """
        if inputs.ndim != 3 or inputs.shape[1] != inputs.shape[2]:
            raise ValueError(f"ClrsModel expects an adjacency [B, n, n], got shape {inputs.shape}.")
        adjacency = inputs.astype(jnp.float32)
        b, n = adjacency.shape[:2]
        init = self.is_initializing()
        values, hints = self._features(features, adjacency, init)
        if lengths is None:
            if self.mode == "fixed_steps" and not init:
                raise ValueError("ClrsModel in mode 'fixed_steps' needs lengths.")
            lengths = jnp.full((b,), 2, jnp.int32)
        encoder = FeatureEncoder(of_stage(self.spec, "input"), self.hidden, name="input_encoder")
        base = encoder(values, b, n)
        x = ProcessorInputs(base.node, base.edge, base.graph, adjacency)
        self._check_terms()
        aux = []
        edge_latents = None  # the Triplet-GMPNN's edge latents at z*, for the decoder
        if self.mode == "fixed_steps":
            z, stats, hint_loss, penalty = self._fixed_steps(x, hints, lengths, z0, train, init)
            aux.append(self.hint_loss_weight * hint_loss)
        else:
            cell = make_processor(self.processor, name="cell", **dict(self._processor_kwargs()))
            if self.mode == "deq":
                z, stats = DEQ(cell, spec=self.deq, name="deq")(
                    x, train=train, max_iter=max_iter, z0=z0, stats_probe=stats_probe
                )
                penalty = None
                if self.decode_edge_latents:  # one cell call at z* serves both
                    fz, edge_latents = cell(z, x, return_edges=True)
                elif self.step_penalty:
                    fz = cell(z, x)
                if self.step_penalty:
                    penalty = jnp.square(per_sample_norm(fz - z))
            else:
                z, stats, penalty = self._unroll(cell, x, z0, train, max_iter, init)
        if self.step_penalty:
            aux.append(self.step_penalty * penalty)
        if aux and not init:
            self.sow("intermediates", AUX_LOSS, sum(aux[1:], aux[0]))
        if self.decode_edge_latents and edge_latents is None:
            _, edge_latents = cell(z, x, return_edges=True)
        return self._decode(base, z, edge_latents), stats

    def _check_terms(self) -> None:
        """Refuses the penalty terms of ``deq.terms`` that the mode cannot compute."""
        terms = self.deq.terms
        if self.mode != "deq" and any(isinstance(t, Alignment) for t in terms):
            raise ValueError("The alignment penalty needs mode='deq'.")
        if self.mode == "fixed_steps" and terms:
            raise ValueError(
                "Jacobian terms need a fixed point: mode 'deq' or 'hint_propagation' (for "
                "'fixed_steps' set regularizer.jacobian_weight=0, spectral_every=0 and "
                "spectral_weight=0)."
            )

    def _unroll(self, cell, x, z0, train: bool, max_iter: int | None, init: bool):
        """Iterates the cell to its fixed point, differentiably (``hint_propagation``)."""
        z_start = self._start(cell.state_spec(x), z0)
        if init:
            cell(z_start, x)
        module, variables = cell.unbind()
        f = lambda z, args: module.apply(args[0], z, args[1])
        args = (variables, x)
        z, stats, penalty = unroll_to_fixed_point(
            f,
            z_start,
            args,
            max_iter=self._budget(train, max_iter),
            tol=self.deq.solver.tol,
            stop_mode=self.deq.solver.stop_mode,
        )
        if self.deq.terms:
            self._sow_terms(f, z, args)
        return z, stats, penalty

    def _decode(self, base: ProcessorInputs, z: Any, edge_latents: jax.Array | None):
        """The output feature's logits from ``[x_node, z]`` (and the edge latents, if any)."""
        out = of_stage(self.spec, "output")[0]
        nodes = z[0] if self.edge_state else z  # the edge state is read through the cell
        h = jnp.concatenate([base.node, nodes], axis=-1)  # [B, n, 2H]
        edge = base.edge
        if edge_latents is not None:
            edge = jnp.concatenate([edge, edge_latents], axis=-1)  # [B, n, n, 2H]
        decoder = FeatureDecoder((out,), self.hidden, name="output_decoder")
        logits = decoder(h, edge, base.graph)[out.name]
        if out.type == "mask":  # two-class logits [0, l]: softmax cross-entropy = binary
            logits = jnp.stack([jnp.zeros_like(logits), logits], axis=-1)  # [B, n, n, 2]
        return logits

    def _sow_terms(self, f, z, args) -> None:
        """Sows the penalty terms of ``deq.terms`` at the unrolled map's final state
        (`deq_jax.nn.deq.sow_terms`; none re-solves, the alignment penalty is refused)."""

        def resolve(start):
            raise ValueError("The alignment penalty needs mode='deq'.")

        sow_terms(self, self.deq.terms, f, z, args, resolve)

    def _fixed_steps(self, x, hints, lengths, z0, train: bool, init: bool):
        """Runs ``max(length - 1, 1)`` supervised steps per example (module docstring)."""
        specs = of_stage(self.spec, "hint")
        b, n = x.adjacency.shape[:2]
        step = ClrsStep(specs, self.hidden, self.processor, self._processor_kwargs(), name="step")
        fed = {f.name: dense_value(f, hints[f.name][:, 0], n) for f in specs}
        z = self._start(jax.ShapeDtypeStruct((b, n, self.hidden), jnp.float32), z0)
        if init:
            step(z, fed, x)
        module, variables = step.unbind()
        randomised = train and (self.gumbel_hints or self.teacher_forcing > 0)
        if randomised and not self.has_rng("dropout"):
            raise ValueError("Gumbel hints and teacher forcing draw from the 'dropout' rng stream.")
        return run_fixed_steps(
            lambda z, fed: module.apply(variables, z, fed, x),
            z,
            hints,
            lengths,
            specs,
            train=train,
            feedback_mode=("gumbel" if train else "hard") if self.gumbel_hints else "soft",
            key=self.make_rng("dropout") if randomised else None,
            teacher_forcing=self.teacher_forcing if train else 0.0,
            gumbel_tau=self.gumbel_tau,
        )
