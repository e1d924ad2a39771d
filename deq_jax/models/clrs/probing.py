"""Encoders for probes and the recorder of hint trajectories (CLRS's ``probing.py``).

Algorithms call `Trajectory.push` where CLRS's algorithms call ``probing.push(probes,
Stage.HINT, ...)``; each push copies the state, so later mutation does not leak into
recorded steps.
"""

from __future__ import annotations

import numpy as np

Probes = dict[str, np.ndarray]


def mask_one(i: int, n: int) -> np.ndarray:
    """One-hot float64 ``[n]`` with a 1 at ``i``."""
    probe = np.zeros(n)
    probe[i] = 1.0
    return probe


def categorical(values: np.ndarray, num_classes: int) -> np.ndarray:
    """One-hot float64 ``[..., num_classes]`` of integer ``values``."""
    return np.eye(num_classes)[values]


class Trajectory:
    """The hints of one run: a list of ``{name: array}`` snapshots, one per step."""

    def __init__(self):
        self.steps: list[Probes] = []

    def push(self, **probes) -> None:
        """Records one step; arrays are copied, Python numbers become 0-d arrays."""
        self.steps.append({name: np.array(value) for name, value in probes.items()})
