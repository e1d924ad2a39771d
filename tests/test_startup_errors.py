"""Start-up errors a user can cause end in one FATAL line with the fix, no traceback
(issue 72): missing or malformed data, a workdir holding another model's checkpoints,
only damaged checkpoints or another vocabulary's run, a workdir that is a file or not
writable. `launch.flags.user_errors` does it; the loaders' `DataError` messages say
how to get the data."""

import os

import numpy as np
import pytest
from conftest import run_module

from deq_jax import tasks
from deq_jax.tasks import easy_to_hard_files, idx_files, text_corpus
from deq_jax.tasks.errors import DataError, DataFormatError, DataNotFoundError
from deq_jax.tasks.text_vocab import char_vocabulary
from deq_jax.training.families.lm_setup import VocabularyMismatchError, check_vocabulary
from deq_jax.training.run import checkpoint
from deq_jax.training.run.workdir import WorkdirError, WorkdirLockedError, ensure_workdir
from launch import flags as launch_flags

FASHION = ("configs/mdeq_fashion_mnist.py:smoke",)
PREFIX_SUM = ("configs/prefix_sum.py:smoke",)


def _train(config, workdir, *overrides):
    return run_module("launch.main", "--config", *config, f"--workdir={workdir}", *overrides)


def _fatal_line(proc, *fix):
    """The one stderr line of a run refused at start-up; checks status 2, no traceback
    and that the line holds each of ``fix``."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("FATAL ")
    for text in fix:
        assert text in lines[0]
    return lines[0]


# End to end: python -m launch.main.


def test_empty_fashion_mnist_directory(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _train(FASHION, tmp_path / "w", f"--config.task.dir={empty}")
    line = _fatal_line(proc, "FATAL data error:", str(empty), idx_files.INSTALL_FASHION_MNIST)
    assert "train-images-idx3-ubyte" in line and idx_files.DEFAULT_FASHION_MNIST_DIR in line


def test_malformed_idx_file(tmp_path):
    data = tmp_path / "fm"
    data.mkdir()
    for pair in idx_files.IDX_FILES.values():
        for name in pair:
            (data / name).write_bytes(b"\x00\x00\x08\x04" + bytes(16))  # a 4-d magic number
    proc = _train(FASHION, tmp_path / "w", f"--config.task.dir={data}")
    _fatal_line(
        proc,
        "FATAL data error:",
        f"{data}/train-images-idx3-ubyte is not an MNIST-format idx file",
        idx_files.INSTALL_FASHION_MNIST,
    )


def test_checkpoint_from_another_model(tmp_path):
    workdir = str(tmp_path / "w")
    ckpt = checkpoint.Checkpointer(workdir, every_steps=1, keep=1)
    other = {"params": {"w": np.zeros((3, 3), np.float32)}, "step": np.asarray(1, np.int32)}
    ckpt.maybe_save(1, other, force=True)
    ckpt.close()
    proc = _train(PREFIX_SUM, workdir)
    line = _fatal_line(proc, "FATAL checkpoint error:", "does not fit the model", "fresh --workdir")
    assert "in the model, not in the checkpoint; " in line  # the listed leaves, folded
    assert checkpoint.saved_steps(workdir) == [1]  # left untouched


@pytest.mark.parametrize("where", ["", "sub"])
def test_workdir_that_is_a_file(tmp_path, where):
    path = tmp_path / "file"
    path.write_text("not a directory")
    workdir = os.path.join(path, where) if where else str(path)
    _fatal_line(_train(PREFIX_SUM, workdir), "FATAL workdir error:", workdir, str(path))


@pytest.fixture
def unwritable_workdir(tmp_path):
    """A workdir that cannot be created: under a read-only directory, or for root (who
    can write anywhere else) under /sys."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        yield str(locked / "run")
        locked.chmod(0o700)
        return
    path = f"/sys/deq_jax_test_{os.getpid()}"
    try:
        os.makedirs(path)
    except PermissionError:
        yield path
        return
    os.rmdir(path)
    pytest.skip("root can write anywhere, even in /sys here")


def test_workdir_that_is_not_writable(unwritable_workdir):
    proc = _train(PREFIX_SUM, unwritable_workdir)
    _fatal_line(proc, "FATAL workdir error:", unwritable_workdir, "write to")
    assert not os.path.exists(unwritable_workdir)


# In process: the wrapper and the library's messages.


