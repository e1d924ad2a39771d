"""Partition rules: where each parameter (and its optimiser state) lives on the mesh.

Every array of the train state gets a `PartitionSpec` over the mesh axes of
`deq_jax.training.run.mesh`, decided in two passes:

1. **Tensor.** The model's rules (`RULES`, one table per model, read top to bottom,
   the first match wins) map a parameter path pattern to the ``tensor`` axis of each
   dimension: the language model's heads, feed-forward inner dimension and
   vocabulary; MDEQ's block channels. A model without a table has no tensor rules.
2. **FSDP.** Every array of at least ``min_size`` entries is also split over ``fsdp``
   along its largest dimension that the fsdp size divides (and that the tensor rule
   left free); smaller arrays, and those no dimension of which the fsdp size divides,
   stay replicated over ``fsdp``. Nothing is split over ``data``.

A path is the state's own (``params/cell/attn/qkv/kernel``,
``opt_state/1/0/mu/cell/attn/qkv/kernel``): a rule's pattern is searched in it, so the
optimiser's moments and the weight average take their parameter's layout. A rule
applies only to arrays of its rank. A rule whose dimension the tensor size does not
divide (a vocabulary of 65 characters over 2) leaves that array whole over ``tensor``;
`check_tensor_sizes` refuses, before anything runs, a tensor size that does not divide
a model's head count or channels. A rule that matches no parameter is named in one
warning (`state_specs`).

References:
  Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using
  Model Parallelism", 2019 (column- then row-parallel pairs: qkv then the output
  projection, ff1 then ff2).
  Rajbhandari et al., "ZeRO", SC 2020; the FSDP of MaxText and levanter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from deq_jax.training.run.mesh import FSDP, TENSOR, ConfigError, axis_size

T = TENSOR
# A rule: (path pattern, the tensor axis or None for each dimension of the array).
Rule = tuple[str, tuple[str | None, ...]]

# `deq_jax.models.language.DEQTransformerLM` (its DEQ, weight-tied and untied stacks).
LANGUAGE_MODEL: tuple[Rule, ...] = (
    (r"attn/qkv/kernel$", (None, T)),  # [d_model, 3 H Dh]: column-parallel over heads
    (r"attn/qkv/scale$", (T,)),  # [3 H Dh] weight norm's gains
    (r"attn/r_net/kernel$", (None, T)),  # [d_model, H Dh]: the position keys, per head
    (r"attn/r_net/scale$", (T,)),  # [H Dh]
    (r"attn/r_[wr]_bias$", (T, None)),  # [H, Dh]
    (r"attn/o_net/kernel$", (T, None)),  # [H Dh, d_model]: row-parallel
    (r"ff/ff1/kernel$", (None, T)),  # [d_model, d_inner]: column-parallel
    (r"ff/ff1/(bias|scale)$", (T,)),  # [d_inner]
    (r"ff/ff2/kernel$", (T, None)),  # [d_inner, d_model]: row-parallel
    (r"inject/kernel$", (None, T)),  # [d_model, 3 H Dh]: added to qkv
    (r"inject/bias$", (T,)),  # [3 H Dh]
    (r"io/(emb|out)_\d+$", (T, None)),  # [V_i, d_i] a cluster's vocabulary
    (r"io/out_bias$", (T,)),  # [V]
)
# `deq_jax.models.mdeq.MDEQ`: each residual block's inner (expanded) channels, and the
# output channels of the fusion's convolutions.
MDEQ: tuple[Rule, ...] = (
    (r"block_\d+/conv1/kernel$", (None, None, None, T)),  # [kh, kw, C_i, e C_i]
    (r"block_\d+/(conv1/scale|gn1/(scale|bias))$", (T,)),  # [e C_i]
    (r"block_\d+/conv2/kernel$", (None, None, T, None)),  # [kh, kw, e C_i, C_i]
    (r"fuse/.+/kernel$", (None, None, None, T)),  # [kh, kw, C_i, C_j]
)
# By ``config.model.name``; any other model is sharded by the FSDP pass alone.
RULES: dict[str, tuple[Rule, ...]] = {"deq_transformer_lm": LANGUAGE_MODEL, "mdeq": MDEQ}
# Arrays with fewer entries stay replicated (``config.train.fsdp_min_size``'s default):
# biases and norms cost little and would only add collectives.
MIN_SIZE = 4096


def tensor_sizes(model: Mapping[str, Any]) -> dict[str, int]:
    """The sizes a model's tensor rules split, by config key (``model.n_head``...)."""
    name = model.get("name")
    if name == "deq_transformer_lm":
        return {"model.n_head": model.get("n_head", 1), "model.d_inner": model.get("d_inner", 1)}
    if name == "mdeq":
        channels = tuple(model.get("channels", ()) or ())
        expansion = model.get("expansion", 1)
        sizes = {f"model.channels[{i}]": c for i, c in enumerate(channels)}
        expanded = {
            f"model.channels[{i}] x expansion": c * expansion for i, c in enumerate(channels)
        }
        sizes.update(expanded)
        return sizes
    return {}


