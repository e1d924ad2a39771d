"""Tests for the maze task: perfect mazes, their unique paths, geometry and the interface."""

import collections
import dataclasses
import hashlib
import sys

import numpy as np
import pytest

import deq_jax.tasks as tasks
from configs import mazes as maze_config
from deq_jax.tasks.maze_generator import GOAL, START, WALL, carve, draw_maze, tree_path
from deq_jax.tasks.mazes import (
    MazeConfig,
    check_maze_size,
    generate_split,
    image_size,
    load,
    maze_accuracy,
    render,
)

# The module itself; ``deq_jax.tasks.mazes`` names the constructor.
mazes_module = sys.modules[generate_split.__module__]

SMALL = MazeConfig(train_size=60, test_maze_sizes=(9, 13, 33), test_size=12)


def _bfs(grid, source):
    """Distances over the open pixels of a compact grid from ``source`` (-1: unreached)."""
    dist = np.full(grid.shape, -1)
    dist[source] = 0
    queue = collections.deque([source])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if grid[nr, nc] != WALL and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def _where(grid, code):
    (r,), (c,) = np.nonzero(grid == code)
    return int(r), int(c)


@pytest.mark.parametrize("generator", ["from_start", "random_start"])
@pytest.mark.parametrize("split", ["train", "test_13", "test_33"])
def test_mazes_are_perfect_and_paths_are_the_unique_shortest(split, generator):
    config = dataclasses.replace(SMALL, generator=generator)
    raw = generate_split(config, split)
    n = check_maze_size(config.maze_size(split))
    for grid, path in zip(raw["grids"][:6], raw["paths"][:6], strict=True):
        assert grid.shape == (2 * n + 1,) * 2
        assert (grid[0] == WALL).all() and (grid[-1] == WALL).all()
        assert (grid[:, 0] == WALL).all() and (grid[:, -1] == WALL).all()
        assert (grid[1::2, 1::2] != WALL).all()  # every cell is open
        assert (grid[::2, ::2] == WALL).all()  # corners between cells are walls
        passages = int(np.sum(grid[1::2, 2:-1:2] != WALL) + np.sum(grid[2:-1:2, 1::2] != WALL))
        assert passages == n * n - 1  # a tree: connected (below) with cells - 1 edges
        start, goal = _where(grid, START), _where(grid, GOAL)
        assert start != goal
        from_start, from_goal = _bfs(grid, start), _bfs(grid, goal)
        assert (from_start[grid != WALL] >= 0).all()  # connected
        length = from_start[goal]
        on_path = path.astype(bool)
        assert on_path.sum() == length + 1 and on_path[start] and on_path[goal]
        assert (grid[on_path] != WALL).all()
        np.testing.assert_array_equal(from_start[on_path] + from_goal[on_path], length)


def test_carve_and_tree_path_known_answers():
    parent, root = carve(2, [0.0, 0.0, 0.0, 0.0])  # root 0, always the first option
    assert root == 0 and parent == [-1, 3, 0, 2]  # 0 -> 2 -> 3 -> 1 (down, right, up)
    assert tree_path(parent, 1, 2) == [1, 3, 2]
    assert tree_path(parent, 0, 1) == [0, 2, 3, 1]
    assert tree_path(parent, 3, 0) == [3, 2, 0]
    grid, path = draw_maze(2, [0.0] * 5 + [0.99], generator="random_start")  # start 0, goal 3
    np.testing.assert_array_equal(
        grid,
        [[0, 0, 0, 0, 0], [0, 2, 0, 1, 0], [0, 1, 0, 1, 0], [0, 1, 1, 3, 0], [0, 0, 0, 0, 0]],
    )
    np.testing.assert_array_equal(
        path, [[0] * 5, [0, 1, 0, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 1, 0], [0] * 5]
    )