def test_user_errors_prints_one_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as stop:
        with launch_flags.user_errors():
            raise DataNotFoundError("No directory /x:\n  it holds nothing\n\nGet it.")
    assert stop.value.code == 2
    assert (
        capsys.readouterr().err == "FATAL data error: No directory /x: it holds nothing; Get it.\n"
    )


@pytest.mark.parametrize(
    "error",
    [ValueError("a bug"), RuntimeError("x"), FileNotFoundError(2, "No such file", "/elsewhere")],
)
def test_other_errors_pass_through_unchanged(error, capsys):
    with pytest.raises(type(error)) as raised:
        with launch_flags.user_errors():
            raise error
    assert raised.value is error and capsys.readouterr().err == ""


def test_workdir_lock_and_save_errors_are_one_line_with_their_status(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(WorkdirError) as raised:
        ensure_workdir(str(blocker / "sub"))
    line = launch_flags.user_error_line(raised.value)
    assert line == (
        f"FATAL workdir error: --workdir {blocker / 'sub'} cannot be a directory: {blocker} "
        "is a file. Name a directory (it is created if missing)."
    )
    locked = WorkdirLockedError("The workdir /w is in use by another run: process 7 on h.")
    assert launch_flags.user_error_line(locked).startswith("FATAL workdir error: The workdir")
    with pytest.raises(SystemExit) as stop:
        with launch_flags.user_errors():
            raise checkpoint.CheckpointSaveError(28, "Saving the checkpoint of step 4 failed.")
    assert stop.value.code == launch_flags.IO_ERROR_EXIT_STATUS == 74
    assert capsys.readouterr().err == (
        "FATAL checkpoint save failed: Saving the checkpoint of step 4 failed.\n"
    )


def test_unreadable_checkpoints_are_one_line(tmp_path):
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=2)
    ckpt.maybe_save(1, {"w": np.ones(4, np.float32)}, force=True)
    ckpt.close()
    open(tmp_path / "checkpoints" / "1" / "default" / "_METADATA", "w").close()
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=2)
    with pytest.raises(checkpoint.CheckpointUnreadableError) as raised:
        ckpt.restore_or_init({"w": np.zeros(4, np.float32)})
    ckpt.close()
    line = launch_flags.user_error_line(raised.value)
    assert line.startswith("FATAL checkpoint error: No checkpoint in ") and "\n" not in line
    assert "_METADATA" in line and "fresh --workdir" in line


def test_vocabulary_mismatch_is_one_line(tmp_path):
    check_vocabulary(str(tmp_path), char_vocabulary("abc"))
    with pytest.raises(VocabularyMismatchError) as raised:
        check_vocabulary(str(tmp_path), char_vocabulary("abcd"))
    line = launch_flags.user_error_line(raised.value)
    assert line.startswith("FATAL vocabulary error: The checkpoints in ")
    assert "fresh --workdir" in line


@pytest.mark.parametrize(
    "load, kind, fix",
    [
        (lambda d: tasks.get("mnist", dir=d).input_shape, DataNotFoundError, "exdb/mnist"),
        (lambda d: tasks.get("cifar10", dir=d).input_shape, DataNotFoundError, "tar xzf"),
        (lambda d: tasks.get("char_text", path=d), DataNotFoundError, "launch.prepare_data"),
        (lambda d: tasks.get("wikitext", path=d), DataNotFoundError, "wiki.train.tokens"),
        (
            lambda d: easy_to_hard_files.read_prefix_sum_files(d, 8, start=0, count=1),
            DataNotFoundError,
            "prefix_sums_data.tar.gz",
        ),
        (
            lambda d: list(easy_to_hard_files.maze_image_chunks(f"{d}/maze_data_train_9", 1, 24)),
            DataNotFoundError,
            "maze_data_train_9.tar.gz",
        ),
        (lambda d: text_corpus.read_text(_write(d, "c.txt", b"\xff")), DataFormatError, "UTF-8"),
    ],
)
def test_loaders_name_the_path_and_the_fix(tmp_path, load, kind, fix):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(kind) as raised:
        load(missing)
    assert isinstance(raised.value, DataError)
    assert missing in str(raised.value) and fix in str(raised.value)


def _write(directory, name, payload):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(payload)
    return path


def test_data_errors_are_still_the_builtin_types():
    assert issubclass(DataNotFoundError, FileNotFoundError) and issubclass(
        DataFormatError, ValueError
    )
    assert tasks.DataError is DataError
