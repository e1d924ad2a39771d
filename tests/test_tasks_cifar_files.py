"""Tests for CIFAR-10 read from its python batches (``tasks.get("cifar10", dir=...)``).

Each test writes a small ``cifar-10-batches-py`` directory (a few 32x32 images per
batch file, pickled as the real files are) into a temporary directory.
"""

import os
import pickle

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks import cifar_files, data, image_records

PER_BATCH, N_TEST = 6, 8


def make_batch(n, seed):
    """``{b"data": uint8 [n, 3072], b"labels": [n]}``; the channels have different means."""
    rng = np.random.default_rng(seed)
    planes = rng.integers(0, 256, (n, 3, 1024))
    planes[:, 1] //= 2
    planes[:, 2] //= 4
    labels = [int(v) for v in rng.integers(0, 10, n)]
    return {
        b"batch_label": b"x",
        b"data": planes.reshape(n, 3072).astype(np.uint8),
        b"labels": labels,
    }


def write_batch(path, batch):
    with open(path, "wb") as f:
        pickle.dump(batch, f)


def write_cifar_dir(directory, per_batch=PER_BATCH, n_test=N_TEST) -> dict:
    os.makedirs(directory, exist_ok=True)
    batches = {}
    names = (*cifar_files.TRAIN_BATCHES, cifar_files.TEST_BATCH)
    for seed, name in enumerate(names):
        batches[name] = make_batch(n_test if name == cifar_files.TEST_BATCH else per_batch, seed)
        write_batch(os.path.join(directory, name), batches[name])
    return batches


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("src") / cifar_files.SOURCE_NAME)
    return directory, write_cifar_dir(directory)


@pytest.fixture(scope="module")
def task(cifar_dir, tmp_path_factory):
    """30 training images (6 per batch file): 24 train, 6 valid; 8 test."""
    t = tasks.get(
        "cifar10", dir=cifar_dir[0], data_dir=str(tmp_path_factory.mktemp("data")), valid_size=6
    )
    t.prepare()
    return t


def test_load_cifar10_dir_converts_planes_to_hwc(cifar_dir):
    directory, batches = cifar_dir
    got = cifar_files.load_cifar10_dir(directory)
    x, y = got["train"]
    assert x.shape == (30, 32, 32, 3) and x.dtype == np.uint8 and y.shape == (30,)
    second = batches["data_batch_2"]
    raw = second[b"data"][4]  # the 5th image of the 2nd file is training image 10
    for yy, xx, c in [(0, 0, 0), (3, 17, 1), (31, 30, 2), (12, 0, 2)]:
        assert x[10, yy, xx, c] == raw[c * 1024 + yy * 32 + xx]
    assert y[10] == second[b"labels"][4]
    np.testing.assert_array_equal(got["test"][1], batches["test_batch"][b"labels"])
    assert got["test"][0].shape == (N_TEST, 32, 32, 3)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: {**b, b"data": b[b"data"][:, :3000]}, r"b'data' must be uint8 \[N, 3072\]"),
        (lambda b: {**b, b"data": b[b"data"].astype(np.int64)}, "must be uint8"),
        (lambda b: {**b, b"labels": b[b"labels"][:-1]}, "holds 6 images but 5 labels"),
        (lambda b: {**b, b"labels": [10] + b[b"labels"][1:]}, r"labels outside 0\.\.9"),
        (lambda b: {b"data": b[b"data"]}, "expected a dict with b'data' and b'labels'"),
        (lambda b: [1, 2], "expected a dict"),
    ],
)
def test_bad_batch_raises_names_the_file_and_writes_nothing(tmp_path, change, message):
    directory = str(tmp_path / "src")
    batches = write_cifar_dir(directory)
    path = os.path.join(directory, "data_batch_3")
    write_batch(path, change(batches["data_batch_3"]))
    with pytest.raises(ValueError, match=message) as error:
        cifar_files.load_cifar10_dir(directory)
    assert "data_batch_3" in str(error.value)
    task = tasks.get("cifar10", dir=directory, data_dir=str(tmp_path / "data"))
    with pytest.raises(ValueError, match=message):
        task.prepare()
    assert not (tmp_path / "data").exists()


