"""Mazes: mark the path from the start to the goal of a perfect maze.

The easy-to-hard maze format. A maze of size ``S`` (odd, ``S >= 3``) has
``n = (S + 1) / 2`` cells per side, carved by a randomised depth-first search, so the
passages form a spanning tree of the ``n x n`` grid; start and goal are distinct random
cells and the target is the unique path between them. ``generator`` says where the
search starts (`deq_jax.tasks.maze_generator`): ``"from_start"`` (the default) at the
start cell, as easy-to-hard-data does, which gives longer paths; ``"random_start"`` at a
random cell, the first generator of this project. ``files_dir`` reads easy-to-hard-data's
own files instead (`deq_jax.tasks.easy_to_hard_files`).

Pixels. The maze is a ``(2n + 1) x (2n + 1)`` grid: cell ``(r, c)`` is pixel
``(2r + 1, 2c + 1)``, the passage between two neighbouring cells is the pixel between
them, everything else is wall. The grid is upscaled 2x (each pixel becomes a 2x2
block) and framed by a 1-pixel zero border, so an image is ``H = W = 2(2n + 1) + 2 =
2S + 6`` pixels a side: 24 for ``S = 9``, 32 for ``S = 13``, 72 for ``S = 33``.
Inputs are float32 ``[H, W, 3]``: walls ``(0, 0, 0)``, open ``(1, 1, 1)``, the start
green ``(0, 1, 0)``, the goal red ``(1, 0, 0)``. Targets are int32 ``[H, W]``: 1 on
the open pixels of the path (start and goal included), upscaled and framed the same way.

Storage. Each split is generated in memory from ``(seed, split)`` (a Python loop over
cells: about 0.7 s for 10,000 9x9 mazes, 0.3 s for 1,000 33x33 ones) and cached per
process as compact ``(2n + 1)^2`` grids; images are rendered per batch. Mazes are
distinct within a split; the test split of the training size holds no training maze.
The validation split ``"valid"`` (for model selection: ``val_size`` mazes of the
training size, or of ``val_maze_size``; none with ``val_size=0``) holds no training
maze and none of the test split of its size; each split draws from its own stream, so
adding it changes no other split.
Splits read from easy-to-hard files (``files_dir``) are the first ``train_size`` or
``test_size`` mazes of ``maze_data_train_{S}`` or ``maze_data_test_{S}``, and
``"valid"`` the ``val_size`` mazes after the first ``train_size`` in ``maze_data_train_{S}``,
checked to be renderings of compact grids and stored as such; their uniqueness is the
files' own.

Batches are ``{"inputs": float32 [b, H, W, 3], "targets": int32 [b, H, W], "mask":
bool [b], "index": int32 [b]}``; `maze_accuracy` scores logits ``[B, H, W, 2]`` (or
one "on path" logit ``[B, H, W]``) by pixel and by whole maze.

References:
  Schwarzschild et al., "Datasets for Studying Generalization from Easy to Hard
  Examples", arXiv:2108.06011, 2021 (the maze format).
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (train on 9x9 mazes, test on larger ones).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from deq_jax.tasks import data, easy_to_hard_files
from deq_jax.tasks.base import Task
from deq_jax.tasks.errors import DataFormatError
from deq_jax.tasks.maze_generator import (
    FROM_START,
    GOAL,
    START,
    check_generator,
    draw_maze,
    draws_per_maze,
)
from deq_jax.tasks.splits import TRAIN, VALID, HeldOutSplits, SplitSizes

_COLOURS = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 0]], np.float32)  # by code
_MAX_DRAWS_FACTOR = 20  # give up on distinct mazes after 20 * size + 1000 draws


def check_maze_size(size: int) -> int:
    """Returns ``n``, the cells per side of a size-``size`` maze.

    Raises:
      ValueError: unless ``size`` is an odd integer >= 3, naming the valid choices.
    """
    if not isinstance(size, int | np.integer) or size < 3 or size % 2 == 0:
        raise ValueError(f"Maze size must be an odd integer >= 3 (3, 5, 7, 9, ...), got {size!r}.")
    return (int(size) + 1) // 2


def image_size(size: int) -> int:
    """Side in pixels of the image of a size-``size`` maze: ``2 * size + 6``."""
    return 2 * (2 * check_maze_size(size) + 1) + 2


def render(grids: np.ndarray, paths: np.ndarray) -> dict[str, np.ndarray]:
    """Compact grids ``[N, g, g]`` to model-ready images (upscaled 2x, 1-pixel border).

    Returns:
      ``{"inputs": float32 [N, 2g + 2, 2g + 2, 3], "targets": int32 [N, 2g + 2, 2g + 2]}``.
    """
    up = lambda x: np.pad(
        x.repeat(2, axis=1).repeat(2, axis=2), [(0, 0), (1, 1), (1, 1)] + [(0, 0)] * (x.ndim - 3)
    )
    return {"inputs": up(_COLOURS[grids]), "targets": up(paths.astype(np.int32))}


@dataclasses.dataclass(frozen=True)
class MazeConfig(SplitSizes):
    """What to generate (frozen, hashable).

    Attributes:
      seed: seeds every split (independent streams per split).
      train_size: training mazes (50,000 in Anil et al. 2022).
      train_maze_size: maze size ``S`` of the training split.
      test_maze_sizes: one test split ``"test_{S}"`` per size.
      test_size: mazes per test split.
      val_size: mazes of the validation split ``"valid"`` (0: none).
      val_maze_size: maze size of ``"valid"``; 0 (the default): the training size. A
        size between the training and the test sizes makes the best checkpoint the
        one that extrapolates best, where validation at the training size (solved
        perfectly early on) cannot tell checkpoints apart.
      generator: ``"from_start"`` (easy-to-hard-data's) or ``"random_start"``; see
        `deq_jax.tasks.maze_generator`.
      files_dir: if set, the splits are read from easy-to-hard-data's maze folders
        under it (``maze_data_train_{S}``, ``maze_data_test_{S}``) instead of generated.
    """

    seed: int = 0
    train_size: int = 10_000
    train_maze_size: int = 9
    test_maze_sizes: tuple[int, ...] = (9, 11, 13, 15, 19, 25, 33)
    test_size: int = 1_000
    val_size: int = 1_000
    generator: str = FROM_START
    files_dir: str = ""
    val_maze_size: int = 0

    def __post_init__(self):
        check_generator(self.generator)
        for size in (self.train_maze_size, *self.test_maze_sizes):
            check_maze_size(size)
        if self.val_maze_size:
            check_maze_size(self.val_maze_size)
        object.__setattr__(self, "test_maze_sizes", tuple(int(s) for s in self.test_maze_sizes))
        if not self.test_maze_sizes or len(set(self.test_maze_sizes)) != len(self.test_maze_sizes):
            raise ValueError(f"test_maze_sizes must be distinct sizes, got {self.test_maze_sizes}.")
        for field in ("seed", "train_size", "test_size", "val_size"):
            value, least = getattr(self, field), 0 if field in ("seed", "val_size") else 1
            if not isinstance(value, int | np.integer) or value < least:
                raise ValueError(f"MazeConfig.{field} must be >= {least}, got {value!r}.")

    @property
    def test_splits(self) -> tuple[str, ...]:
        """``("test_9", ...)`` in the order of `test_maze_sizes`."""
        return tuple(f"test_{s}" for s in self.test_maze_sizes)

    def maze_size(self, split: str) -> int:
        """Maze size ``S`` of ``split``."""
        size = self.scale(split, self.train_maze_size)
        return (self.val_maze_size or size) if split == VALID else size


@functools.lru_cache(maxsize=32)
def generate_split(config: MazeConfig, split: str) -> dict[str, np.ndarray]:
    """Generates one split with ``config.generator``, deterministically; cached.

    Returns:
      ``{"grids": uint8 [N, 2n + 1, 2n + 1], "paths": uint8 [N, 2n + 1, 2n + 1]}``
      (read-only), distinct mazes in draw order (see `draw_maze`).

    Raises:
      ValueError: if the split asks for more distinct mazes than can be found.
    """
    maze_size, count = config.maze_size(split), config.size(split)
    n = check_maze_size(maze_size)
    kind = {TRAIN: 0, VALID: 2}.get(split, 1)
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, kind, maze_size]))
    clash = split != TRAIN and maze_size == config.train_maze_size
    seen = {g.tobytes() for g in generate_split(config, TRAIN)["grids"]} if clash else set()
    test_of_its_size = f"test_{maze_size}"
    if split == VALID and test_of_its_size in config.splits:
        seen |= {g.tobytes() for g in generate_split(config, test_of_its_size)["grids"]}
    grids, paths = [], []
    for _ in range(_MAX_DRAWS_FACTOR * count + 1000):
        if len(grids) == count:
            break
        draws = rng.random(draws_per_maze(n, config.generator)).tolist()
        grid, path = draw_maze(n, draws, generator=config.generator)
        if grid.tobytes() not in seen:
            seen.add(grid.tobytes())
            grids.append(grid)
            paths.append(path)
    if len(grids) < count:
        raise ValueError(
            f"Split {split!r}: found only {len(grids)} distinct {maze_size}x{maze_size} mazes, "
            f"not {count}; ask for fewer."
        )
    grids, paths = np.stack(grids), np.stack(paths)
    grids.flags.writeable = paths.flags.writeable = False
    return {"grids": grids, "paths": paths}


def compact(
    inputs: np.ndarray, targets: np.ndarray, what: str = "images", hint: str = ""
) -> dict[str, np.ndarray]:
    """The inverse of `render`: images ``[N, H, W, 3]`` and targets ``[N, H, W]`` to grids.

    Raises:
      DataFormatError: naming ``what`` (and ending with ``hint``, how to get good
        files) unless each image is a rendering (2x upscaled, in a zero frame, in the
        four colours) of a grid with one start and one goal.
    """
    colours = inputs[:, 1:-1:2, 1:-1:2]  # [N, g, g, 3]
    match = (colours[..., None, :] == _COLOURS).all(-1)  # [N, g, g, 4]
    if not match.any(-1).all():
        raise DataFormatError(
            f"{what}: a pixel is none of black, white, green (start), red (goal). {hint}".rstrip()
        )
    raw = {"grids": match.argmax(-1).astype(np.uint8), "paths": targets[:, 1:-1:2, 1:-1:2]}
    raw["paths"] = raw["paths"].astype(np.uint8)
    again = render(raw["grids"], raw["paths"])
    if not (np.array_equal(again["inputs"], inputs) and np.array_equal(again["targets"], targets)):
        raise DataFormatError(
            f"{what}: not a maze grid upscaled 2x in a 1-pixel zero frame. {hint}".rstrip()
        )
    for code, name in ((START, "start"), (GOAL, "goal")):
        if not ((raw["grids"] == code).sum((1, 2)) == 1).all():
            raise DataFormatError(
                f"{what}: a maze without exactly one {name} cell. {hint}".rstrip()
            )
    return raw


@functools.lru_cache(maxsize=32)
def read_split(config: MazeConfig, split: str) -> dict[str, np.ndarray]:
    """One split from easy-to-hard-data's folders under ``config.files_dir``; cached.

    Returns:
      `generate_split`'s ``{"grids", "paths"}`` (read-only) for the first
      ``config.size(split)`` mazes of the folder (of the training folder after the
      training mazes, for ``"valid"``).
    """
    maze_size, count = config.maze_size(split), config.size(split)
    in_train = split in (TRAIN, VALID)
    folder = easy_to_hard_files.maze_folder(config.files_dir, train=in_train, size=maze_size)
    start = config.train_size if split == VALID else 0
    chunks = easy_to_hard_files.maze_image_chunks(folder, count, image_size(maze_size), start=start)
    hint = easy_to_hard_files.maze_download_hint(folder)
    parts = [compact(c["inputs"], c["targets"], f"Mazes in {folder}", hint) for c in chunks]
    raw = {k: np.concatenate([p[k] for p in parts]) for k in ("grids", "paths")}
    raw["grids"].flags.writeable = raw["paths"].flags.writeable = False
    return raw


def split_grids(config: MazeConfig, split: str) -> dict[str, np.ndarray]:
    """`read_split` if ``config.files_dir`` is set, else `generate_split`."""
    return (read_split if config.files_dir else generate_split)(config, split)


def load(split: str, *, config: MazeConfig = MazeConfig()) -> dict[str, np.ndarray]:
    """One whole split, rendered (`render`): ``{"inputs": [N, H, W, 3], "targets": [N, H, W]}``."""
    raw = split_grids(config, split)
    return render(raw["grids"], raw["paths"])


class MazeRecords:
    """`generate_split`'s compact grids ``raw`` as a record source, rendered on access."""

    def __init__(self, raw: dict[str, np.ndarray]):
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw["grids"])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        rows = np.asarray(indices, np.int64)
        batch = render(self.raw["grids"][rows], self.raw["paths"][rows])
        return [{k: v[i] for k, v in batch.items()} for i in range(len(rows))]


