"""Tests for the MNIST-format tasks: the idx reader, the records, splits and augmentation.

Every test writes its own small idx files (a few dozen 8x8 or 28x28 images) into a
temporary directory; none needs the real Fashion-MNIST files.
"""

import gzip
import os
from unittest import mock

import numpy as np
import pytest

import deq_jax.tasks as tasks
from deq_jax.tasks import data, idx_files, image_augment, image_records

N_TRAIN, N_TEST = 40, 12


def idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """``array`` (uint8, 3-D images or 1-D labels) in the idx format."""
    magic = magic if magic is not None else (0x803 if array.ndim == 3 else 0x801)
    dims = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return magic.to_bytes(4, "big") + dims + np.asarray(array, np.uint8).tobytes()


def write(path, payload: bytes) -> str:
    path = str(path)
    with gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb") as f:
        f.write(payload)
    return path


def make_arrays(size=8, n_train=N_TRAIN, n_test=N_TEST, seed=0):
    """Distinct images whose brightness grows with their index; labels ``i % 10``."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        base = np.linspace(0, 200, n)[:, None, None]
        noise = rng.integers(0, 50, (n, size, size))
        out[split] = ((base + noise).astype(np.uint8), (np.arange(n) % 10).astype(np.uint8))
    return out


def write_dir(directory, arrays=None, gz=True, **kwargs) -> dict:
    """Writes the four idx files of ``arrays`` (default `make_arrays`) into ``directory``."""
    arrays = arrays if arrays is not None else make_arrays(**kwargs)
    os.makedirs(directory, exist_ok=True)
    ext = ".gz" if gz else ""
    for split, (images_name, labels_name) in idx_files.IDX_FILES.items():
        write(os.path.join(directory, images_name + ext), idx_bytes(arrays[split][0]))
        write(os.path.join(directory, labels_name + ext), idx_bytes(arrays[split][1]))
    return arrays


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("idx"))
    return directory, write_dir(directory)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def task(idx_dir, data_dir):
    """A prepared task: 30 train, 10 valid, 12 test 8x8 images."""
    t = tasks.get(
        "fashion_mnist",
        dir=idx_dir[0],
        data_dir=data_dir,
        valid_size=10,
        crop_padding=2,
        flip=True,
    )
    t.prepare()
    return t


def rows(images: np.ndarray) -> list[bytes]:
    return [image.tobytes() for image in images]


# The reader.


@pytest.mark.parametrize("name", ["images.idx3", "images.idx3.gz"])
def test_read_idx_round_trip(tmp_path, name):
    images = np.random.default_rng(0).integers(0, 256, (5, 3, 4)).astype(np.uint8)
    labels = np.array([0, 9, 3, 3, 1], np.uint8)
    got = idx_files.read_idx(write(tmp_path / name, idx_bytes(images)))
    np.testing.assert_array_equal(got, images)
    assert got.dtype == np.uint8 and got.shape == (5, 3, 4)
    np.testing.assert_array_equal(
        idx_files.read_idx(write(tmp_path / f"l{name}", idx_bytes(labels))), labels
    )
    magic, dims = idx_files.read_idx_header(str(tmp_path / name))
    assert magic == idx_files.IMAGES_MAGIC and dims == (5, 3, 4)


GOOD = idx_bytes(np.zeros((2, 3, 3), np.uint8))


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\x00\x00\x08\x02" + GOOD[4:], r"magic number 0x00000802, expected 0x00000803"),
        (b"\x00\x00\x0d\x03" + GOOD[4:], r"magic number 0x00000d03"),
        (GOOD[:-1], r"truncated: its header announces 2x3x3 = 18 bytes of data, the file holds 17"),
        (GOOD[:10], r"truncated: 10 bytes, shorter than its 16-byte header"),
        (GOOD[:2], r"truncated: 2 bytes"),
        (GOOD + b"\x00\x00", r"2 trailing bytes after the 2x3x3 = 18 bytes"),
    ],
)
@pytest.mark.parametrize("name", ["bad-idx3-ubyte", "bad-idx3-ubyte.gz"])
def test_read_idx_errors_name_the_file(tmp_path, payload, message, name):
    path = write(tmp_path / name, payload)
    with pytest.raises(ValueError, match=message) as error:
        idx_files.read_idx(path)
    assert path in str(error.value)


def test_read_idx_damaged_gzip(tmp_path):
    path = str(tmp_path / "x.gz")
    with open(path, "wb") as f:
        f.write(gzip.compress(GOOD)[:-12])  # cut the stream short
    with pytest.raises(ValueError, match=r"x\.gz is not a complete gzip file"):
        idx_files.read_idx(path)


def test_load_idx_dir_raw_gz_and_mixed(tmp_path):
    arrays = write_dir(tmp_path / "gz", gz=True)
    write_dir(tmp_path / "raw", arrays, gz=False)
    for directory in ("gz", "raw"):
        got = idx_files.load_idx_dir(str(tmp_path / directory))
        assert set(got) == {"train", "test"}
        for split in got:
            np.testing.assert_array_equal(got[split][0], arrays[split][0])
            np.testing.assert_array_equal(got[split][1], arrays[split][1])
    # A raw file wins over its .gz twin.
    os.rename(tmp_path / "gz" / "t10k-labels-idx1-ubyte.gz", tmp_path / "raw" / "keep.gz")
    write(tmp_path / "raw" / "t10k-labels-idx1-ubyte.gz", b"not gzip")
    got = idx_files.load_idx_dir(str(tmp_path / "raw"))
    np.testing.assert_array_equal(got["test"][1], arrays["test"][1])
    assert idx_files.idx_image_shape(str(tmp_path / "raw")) == (8, 8)


def test_load_idx_dir_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="No directory .*nowhere") as error:
        idx_files.load_idx_dir(str(tmp_path / "nowhere"))
    assert "apt-get" not in str(error.value)
    default = str(tmp_path / "fashion-mnist")
    monkeypatch.setattr(idx_files, "DEFAULT_FASHION_MNIST_DIR", default)
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        idx_files.load_idx_dir(default)

    arrays = write_dir(tmp_path / "d")
    os.remove(tmp_path / "d" / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(FileNotFoundError, match=r"no t10k-images-idx3-ubyte \(nor .*\.gz\)"):
        idx_files.load_idx_dir(str(tmp_path / "d"))

    write_dir(tmp_path / "d", arrays)
    write(tmp_path / "d" / "train-labels-idx1-ubyte.gz", idx_bytes(arrays["train"][1][:-1]))
    with pytest.raises(ValueError, match="holds 40 images but .*train-labels.* holds 39 labels"):
        idx_files.load_idx_dir(str(tmp_path / "d"))

    bad = arrays["test"][1].copy()
    bad[3] = 10
    write_dir(tmp_path / "d", arrays)
    write(tmp_path / "d" / "t10k-labels-idx1-ubyte.gz", idx_bytes(bad))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz holds label 10"):
        idx_files.load_idx_dir(str(tmp_path / "d"))

    write_dir(tmp_path / "d", arrays)
    write(tmp_path / "d" / "train-images-idx3-ubyte.gz", idx_bytes(arrays["train"][1]))
    with pytest.raises(ValueError, match="holds labels, not images"):
        idx_files.load_idx_dir(str(tmp_path / "d"))


def test_mnist_needs_a_directory():
    with pytest.raises(ValueError, match=r"mnist needs dir=.*train-images-idx3-ubyte"):
        tasks.get("mnist")


# Bad input writes nothing.


def _break(directory, arrays, how):
    if how == "missing_dir":
        return str(directory) + "_nowhere"
    write_dir(directory, arrays)
    path = os.path.join(directory, "train-images-idx3-ubyte.gz")
    if how == "missing_file":
        os.remove(path)
    elif how == "truncated":
        write(path, idx_bytes(arrays["train"][0])[:-5])
    elif how == "magic":
        write(path, b"\x00\x00\x08\x04" + idx_bytes(arrays["train"][0])[4:])
    elif how == "counts":
        write(path, idx_bytes(arrays["train"][0][:-1]))
    elif how == "labels":
        write(
            os.path.join(directory, "train-labels-idx1-ubyte.gz"), idx_bytes(arrays["train"][1] + 1)
        )
    elif how == "image_size":
        pass
    return str(directory)


@pytest.mark.parametrize(
    "how, error, message",
    [
        ("missing_dir", FileNotFoundError, "No directory"),
        ("missing_file", FileNotFoundError, "no train-images-idx3-ubyte"),
        ("truncated", ValueError, "truncated"),
        ("magic", ValueError, "magic number 0x00000804"),
        ("counts", ValueError, "holds 39 images"),
        ("labels", ValueError, "holds label 10"),
        ("image_size", ValueError, r"expects 28x28 images but .* holds 8x8"),
    ],
)
def test_bad_input_raises_and_writes_nothing(tmp_path, how, error, message):
    directory = _break(tmp_path / "src", make_arrays(), how)
    size = 28 if how == "image_size" else 0
    task = tasks.get(
        "fashion_mnist", dir=directory, data_dir=str(tmp_path / "data"), image_size=size
    )
    with pytest.raises(error, match=message):
        task.prepare()
    assert not (tmp_path / "data").exists()


def test_valid_size_must_leave_training_images(tmp_path):
    directory = str(tmp_path / "src")
    write_dir(directory)
    task = tasks.get("mnist", dir=directory, data_dir=str(tmp_path / "data"), valid_size=40)
    with pytest.raises(ValueError, match="valid_size 40 must be >= 0 and leave training"):
        task.prepare()
    assert not (tmp_path / "data").exists()
    with pytest.raises(ValueError, match="valid_size must be an integer >= 0"):
        tasks.get("mnist", dir=directory, valid_size=-1)


def test_expected_image_size(tmp_path):
    directory = str(tmp_path / "src")
    write_dir(directory, size=28, n_train=12, n_test=3)
    task = tasks.get("fashion_mnist", dir=directory, data_dir=str(tmp_path / "d"), image_size=32)
    with pytest.raises(ValueError, match=r"The config expects 32x32 images but .*src holds 28x28"):
        task.input_shape  # noqa: B018 - the property reads the header
    ok = tasks.get(
        "fashion_mnist", dir=directory, data_dir=str(tmp_path / "d"), image_size=28, valid_size=2
    )
    assert ok.input_shape == (28, 28, 1)
    assert not (tmp_path / "d").exists()  # input_shape reads a header, writes nothing


# Records, splits, standardisation.


def test_splits_sizes_and_disjoint(task, idx_dir):
    _, arrays = idx_dir
    assert task.splits == ("train", "valid", "test") and task.eval_splits == ("valid", "test")
    assert task.input_shape == (8, 8, 1) and task.num_classes == 10
    sizes = {s: task.num_examples(s) for s in task.splits}
    assert sizes == {"train": 30, "valid": 10, "test": 12}
    train, valid = task.source("train"), task.source("valid")
    assert train.images.shape == (30, 8, 8, 1) and train.images.dtype == np.uint8
    assert not set(rows(train.images)) & set(rows(valid.images))
    originals = arrays["train"][0][..., None]
    assert sorted(rows(train.images) + rows(valid.images)) == sorted(rows(originals))
    np.testing.assert_array_equal(task.source("test").images[..., 0], arrays["test"][0])
    # The cut is valid_cut's, labels travel with their images.
    keep, cut = image_records.valid_cut(40, 10, 0)
    np.testing.assert_array_equal(valid.images, originals[cut])
    np.testing.assert_array_equal(valid.labels, arrays["train"][1][cut])
    np.testing.assert_array_equal(train.labels, arrays["train"][1][keep])


def test_valid_cut_is_fixed_by_the_seed():
    a, b = image_records.valid_cut(100, 20, 0), image_records.valid_cut(100, 20, 0)
    np.testing.assert_array_equal(a[1], b[1])
    c = image_records.valid_cut(100, 20, 1)
    assert not np.array_equal(a[1], c[1])
    assert len(a[0]) == 80 and not set(a[0]) & set(a[1])
    assert set(a[0]) | set(a[1]) == set(range(100))


def test_standardisation_uses_the_train_split_only(task, idx_dir):
    _, arrays = idx_dir
    keep, _ = image_records.valid_cut(40, 10, 0)
    train_pixels = arrays["train"][0][keep] / 255.0
    for split in task.splits:  # every split is standardised with the train statistics
        np.testing.assert_allclose(task.source(split).mean, [train_pixels.mean()], rtol=1e-6)
        np.testing.assert_allclose(task.source(split).std, [train_pixels.std()], rtol=1e-6)
    everything = np.concatenate([arrays["train"][0], arrays["test"][0]]) / 255.0
    assert abs(everything.mean() - train_pixels.mean()) > 1e-3
    assert abs(arrays["train"][0].mean() / 255.0 - train_pixels.mean()) > 1e-4
    x = data.to_arrays(task.source("train"))["inputs"]
    assert x.dtype == np.float32 and x.shape == (30, 8, 8, 1)
    np.testing.assert_allclose(x.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(x.std(), 1.0, rtol=1e-5)


def test_channel_stats_per_channel():
    images = np.random.default_rng(0).integers(0, 256, (5, 3, 4, 3)).astype(np.uint8)
    images[..., 2] //= 4  # channels of different statistics
    mean, std = image_records.channel_stats(images)
    ref = images / 255.0
    np.testing.assert_allclose(mean, ref.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(std, ref.std(axis=(0, 1, 2)), rtol=1e-9)
    assert mean[2] < mean[0] / 2
    with pytest.raises(ValueError, match="constant in a channel"):
        image_records.channel_stats(np.full((2, 3, 3, 1), 7, np.uint8))


def test_prepare_is_idempotent_and_configs_are_distinct(task, idx_dir, data_dir, tmp_path):
    directory, _ = idx_dir
    rebuilt = AssertionError("rebuilt")
    _, image_files_builder = image_records.builder_classes()
    with (
        mock.patch.object(image_files_builder, "_split_generators", side_effect=rebuilt),
        mock.patch.object(image_records.ImageFilesData, "splits_and_metadata", side_effect=rebuilt),
    ):
        task.prepare()
        again = tasks.get(
            "fashion_mnist", dir=directory, data_dir=data_dir, valid_size=10, crop_padding=0
        )
        again.prepare()
        assert again.num_examples("valid") == 10
    names = sorted(os.listdir(os.path.join(data_dir, "image_files")))
    assert len(names) == 1 and names[0].endswith("-valid10-seed0")
    # Another cut, and other files, write records of their own.
    tasks.get("fashion_mnist", dir=directory, data_dir=data_dir, valid_size=0).prepare()
    other = str(tmp_path / "other")
    write_dir(other, make_arrays(seed=1))
    tasks.get("fashion_mnist", dir=other, data_dir=data_dir, valid_size=10).prepare()
    names = sorted(os.listdir(os.path.join(data_dir, "image_files")))
    assert len(names) == 3 and len({n.split("-")[1] for n in names}) == 2


def test_no_valid_split(tmp_path, idx_dir):
    t = tasks.get("mnist", dir=idx_dir[0], data_dir=str(tmp_path), valid_size=0)
    assert t.splits == ("train", "test") and t.eval_splits == ("test",)
    assert t.num_examples("train") == 40
    with pytest.raises(ValueError, match="Valid splits: train, test"):
        t.source("valid")
    assert t.augment == image_augment.CropFlip(2, False)  # MNIST: crops, no flips


# Batches and augmentation.


def test_eval_batches_padded_and_never_augmented(task):
    batches = list(task.eval_iterator("test", 5))
    assert len(batches) == 3 and [int(b["mask"].sum()) for b in batches] == [5, 5, 2]
    assert not batches[-1]["mask"][2:].any()
    source = task.source("test")
    for b in batches:
        assert b["inputs"].shape == (5, 8, 8, 1) and b["targets"].dtype == np.int32
        expected = np.stack([source[int(i)]["inputs"] for i in b["index"]])
        np.testing.assert_array_equal(b["inputs"], expected)
    m = task.metrics(np.eye(10)[batches[0]["targets"]], batches[0]["targets"], batches[0]["mask"])
    assert float(m["accuracy"]) == 1.0 and float(m["count"]) == 5


def test_training_batches_cropped_and_flipped(task):
    assert task.augments_training
    source = task.source("train")
    changed = 0
    for step, batch in zip(range(5), task.train_iterator(6, seed=3), strict=False):
        assert batch["inputs"].shape == (6, 8, 8, 1) and batch["inputs"].dtype == np.float32
        clean = np.stack([source[int(i)]["inputs"] for i in batch["index"]])
        expected = task.augment(
            clean, seed=3, step=step, batch_size=6, pad_value=-source.mean / source.std
        )
        np.testing.assert_array_equal(batch["inputs"], expected)
        changed += int((batch["inputs"] != clean).any(axis=(1, 2, 3)).sum())
    assert changed >= 20  # of 30 images; (p, p) without a flip is the identity (1 in 50)


def test_augmentation_resumes_and_ignores_process_count(task):
    it = task.train_iterator(6, seed=1)
    uninterrupted = [next(it) for _ in range(8)]  # more than one epoch (5 steps)
    resumed = next(task.train_iterator(6, seed=1, start_step=7))
    np.testing.assert_array_equal(resumed["inputs"], uninterrupted[7]["inputs"])
    halves = [
        next(task.train_iterator(6, seed=1, start_step=7, process_index=p, process_count=2))
        for p in (0, 1)
    ]
    for key in ("inputs", "targets", "index"):
        np.testing.assert_array_equal(
            np.concatenate([h[key] for h in halves]), uninterrupted[7][key]
        )
    other = next(task.train_iterator(6, seed=2, start_step=7))
    assert not np.array_equal(other["inputs"], uninterrupted[7]["inputs"])


def test_end_to_end_real_size(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    write_dir(src, size=28, n_train=30, n_test=7, gz=False)
    task = tasks.get("fashion_mnist", dir=src, data_dir=out, valid_size=5)
    assert task.input_shape == (28, 28, 1) and task.num_classes == 10
    task.prepare()
    batch = next(task.train_iterator(8, seed=0, start_step=4))
    assert batch["inputs"].shape == (8, 28, 28, 1) and batch["inputs"].dtype == np.float32
    assert batch["targets"].shape == (8,) and batch["targets"].dtype == np.int32
    assert batch["mask"].all() and batch["index"].dtype == np.int32
    counts = [sum(int(b["mask"].sum()) for b in task.eval_iterator(s, 4)) for s in task.eval_splits]
    assert counts == [5, 7]
