"""CLRS processors as DEQ cells: MPNN with max aggregation and Triplet-MPNN with gating.

A processor is one message-passing step over a graph of ``n`` nodes with node states
``z [B, n, H]``, called like every cell of the library, ``cell(z, x) -> z``, so it can
run inside `deq_jax.nn.DEQ` or in a plain loop. ``x`` is a `ProcessorInputs`: the
encoded node, edge and graph features and the adjacency. With ``h_i = [x_i, z_i]``:

* messages ``m_ij = MLP(relu(W_s h_i + W_r h_j + W_e e_ij + W_g g))`` from sender ``i``
  to receiver ``j`` (plus, for the Triplet-MPNN, the edge latent ``t_ij``);
* max aggregation ``a_j = max_{i: adj_ij = 1} m_ij`` (the adjacency holds self-loops,
  so every node hears itself);
* update ``z'_j = LN(relu(U_1 h_j + U_2 a_j))``; the Triplet-MPNN gates it,
  ``z'_j = gate_j * z'_j + (1 - gate_j) * z_j``, the gate's bias starting at -3 so a
  fresh cell mostly keeps its state.

Triplet messages (Dudzik & Veličković 2022; Ibarz et al. 2022): ``t_ijk = T_1 h_i +
T_2 h_j + T_3 h_k + T_e1 e_ij + T_e2 e_ik + T_e3 e_jk + T_g g`` (``triplet_features``
wide), ``t_jk = relu(O max_i t_ijk)`` an edge latent per pair. CLRS's code hands
these latents to its decoders only; here they also enter the messages, so they shape
the fixed point the DEQ solves for, and ``cell(z, x, return_edges=True)`` hands them
out for the decoders too (`deq_jax.models.clrs.model.ClrsModel`'s
``decode_edge_latents``).

With ``edge_state = F > 0`` (Triplet-MPNN only) the processor keeps a persistent edge
state ``s [B, n, n, F]`` beside the node states, as the Relational Transformer keeps
edge states: the state is the pair ``(z, s)``, the triplets read ``[e, s]`` for the
edge features, pass a ReLU layer before the max (so a step can compose ``s_ij`` and
``s_ik`` into a min-max, the path algebra of minimum spanning trees), and
``s'_jk = g_jk * LN(relu(S [max_i t_ijk, s_jk, e_jk])) + (1 - g_jk) * s_jk`` with a
gate ``g`` like the node update's; the messages read ``s_ij`` as well. The DEQ solves
for the pair.

Every term is a per-node or per-edge map or a max over nodes, so the processors are
equivariant to relabelling the nodes and run on any graph size.

References:
  Gilmer et al., "Neural Message Passing for Quantum Chemistry", ICML 2017.
  Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022
  (``clrs/_src/processors.py``: ``PGN``, ``MPNN``, ``get_triplet_msgs``).
  Ibarz et al., "A Generalist Neural Algorithmic Learner", LoG 2022 (triplets, gating).
  Dudzik & Veličković, "Graph Neural Networks are Dynamic Programmers", NeurIPS 2022.
  Diao & Loynd, "Relational Attention: Generalizing Transformers for Graph-Structured
  Tasks", ICLR 2023 (persistent edge states on CLRS).
  Xhonneux, He, Deac, Tang, Gidel, "Deep Equilibrium Models for Algorithmic
  Reasoning", ICLR 2024 blog post track.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.nn.state import state_like

# Stands in for -inf where a sender is not a neighbour (CLRS's BIG_NUMBER).
_BIG = 1e6


class ProcessorInputs(NamedTuple):
    """What a processor step reads besides the state (a pytree, batch axis first).

    Attributes:
      node: encoded node features ``[B, n, H]``.
      edge: encoded edge features ``[B, n, n, H]``; ``edge[:, i, j]`` on ``i -> j``.
      graph: encoded graph features ``[B, H]``.
      adjacency: ``[B, n, n]`` 0/1 with self-loops, ``adjacency[:, i, j] = 1`` for an
        edge ``i -> j``.
    """

    node: jax.Array
    edge: jax.Array
    graph: jax.Array
    adjacency: jax.Array


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def max_reduce(x: jax.Array, axis: int) -> jax.Array:
    """``jnp.max(x, axis)`` whose derivative flows to one maximiser (the first).

    `jnp.max`'s derivative divides by the number of entries equal to the maximum; when
    XLA recomputes a fused operand (a sum of broadcasts, as the triplets) for that
    comparison, rounding can leave no entry equal and give 0 / 0 = NaN inside a scan.
    Routing the tangent through `jnp.argmax` needs no such equality.
    """
    return jnp.max(x, axis=axis)


@max_reduce.defjvp
def _max_reduce_jvp(axis, primals, tangents):
    (x,), (t,) = primals, tangents
    index = jnp.expand_dims(jnp.argmax(x, axis=axis), axis)
    return jnp.max(x, axis=axis), jnp.squeeze(jnp.take_along_axis(t, index, axis=axis), axis)


def masked_max(messages: jax.Array, adjacency: jax.Array) -> jax.Array:
    """``a[:, j] = max_{i: adjacency[:, i, j] = 1} messages[:, i, j]``.

    Args:
      messages: ``[B, n, n, H]``, ``messages[:, i, j]`` from sender ``i`` to ``j``
        (or ``[B, n, ..., H]`` with more receiver axes, as the triplets).
      adjacency: ``[B, n, n]`` 0/1 (or ``[B, n, ...]``, the messages' shape without H).

    Returns:
      ``[B, n, H]``; a node without neighbours gets ``-1e6`` (the adjacency of CLRS
      graphs holds self-loops, so none lacks one).
    """
    keep = adjacency[..., None] > 0.5  # [B, n, n, 1]
    return max_reduce(jnp.where(keep, messages, -_BIG), 1)


def triplet_messages(
    h: jax.Array, edge: jax.Array, graph: jax.Array, features: int, dense: Any
) -> jax.Array:
    """``t_ijk`` ``[B, n, n, n, features]`` of Dudzik & Veličković (2022).

    ``t_ijk = T_1 h_i + T_2 h_j + T_3 h_k + T_e1 e_ij + T_e2 e_ik + T_e3 e_jk + T_g g``,
    built by broadcasting (memory ``B n^3 features``). ``dense(features, name)`` makes
    the linear maps.
    """
    t1, t2, t3 = (dense(features, f"triplet_node_{k}")(h) for k in (1, 2, 3))  # [B, n, F]
    e1, e2, e3 = (dense(features, f"triplet_edge_{k}")(edge) for k in (1, 2, 3))  # [B, n, n, F]
    tg = dense(features, "triplet_graph")(graph)  # [B, F]
    return (
        t1[:, :, None, None]  # i
        + t2[:, None, :, None]  # j
        + t3[:, None, None, :]  # k
        + e1[:, :, :, None]  # (i, j)
        + e2[:, :, None, :]  # (i, k)
        + e3[:, None, :, :]  # (j, k)
        + tg[:, None, None, None]
    )  # [B, n, n, n, F]


class MPNN(nn.Module):
    """A max-aggregation message-passing step as a cell ``(z, ProcessorInputs) -> z``.

    See the module docstring for the equations.

    Attributes:
      hidden: the state size ``H`` per node (also the message width).
      use_ln: layer-normalise the update (as CLRS's baselines).
      gated: gate the update (Ibarz et al. 2022).
      use_triplets: add triplet edge latents to the messages.
      triplet_features: the width of ``t_ijk``.
      edge_state: the width ``F`` of a persistent edge state (module docstring; 0:
        none). The state is then the pair ``(z [B, n, H], s [B, n, n, F])``.
      param_dtype: dtype of the parameters.

    References:
      Veličković et al., "The CLRS Algorithmic Reasoning Benchmark", ICML 2022.
      Ibarz et al., "A Generalist Neural Algorithmic Learner", LoG 2022.
    """

    hidden: int = 64
    use_ln: bool = True
    gated: bool = False
    use_triplets: bool = False
    triplet_features: int = 8
    edge_state: int = 0
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.edge_state < 0 or (self.edge_state and not self.use_triplets):
            raise ValueError(
                f"edge_state must be >= 0 and needs use_triplets=True ({type(self).__name__}), "
                f"got {self.edge_state}."
            )
        super().__post_init__()

    def state_spec(self, x: ProcessorInputs) -> Any:
        """``[B, n, hidden]`` in the promoted dtype of the node features and parameters;
        with ``edge_state``, the pair of it and ``[B, n, n, edge_state]``."""
        dtype = jnp.promote_types(x.node.dtype, self.param_dtype)
        nodes = state_like(x.node, self.hidden, dtype)
        if not self.edge_state:
            return nodes
        return nodes, jax.ShapeDtypeStruct((*x.edge.shape[:3], self.edge_state), dtype)

    def _dense(self, features: int, name: str, **kwargs: Any) -> nn.Dense:
        return nn.Dense(features, param_dtype=self.param_dtype, name=name, **kwargs)

    @nn.compact
    def __call__(self, z: Any, x: ProcessorInputs, return_edges: bool = False) -> Any:
        """``z [B, n, H], x -> z' [B, n, H]`` (with ``edge_state``, ``(z, s) -> (z', s')``).

        With ``return_edges`` (triplet processors only) also returns the step's triplet
        edge latents ``relu(W max_k t_ijk)`` ``[B, n, n, H]``, which CLRS's Triplet-GMPNN
        hands its decoders.
        """
        if return_edges and not self.use_triplets:
            raise ValueError(f"{type(self).__name__} has no triplet edge latents to return.")
        if self.edge_state:
            if not (isinstance(z, tuple) and len(z) == 2):
                raise ValueError(
                    f"{type(self).__name__} with edge_state={self.edge_state} takes the state "
                    "pair (nodes [B, n, H], edges [B, n, n, F]) of its state_spec."
                )
            z, edge_z = z
        b, n = z.shape[:2]
        if x.edge.shape[:3] != (b, n, n) or x.adjacency.shape != (b, n, n):
            raise ValueError(
                f"{type(self).__name__} expects z [B, n, H], edge features [B, n, n, F] and "
                f"adjacency [B, n, n]; got z {z.shape}, edge {x.edge.shape} and adjacency "
                f"{x.adjacency.shape}."
            )
        width = self.hidden
        h = jnp.concatenate([x.node.astype(z.dtype), z], axis=-1)  # [B, n, F + H]
        sender = self._dense(width, "msg_sender")(h)  # [B, n, H]
        receiver = self._dense(width, "msg_receiver")(h)  # [B, n, H]
        messages = (
            sender[:, :, None]
            + receiver[:, None, :]
            + self._dense(width, "msg_edge")(x.edge)
            + self._dense(width, "msg_graph")(x.graph)[:, None, None]
        )  # [B, n, n, H], [:, i, j] from i to j
        if self.edge_state:
            edge_in = jnp.concatenate([x.edge, edge_z.astype(x.edge.dtype)], axis=-1)
            messages = messages + self._dense(width, "msg_edge_state")(edge_z)
        else:
            edge_in = x.edge
        if self.use_triplets:
            triplets = triplet_messages(h, edge_in, x.graph, self.triplet_features, self._dense)
            if self.edge_state:  # a ReLU layer before the max: min-max compositions
                triplets = self._dense(self.triplet_features, "triplet_hidden")(nn.relu(triplets))
            pooled = max_reduce(triplets, 1)
            latents = self._dense(width, "triplet_out")(pooled)  # [B, n, n, H]
            latents = nn.relu(latents)
            messages = messages + latents
        messages = self._dense(width, "msg_mlp_1")(nn.relu(messages))
        messages = self._dense(width, "msg_mlp_2")(nn.relu(messages))
        aggregated = masked_max(messages, x.adjacency)  # [B, n, H]
        out = nn.relu(
            self._dense(width, "update_self")(h) + self._dense(width, "update_msg")(aggregated)
        )
        if self.use_ln:
            out = nn.LayerNorm(param_dtype=self.param_dtype, name="norm")(out)
        if self.gated:
            gate = self._dense(width, "gate_self")(h) + self._dense(width, "gate_msg")(aggregated)
            bias_init = nn.initializers.constant(-3.0)
            gate = jax.nn.sigmoid(
                self._dense(width, "gate_out", bias_init=bias_init)(nn.relu(gate))
            )
            out = gate * out + (1.0 - gate) * z
        if self.edge_state:
            out = (out, self._edge_update(pooled, edge_z, x.edge))
        return (out, latents) if return_edges else out

    def _edge_update(self, pooled: jax.Array, s: jax.Array, edge: jax.Array) -> jax.Array:
        """The gated edge-state update ``s' [B, n, n, F]`` (module docstring)."""
        width = self.edge_state
        read = jnp.concatenate([pooled, s, edge], axis=-1)
        out = nn.relu(self._dense(width, "edge_update")(read))
        out = nn.LayerNorm(param_dtype=self.param_dtype, name="edge_norm")(out)
        bias_init = nn.initializers.constant(-3.0)
        gate = jax.nn.sigmoid(self._dense(width, "edge_gate", bias_init=bias_init)(read))
        return gate * out + (1.0 - gate) * s


class TripletMPNN(MPNN):
    """The Triplet-GMPNN of Ibarz et al. (2022): `MPNN` with triplet messages and gating.

    References:
      Ibarz et al., "A Generalist Neural Algorithmic Learner", LoG 2022.
    """

    gated: bool = True
    use_triplets: bool = True


class GatedMPNN(MPNN):
    """CLRS's GMPNN: `MPNN` with the gated update of Ibarz et al. (2022).

    References:
      Ibarz et al., "A Generalist Neural Algorithmic Learner", LoG 2022.
    """

    gated: bool = True


PROCESSORS = {"mpnn": MPNN, "gmpnn": GatedMPNN, "triplet_mpnn": TripletMPNN}


def make_processor(kind: str, **kwargs: Any) -> MPNN:
    """The processor ``kind`` (``"mpnn"``, ``"gmpnn"``, ``"triplet_mpnn"``) with ``kwargs``.

    Raises:
      ValueError: for an unknown kind, listing the valid ones.
    """
    if kind not in PROCESSORS:
        raise ValueError(f"Unknown processor {kind!r}. Valid processors: {', '.join(PROCESSORS)}.")
    return PROCESSORS[kind](**kwargs)
