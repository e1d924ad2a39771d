"""Checkpoints: orbax `CheckpointManager` in the workdir, and nothing else saves state.

`Checkpointer` saves the whole train state every ``every_steps`` steps and at the end,
keeps the last ``keep``, and on start-up restores the latest one into a template (the
freshly initialised state, which fixes structure, shapes, dtypes and shardings). A
checkpoint that does not fit the template (another model shape, another optimiser) is
refused with a message naming the differences, before anything is read into memory or
written to disk, so the old checkpoint is left as it was.

A checkpoint that cannot be read (a truncated array file, an empty ``_METADATA``) is
moved aside to ``{workdir}/checkpoints_unreadable/`` (never deleted), one warning line
names its step, the damaged file and the error, and the run resumes from the newest
checkpoint that can be read. If none can be read, nothing is moved and
`CheckpointUnreadableError` lists every step with its file and error.

Orbax writes each checkpoint into a temporary directory and renames it when complete,
so a save that fails midway (a full disk, a quota, a network filesystem error) or is
cut short by a kill leaves no checkpoint, only the temporary directory, which the next
start removes. A failed save raises `CheckpointSaveError` (with ``async_save``, from the
next save or `Checkpointer.wait`), naming the step and the cause; the previous
checkpoints are untouched and a rerun resumes from the newest. Training stops there
rather than retrying: a disk that failed one save rarely takes the next.

References:
  Orbax checkpointing, https://orbax.readthedocs.io (``CheckpointManager``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

# How many differing leaves a mismatch message names before it abbreviates.
_MAX_LISTED = 8
# Where unreadable checkpoints are moved, next to ``checkpoints/`` in the workdir.
UNREADABLE_DIR = "checkpoints_unreadable"
# What orbax says when a template without shardings meets a checkpoint saved on other
# devices (not damage: the checkpoint is not moved aside for it).
_DEVICES_DIFFER = "devices are different from the devices used to save"
# The longest error text a one-line unreadable-checkpoint message quotes.
_MAX_ERROR_CHARS = 240


class CheckpointMismatchError(ValueError):
    """A checkpoint in the workdir does not fit the state the config builds."""


class CheckpointUnreadableError(OSError):
    """No checkpoint in the workdir can be read (each is damaged)."""


class CheckpointSaveError(OSError):
    """Writing a checkpoint failed; the earlier checkpoints are intact."""


def saved_steps(workdir: str) -> list[int]:
    """The steps of the checkpoints under ``{workdir}/checkpoints``, ascending, read from
    the directory names alone: nothing is created, opened or generated."""
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def _json_problem(step_dir: str) -> tuple[str, str] | None:
    """``(path, error)`` of the first JSON metadata file of a checkpoint that does not
    parse (orbax's own errors do not name it), or ``None``."""
    for root, _, files in sorted(os.walk(step_dir)):
        for name in sorted(files):
            path = os.path.join(root, name)
            if not (name.startswith("_") or root.endswith("array_metadatas")):
                continue
            try:
                with open(path) as f:
                    json.load(f)
            except (OSError, ValueError) as e:
                return path, f"{type(e).__name__}: {e}"
    return None


def _error_chain(error: BaseException) -> list[BaseException]:
    """``error`` and every error it was raised from (``__cause__``, else
    ``__context__``), outermost first."""
    chain = [error]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    return chain


def describe_read_error(step_dir: str, error: BaseException) -> tuple[str, str]:
    """``(file, error)``: the damaged file of an unreadable checkpoint and the error, in
    one line each.

    A metadata file that is not valid JSON is named directly; otherwise the innermost
    error of the chain (TensorStore's, which names the array and the file it read) is
    quoted, shortened to one line, and the file is the first path it names.
    """
    found = _json_problem(step_dir)
    if found:
        return found
    inner = _error_chain(error)[-1]
    text = " ".join(str(inner).split())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 3] + "..."
    paths = re.findall(r"\"(/[^\"]+)\"", str(inner))
    return (paths[0] if paths else step_dir), f"{type(inner).__name__}: {text}"