def test_from_start_carves_from_the_start_cell_known_answer():
    parent, root = carve(2, [0.0, 0.0, 0.0], root=3)  # the first option at every step
    assert root == 3 and parent == [1, 3, 0, -1]  # 3 -> 1 (up) -> 0 (left) -> 2 (down)
    # start int(0.99 * 4) = 3, goal int(0.0 * 3) = 0, then the three carving steps
    grid, path = draw_maze(2, [0.99, 0.0, 0.0, 0.0, 0.0], generator="from_start")
    np.testing.assert_array_equal(
        grid,
        [[0, 0, 0, 0, 0], [0, 3, 1, 1, 0], [0, 1, 0, 1, 0], [0, 1, 0, 2, 0], [0, 0, 0, 0, 0]],
    )
    np.testing.assert_array_equal(
        path, [[0] * 5, [0, 1, 1, 1, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0], [0] * 5]
    )
    with pytest.raises(ValueError, match="Valid generators: from_start, random_start"):
        MazeConfig(generator="kruskal")
    with pytest.raises(ValueError, match="Valid generators"):
        tasks.get("mazes", generator="")


def test_from_start_gives_easy_to_hard_path_lengths():
    # 13x13 mean path pixels (compact grid), measured over 10,000 mazes: from_start 41.0,
    # random_start 26.9; easy-to-hard-data's gen_dataset 41.1 over 10,000. The standard
    # deviation is about 20, so 400 mazes give a mean within +-3 (3 standard errors).
    means = {}
    for generator in ("from_start", "random_start"):
        config = MazeConfig(
            train_size=400, train_maze_size=13, test_maze_sizes=(9,), generator=generator
        )
        means[generator] = generate_split(config, "train")["paths"].sum((1, 2)).mean()
    assert abs(means["from_start"] - 41.0) < 3 and abs(means["random_start"] - 26.9) < 3
    assert means["from_start"] > means["random_start"] + 10


def test_random_start_reproduces_the_first_generator_bit_for_bit():
    # Digests of the data the project generated before the generator option (commit
    # f8ca09e, MazeConfig without it), which configs/mazes.py's recorded runs trained on.
    config = MazeConfig(
        train_size=60, test_maze_sizes=(9, 13), test_size=12, generator="random_start"
    )
    for split, digest in (("train", "18d80cf7c5634384"), ("test_13", "c567dc96d206a4df")):
        raw = generate_split(config, split)
        data = raw["grids"].tobytes() + raw["paths"].tobytes()
        assert hashlib.sha256(data).hexdigest()[:16] == digest


@pytest.mark.parametrize("size, side", [(9, 24), (13, 32), (33, 72), (3, 12)])
def test_image_geometry(size, side):
    assert image_size(size) == side


def test_rendered_images_colours_and_targets():
    arrays = load("test_13", config=SMALL)
    inputs, targets = arrays["inputs"], arrays["targets"]
    assert inputs.shape == (12, 32, 32, 3) and inputs.dtype == np.float32
    assert targets.shape == (12, 32, 32) and targets.dtype == np.int32
    assert load("train", config=SMALL)["inputs"].shape == (60, 24, 24, 3)
    colours = {tuple(c) for c in inputs.reshape(-1, 3)}
    assert colours == {(0, 0, 0), (1, 1, 1), (0, 1, 0), (1, 0, 0)}
    for x, y in zip(inputs, targets, strict=True):
        green = (x == [0, 1, 0]).all(-1)
        red = (x == [1, 0, 0]).all(-1)
        assert green.sum() == 4 and red.sum() == 4  # one cell, upscaled 2x
        assert y[green].all() and y[red].all()
        assert (x[y == 1].sum(-1) > 0).all()  # the path runs over open pixels only
        assert not x[[0, -1]].any() and not x[:, [0, -1]].any()  # zero border
    raw = generate_split(SMALL, "test_13")
    up = raw["paths"][0].repeat(2, 0).repeat(2, 1)
    np.testing.assert_array_equal(targets[0, 1:-1, 1:-1], up)
    np.testing.assert_array_equal(
        render(raw["grids"][:1], raw["paths"][:1])["targets"][0], targets[0]
    )


