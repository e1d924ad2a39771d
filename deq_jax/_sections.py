"""`from_section`: a frozen dataclass built from a config section, unknown keys refused."""

from __future__ import annotations

import dataclasses
from typing import Any


def from_section(cls: type, section: Any, name: str) -> Any:
    """``cls(**section)`` for a dataclass built from a config section.

    Args:
      cls: the dataclass.
      section: a dict or ConfigDict of its fields.
      name: the section's name, for the error message.

    Raises:
      ValueError: for an unknown key, listing the valid ones.
    """
    fields = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(fields) - set(valid))
    if unknown:
        raise ValueError(
            f"Unknown {name} key(s) {', '.join(unknown)}. Valid keys: {', '.join(valid)}."
        )
    return cls(**fields)
