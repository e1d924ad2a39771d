"""Reading easy-to-hard-data's ``.npy`` files: mazes (NCHW) and prefix sums (centred bits).

The files are written here in the exact format of easy-to-hard-data: mazes upscaled and
framed as ``make_mazes.py``'s ``gen_dataset`` does it, transposed to NCHW and saved as
float64; prefix sums as ``make_prefixsums.py`` makes them ({0, 1} floats, ``[N, L]``) and
as ``PrefixSumDataset`` hands them out (``[N, 1, L]``, ``bits - 0.5``).
"""

import dataclasses
import os

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks import easy_to_hard_files
from deq_jax.tasks.maze_generator import GOAL, OPEN, START
from deq_jax.tasks.mazes import MazeConfig, generate_split, read_split

_COLOURS = {OPEN: (1, 1, 1), START: (0, 1, 0), GOAL: (1, 0, 0)}  # walls stay (0, 0, 0)


def _easy_to_hard_images(grids, paths):
    """``gen_dataset``'s upscaling of ``make_mazes.py``, on ``[N, g, g]`` compact grids.

    Returns NCHW float64 inputs ``[N, 3, H, W]`` and solutions ``[N, H, W]``, as the
    script saves them.
    """
    num, side = grids.shape[:2]
    maze_size = (side - 1) // 2  # cells per side: make_mazes.py's maze_size
    data_array = np.zeros((num, side, side, 3))
    for code, colour in _COLOURS.items():
        data_array[grids == code] = colour
    solution_array = paths[..., None].astype(np.float64)  # [N, g, g, 1]
    img_size = 2 * (2 * maze_size + 1) + 2
    border = (img_size - 4 * maze_size) // 2
    big = np.zeros((2, num, img_size, img_size, 3))
    for out, small in zip(big, (data_array, solution_array), strict=True):
        out[:, border - 1 : -border : 2, border - 1 : -border : 2, :] = small
        out[:, border : -border + 1 : 2, border : -border + 1 : 2, :] = small
        out[:, border : -border + 1 : 2, border - 1 : -border : 2, :] = small
        out[:, border - 1 : -border : 2, border : -border + 1 : 2, :] = small
    return big[0].transpose((0, 3, 1, 2)), big[1].transpose((0, 3, 1, 2))[:, 0]


def _write_mazes(root, split, size, grids, paths):
    folder = os.path.join(root, f"maze_data_{split}_{size}")
    os.makedirs(folder, exist_ok=True)
    inputs, solutions = _easy_to_hard_images(grids, paths)
    np.save(os.path.join(folder, "inputs.npy"), inputs)
    np.save(os.path.join(folder, "solutions.npy"), solutions)
    return folder


GENERATED = MazeConfig(train_size=30, test_maze_sizes=(9, 13), test_size=10, val_size=0)


@pytest.fixture
def maze_root(tmp_path):
    """easy-to-hard folders holding `GENERATED`'s mazes (5 more than asked for)."""
    more = MazeConfig(train_size=35, test_maze_sizes=(9, 13), test_size=15)
    for split, folder, size in (
        ("train", "train", 9),
        ("test_9", "test", 9),
        ("test_13", "test", 13),
    ):
        raw = generate_split(more, split)
        _write_mazes(str(tmp_path), folder, size, raw["grids"], raw["paths"])
    return str(tmp_path)