def test_deterministic_distinct_and_seed_dependent():
    first = generate_split(SMALL, "train")["grids"].copy()
    generate_split.cache_clear()
    np.testing.assert_array_equal(generate_split(SMALL, "train")["grids"], first)
    other = MazeConfig(seed=1, train_size=60, test_maze_sizes=(9,), test_size=12)
    assert not np.array_equal(generate_split(other, "train")["grids"], first)
    rows = lambda g: {m.tobytes() for m in g}
    assert len(rows(first)) == 60
    test = generate_split(SMALL, "test_9")["grids"]
    assert len(rows(test)) == 12 and not rows(test) & rows(first)
    assert not generate_split(SMALL, "train")["grids"].flags.writeable


@pytest.mark.parametrize("size", [8, 1, 0, -3, 2, 9.0])
def test_bad_maze_size_names_valid_choices(size):
    with pytest.raises(ValueError, match=r"odd integer >= 3 \(3, 5, 7, 9"):
        MazeConfig(train_maze_size=size)
    with pytest.raises(ValueError, match="odd integer"):
        tasks.get("mazes", test_maze_sizes=(9, size))


def test_bad_config_and_splits():
    with pytest.raises(ValueError, match="Valid splits: train, valid, test_9, test_13, test_33"):
        SMALL.size("test_11")
    with pytest.raises(ValueError, match="distinct"):
        MazeConfig(test_maze_sizes=(9, 9))
    with pytest.raises(ValueError, match="train_size"):
        MazeConfig(train_size=0)
    tiny = MazeConfig(
        train_maze_size=3, train_size=500, test_maze_sizes=(3,), test_size=5, val_size=0
    )
    with pytest.raises(ValueError, match="distinct 3x3 mazes"):
        generate_split(tiny, "train")  # 2x2 cells: only 4 trees x 12 (start, goal) pairs
    with pytest.raises(ValueError, match="Valid keywords"):
        tasks.get("mazes", maze_size=9)


def test_validation_split_is_new_mazes_of_the_training_size():
    config = dataclasses.replace(SMALL, val_size=40)
    valid = generate_split(config, "valid")
    assert valid["grids"].shape == (40, 11, 11)  # 9x9: 5 cells a side, 2 * 5 + 1 pixels
    rows = lambda split: {g.tobytes() for g in generate_split(config, split)["grids"]}
    assert len(rows("valid")) == 40 and not rows("valid") & (rows("train") | rows("test_9"))
    without = dataclasses.replace(SMALL, val_size=0)  # its own stream: the rest unchanged
    assert "valid" not in without.splits
    for split in without.splits:
        np.testing.assert_array_equal(
            generate_split(without, split)["grids"], generate_split(config, split)["grids"]
        )
    task = tasks.get("mazes", train_size=60, test_maze_sizes=(9,), test_size=12, val_size=40)
    assert task.validation_split == "valid" and task.num_examples("valid") == 40
    assert tasks.get("mazes", test_maze_sizes=(9,), val_size=0).validation_split is None


def test_validation_split_of_a_larger_size_for_selecting_extrapolation():
    config = dataclasses.replace(SMALL, val_size=20, val_maze_size=13)
    valid = generate_split(config, "valid")
    assert config.maze_size("valid") == 13 and valid["grids"].shape == (20, 15, 15)
    rows = lambda split: {g.tobytes() for g in generate_split(config, split)["grids"]}
    assert len(rows("valid")) == 20 and not rows("valid") & rows("test_13")
    at_train_size = dataclasses.replace(config, val_maze_size=0)  # the other splits unchanged
    assert at_train_size.maze_size("valid") == 9
    for split in ("train", "test_9", "test_13"):
        np.testing.assert_array_equal(
            generate_split(at_train_size, split)["grids"], generate_split(config, split)["grids"]
        )
    task = tasks.get("mazes", train_size=60, test_maze_sizes=(9,), val_size=8, val_maze_size=11)
    assert task.source("valid")[0]["inputs"].shape == (28, 28, 3)  # 2 * 11 + 6 pixels
    assert task.input_shape == (24, 24, 3)  # the model is still built on 9x9 mazes
    with pytest.raises(ValueError, match="odd integer"):
        dataclasses.replace(SMALL, val_maze_size=10)


