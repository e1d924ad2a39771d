"""Prefix sums: map a bit string to the parity of every prefix.

Input ``x`` is a random bit string of length ``L``; the target at position ``i`` is
``(x_0 + ... + x_i) mod 2``. Models train on 32-bit strings and are tested on longer
ones (16 to 512 bits), where extrapolation needs more test-time iterations.

The data are generated deterministically from `PrefixSumConfig` (numpy only), in
memory and once per process (0.5 s for the nine splits of the default config on a
2-core CPU); nothing is written to disk. Splits are ``"train"``, the
validation split ``"valid"`` (``val_size`` strings of the training length, for model
selection; none with ``val_size=0``) and ``"test_{L}"`` for each test length.

Uniqueness and overlap: the strings within each split are unique. The test split whose
length equals ``train_length`` contains no training string, and ``"valid"`` holds neither
a training string nor one of that test split; test splits of other lengths cannot
overlap the training strings. Adding or resizing ``"valid"`` leaves the training and
test strings as they were (each split draws from its own stream). Test strings of one
length are drawn independently of those of any other length. A split asks for at most
as many strings as exist (``2**L``, less the strings taken at ``train_length``);
otherwise the config raises.

easy-to-hard files. With ``files_dir`` set, the splits are read from easy-to-hard-data's
prefix-sum files there instead (``{L}_data.npy`` and ``{L}_targets.npy``, see
`deq_jax.tasks.easy_to_hard_files`): ``"train"`` is the first ``train_size`` strings of
the ``train_length`` files, ``"test_{L}"`` the first ``test_size`` of the ``L`` files, or,
at ``L = train_length``, the ``test_size`` strings after the training ones, and
``"valid"`` the ``val_size`` strings after those (so no test or validation string is a
training row; the files' own strings are unique per length when generated
by ``make_prefixsums.py`` below 24 bits, and drawn at random above). Targets are checked
to be the prefix parities of the inputs.

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (10,000 unique 32-bit training strings).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from deq_jax.tasks import data, easy_to_hard_files
from deq_jax.tasks.base import Task
from deq_jax.tasks.bit_strings import cumulative_parity, random_strings
from deq_jax.tasks.errors import DataFormatError
from deq_jax.tasks.splits import TRAIN, VALID, HeldOutSplits, SplitSizes


def _test_split(length: int) -> str:
    return f"test_{length}"


@dataclasses.dataclass(frozen=True)
class PrefixSumConfig(SplitSizes):
    """What to generate. Hashable: it keys the cache of `generate_split`.

    Attributes:
      seed: seeds every split (train and test draws use independent streams).
      train_size: number of unique training strings.
      train_length: bits per training string.
      test_lengths: one test split ``"test_{L}"`` per length.
      test_size: strings per test split.
      val_size: strings of the validation split ``"valid"`` (``train_length`` bits,
        disjoint from the training strings and from the test split of that length);
        0: no validation split.
    """

    seed: int = 0
    train_size: int = 10_000
    train_length: int = 32
    test_lengths: tuple[int, ...] = (16, 32, 48, 64, 128, 256, 512)
    test_size: int = 10_000
    val_size: int = 1_000

    def __post_init__(self):
        object.__setattr__(self, "test_lengths", tuple(int(n) for n in self.test_lengths))
        for field in ("seed", "train_size", "train_length", "test_size", "val_size"):
            value = getattr(self, field)
            least = 0 if field in ("seed", "val_size") else 1
            if not isinstance(value, int | np.integer) or value < least:
                raise ValueError(f"PrefixSumConfig.{field} must be >= {least}, got {value!r}.")
        if not self.test_lengths or min(self.test_lengths) < 1:
            raise ValueError(f"test_lengths must be positive lengths, got {self.test_lengths}.")
        if len(set(self.test_lengths)) != len(self.test_lengths):
            raise ValueError(f"test_lengths must be distinct, got {self.test_lengths}.")
        for split in sorted(self.splits, key=lambda s: s == VALID):  # "valid" last
            length, size = self.length(split), self.size(split)
            taken = self.train_size if split != TRAIN and length == self.train_length else 0
            if split == VALID and self.train_length in self.test_lengths:
                taken += self.test_size
            if size > 2**length - taken:
                besides = "training and test strings" if split == VALID else "training strings"
                hint = "; lower val_size (0: no validation split)" if split == VALID else ""
                raise ValueError(
                    f"Split {split!r} asks for {size} unique {length}-bit strings but only "
                    f"{2**length - taken} exist besides the {besides}{hint}."
                )

    @property
    def test_splits(self) -> tuple[str, ...]:
        """``("test_16", ...)`` in the order of `test_lengths`."""
        return tuple(_test_split(n) for n in self.test_lengths)

    def length(self, split: str) -> int:
        """Bits per string in ``split``."""
        return self.scale(split, self.train_length)


@functools.lru_cache(maxsize=32)
def generate_split(config: PrefixSumConfig, split: str) -> dict[str, np.ndarray]:
    """Generates one split: ``{"inputs": uint8 [N, L], "targets": uint8 [N, L]}``,
    read-only; cached (the validation and test splits exclude the training strings)."""
    length, size = config.length(split), config.size(split)
    kind = {TRAIN: 0, VALID: 2}.get(split, 1)
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, kind, length]))
    exclude = None
    if split != TRAIN and length == config.train_length:
        exclude = generate_split(config, TRAIN)["inputs"]
    test_at_train_length = _test_split(config.train_length)
    if split == VALID and test_at_train_length in config.splits:
        exclude = np.concatenate([exclude, generate_split(config, test_at_train_length)["inputs"]])
    inputs = random_strings(length, size, rng, exclude=exclude)
    arrays = {"inputs": inputs, "targets": cumulative_parity(inputs)}
    for array in arrays.values():
        array.flags.writeable = False  # shared by every caller of the cache
    return arrays


def read_split(config: PrefixSumConfig, split: str, files_dir: str) -> dict[str, np.ndarray]:
    """One split from easy-to-hard-data's files in ``files_dir``, as `load` returns it.

    Raises:
      DataFormatError: naming the targets file if its targets are not the prefix
        parities of the inputs (or the file whose shape, length or values are off).
      DataNotFoundError: naming a missing file.
    """
    length, count = config.length(split), config.size(split)
    start = config.train_size if split != TRAIN and length == config.train_length else 0
    if split == VALID and config.train_length in config.test_lengths:
        start += config.test_size
    raw = easy_to_hard_files.read_prefix_sum_files(files_dir, length, start=start, count=count)
    if not np.array_equal(raw["targets"], cumulative_parity(raw["inputs"])):
        raise DataFormatError(
            f"{files_dir}/{length}_targets.npy: the targets are not the prefix parities of "
            f"{length}_data.npy (rows {start} to {start + count - 1}). "
            + easy_to_hard_files.PREFIX_SUMS_DOWNLOAD
        )
    return {
        "inputs": raw["inputs"][..., None].astype(np.float32),  # [N, L, 1]
        "targets": raw["targets"].astype(np.int32),  # [N, L]
    }


def load(split: str, *, config: PrefixSumConfig = PrefixSumConfig()) -> dict[str, np.ndarray]:
    """One split as model-ready arrays (`generate_split`'s strings).

    Returns:
      ``{"inputs": float32 [N, L, 1] (bits as 0./1.), "targets": int32 [N, L]}``, in
      generation order.
    """
    config.check_split(split)
    raw = generate_split(config, split)
    return {
        "inputs": raw["inputs"][..., None].astype(np.float32),  # [N, L, 1]
        "targets": raw["targets"].astype(np.int32),  # [N, L]
    }


class PrefixSumTask(HeldOutSplits, Task):
    """The prefix-sum task behind the uniform task interface (see `deq_jax.tasks`).

    Args:
      config: what to generate (or, with ``files_dir``, which rows to read).
      files_dir: if set, read easy-to-hard-data's ``.npy`` files there (`read_split`).
    """

    name = "prefix_sum"
    num_classes = 2
    train_split = TRAIN
    selection_metric = ("string_accuracy", "max")  # the whole-string accuracy

    def __init__(
        self,
        config: PrefixSumConfig = PrefixSumConfig(),
        *,
        files_dir: str = "",
    ):
        self.config = config
        self.files_dir = files_dir
        self._arrays: dict[str, dict[str, np.ndarray]] = {}

    @property
    def input_shape(self) -> tuple[int, int]:
        """One training example's input shape, ``(train_length, 1)``, for ``model.init``."""
        return (self.config.train_length, 1)

    def num_examples(self, split: str) -> int:
        """Number of strings in ``split``."""
        return self.config.size(split)

    def source(self, split: str) -> dict[str, np.ndarray]:
        """The arrays of ``split`` (see `arrays`)."""
        return self.arrays(split)

    def arrays(self, split: str) -> dict[str, np.ndarray]:
        """The model-ready arrays of ``split`` (`load`, or `read_split` with
        ``files_dir``), made once and cached."""
        if split not in self._arrays:
            if self.files_dir:
                self._arrays[split] = read_split(self.config, split, self.files_dir)
            else:
                self._arrays[split] = load(split, config=self.config)
        return self._arrays[split]

    @staticmethod
    def metrics(logits, targets, mask=None) -> dict:
        """``bit_accuracy``, ``string_accuracy`` (all bits right) and ``count``.

        See `deq_jax.tasks.data.sequence_accuracy`; logits are ``[B, L, 2]``.
        """
        return data.sequence_accuracy(logits, targets, mask)


def prefix_sum(
    *,
    data_dir: str | None = None,
    seed: int = 0,
    train_size: int = 10_000,
    train_length: int = 32,
    test_lengths: tuple[int, ...] = (16, 32, 48, 64, 128, 256, 512),
    test_size: int = 10_000,
    val_size: int = 1_000,
    files_dir: str = "",
) -> PrefixSumTask:
    """Builds the prefix-sum task; the registry's constructor (see `PrefixSumConfig`).

    ``files_dir``: read easy-to-hard-data's ``.npy`` files there instead of generating.
    ``data_dir`` is unused (the strings are generated in memory, or read from
    ``files_dir``).
    """
    del data_dir  # Generated in memory or read from files_dir.
    config = PrefixSumConfig(
        seed=seed,
        train_size=train_size,
        train_length=train_length,
        test_lengths=tuple(test_lengths),
        test_size=test_size,
        val_size=val_size,
    )
    return PrefixSumTask(config, files_dir=files_dir)