def maze_accuracy(logits, targets, mask=None) -> dict:
    """Per-pixel and whole-maze accuracy; numpy or jax arrays, jittable.

    Args:
      logits: ``[B, H, W, 2]`` scores for (off path, on path), or ``[B, H, W]`` one
        "on path" logit (positive means on the path).
      targets: int ``[B, H, W]``, 1 on the path.
      mask: optional ``[B]`` bool, which examples count (padding is False).

    Returns:
      ``{"pixel_accuracy": mean over counted pixels, "maze_accuracy": fraction of
      counted mazes with every pixel right, "count": number of counted mazes}``.
    """
    if logits.shape == targets.shape:
        logits = jnp.stack([jnp.zeros_like(logits), logits], axis=-1)  # [B, H, W, 2]
    names = {"bit_accuracy": "pixel_accuracy", "string_accuracy": "maze_accuracy"}
    return {names.get(k, k): v for k, v in data.sequence_accuracy(logits, targets, mask).items()}


class MazeTask(HeldOutSplits, Task):
    """The maze task of ``config`` behind the uniform task interface (see `deq_jax.tasks`)."""

    name = "mazes"
    num_classes = 2
    train_split = TRAIN
    selection_metric = ("maze_accuracy", "max")  # every path pixel right

    def __init__(self, config: MazeConfig = MazeConfig()):
        self.config = config

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One training image's shape ``(H, W, 3)``, for ``model.init``."""
        return (image_size(self.config.train_maze_size),) * 2 + (3,)

    def source(self, split: str) -> MazeRecords:
        """The record source of ``split`` (generated or read once: both are cached)."""
        return MazeRecords(split_grids(self.config, split))

    @staticmethod
    def metrics(logits, targets, mask=None) -> dict:
        """``{"pixel_accuracy", "maze_accuracy", "count"}``; see `maze_accuracy`."""
        return maze_accuracy(logits, targets, mask)


def mazes(
    *,
    data_dir: str | None = None,
    seed: int = 0,
    train_size: int = 10_000,
    train_maze_size: int = 9,
    test_maze_sizes: tuple[int, ...] = (9, 11, 13, 15, 19, 25, 33),
    test_size: int = 1_000,
    val_size: int = 1_000,
    generator: str = FROM_START,
    files_dir: str = "",
    val_maze_size: int = 0,
) -> MazeTask:
    """Builds the maze task; the registry's constructor (see `MazeConfig`).

    ``data_dir`` is unused (the mazes are generated in memory, or read from
    ``files_dir``).
    """
    del data_dir  # Generated in memory or read from files_dir.
    return MazeTask(
        MazeConfig(
            seed=seed,
            train_size=train_size,
            train_maze_size=train_maze_size,
            test_maze_sizes=tuple(test_maze_sizes),
            test_size=test_size,
            val_size=val_size,
            generator=generator,
            files_dir=files_dir,
            val_maze_size=val_maze_size,
        )
    )