def save_error(
    directory: str, step: int | None, error: BaseException, intact: list[int], best: bool = False
) -> CheckpointSaveError:
    """The `CheckpointSaveError` of a failed save of ``step`` into ``directory``: the
    cause in one line, and the newest of the ``intact`` steps (of the best checkpoints
    with ``best``)."""
    cause = f"{type(error).__name__}: {' '.join(str(error).split())[:_MAX_ERROR_CHARS]}"
    fix = "once the cause (disk space, quota, permissions) is fixed"
    if best:
        kept = f"the best checkpoint before it, step {intact[-1]}, is intact" if intact else ""
        rest = f"{kept}; " if kept else ""
        after = f"{rest}the same command resumes the run from its newest checkpoint {fix}."
    elif intact:
        after = f"the newest checkpoint, step {intact[-1]}, is intact and the same command "
        after += f"resumes from it {fix}."
    else:
        after = f"there is no earlier checkpoint; the same command starts afresh {fix}."
    what = "best checkpoint" if best else "checkpoint"
    return CheckpointSaveError(
        getattr(error, "errno", None) or errno.EIO,
        f"Saving the {what} of step {step} in {directory} failed ({cause}). Nothing of it "
        f"counts as a checkpoint: {after}",
    )


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
      async_save: let orbax write in a background thread (training goes on while the
        arrays, already copied off the devices, are written).
    """

    def __init__(self, workdir: str, *, every_steps: int, keep: int, async_save: bool = False):
        if every_steps < 1 or keep < 1:
            raise ValueError(
                f"ckpt.every_steps and ckpt.keep must be >= 1, got {every_steps}, {keep}."
            )
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.every_steps = every_steps
        # The step of a save still being written in the background (``async_save``).
        self._pending: int | None = None
        self._failed = False
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # what a failed or killed save left
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
        """Restores the newest readable checkpoint into ``template``; returns
        ``(state, step)``.

        Checkpoints are tried newest first. One that cannot be read is moved aside to
        ``{workdir}/checkpoints_unreadable/{step}`` (after a readable one is found) with
        a one-line warning naming its step, file and error.

        Args:
          template: the freshly initialised state; returned unchanged (with step 0)
            when the workdir has no checkpoint.

        Raises:
          CheckpointMismatchError: if the newest readable checkpoint's leaves differ
            from the template's in structure, shape or dtype. Nothing is written or
            deleted.
          CheckpointUnreadableError: if no checkpoint can be read; each is named with
            its file and error, and nothing is moved.
        """
        unreadable: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            try:
                state = self._restore(step, template)
            except CheckpointMismatchError:
                raise
            except Exception as e:  # orbax and TensorStore raise many types
                if any(_DEVICES_DIFFER in str(x) for x in _error_chain(e)):  # not damage
                    raise ValueError(
                        f"The checkpoint at step {step} in {self.directory} was saved on "
                        "other devices, and the template it is restored into has no sharding "
                        "for this run's devices: give the template's arrays this run's "
                        "shardings (e.g. `deq_jax.training.run.sharding.replicate`)."
                    ) from e
                file, error = describe_read_error(self._step_dir(step), e)
                unreadable.append((step, f"{file}: {error}"))
                continue
            for bad, reason in unreadable:
                moved = self._move_aside(bad)
                logging.warning(
                    "Checkpoint step %d cannot be read (%s); moved it to %s and resuming "
                    "from step %d.",
                    bad,
                    reason,
                    moved,
                    step,
                )
            return state, step
        if unreadable:
            listed = "\n  ".join(f"step {s}: {reason}" for s, reason in unreadable)
            raise CheckpointUnreadableError(
                f"No checkpoint in {self.directory} can be read:\n  {listed}\nNothing was "
                "moved or deleted. Move the damaged step directories out of the way to start "
                "from scratch, or use a fresh --workdir."
            )
        return template, 0

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _restore(self, step: int, template: Any) -> Any:
        """Checks checkpoint ``step`` against ``template`` and restores it into it."""
        saved = self._manager.item_metadata(step)
        saved = getattr(saved, "tree", saved)
        problems = describe_mismatch(saved, template)
        if problems:
            listed = problems[:_MAX_LISTED]
            if len(problems) > _MAX_LISTED:
                listed.append(f"... and {len(problems) - _MAX_LISTED} more")
            if any(re.match(r"opt_state/(\S+/)?average/", line) for line in problems):
                listed.append(
                    "(opt_state/.../average: the checkpoint and the config differ in weight "
                    "averaging, train.ema_decay 0 against > 0)"
                )
            raise CheckpointMismatchError(
                f"The checkpoint at step {step} in {self.directory} does not fit the model "
                "this config builds:\n  " + "\n  ".join(listed) + "\nUse a fresh --workdir, or "
                "the config the checkpoint was written with. The checkpoint was left untouched."
            )
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def _move_aside(self, step: int) -> str:
        """Moves checkpoint ``step`` to ``{workdir}/checkpoints_unreadable/`` (the lead
        process only); returns where it went."""
        root = os.path.join(os.path.dirname(self.directory), UNREADABLE_DIR)
        target, n = os.path.join(root, str(step)), 1
        while os.path.exists(target):
            n += 1
            target = os.path.join(root, f"{step}-{n}")
        if jax.process_index() == 0:
            os.makedirs(root, exist_ok=True)
            shutil.move(self._step_dir(step), target)
        self._manager.reload()
        return target

    def maybe_save(self, step: int, state: Any, *, force: bool = False) -> bool:
        """Saves ``state`` as ``step`` if due (or ``force``); returns whether it saved.

        Raises:
          CheckpointSaveError: if this save, or the background save before it, failed.
        """
        if not force and step % self.every_steps:
            return False
        if step in self._manager.all_steps():
            return False
        with self._failure_explained(step):
            saved = self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._pending = step if saved and self._manager.is_saving_in_progress() else None
        return saved

    def wait(self) -> None:
        """Blocks until every pending save is on disk.

        Raises:
          CheckpointSaveError: if a background save failed.
        """
        with self._failure_explained(self._pending):
            self._manager.wait_until_finished()
        self._pending = None

    @contextlib.contextmanager
    def _failure_explained(self, step: int | None):
        """Re-raises a failed save (of ``step``, or of the background save still
        pending) as `CheckpointSaveError` (`save_error`)."""
        try:
            yield
        except Exception as e:  # orbax, TensorStore and the OS raise many types
            failed = self._pending if self._pending is not None else step
            self._pending, self._failed = None, True
            intact = [s for s in saved_steps(os.path.dirname(self.directory)) if s != failed]
            raise save_error(self.directory, failed, e, intact) from e

    def close(self) -> None:
        """Finishes pending saves (unless a save has failed) and releases the manager."""
        if not self._failed:
            self.wait()
        self._manager.close()