def test_missing_directory_or_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No directory .*nowhere.*cifar-10-python\.tar"):
        cifar_files.load_cifar10_dir(str(tmp_path / "nowhere"))
    inner = tmp_path / "download" / cifar_files.SOURCE_NAME
    write_cifar_dir(str(inner))
    with pytest.raises(FileNotFoundError, match=r"no CIFAR-10 batch file data_batch_1 \(did you"):
        cifar_files.load_cifar10_dir(str(tmp_path / "download"))
    os.remove(inner / "test_batch")
    task = tasks.get("cifar10", dir=str(inner), data_dir=str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match="no CIFAR-10 batch file test_batch"):
        task.prepare()
    (inner / "test_batch").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ValueError, match="test_batch is not a CIFAR-10 python batch"):
        task.prepare()
    assert not (tmp_path / "data").exists()


def test_bad_arguments(tmp_path, cifar_dir):
    with pytest.raises(ValueError, match="with dir= the files are read"):
        tasks.get("cifar10", dir=cifar_dir[0], download=True)
    with pytest.raises(ValueError, match=r"expects 28x28 images but .* holds 32x32"):
        tasks.get("cifar10", dir=cifar_dir[0], data_dir=str(tmp_path), image_size=28).prepare()
    with pytest.raises(ValueError, match=r"expects 28x28 images but tfds' cifar10 holds 32x32"):
        tasks.get("cifar10", image_size=28)
    assert not os.listdir(tmp_path)


def test_splits_statistics_and_batches(task, cifar_dir):
    _, batches = cifar_dir
    assert task.input_shape == (32, 32, 3) and task.eval_splits == ("valid", "test")
    assert [task.num_examples(s) for s in task.splits] == [24, 6, 8]
    train, valid = task.source("train"), task.source("valid")
    every = cifar_files.load_cifar10_dir(cifar_dir[0])["train"][0]
    keep, cut = image_records.valid_cut(30, 6, 0)
    np.testing.assert_array_equal(train.images, every[keep])
    np.testing.assert_array_equal(valid.images, every[cut])
    pixels = every[keep] / 255.0
    np.testing.assert_allclose(train.mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(train.std, pixels.std(axis=(0, 1, 2)), rtol=1e-5)
    assert train.mean[0] > 1.5 * train.mean[1] > 2.5 * train.mean[2]  # per channel
    x = data.to_arrays(train)["inputs"]
    np.testing.assert_allclose(x.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
    np.testing.assert_allclose(x.std(axis=(0, 1, 2)), 1.0, rtol=1e-4)
    np.testing.assert_array_equal(task.source("test").labels, batches["test_batch"][b"labels"])


def test_training_batches_augmented_eval_batches_not(task):
    assert task.augments_training and task.augment.crop_padding == 4 and task.augment.flip
    source = task.source("train")
    batch = next(task.train_iterator(8, seed=0, start_step=3))
    assert batch["inputs"].shape == (8, 32, 32, 3) and batch["targets"].dtype == np.int32
    clean = np.stack([source[int(i)]["inputs"] for i in batch["index"]])
    assert (batch["inputs"] != clean).any(axis=(1, 2, 3)).sum() >= 6
    black = -source.mean / source.std  # the padding, in standardised pixels
    padded_rows = np.isclose(batch["inputs"], black).all(axis=(2, 3))  # [8, 32] whole rows
    assert padded_rows.any()
    halves = [
        next(task.train_iterator(8, seed=0, start_step=3, process_index=p, process_count=2))
        for p in (0, 1)
    ]
    np.testing.assert_array_equal(np.concatenate([h["inputs"] for h in halves]), batch["inputs"])
    test = task.source("test")
    for b in task.eval_iterator("test", 3):
        expected = np.stack([test[int(i)]["inputs"] for i in b["index"]])
        np.testing.assert_array_equal(b["inputs"], expected)
