"""A small name -> constructor registry used for everything a config can name.

Each registry maps a string (the constructor's own name, e.g. ``"anderson"``) to a
callable. ``get(name, **kwargs)`` validates both the name and the keywords and fails
with a message listing the valid ones, so a typo in a config is caught at start-up.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any


def _accepted_keywords(ctor: Callable[..., Any]) -> tuple[list[str], bool]:
    """Returns (keyword names, accepts **kwargs) for a constructor."""
    if dataclasses.is_dataclass(ctor):
        names = [f.name for f in dataclasses.fields(ctor) if f.init]
        return names, False
    params = inspect.signature(ctor).parameters.values()
    names = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return names, var_kw


class Registry:
    """Maps names to constructors and checks the keywords given to them.

    Args:
      kind: what the registry holds, used in error messages (e.g. ``"solver"``).
    """

    def __init__(self, kind: str):
        self._kind = kind
        self._ctors: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, ctor: Callable[..., Any], *, overwrite: bool = False):
        """Registers ``ctor`` under ``name``; returns ``ctor`` so it can decorate."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self._kind} name must be a non-empty string, got {name!r}.")
        if name in self._ctors and not overwrite:
            raise ValueError(
                f"A {self._kind} named {name!r} is already registered; "
                "pass overwrite=True to replace it."
            )
        self._ctors[name] = ctor
        return ctor

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._ctors)

    def get(self, name: str, **kwargs: Any) -> Any:
        """Builds the registered object ``name`` with ``kwargs``.

        Raises:
          ValueError: for an unknown name (the message lists the valid names) or an
            unknown keyword (the message lists the valid keywords).
        """
        if name not in self._ctors:
            raise ValueError(
                f"Unknown {self._kind} {name!r}. Valid {self._kind}s: {', '.join(self.names())}."
            )
        ctor = self._ctors[name]
        valid, var_kw = _accepted_keywords(ctor)
        unknown = sorted(set(kwargs) - set(valid))
        if unknown and not var_kw:
            raise ValueError(
                f"Unknown keyword(s) {', '.join(map(repr, unknown))} for {self._kind} {name!r}. "
                f"Valid keywords: {', '.join(valid)}."
            )
        return ctor(**kwargs)

    def __contains__(self, name: str) -> bool:
        return name in self._ctors
