"""Tests for the prefix-sum task: generation in memory and the task interface."""

import sys

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks.prefix_sum import (
    PrefixSumConfig,
    cumulative_parity,
    generate_split,
    load,
    random_strings,
)

# The module that draws the strings (its sampling switch is patched below).
strings_module = sys.modules[random_strings.__module__]

SMALL = {"train_size": 200, "train_length": 12, "test_lengths": (8, 12, 40), "test_size": 50}


def _rows(bits):
    return {row.tobytes() for row in bits}


def test_cumulative_parity_matches_direct_computation():
    bits = np.random.default_rng(0).integers(0, 2, size=(7, 33), dtype=np.uint8)
    expected = np.zeros_like(bits)
    for b in range(bits.shape[0]):
        running = 0
        for i in range(bits.shape[1]):
            running ^= int(bits[b, i])
            expected[b, i] = running
    np.testing.assert_array_equal(cumulative_parity(bits), expected)
    assert cumulative_parity(bits).dtype == np.uint8


@pytest.mark.parametrize("length", [10, 32])  # exact sampling and rejection sampling
def test_random_strings_distinct_and_avoid_exclude(length):
    rng = np.random.default_rng(0)
    exclude = random_strings(length, 300, rng)
    drawn = random_strings(length, 600, rng, exclude=exclude)
    assert drawn.shape == (600, length) and drawn.dtype == np.uint8
    assert set(np.unique(drawn)) <= {0, 1}
    assert len(_rows(drawn)) == 600
    assert not _rows(drawn) & _rows(exclude)


@pytest.mark.parametrize("enumerate_max_length", [20, 0])  # exact / rejection sampling
def test_random_strings_exhausts_small_spaces_and_refuses_more(monkeypatch, enumerate_max_length):
    monkeypatch.setattr(strings_module, "_ENUMERATE_MAX_LENGTH", enumerate_max_length)
    rng = np.random.default_rng(0)
    every = random_strings(4, 16, rng)
    assert len(_rows(every)) == 16
    half = random_strings(4, 8, rng, exclude=every[:8])
    assert _rows(half) == _rows(every[8:])
    with pytest.raises(ValueError, match="available"):
        random_strings(4, 1, rng, exclude=every)
    with pytest.raises(ValueError, match="length"):
        random_strings(0, 1, rng)
    with pytest.raises(ValueError, match="exclude"):
        random_strings(8, 1, rng, exclude=np.zeros((2, 7), np.uint8))


def test_default_config_matches_the_papers():
    config = PrefixSumConfig()
    assert (config.train_size, config.train_length) == (10_000, 32)
    assert config.splits == tuple(
        ["train", "valid"] + [f"test_{n}" for n in (16, 32, 48, 64, 128, 256, 512)]
    )
    train = generate_split(config, "train")["inputs"]
    assert train.shape == (10_000, 32) and len(_rows(train)) == 10_000
    test = generate_split(config, "test_32")["inputs"]
    assert len(_rows(test)) == 10_000 and not _rows(test) & _rows(train)


def test_generation_is_deterministic_in_seed():
    config = PrefixSumConfig(**SMALL)
    for split in config.splits:
        a, b = generate_split(config, split), generate_split(PrefixSumConfig(**SMALL), split)
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        other = generate_split(PrefixSumConfig(seed=1, **SMALL), split)
        assert not np.array_equal(a["inputs"], other["inputs"])


def test_splits_have_right_shapes_unique_strings_and_parity_targets():
    config = PrefixSumConfig(**SMALL)
    train = generate_split(config, "train")["inputs"]
    for split, (size, length) in {
        "train": (200, 12),
        "test_8": (50, 8),
        "test_12": (50, 12),
        "test_40": (50, 40),
    }.items():
        arrays = generate_split(config, split)
        assert arrays["inputs"].shape == arrays["targets"].shape == (size, length)
        assert len(_rows(arrays["inputs"])) == size
        np.testing.assert_array_equal(
            arrays["targets"], np.cumsum(arrays["inputs"].astype(int), axis=1) % 2
        )
    assert not _rows(generate_split(config, "test_12")["inputs"]) & _rows(train)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"train_size": 5000, "train_length": 12}, "train"),
        ({"train_length": 4, "train_size": 16, "test_lengths": (4,)}, "test_4"),
        ({"test_lengths": (16, 0)}, "test_lengths"),
        ({"test_lengths": (16, 16)}, "distinct"),
        ({"test_lengths": ()}, "test_lengths"),
        ({"train_size": 0}, "train_size"),
        ({"seed": -1}, "seed"),
    ],
)
def test_config_bad_values_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrefixSumConfig(**kwargs)


