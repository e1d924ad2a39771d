"""Checkpoints: orbax `CheckpointManager` in the workdir, and nothing else saves state.

`Checkpointer` saves the whole train state every ``every_steps`` steps and at the end,
keeps the last ``keep``, and on start-up restores the latest one into a template (the
freshly initialised state, which fixes structure, shapes, dtypes and shardings). A
checkpoint that does not fit the template (another model shape, another optimiser) is
refused with a message naming the differences, before anything is read into memory or
written to disk, so the old checkpoint is left as it was.

References:
  Orbax checkpointing, https://orbax.readthedocs.io (``CheckpointManager``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

# How many differing leaves a mismatch message names before it abbreviates.
_MAX_LISTED = 8


class CheckpointMismatchError(ValueError):
    """A checkpoint in the workdir does not fit the state the config builds."""


def _path_str(path: tuple[Any, ...]) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _leaf_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{"params/w": (shape, dtype)}`` for every array leaf of ``tree``."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {_path_str(p): (tuple(np.shape(x)), _dtype_str(x)) for p, x in flat}


def _dtype_str(x: Any) -> str:
    dtype = getattr(x, "dtype", None)
    return str(dtype if dtype is not None else jnp.asarray(x).dtype)


def describe_mismatch(saved: Any, template: Any) -> list[str]:
    """Lines naming every leaf whose presence, shape or dtype differs (empty if none).

    Args:
      saved: the checkpoint's tree metadata (leaves with ``shape`` and ``dtype``).
      template: the state (or abstract state) it should be restored into.
    """
    have, want = _leaf_specs(saved), _leaf_specs(template)
    lines = []
    for key in sorted(set(have) | set(want)):
        if key not in want:
            lines.append(f"{key}: in the checkpoint, not in the model")
        elif key not in have:
            lines.append(f"{key}: in the model, not in the checkpoint")
        elif have[key] != want[key]:
            (hs, hd), (ws, wd) = have[key], want[key]
            lines.append(f"{key}: checkpoint {hd}{list(hs)}, model {wd}{list(ws)}")
    return lines


class Checkpointer:
    """Periodic orbax checkpoints of a train state under ``{workdir}/checkpoints``.

    Args:
      workdir: the run's directory.
      every_steps: save when ``step % every_steps == 0`` (and whenever forced).
      keep: how many of the latest checkpoints are kept.
      async_save: let orbax write in a background thread.
    """

    def __init__(self, workdir: str, *, every_steps: int, keep: int, async_save: bool = False):
        if every_steps < 1 or keep < 1:
            raise ValueError(
                f"ckpt.every_steps and ckpt.keep must be >= 1, got {every_steps}, {keep}."
            )
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.every_steps = every_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=ocp.StandardCheckpointHandler()
        )

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or ``None``."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """The steps of every kept checkpoint, ascending."""
        return sorted(self._manager.all_steps())

    def restore_or_init(self, template: Any) -> tuple[Any, int]:
        """Restores the latest checkpoint into ``template``; returns ``(state, step)``.

        Args:
          template: the freshly initialised state; returned unchanged (with step 0)
            when the workdir has no checkpoint.

        Raises:
          CheckpointMismatchError: if the checkpoint's leaves differ from the
            template's in structure, shape or dtype. Nothing is written or deleted.
        """
        step = self.latest_step()
        if step is None:
            return template, 0
        saved = self._manager.item_metadata(step)
        saved = getattr(saved, "tree", saved)
        problems = describe_mismatch(saved, template)
        if problems:
            listed = problems[:_MAX_LISTED]
            if len(problems) > _MAX_LISTED:
                listed.append(f"... and {len(problems) - _MAX_LISTED} more")
            raise CheckpointMismatchError(
                f"The checkpoint at step {step} in {self.directory} does not fit the model "
                "this config builds:\n  " + "\n  ".join(listed) + "\nUse a fresh --workdir, or "
                "the config the checkpoint was written with. The checkpoint was left untouched."
            )
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
        state = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        return state, step

    def maybe_save(self, step: int, state: Any, *, force: bool = False) -> bool:
        """Saves ``state`` as ``step`` if due (or ``force``); returns whether it saved."""
        if not force and step % self.every_steps:
            return False
        if step in self._manager.all_steps():
            return False
        return self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def wait(self) -> None:
        """Blocks until every pending save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finishes pending saves and releases the manager."""
        self._manager.wait_until_finished()
        self._manager.close()
