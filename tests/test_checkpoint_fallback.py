"""Restoring past a damaged checkpoint, and metrics never written twice (issue 36)."""

import logging
import os

import numpy as np
import pytest

from deq_jax.training.run import checkpoint, writers


def _state(step):
    """A small train-state-like tree; ``w`` is random (incompressible) and big enough to
    be the largest data file."""
    w = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)
    return {
        "params": {"w": w},
        "step": np.asarray(step, np.int32),
    }


def _saved(tmp_path, steps=(1, 2, 3)):
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=5)
    for step in steps:
        ckpt.maybe_save(step, _state(step))
    ckpt.close()
    return os.path.join(str(tmp_path), "checkpoints")


def _restore(tmp_path):
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=5)
    try:
        return ckpt.restore_or_init(_state(0))
    finally:
        ckpt.close()


def _empty_metadata(step_dir):
    path = os.path.join(step_dir, "default", "_METADATA")
    open(path, "w").close()
    return path


def _truncate_largest_array_file(step_dir):
    files = [
        os.path.join(root, name)
        for root, _, names in os.walk(os.path.join(step_dir, "default"))
        if os.path.basename(root) == "d"
        for name in names
    ]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.truncate(100)
    return path


@pytest.mark.parametrize(
    "damage,names",
    [
        (_empty_metadata, ("_METADATA", "JSONDecodeError")),
        (_truncate_largest_array_file, ("params.w", "OUT_OF_RANGE")),
    ],
)
def test_damaged_newest_checkpoint_is_moved_aside_and_the_previous_restored(
    tmp_path, caplog, damage, names
):
    directory = _saved(tmp_path)
    damage(os.path.join(directory, "3"))
    with caplog.at_level(logging.WARNING, logger="absl"):
        state, step = _restore(tmp_path)
    assert step == 2
    np.testing.assert_array_equal(state["params"]["w"], _state(2)["params"]["w"])
    assert checkpoint.saved_steps(str(tmp_path)) == [1, 2]
    moved = tmp_path / checkpoint.UNREADABLE_DIR / "3"
    assert (moved / "default").is_dir()  # moved, not deleted
    [message] = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert "\n" not in message
    assert message.startswith("Checkpoint step 3 cannot be read (")
    assert os.path.join(directory, "3", "default") in message
    for name in names:
        assert name in message
    assert f"moved it to {moved} and resuming from step 2" in message


def test_a_second_damaged_copy_of_a_step_does_not_overwrite_the_first(tmp_path):
    directory = _saved(tmp_path, steps=(1, 2))
    _empty_metadata(os.path.join(directory, "2"))
    assert _restore(tmp_path)[1] == 1
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=5)
    ckpt.maybe_save(2, _state(2))
    ckpt.close()
    _empty_metadata(os.path.join(directory, "2"))
    assert _restore(tmp_path)[1] == 1
    assert sorted(os.listdir(tmp_path / checkpoint.UNREADABLE_DIR)) == ["2", "2-2"]


def test_no_readable_checkpoint_is_a_clear_error_and_moves_nothing(tmp_path):
    directory = _saved(tmp_path, steps=(1, 2))
    _empty_metadata(os.path.join(directory, "2"))
    _truncate_largest_array_file(os.path.join(directory, "1"))
    with pytest.raises(checkpoint.CheckpointUnreadableError) as info:
        _restore(tmp_path)
    text = str(info.value)
    assert f"No checkpoint in {directory} can be read" in text
    assert "step 2: " in text and "_METADATA" in text
    assert "step 1: " in text and "OUT_OF_RANGE" in text
    assert "Nothing was moved or deleted" in text
    assert checkpoint.saved_steps(str(tmp_path)) == [1, 2]
    assert not (tmp_path / checkpoint.UNREADABLE_DIR).exists()


def test_mismatch_is_still_refused_untouched(tmp_path):
    _saved(tmp_path, steps=(1,))
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=5)
    wide = {"params": {"w": np.zeros((64, 65), np.float32)}, "step": np.asarray(0, np.int32)}
    with pytest.raises(checkpoint.CheckpointMismatchError, match="params/w"):
        ckpt.restore_or_init(wide)
    ckpt.close()
    assert checkpoint.saved_steps(str(tmp_path)) == [1]


def test_saved_steps_reads_names_only(tmp_path):
    assert checkpoint.saved_steps(str(tmp_path / "absent")) == []
    assert not (tmp_path / "absent").exists()
    _saved(tmp_path, steps=(2, 10))
    assert checkpoint.saved_steps(str(tmp_path)) == [2, 10]


def test_metric_writer_skips_records_an_earlier_invocation_wrote(tmp_path):
    first = writers.MetricWriter(str(tmp_path), tensorboard=False)
    first.write(2, "train", {"loss": 1.0})
    first.write(4, "train", {"loss": 0.5})
    first.close()
    again = writers.MetricWriter(str(tmp_path), tensorboard=False)
    again.write(4, "train", {"loss": 0.5})  # a resumed run repeating step 4
    again.write(4, "test_16", {"accuracy": 0.9})
    again.write(6, "train", {"loss": 0.25})
    again.close()
    records = writers.read_metrics(str(tmp_path))
    assert [(r["step"], r["split"]) for r in records] == [
        (2, "train"),
        (4, "train"),
        (4, "test_16"),
        (6, "train"),
    ]


def test_metric_writer_creates_nothing_until_it_writes(tmp_path):
    writer = writers.MetricWriter(str(tmp_path / "w"), tensorboard=True)
    writer.close()
    assert not (tmp_path / "w").exists()
