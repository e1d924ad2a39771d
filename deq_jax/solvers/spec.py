"""Composed solvers named by a small spec string, for configs.

Grammar: ``spec := name | name "(" arg ("," arg)* ")"`` and ``arg := spec [":" steps]``;
``steps`` (an integer) is a `sequence` stage's step count. Examples::

    "anderson"
    "sequence(fixed_point_iteration:3, anderson)"
    "fallback(anderson, broyden)"
    "restart(anderson)"
    "fallback(sequence(fixed_point_iteration:3, anderson), broyden)"

Every solver named gets the shared budget keywords (``tol``, ``stop_mode``,
``max_iter``, ``full_budget``) and its own keyword section, looked up by its name
(``hyper["anderson"] = {"m": 5}``, ``hyper["fallback"] = {"patience": 5}``).
`deq_jax.solvers.get` reads a spec string (as a name) with `build_spec`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from deq_jax.solvers.base import Solver

COMBINATORS = ("sequence", "fallback", "restart")
_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z_0-9]*|\d+|[(),:])")


def _tokens(spec: str) -> list[str]:
    out, pos = [], 0
    spec = spec.strip()
    while pos < len(spec):
        match = _TOKEN.match(spec, pos)
        if match is None:
            raise ValueError(f"Cannot read solver spec {spec!r} at {spec[pos:]!r}.")
        out.append(match.group(1))
        pos = match.end()
    return out


def _parse(tokens: list[str], spec: str) -> tuple[str, list[tuple[Any, int | None]]]:
    """One ``spec`` from the front of ``tokens`` -> ``(name, [(child, steps), ...])``."""

    def fail(why: str):
        raise ValueError(f"Bad solver spec {spec!r}: {why}.")

    if not tokens or not re.fullmatch(r"[A-Za-z_]\w*", tokens[0]):
        fail(f"expected a solver name, got {tokens[0] if tokens else 'the end'!r}")
    name, args = tokens.pop(0), []
    if tokens and tokens[0] == "(":
        tokens.pop(0)
        while True:
            child = _parse(tokens, spec)
            steps = None
            if tokens and tokens[0] == ":":
                tokens.pop(0)
                if not tokens or not tokens[0].isdigit():
                    fail("a ':' must be followed by a step count")
                steps = int(tokens.pop(0))
            args.append((child, steps))
            if not tokens:
                fail("missing ')'")
            sep = tokens.pop(0)
            if sep == ")":
                break
            if sep != ",":
                fail(f"expected ',' or ')', got {sep!r}")
    return name, args


def build_spec(
    spec: str,
    get: Callable[..., Solver],
    names: list[str],
    hyper: Mapping[str, Mapping[str, Any]] | None = None,
    **common: Any,
) -> Solver:
    """Builds the solver a spec string names.

    Args:
      spec: e.g. ``"fallback(anderson, broyden)"`` (grammar in the module docstring).
      get: the solver registry's ``get(name, **keywords)``.
      names: the registered solver names (for messages).
      hyper: keyword sections by solver name.
      **common: budget keywords given to every solver named.

    Raises:
      ValueError: for a malformed spec, an unknown solver (the valid names are
        listed), arguments given to a plain solver, a step count outside a
        ``sequence`` or the wrong number of parts for a combinator.
    """
    hyper = dict(hyper or {})
    tokens = _tokens(spec)
    tree = _parse(tokens, spec)
    if tokens:
        raise ValueError(f"Bad solver spec {spec!r}: unexpected {' '.join(tokens)!r} at the end.")

    def build(node) -> Solver:
        name, args = node
        if name not in names:
            raise ValueError(
                f"Unknown solver {name!r} in spec {spec!r}. Valid solvers: {', '.join(names)}."
            )
        own = {**common, **dict(hyper.get(name, {}))}
        if name not in COMBINATORS:
            if args:
                raise ValueError(f"Solver {name!r} in spec {spec!r} takes no parts.")
            return get(name, **own)
        parts = [build(child) for child, _ in args]
        steps = [count for _, count in args]
        if name != "sequence" and any(count is not None for count in steps):
            raise ValueError(f"Only sequence stages take ':steps' (in spec {spec!r}).")
        want = {"fallback": 2, "restart": 1}.get(name)
        if (want and len(parts) != want) or not parts:
            example = {"fallback": "(anderson, broyden)", "restart": "(anderson)"}
            raise ValueError(
                f"{name} takes {want or 'one or more'} part(s), got {len(parts)} in spec "
                f"{spec!r}; e.g. {name}{example.get(name, '(fixed_point_iteration:3, anderson)')}."
            )
        if name == "fallback":
            return get(name, primary=parts[0], backup=parts[1], **own)
        if name == "restart":
            return get(name, solver=parts[0], **own)
        if any(count is None for count in steps[:-1]) or steps[-1] is not None:
            raise ValueError(
                f"Every sequence stage but the last needs ':steps', the last none "
                f"(in spec {spec!r})."
            )
        return get(name, solvers=parts, steps=steps[:-1], **own)

    return build(tree)
