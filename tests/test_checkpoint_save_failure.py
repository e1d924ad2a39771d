"""A checkpoint save that fails midway (issue 72): a full disk injected at the storage
layer, while the arrays are written or when the checkpoint is committed, with
synchronous and asynchronous saves. The save raises `CheckpointSaveError` naming the
step, the cause and the intact checkpoint; nothing of it counts as a checkpoint; the
earlier checkpoint restores; training stops there and a rerun ends where an
uninterrupted run does."""

import contextlib
import errno
import os

import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.path import atomicity
from orbax.checkpoint._src.serialization import jax_array_handlers

from benchmarks import fault_matrix
from deq_jax.training import train_and_evaluate
from deq_jax.training.run.checkpoint import Checkpointer, CheckpointSaveError, saved_steps

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


@contextlib.contextmanager
def full_disk(where, monkeypatch, final=None):
    """Saves fail with ENOSPC ``where`` (``"arrays"``: writing the array data;
    ``"commit"``: renaming the finished temporary directory, only of the checkpoints
    whose final path ``final(path)`` accepts)."""
    owner, name = {
        "arrays": (jax_array_handlers.ArrayHandler, "serialize"),
        "commit": (atomicity.AtomicRenameTemporaryPath, "finalize"),
    }[where]
    original = getattr(owner, name)

    async def failing(self, *args, **kwargs):
        if final is None or final(self.get_final()):
            raise ENOSPC
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    yield
    monkeypatch.setattr(owner, name, original)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("where", ["arrays", "commit"])
def test_a_failed_save_leaves_the_previous_checkpoint_intact(
    tmp_path, monkeypatch, where, async_save
):
    ckpt = Checkpointer(str(tmp_path), every_steps=1, keep=1, async_save=async_save)
    ckpt.maybe_save(1, {"w": jnp.ones(8, jnp.float32)})
    ckpt.wait()
    with full_disk(where, monkeypatch), pytest.raises(CheckpointSaveError) as raised:
        ckpt.maybe_save(2, {"w": jnp.full(8, 2, jnp.float32)})
        ckpt.wait()  # an asynchronous save fails here
    ckpt.close()
    message = str(raised.value)
    assert raised.value.errno == errno.ENOSPC
    assert "checkpoint of step 2" in message and "No space left on device" in message
    assert "the newest checkpoint, step 1, is intact" in message
    assert saved_steps(str(tmp_path)) == [1]  # nothing half-written counts
    again = Checkpointer(str(tmp_path), every_steps=1, keep=1)
    state, step = again.restore_or_init({"w": np.zeros(8, np.float32)})
    again.close()
    assert step == 1 and np.array_equal(np.asarray(state["w"]), np.ones(8))
    # Anything else is orbax's temporary directory (removed at the next start, unless a
    # background thread of the failed save creates it only after that start).
    others = [d for d in os.listdir(tmp_path / "checkpoints") if d != "1"]
    assert all(d.startswith("2.orbax-checkpoint-tmp") for d in others)


def test_a_failed_first_save_says_there_is_no_earlier_checkpoint(tmp_path, monkeypatch):
    ckpt = Checkpointer(str(tmp_path), every_steps=1, keep=1)
    with full_disk("commit", monkeypatch), pytest.raises(CheckpointSaveError) as raised:
        ckpt.maybe_save(1, {"w": jnp.ones(8, jnp.float32)})
    ckpt.close()
    assert "there is no earlier checkpoint" in str(raised.value)
    assert saved_steps(str(tmp_path)) == []


def test_training_stops_on_a_failed_save_and_a_rerun_ends_as_uninterrupted(tmp_path, monkeypatch):
    data_dir = str(tmp_path / "data")
    reference = train_and_evaluate(
        fault_matrix.config(data_dir), str(tmp_path / "ref"), emit=lambda line: None
    )
    workdir = str(tmp_path / "w")
    step_8 = lambda path: path.name == "8" and path.parent.name == "checkpoints"  # noqa: E731
    with full_disk("commit", monkeypatch, step_8), pytest.raises(CheckpointSaveError) as raised:
        train_and_evaluate(fault_matrix.config(data_dir), workdir, emit=lambda line: None)
    assert "Saving the checkpoint of step 8" in str(raised.value)
    assert "the newest checkpoint, step 4, is intact" in str(raised.value)
    assert saved_steps(workdir) == [4]
    assert not os.path.exists(os.path.join(workdir, "run.lock"))
    lines = []
    resumed = train_and_evaluate(fault_matrix.config(data_dir), workdir, emit=lines.append)
    assert "resuming from step 4" in lines[0]
    assert fault_matrix.identical(fault_matrix.params(resumed), fault_matrix.params(reference))


def test_a_failed_best_checkpoint_save_stops_training_too(tmp_path, monkeypatch):
    best = lambda path: "checkpoints_best" in str(path)  # noqa: E731
    with full_disk("commit", monkeypatch, best), pytest.raises(CheckpointSaveError) as raised:
        train_and_evaluate(
            fault_matrix.config(str(tmp_path / "data")), str(tmp_path), emit=lambda line: None
        )
    assert "Saving the best checkpoint of step 3" in str(raised.value)
    assert "resumes the run from its newest checkpoint" in str(raised.value)
    assert not os.path.exists(tmp_path / "run.lock")