def test_maze_files_read_back_as_the_mazes_they_hold(maze_root):
    inputs, solutions = (
        np.load(os.path.join(maze_root, "maze_data_test_13", name))
        for name in ("inputs.npy", "solutions.npy")
    )
    assert inputs.shape == (15, 3, 32, 32) and inputs.dtype == np.float64
    assert solutions.shape == (15, 32, 32)
    config = dataclasses.replace(GENERATED, files_dir=maze_root)
    for split in config.splits:
        read, made = read_split(config, split), generate_split(GENERATED, split)
        for key in ("grids", "paths"):
            np.testing.assert_array_equal(read[key], made[key])
    task = tasks.get(
        "mazes", files_dir=maze_root, train_size=30, test_maze_sizes=(13,), test_size=10, val_size=5
    )
    # "valid": the five mazes after the 30 training ones in the training folder.
    more_train = generate_split(dataclasses.replace(GENERATED, train_size=35), "train")
    valid = read_split(task.config, "valid")
    for key in ("grids", "paths"):
        np.testing.assert_array_equal(valid[key], more_train[key][30:])
    with pytest.raises(ValueError, match=r"holds 35 mazes, fewer than the 6 asked for after row"):
        read_split(dataclasses.replace(task.config, val_size=6), "valid")
    batch = next(task.eval_iterator("test_13", 4))
    np.testing.assert_array_equal(batch["inputs"], inputs[:4].transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(batch["targets"], solutions[:4])
    assert batch["inputs"].dtype == np.float32 and batch["targets"].dtype == np.int32
    assert next(task.train_iterator(8, seed=0))["inputs"].shape == (8, 24, 24, 3)


def test_maze_chunks_cover_the_rows_in_order(maze_root, monkeypatch):
    monkeypatch.setattr(easy_to_hard_files, "_CHUNK_BYTES", 4 * 3 * 24 * 24 * 8 + 7)  # 4 mazes
    folder = os.path.join(maze_root, "maze_data_train_9")
    chunks = list(easy_to_hard_files.maze_image_chunks(folder, 10, 24))
    assert [len(c["inputs"]) for c in chunks] == [4, 4, 2]
    whole = np.load(os.path.join(folder, "inputs.npy"))[:10].transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(np.concatenate([c["inputs"] for c in chunks]), whole)


def _config(root, **fields):
    return MazeConfig(train_size=5, test_maze_sizes=(9,), test_size=5, files_dir=root, **fields)


def test_missing_maze_folder_names_the_file_and_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"maze_data_train_9/inputs.npy not found"):
        read_split(_config(str(tmp_path)), "train")
    with pytest.raises(FileNotFoundError, match=r"Easy_to_Hard_Datav2/maze_data_train_9.tar.gz"):
        read_split(_config(str(tmp_path)), "train")


def _rewrite(root, name, array):
    np.save(os.path.join(root, "maze_data_train_9", name), array)


@pytest.mark.parametrize(
    "name, change, message",
    [
        (
            "inputs.npy",
            lambda x: x.transpose(0, 2, 3, 1),
            r"inputs.npy has shape \(35, 24, 24, 3\)",
        ),
        ("solutions.npy", lambda y: y[:, None], r"\[N, 24, 24\]"),
        ("inputs.npy", lambda x: x * 255, r"inputs.npy \(mazes 0 to 4\) holds 255.0"),
        ("solutions.npy", lambda y: y - 1, r"solutions.npy \(mazes 0 to 4\) holds -1.0"),
        ("inputs.npy", lambda x: x[:3], "holds 3 mazes, fewer than the 5 asked for .lower"),
        ("inputs.npy", lambda x: np.roll(x, 1, axis=3), "not a maze grid upscaled 2x"),
        ("inputs.npy", lambda x: x * np.array([1, 0, 1])[:, None, None], "none of black, white"),
        ("solutions.npy", lambda y: np.roll(y, 1, axis=2), "not a maze grid upscaled 2x"),
    ],
)
def test_bad_maze_files_name_the_file_and_the_fault(maze_root, name, change, message):
    array = np.load(os.path.join(maze_root, "maze_data_train_9", name))
    _rewrite(maze_root, name, change(array))
    with pytest.raises(ValueError, match=message) as error:
        read_split(_config(maze_root), "train")
    assert "maze_data_train_9" in str(error.value)


def test_a_maze_without_its_start_is_refused(maze_root):
    inputs = np.load(os.path.join(maze_root, "maze_data_train_9", "inputs.npy"))
    inputs[2] = np.where((inputs[2] == [[[0]], [[1]], [[0]]]).all(0), 1.0, inputs[2])  # green
    _rewrite(maze_root, "inputs.npy", inputs)
    with pytest.raises(ValueError, match="maze_data_train_9: a maze without exactly one start"):
        read_split(_config(maze_root), "train")