def test_validation_split_is_new_strings_of_the_training_length():
    config = PrefixSumConfig(**SMALL, val_size=300)
    valid = generate_split(config, "valid")
    assert valid["inputs"].shape == (300, 12) and len(_rows(valid["inputs"])) == 300
    np.testing.assert_array_equal(valid["targets"], cumulative_parity(valid["inputs"]))
    for other in ("train", "test_12"):  # the splits of its length
        assert not _rows(valid["inputs"]) & _rows(generate_split(config, other)["inputs"])
    # Its own stream: with or without it, every other split draws the same strings.
    without = PrefixSumConfig(**SMALL, val_size=0)
    assert "valid" not in without.splits
    for split in without.splits:
        np.testing.assert_array_equal(
            generate_split(without, split)["inputs"], generate_split(config, split)["inputs"]
        )
    task = tasks.get("prefix_sum", **SMALL, val_size=300)
    assert task.validation_split == "valid" and task.eval_splits == ("test_8", "test_12", "test_40")
    assert task.splits == ("train", "valid", "test_8", "test_12", "test_40")
    assert tasks.get("prefix_sum", **SMALL, val_size=0).validation_split is None


def test_validation_split_larger_than_the_strings_left_says_what_to_lower():
    # 2**8 = 256 strings: 200 train, 50 test_8, 6 left.
    small = {"train_size": 200, "train_length": 8, "test_lengths": (8,), "test_size": 50}
    assert PrefixSumConfig(**small, val_size=6).size("valid") == 6
    with pytest.raises(ValueError, match="only 6 exist besides the training and test.*val_size"):
        PrefixSumConfig(**small, val_size=7)


def test_unknown_split_lists_valid_splits():
    config = PrefixSumConfig(**SMALL)
    with pytest.raises(ValueError, match="Valid splits: train, valid, test_8, test_12, test_40"):
        generate_split(config, "test_16")
    with pytest.raises(ValueError, match="Valid splits"):
        load("validation", config=config)


def test_load_gives_model_ready_arrays_of_the_cached_read_only_strings():
    config = PrefixSumConfig(**SMALL)
    for split in config.splits:
        expected = generate_split(config, split)
        assert generate_split(config, split) is expected  # cached
        assert not expected["inputs"].flags.writeable
        arrays = load(split, config=config)
        assert arrays["inputs"].shape == (config.size(split), config.length(split), 1)
        assert arrays["inputs"].dtype == np.float32 and arrays["targets"].dtype == np.int32
        np.testing.assert_array_equal(arrays["inputs"][..., 0], expected["inputs"])
        np.testing.assert_array_equal(arrays["targets"], expected["targets"])


def test_registry_builds_task_and_rejects_unknowns():
    assert "prefix_sum" in tasks.names()
    task = tasks.get("prefix_sum", **SMALL)
    assert task.name == "prefix_sum" and task.num_classes == 2
    assert task.input_shape == (12, 1)
    assert task.train_split == "train"
    assert task.eval_splits == ("test_8", "test_12", "test_40")
    assert task.splits == ("train", "valid") + task.eval_splits
    assert task.num_examples("test_40") == 50 and task.steps_per_epoch(64) == 3
    with pytest.raises(ValueError, match="prefix_sum"):
        tasks.get("prefix_sums")
    with pytest.raises(ValueError, match="train_length"):
        tasks.get("prefix_sum", train_len=32)


def test_task_iterators_and_metrics():
    task = tasks.get("prefix_sum", **SMALL)
    it = task.train_iterator(64, seed=5, start_step=4)
    batch = next(it)
    assert batch["inputs"].shape == (64, 12, 1) and batch["targets"].shape == (64, 12)
    full = task.train_iterator(64, seed=5)
    for _ in range(4):
        next(full)
    np.testing.assert_array_equal(next(full)["index"], batch["index"])
    metrics = []
    seen = []
    for b in task.eval_iterator("test_40", 16):
        logits = np.eye(2, dtype=np.float32)[b["targets"]]  # [b, L, 2], perfect
        metrics.append(task.metrics(logits, b["targets"], b["mask"]))
        seen.extend(b["index"][b["mask"]].tolist())
    assert seen == list(range(50))
    merged = tasks.data.weighted_mean(metrics)
    assert merged == {"count": 50.0, "bit_accuracy": 1.0, "string_accuracy": 1.0}
    with pytest.raises(ValueError, match="Valid splits"):
        task.eval_iterator("test_16", 16)


def test_prepare_generates_in_memory_writing_and_printing_nothing(tmp_path, capfd):
    task = tasks.get("prefix_sum", data_dir=str(tmp_path), **SMALL)
    task.prepare()
    assert capfd.readouterr().out == "" and not list(tmp_path.iterdir())
    np.testing.assert_array_equal(
        task.source("train")["targets"], generate_split(task.config, "train")["targets"]
    )
