"""Linen variables <-> NNX state: one checkpoint, either layer.

`to_linen` reads an NNX module's parameters and batch statistics as the variables of its
linen twin (``{"params": ..., "batch_stats": ...}``), and `from_linen` writes such
variables into an NNX module, so that weights trained with `deq_jax.nn` load into
`deq_jax.nnx` and back. The two trees differ only in their names:

* an ``nnx.Param`` lives in linen's ``"params"`` collection, an ``nnx.BatchStat`` in
  ``"batch_stats"``; other variables (rng streams, sown intermediates) have no linen
  counterpart and are left out;
* an attribute keeps its name, and an entry of a list or dict attribute ``layers`` is
  ``layers_0``, ``layers_key``: the names linen gives the sub-modules a ``setup``
  assigns;
* a module whose linen twin names its parts otherwise (the ``@nn.compact`` cells'
  ``Conv_0``, ``VariationalDropout_0``) says so by a method ``linen_names(self)``
  returning ``{nnx path prefix: linen path prefix}`` (tuples, the NNX prefix one or two
  steps long; an empty linen prefix merges a container into the module's own scope).

The same names place a `deq_jax.nnx.VariationalDropout` in its cell (`linen_path`), so
that it draws the mask its linen twin would draw from the same key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx, traverse_util
from flax.core import unfreeze

Path = tuple[Any, ...]
# The NNX variable types that have a linen collection, most specific first.
COLLECTIONS = ((nnx.BatchStat, "batch_stats"), (nnx.Param, "params"))
_CONTAINERS = (nnx.List, nnx.Dict, list, tuple, dict)


def collection_of(variable: nnx.Variable) -> str | None:
    """The linen collection of an NNX variable: ``"params"``, ``"batch_stats"`` or ``None``."""
    for kind, collection in COLLECTIONS:
        if isinstance(variable, kind):
            return collection
    return None


def _child(node: Any, key: Any) -> Any:
    if isinstance(node, _CONTAINERS):
        return node[key]
    return getattr(node, key)


def _step(node: Any, path: Path) -> tuple[int, tuple[str, ...]]:
    """How many steps of ``path`` (below ``node``) one linen name covers, and that name."""
    names = node.linen_names() if callable(getattr(node, "linen_names", None)) else {}
    for length in (2, 1):
        prefix = tuple(path[:length])
        if len(prefix) == length and prefix in names:
            return length, tuple(names[prefix])
    if isinstance(node, _CONTAINERS):
        return 1, (str(path[0]),)
    if len(path) > 1 and isinstance(_child(node, path[0]), _CONTAINERS):
        return 2, (f"{path[0]}_{path[1]}",)  # linen's name for a setup's list entry
    return 1, (str(path[0]),)


def linen_path(module: nnx.Module, path: Path) -> tuple[str, ...]:
    """The linen path of what sits at ``path`` below ``module`` (module docstring).

    Args:
      module: the NNX module the path starts from.
      path: an NNX path below it, e.g. ``("convs", 0, "kernel")``.

    Returns:
      The path of the same variable or sub-module in the linen twin's variables, e.g.
      ``("Conv_0", "kernel")``.
    """
    node, out, path = module, [], tuple(path)
    while path:
        length, names = _step(node, path)
        for key in path[:length]:
            node = _child(node, key)
        out.extend(names)
        path = path[length:]
    return tuple(out)


def _flat_variables(module: nnx.Module) -> list[tuple[tuple[str, ...], nnx.Variable]]:
    """``(linen key, variable)`` for each variable with a linen collection; the key is
    ``(collection, *linen path)``."""
    out = []
    for path, variable in nnx.to_flat_state(nnx.state(module)):
        collection = collection_of(variable)
        if collection is not None:
            out.append(((collection, *linen_path(module, path)), variable))
    return out


def to_linen(module: nnx.Module) -> dict[str, Any]:
    """The variables of ``module``'s linen twin, e.g. a `deq_jax.nnx.DEQ`'s as those of
    the `deq_jax.nn.DEQ` with the same cell.

    Args:
      module: an NNX module (a DEQ, a cell, a model holding them).

    Returns:
      A nested dict ``{"params": ..., "batch_stats": ...}`` (the collections it has) of
      the module's arrays (not copies), ready for ``linen_model.apply``.

    Example::

        z, stats = dj.nn.DEQ(dj.nn.MLPCell(8), spec=spec).apply(
            dj.nnx.to_linen(nnx_deq), x, train=False)
    """
    flat = {key: variable.get_value() for key, variable in _flat_variables(module)}
    return traverse_util.unflatten_dict(flat)


def from_linen(module: nnx.Module, variables: Mapping[str, Any]) -> nnx.Module:
    """Writes a linen twin's variables into ``module``, in place, and returns it.

    Each value is cast to the dtype of the NNX variable it replaces (``module`` is the
    template, as when a checkpoint is restored into one). Collections other than
    ``"params"`` and ``"batch_stats"`` (e.g. ``"intermediates"``) are ignored.

    Args:
      module: the NNX module to fill (built with the linen model's sizes).
      variables: the linen model's variables, e.g. ``linen_model.init(...)`` or a
        restored checkpoint's ``{"params": ..., "batch_stats": ...}``.

    Returns:
      ``module``, its parameters and batch statistics replaced.

    Raises:
      ValueError: naming every variable that one side has and the other lacks, or
        whose shape differs; ``module`` is then left unchanged.
    """
    given = traverse_util.flatten_dict(unfreeze(dict(variables)))
    given = {k: v for k, v in given.items() if k[0] in {c for _, c in COLLECTIONS}}
    wanted = _flat_variables(module)
    missing = ["/".join(k) for k, _ in wanted if k not in given]
    extra = sorted("/".join(k) for k in set(given) - {k for k, _ in wanted})
    shapes = [
        f"{'/'.join(k)}: {tuple(jnp.shape(given[k]))} for {tuple(v.shape)}"
        for k, v in wanted
        if k in given and tuple(jnp.shape(given[k])) != tuple(v.shape)
    ]
    problems = [
        f"{what}: {', '.join(items)}"
        for what, items in (
            ("missing from the linen variables", missing),
            ("not in the NNX module", extra),
            ("shapes differ", shapes),
        )
        if items
    ]
    if problems:
        raise ValueError(
            f"the linen variables do not fit {type(module).__name__}: " + "; ".join(problems)
        )
    for key, variable in wanted:
        variable.set_value(jnp.asarray(given[key], variable.dtype))
    return module