def check_tensor_sizes(model: Mapping[str, Any], tensor: int) -> None:
    """Fails unless ``tensor`` divides every size the model's rules split.

    Raises:
      ConfigError: naming the model key, its size and the tensor size.
    """
    if tensor <= 1:
        return
    for key, size in tensor_sizes(model).items():
        if size % tensor:
            raise ConfigError(
                f"config.train.mesh.tensor={tensor} must divide {key}={size} (the tensor axis "
                f"splits it); use a tensor size that divides it, e.g. 1."
            )


def path_string(path: Sequence[Any]) -> str:
    """``"params/cell/attn/qkv/kernel"`` for a `jax.tree_util` key path."""
    parts = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
    return "/".join(str(p) for p in parts)


def _tensor_axes(path: str, shape, rules, tensor: int, used: set, skipped: list):
    """The tensor axis per dimension from the first rule of the array's rank matching
    ``path`` (all ``None``: none matched, or the tensor size does not divide)."""
    for i, (pattern, axes) in enumerate(rules):
        if len(axes) != len(shape) or not re.search(pattern, path):
            continue
        used.add(i)
        if any(a is not None and size % tensor for a, size in zip(axes, shape, strict=True)):
            skipped.append(f"{pattern} on {list(shape)}")
            return [None] * len(shape)
        return list(axes) if tensor > 1 else [None] * len(shape)
    return [None] * len(shape)


def array_spec(shape, axes: list, fsdp: int, min_size: int) -> PartitionSpec:
    """``axes`` (the tensor pass) plus ``fsdp`` on the largest free dimension it divides,
    for an array of at least ``min_size`` entries."""
    if fsdp > 1 and int(np.prod(shape, dtype=np.int64)) >= min_size:
        free = [d for d in range(len(shape)) if axes[d] is None and shape[d] % fsdp == 0]
        if free:
            axes[max(free, key=lambda d: (shape[d], -d))] = FSDP
    while axes and axes[-1] is None:
        axes.pop()
    return PartitionSpec(*axes)


def state_specs(state: Any, mesh: Mesh, rules: Sequence[Rule] = (), min_size: int = MIN_SIZE):
    """The `PartitionSpec` of every array of ``state`` (module docstring).

    Args:
      state: a pytree of arrays or shape structs (a `TrainState`, its params).
      mesh: the run's mesh (`deq_jax.training.run.mesh.make_mesh`).
      rules: the model's tensor rules (`RULES`).
      min_size: arrays with fewer entries are not split over ``fsdp``.

    Returns:
      A pytree of ``state``'s structure holding `PartitionSpec`s. One warning names
      the rules that matched no array and the arrays a rule could not split.
    """
    tensor, fsdp = axis_size(mesh, TENSOR), axis_size(mesh, FSDP)
    used: set[int] = set()
    skipped: list[str] = []

    def spec(path, x):
        shape = tuple(np.shape(x))
        axes = _tensor_axes(path_string(path), shape, rules, tensor, used, skipped)
        return array_spec(shape, axes, fsdp, min_size)

    specs = jax.tree_util.tree_map_with_path(spec, state)
    unused = [pattern for i, (pattern, _) in enumerate(rules) if i not in used]
    if unused:
        logging.warning("Partition rules that match no parameter: %s", ", ".join(unused))
    if skipped and tensor > 1:
        logging.warning(
            "The tensor size %d does not divide the split dimension of %s: those arrays "
            "stay whole over the tensor axis.",
            tensor,
            "; ".join(dict.fromkeys(skipped)),
        )
    return specs


def state_shardings(state: Any, mesh: Mesh, rules: Sequence[Rule] = (), min_size: int = MIN_SIZE):
    """`state_specs` as `NamedSharding`s on ``mesh``."""
    specs = state_specs(state, mesh, rules, min_size)
    return jax.tree_util.tree_map(
        lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, PartitionSpec)
    )


def rules_for(model_name: str | None) -> tuple[Rule, ...]:
    """The tensor rules of a model (``config.model.name``); none for other models."""
    return RULES.get(model_name or "", ())