def _write_prefix_sums(folder, length, bits, *, centred, channel, targets=None):
    data = bits.astype(np.float32) - (0.5 if centred else 0.0)
    data = data[:, None] if channel else data
    parity = np.cumsum(bits, axis=1) % 2 if targets is None else targets
    np.save(os.path.join(folder, f"{length}_data.npy"), data)
    np.save(os.path.join(folder, f"{length}_targets.npy"), parity.astype(np.float32))


@pytest.mark.parametrize("centred, channel", [(False, False), (True, True), (True, False)])
def test_prefix_sum_files_read_as_bits_in_either_layout(tmp_path, centred, channel):
    rng = np.random.default_rng(0)
    bits = {length: rng.integers(0, 2, size=(35, length)) for length in (8, 12)}
    for length, b in bits.items():
        _write_prefix_sums(str(tmp_path), length, b, centred=centred, channel=channel)
    task = tasks.get(
        "prefix_sum",
        files_dir=str(tmp_path),
        train_size=20,
        train_length=8,
        test_lengths=(8, 12),
        test_size=10,
        val_size=5,
    )
    task.prepare()
    train, test_8, test_12 = (task.arrays(s) for s in ("train", "test_8", "test_12"))
    np.testing.assert_array_equal(train["inputs"][..., 0], bits[8][:20])
    np.testing.assert_array_equal(test_8["inputs"][..., 0], bits[8][20:30])  # after train
    valid = task.arrays("valid")["inputs"][..., 0]
    np.testing.assert_array_equal(valid, bits[8][30:35])  # after train and test
    assert task.validation_split == "valid" and "valid" not in task.eval_splits
    np.testing.assert_array_equal(test_12["inputs"][..., 0], bits[12][:10])
    np.testing.assert_array_equal(test_12["targets"], np.cumsum(bits[12][:10], axis=1) % 2)
    assert train["inputs"].shape == (20, 8, 1) and train["inputs"].dtype == np.float32
    assert test_12["targets"].dtype == np.int32 and task.num_examples("test_8") == 10
    assert next(task.train_iterator(4, seed=0))["inputs"].shape == (4, 8, 1)


def _prefix_task(folder, **fields):
    fields = {"train_size": 20, "train_length": 8, "test_lengths": (8,), "test_size": 10, **fields}
    fields.setdefault("val_size", 0)
    return tasks.get("prefix_sum", files_dir=folder, **fields)


def test_prefix_sum_torch_pickles_get_the_conversion(tmp_path):
    (tmp_path / "8_data.pth").write_bytes(b"PK")
    with pytest.raises(FileNotFoundError, match="torch pickle.*numpy.save.*torch.load"):
        _prefix_task(str(tmp_path)).arrays("train")
    with pytest.raises(FileNotFoundError, match=r"8_data.npy not found. Expected easy-to-hard"):
        _prefix_task(str(tmp_path / "elsewhere")).arrays("train")


@pytest.mark.parametrize(
    "data, targets, message",
    [
        (lambda b: b * 2, None, r"8_data.npy \(rows 0 to 19\) holds 2.0; .*centred bits"),
        (lambda b: b[:, :7], None, r"8_data.npy has shape \(30, 7\); expected \[N, L\] or"),
        (lambda b: b[:15], None, r"8_data.npy holds 15 strings; rows 0 to 19 were asked"),
        (lambda b: b, lambda p: 1 - p, "8_targets.npy: the targets are not the prefix parities"),
        (lambda b: b, lambda p: p[:, ::-1], "8_targets.npy: the targets are not the prefix"),
        (lambda b: b, lambda p: p[:, None], r"8_targets.npy has shape \(30, 1, 8\)"),
    ],
)
def test_bad_prefix_sum_files_name_the_file_and_the_fault(tmp_path, data, targets, message):
    bits = np.random.default_rng(1).integers(0, 2, size=(30, 8))
    parity = np.cumsum(bits, axis=1) % 2
    _write_prefix_sums(
        str(tmp_path),
        8,
        bits,
        centred=False,
        channel=False,
        targets=parity if targets is None else targets(parity),
    )
    np.save(tmp_path / "8_data.npy", data(bits).astype(np.float32))
    with pytest.raises(ValueError, match=message):
        _prefix_task(str(tmp_path)).arrays("train")