def test_task_interface_iterators_and_metrics():
    task = tasks.get(
        "mazes", data_dir="/unused", train_size=60, test_maze_sizes=(9, 13), test_size=12
    )
    assert task.name == "mazes" and task.num_classes == 2 and task.input_shape == (24, 24, 3)
    assert task.splits == ("train", "valid", "test_9", "test_13") and task.eval_splits == (
        "test_9",
        "test_13",
    )
    assert task.num_examples("test_13") == 12 and task.steps_per_epoch(16) == 3
    task.prepare()
    batches = task.train_iterator(16, seed=3)
    stream = [next(batches) for _ in range(5)]
    resumed = next(task.train_iterator(16, seed=3, start_step=4))
    np.testing.assert_array_equal(resumed["inputs"], stream[4]["inputs"])
    assert stream[0]["inputs"].shape == (16, 24, 24, 3) and stream[0]["targets"].dtype == np.int32
    half = next(task.train_iterator(16, seed=3, process_index=1, process_count=2))
    np.testing.assert_array_equal(half["targets"], stream[0]["targets"][8:])
    evals = list(task.eval_iterator("test_13", 5))
    assert len(evals) == 3 and int(sum(b["mask"].sum() for b in evals)) == 12
    batch = evals[0]
    logits = np.eye(2, dtype=np.float32)[batch["targets"]]  # [5, 32, 32, 2], perfect
    m = task.metrics(logits, batch["targets"], batch["mask"])
    assert float(m["pixel_accuracy"]) == 1.0 and float(m["maze_accuracy"]) == 1.0
    logits[0, 5, 5] = logits[0, 5, 5, ::-1]  # one wrong pixel in one maze
    m = task.metrics(logits, batch["targets"], batch["mask"])
    np.testing.assert_allclose(m["maze_accuracy"], 0.8)
    np.testing.assert_allclose(m["pixel_accuracy"], 1 - 1 / (5 * 32 * 32))
    one_logit = np.where(batch["targets"] == 1, 2.0, -2.0)  # [5, 32, 32]
    assert float(maze_accuracy(one_logit, batch["targets"])["maze_accuracy"]) == 1.0
    m = maze_accuracy(-one_logit, batch["targets"], np.array([1, 1, 0, 0, 0], bool))
    assert float(m["maze_accuracy"]) == 0.0 and float(m["count"]) == 2.0
    with pytest.raises(ValueError, match="logits"):
        maze_accuracy(np.zeros((2, 24, 24, 2)), np.zeros((2, 32, 32), np.int32))


def test_configs_pin_random_start_and_the_benchmark_variant_uses_from_start():
    full, smoke = maze_config.get_config(), maze_config.get_config("smoke")
    assert full.task.generator == smoke.task.generator == "random_start"
    bench, bench_smoke = (
        maze_config.get_config("benchmark"),
        maze_config.get_config("benchmark,smoke"),
    )
    assert bench.task.generator == bench_smoke.task.generator == "from_start"
    assert bench.task.train_maze_size == 9 and bench.task.test_maze_sizes == (9, 13, 15, 21)
    # the periodic evaluation reads the validation split, never a test size
    assert tuple(bench.eval.splits) == tuple(bench_smoke.eval.splits) == ("valid",)
    assert bench.task.val_size > 0 and bench_smoke.task.val_size > 0
    assert bench_smoke.train.steps == smoke.train.steps and bench_smoke.task.train_maze_size == 5
    task = tasks.get(**bench_smoke.task.to_dict())
    assert task.config.generator == "from_start" and task.config.files_dir == ""
    assert "--config configs/mazes.py:benchmark" in maze_config.__doc__
    # The accelerator size: deep-thinking's width and data, selection on 13x13; smoke
    # still shrinks it to seconds.
    gpu, gpu_smoke = (maze_config.get_config(a) for a in ("benchmark,gpu", "benchmark,gpu,smoke"))
    assert gpu.task.generator == "from_start" and gpu.model.width == 128
    assert (gpu.task.train_size, gpu.task.val_maze_size) == (50_000, 13)
    assert gpu.train.ema_decay == 0.999 and gpu.eval.score_raw_weights  # averaged weights
    assert bench.train.ema_decay == 0.0  # the CPU figures' recipe, unchanged
    assert gpu_smoke.model.width == 8 and gpu_smoke.train.steps == smoke.train.steps
