"""Tests for the blurry-digits task: blur, splits, the mnist error path and metrics."""

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks import images
from deq_jax.tasks.blurry_digits import MNIST_MEAN, MNIST_STD, BlurredRecords, blur, split_name


def test_blur_known_answers():
    impulse = np.zeros((1, 9, 9, 1), np.float32)
    impulse[0, 4, 4, 0] = 1.0
    blurred = blur(impulse, 1.0)
    assert blurred.shape == impulse.shape and blurred.dtype == np.float32
    np.testing.assert_allclose(blurred.sum(), 1.0, rtol=1e-5)  # mass kept away from edges
    np.testing.assert_allclose(blurred[0, :, :, 0], blurred[0, :, :, 0].T, atol=1e-7)
    assert blurred[0, 4, 4, 0] == blurred.max() < 0.2
    np.testing.assert_array_equal(blur(impulse, 0.0), impulse)
    x = np.random.default_rng(0).random((3, 8, 8, 2)).astype(np.float32)
    np.testing.assert_allclose(blur(2.0 * x - 3.0, 1.5), 2.0 * blur(x, 1.5) - 3.0, atol=1e-5)
    np.testing.assert_allclose(blur(np.full((1, 5, 5, 1), 7.0), 2.0), 7.0, rtol=1e-6)
    channels = blur(x, 1.0)  # channels are blurred independently
    np.testing.assert_allclose(channels[..., 1:], blur(x[..., 1:], 1.0), atol=1e-6)


def test_digits_splits_blur_levels_and_shapes():
    task = tasks.get("blurry_digits", data_dir="/unused", test_sigmas=(0.0, 0.5, 1.0, 2.5))
    assert task.name == "blurry_digits" and task.num_classes == 10
    assert task.input_shape == (8, 8, 1)
    assert task.eval_splits == ("test_sigma0", "test_sigma0.5", "test_sigma1", "test_sigma2.5")
    assert task.splits[:2] == ("train", "valid") and split_name(1.5) == "test_sigma1.5"
    assert task.validation_split == "valid"
    plain = images.load_digits(0)
    np.testing.assert_array_equal(task.source("test_sigma0")["inputs"], plain["test"]["inputs"])
    np.testing.assert_array_equal(task.source("test_sigma1")["targets"], plain["test"]["targets"])
    np.testing.assert_allclose(
        task.source("train")["inputs"], blur(plain["train"]["inputs"], 0.5), atol=1e-6
    )
    np.testing.assert_allclose(  # validation images blurred as the training ones
        task.source("valid")["inputs"], blur(plain["valid"]["inputs"], 0.5), atol=1e-6
    )
    assert task.num_examples("train") == 1257 and task.num_examples("test_sigma2.5") == 360
    assert tasks.get("blurry_digits", valid_size=0).validation_split is None
    with pytest.raises(ValueError, match="no validation split.*valid_size=0"):
        tasks.get("blurry_digits", source="mnist", valid_size=10)
    contrast = [task.source(s)["inputs"].std(axis=(1, 2, 3)).mean() for s in task.eval_splits]
    assert all(a > b for a, b in zip(contrast, contrast[1:], strict=False))  # blurrier, flatter


def test_digits_iterators_and_metrics():
    task = tasks.get("blurry_digits", train_sigma=1.0, test_sigmas=(1.0, 2.0))
    task.prepare()
    iterator = task.train_iterator(64, seed=1)
    stream = [next(iterator) for _ in range(3)]
    batch = stream[0]
    assert batch["inputs"].shape == (64, 8, 8, 1) and batch["inputs"].dtype == np.float32
    resumed = next(task.train_iterator(64, seed=1, start_step=2))
    np.testing.assert_array_equal(resumed["inputs"], stream[2]["inputs"])
    assert task.steps_per_epoch(64) == 1257 // 64
    batches = list(task.eval_iterator("test_sigma2", 100))
    assert len(batches) == 4 and int(sum(b["mask"].sum() for b in batches)) == 360
    targets = batches[-1]["targets"]
    logits = np.eye(10, dtype=np.float32)[targets]
    logits[:30] = np.roll(logits[:30], 1, axis=1)  # 30 wrong, 60 of 100 rows are real
    m = task.metrics(logits, targets, batches[-1]["mask"])
    np.testing.assert_allclose(m["accuracy"], 30 / 60)
    assert float(m["count"]) == 60.0


class _FakeSource:
    """Stands in for a tfds data source: random access to mnist-like records."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]

    def __getitems__(self, indices):
        return [self.records[i] for i in indices]


def test_blurred_records_scale_blur_and_standardise():
    image = np.zeros((28, 28, 1), np.uint8)
    image[10:18, 10:18] = 255
    source = _FakeSource(
        [{"image": image, "label": 7}, {"image": np.full_like(image, 255), "label": 1}]
    )
    records = BlurredRecords(source, 1.0, MNIST_MEAN, MNIST_STD)
    assert len(records) == 2
    first = records[0]
    assert first["inputs"].shape == (28, 28, 1) and int(first["targets"]) == 7
    expected = (blur(image[None] / 255.0, 1.0)[0] - MNIST_MEAN) / MNIST_STD
    np.testing.assert_allclose(first["inputs"], expected, rtol=1e-6)
    both = records.__getitems__([1, 0])
    np.testing.assert_allclose(both[0]["inputs"], (1.0 - MNIST_MEAN) / MNIST_STD, rtol=1e-5)
    np.testing.assert_array_equal(both[1]["inputs"], first["inputs"])


def test_mnist_missing_fails_with_a_clear_message(tmp_path):
    task = tasks.get("blurry_digits", source="mnist", data_dir=str(tmp_path))
    assert task.input_shape == (28, 28, 1)
    with pytest.raises(FileNotFoundError, match="mnist is not prepared under .*tfds build mnist"):
        task.prepare()
    with pytest.raises(FileNotFoundError, match="source='digits'"):
        task.num_examples("test_sigma1")


def test_bad_input():
    with pytest.raises(ValueError, match="Valid sources: digits, mnist"):
        tasks.get("blurry_digits", source="cifar10")
    with pytest.raises(ValueError, match=">= 0"):
        tasks.get("blurry_digits", train_sigma=-1.0)
    with pytest.raises(ValueError, match="non-empty"):
        tasks.get("blurry_digits", test_sigmas=())
    with pytest.raises(ValueError, match="distinct"):
        tasks.get("blurry_digits", test_sigmas=(1, 1.0))
    task = tasks.get("blurry_digits")
    with pytest.raises(ValueError, match="Valid splits: train, valid, test_sigma0.5, test_sigma1"):
        task.source("test")
    with pytest.raises(ValueError, match="logits"):
        task.metrics(np.zeros((4, 10)), np.zeros((4, 1), np.int32))
    with pytest.raises(ValueError, match="Valid keywords"):
        tasks.get("blurry_digits", sigma=1.0)
