"""Tests for the synthetic 1-D regression task."""

import sys

import jax
import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks import data
from deq_jax.tasks.synthetic_1d import (
    Synthetic1DConfig,
    generate,
    mean_squared_error,
    target_function,
)

synthetic_module = sys.modules[generate.__module__]


def test_target_function_known_values():
    np.testing.assert_allclose(target_function(np.array(0.0)), -3.0)
    expected = 1.5 + 1.0 - 5.0 + 2.0 * np.sin(1.0) - 3.0
    np.testing.assert_allclose(target_function(np.array(1.0)), expected)


def test_paper_sizes_noise_and_range():
    arrays = generate(Synthetic1DConfig())
    train, val = arrays["train"], arrays["validation"]
    assert train["inputs"].shape == (4096, 1) and val["inputs"].shape == (1000, 1)
    assert train["targets"].shape == (4096, 1) and val["targets"].shape == (1000, 1)
    assert train["inputs"].dtype == np.float32 and train["targets"].dtype == np.float32
    x = np.concatenate([train["inputs"], val["inputs"]])
    y = np.concatenate([train["targets"], val["targets"]])
    assert x.min() >= -2.0 and x.max() <= 2.0 and x.min() < -1.99 and x.max() > 1.99
    noise = y - target_function(x.astype(np.float64))
    assert abs(noise.mean()) < 0.005
    np.testing.assert_allclose(noise.std(), 0.05, rtol=0.05)


def test_deterministic_from_seed_and_train_stable_under_validation_size():
    a, b = generate(Synthetic1DConfig(seed=3)), generate(Synthetic1DConfig(seed=3))
    for split in ("train", "validation"):
        np.testing.assert_array_equal(a[split]["inputs"], b[split]["inputs"])
        np.testing.assert_array_equal(a[split]["targets"], b[split]["targets"])
    other = generate(Synthetic1DConfig(seed=4))
    assert not np.array_equal(a["train"]["inputs"], other["train"]["inputs"])
    smaller = generate(Synthetic1DConfig(seed=3, validation_size=10))
    np.testing.assert_array_equal(a["train"]["inputs"], smaller["train"]["inputs"])


def test_noise_free_targets_are_exact():
    arrays = generate(Synthetic1DConfig(noise_std=0.0, train_size=50, validation_size=5))
    x = arrays["train"]["inputs"].astype(np.float64)
    np.testing.assert_allclose(arrays["train"]["targets"], target_function(x), rtol=1e-6)


def test_task_interface():
    task = tasks.get("synthetic_1d", data_dir="/unused", train_size=100, validation_size=30)
    assert "synthetic_1d" in tasks.names()
    assert task.name == "synthetic_1d" and task.input_shape == (1,)
    assert task.splits == ("train", "validation") and task.eval_splits == ("validation",)
    task.prepare()
    assert task.num_examples("train") == 100 and task.num_examples("validation") == 30
    assert task.steps_per_epoch(32) == 3
    batch = next(task.train_iterator(32, seed=0))
    assert batch["inputs"].shape == (32, 1) and batch["targets"].shape == (32, 1)
    assert batch["mask"].shape == (32,) and batch["mask"].all()
    resumed = task.train_iterator(32, seed=0, start_step=4)
    it = task.train_iterator(32, seed=0)
    for _ in range(4):
        next(it)
    np.testing.assert_array_equal(next(it)["index"], next(resumed)["index"])
    batches = list(task.eval_iterator("validation", 16))
    assert len(batches) == 2 and batches[-1]["mask"].sum() == 14
    seen = np.concatenate([b["index"][b["mask"]] for b in batches])
    np.testing.assert_array_equal(seen, np.arange(30))


def test_metrics_mse_with_mask_and_jit():
    preds = np.array([[1.0], [2.0], [5.0]], np.float32)
    targets = np.array([[0.0], [0.0], [0.0]], np.float32)
    m = mean_squared_error(preds, targets, np.array([True, True, False]))
    np.testing.assert_allclose(m["mse"], 2.5)
    assert float(m["count"]) == 2.0
    jitted = jax.jit(tasks.get("synthetic_1d").metrics)(preds, targets, np.ones(3, bool))
    np.testing.assert_allclose(jitted["mse"], 10.0)
    combined = data.weighted_mean([m, {"mse": 4.0, "count": 2.0}])
    np.testing.assert_allclose(combined["mse"], 3.25)


def test_bad_input():
    task = tasks.get("synthetic_1d")
    with pytest.raises(ValueError, match="train, validation"):
        task.num_examples("test")
    with pytest.raises(ValueError, match="train, validation"):
        task.eval_iterator("test", 8)
    with pytest.raises(ValueError, match="x_range"):
        Synthetic1DConfig(x_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="noise_std"):
        Synthetic1DConfig(noise_std=-1.0)
    with pytest.raises(ValueError, match="train_size"):
        Synthetic1DConfig(train_size=0)
    with pytest.raises(ValueError, match="Valid keywords"):
        tasks.get("synthetic_1d", size=3)
    with pytest.raises(ValueError, match="equal shapes"):
        mean_squared_error(np.zeros((3, 1)), np.zeros((3,)))


def test_module_is_importable_by_name():
    assert synthetic_module.SPLITS == ("train", "validation")
