"""Backward modes: how gradients flow through `deq_jax.fixed_point`.

``ift`` (implicit function theorem, `jax.custom_vjp`), ``phantom`` (damped unrolled
steps from ``z*``), ``jacobian_free`` (identity in place of the inverse), ``unrolled``
(backprop through a `lax.scan` of the iterations) and ``reversible`` (the exact
gradient of `deq_jax.solvers.reversible`'s steps, undone in constant memory). Build them
directly or by name with `get`.
"""

from deq_jax._registry import Registry
from deq_jax.backward.base import Backward
from deq_jax.backward.ift import BackwardSolveWarning, ift
from deq_jax.backward.krylov import gmres
from deq_jax.backward.nonfinite import NonFiniteGradientWarning
from deq_jax.backward.phantom import jacobian_free, phantom, phantom_steps
from deq_jax.backward.probe import BACKWARD_STATS, read_stats_probe, stats_probe
from deq_jax.backward.reversible import reversible
from deq_jax.backward.unrolled import unrolled

_REGISTRY = Registry("backward mode")
# The registry's bound methods are this package's public registry functions.
register, get, names = _REGISTRY.register, _REGISTRY.get, _REGISTRY.names
for _ctor in (ift, phantom, jacobian_free, unrolled, reversible):
    register(_ctor.__name__, _ctor)


__all__ = [
    "BACKWARD_STATS",
    "Backward",
    "BackwardSolveWarning",
    "NonFiniteGradientWarning",
    "get",
    "gmres",
    "ift",
    "jacobian_free",
    "names",
    "phantom",
    "phantom_steps",
    "read_stats_probe",
    "register",
    "reversible",
    "stats_probe",
    "unrolled",
]
