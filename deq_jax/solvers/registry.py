"""The solver registry: one `get` reads a solver from a name or a spec string.

``get("anderson", m=5, tol=1e-4)`` builds a registered solver by its name;
``get("fallback(anderson, broyden)", tol=1e-4, anderson={"m": 5})`` builds a composed
one from a spec string (`deq_jax.solvers.spec`), each solver it names taking the budget
keywords and its own section of keywords. A config names its solver either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deq_jax._registry import Registry
from deq_jax.solvers.anderson import anderson
from deq_jax.solvers.base import Solver
from deq_jax.solvers.broyden import broyden
from deq_jax.solvers.combinators import sequence
from deq_jax.solvers.fixed_point_iteration import fixed_point_iteration
from deq_jax.solvers.reversible import reversible
from deq_jax.solvers.spec import COMBINATORS, build_spec
from deq_jax.solvers.switching import fallback, restart

# The keywords that hand a combinator its parts.
_PARTS = ("solvers", "primary", "backup", "solver")

_REGISTRY = Registry("solver")
# The registry's bound methods are this package's public registry functions.
register, names = _REGISTRY.register, _REGISTRY.names
for _ctor in (fixed_point_iteration, anderson, broyden, reversible, sequence, fallback, restart):
    register(_ctor.__name__, _ctor)


def _wants_parts(name: str, keywords: Mapping[str, Any]) -> bool:
    """Whether ``name`` is a combinator given none of its parts (read as a spec then, whose
    message says what parts it takes)."""
    return name in COMBINATORS and not set(keywords) & set(_PARTS)


def get(spec: str, **keywords: Any) -> Solver:
    """The solver a name or a spec string names.

    A registered name (``"anderson"``, ``"fallback"``, a solver a user registered) is
    built with ``keywords``, which must be its own (``get("fallback", primary=...,
    backup=...)`` gives a combinator its parts). A spec string composes solvers
    (``"fallback(anderson, broyden)"``, ``"sequence(fixed_point_iteration:3,
    anderson)"``; grammar in `deq_jax.solvers.spec`). Either way, a keyword named after
    a solver with a mapping as its value is that solver's own section (``anderson={"m":
    5}``, ``fallback={"patience": 5}``; sections of solvers not named are ignored), and
    every other keyword goes to each solver named (for a composed solver, the budget:
    ``tol``, ``max_iter``, ``stop_mode``, ``full_budget``).

    Args:
      spec: a registered solver name or a spec string.
      **keywords: the solver's keywords and per-solver sections.

    Returns:
      The `Solver`.

    Raises:
      ValueError: for an unknown name (the valid names are listed), an unknown keyword
        (the valid keywords are listed), or a spec string that does not read (the
        message names the string and what is wrong with it).
    """
    if not isinstance(spec, str):
        raise TypeError(f"A solver name or spec string must be a string, got {spec!r}.")
    sections = {
        name: dict(keywords.pop(name))
        for name in names()
        if isinstance(keywords.get(name), Mapping)
    }
    if spec in _REGISTRY and not _wants_parts(spec, keywords):
        return _REGISTRY.get(spec, **{**keywords, **sections.get(spec, {})})
    if spec.strip().isidentifier() and spec.strip() not in _REGISTRY:
        raise ValueError(
            f"Unknown solver {spec!r}. Valid solvers: {', '.join(names())} (or a spec "
            "string composing them, e.g. 'fallback(anderson, broyden)')."
        )
    return build_spec(spec, _REGISTRY.get, names(), sections, **keywords)


def from_spec(
    spec: str, hyper: Mapping[str, Mapping[str, Any]] | None = None, **common: Any
) -> Solver:
    """`get` with the sections apart: ``get(spec, **common, **hyper)``, ``hyper`` the
    per-solver sections (``{"anderson": {"m": 5}}``), ``common`` the keywords every
    solver named takes.
    """
    sections = {name: dict(section) for name, section in dict(hyper or {}).items()}
    return get(spec, **common, **sections)
