"""Tests for deq_jax.tasks.data: batching, resuming, sharding and metrics."""

import itertools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deq_jax.tasks import data
from deq_jax.tasks.base import Task


def _source(n=23, length=5):
    rng = np.random.default_rng(0)
    return {
        "inputs": rng.normal(size=(n, length, 1)).astype(np.float32),
        "targets": rng.integers(0, 2, size=(n, length)).astype(np.int32),
    }


def _take(iterator, k):
    return list(itertools.islice(iterator, k))


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_train_batches_shapes_and_features_follow_index():
    source = _source()
    batch = next(data.train_batches(source, 4, seed=0))
    assert batch["inputs"].shape == (4, 5, 1) and batch["inputs"].dtype == np.float32
    assert batch["targets"].shape == (4, 5) and batch["targets"].dtype == np.int32
    assert batch["mask"].dtype == bool and batch["mask"].all()
    assert batch["index"].dtype == np.int32
    np.testing.assert_array_equal(batch["targets"], source["targets"][batch["index"]])


def test_train_batches_deterministic_in_seed():
    source = _source()
    a = _take(data.train_batches(source, 4, seed=3), 12)
    b = _take(data.train_batches(source, 4, seed=3), 12)
    c = _take(data.train_batches(source, 4, seed=4), 12)
    _assert_batches_equal(a, b)
    assert any((x["index"] != y["index"]).any() for x, y in zip(a, c, strict=True))


def test_train_epochs_visit_distinct_examples_and_drop_remainder():
    source = _source(n=23)
    steps = data.steps_per_epoch(23, 4)
    assert steps == 5
    batches = _take(data.train_batches(source, 4, seed=0), 2 * steps)
    for epoch in range(2):
        seen = np.concatenate([b["index"] for b in batches[epoch * steps : (epoch + 1) * steps]])
        assert len(set(seen.tolist())) == 20  # 3 dropped, no repeats
        np.testing.assert_array_equal(seen, data.epoch_permutation(23, 0, epoch)[:20])
    first = np.concatenate([b["index"] for b in batches[:steps]])
    second = np.concatenate([b["index"] for b in batches[steps:]])
    assert (first != second).any()  # reshuffled each epoch


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(n=st.integers(1, 40), batch_size=st.integers(1, 8), start_step=st.integers(0, 30))
def test_train_batches_resume_equals_tail_of_full_run(n, batch_size, start_step):
    hypothesis.assume(batch_size <= n)
    source = _source(n=n)
    full = _take(data.train_batches(source, batch_size, seed=7), start_step + 6)
    resumed = _take(data.train_batches(source, batch_size, seed=7, start_step=start_step), 6)
    _assert_batches_equal(full[start_step:], resumed)


def test_train_sharding_union_equals_single_process_batch():
    source = _source(n=30)
    single = _take(data.train_batches(source, 6, seed=1, start_step=4), 5)
    shards = [
        _take(
            data.train_batches(source, 6, seed=1, start_step=4, process_index=p, process_count=3),
            5,
        )
        for p in range(3)
    ]
    for step, batch in enumerate(single):
        parts = [shards[p][step] for p in range(3)]
        assert all(part["inputs"].shape[0] == 2 for part in parts)
        merged = {k: np.concatenate([part[k] for part in parts]) for k in batch}
        _assert_batches_equal([batch], [merged])


@pytest.mark.parametrize("n, batch_size", [(23, 4), (24, 4), (3, 8), (1, 1)])
def test_eval_batches_cover_every_example_once(n, batch_size):
    source = _source(n=n)
    batches = list(data.eval_batches(source, batch_size))
    assert len(batches) == data.num_eval_batches(n, batch_size)
    assert all(b["inputs"].shape[0] == batch_size for b in batches)
    index = np.concatenate([b["index"] for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    np.testing.assert_array_equal(index[mask], np.arange(n))  # in order, once each
    assert mask.sum() == n
    inputs = np.concatenate([b["inputs"] for b in batches])
    np.testing.assert_array_equal(inputs[mask], source["inputs"])


def test_eval_sharding_covers_every_example_once_with_equal_batch_counts():
    n, batch_size, count = 23, 6, 3
    source = _source(n=n)
    per_process = [
        list(data.eval_batches(source, batch_size, process_index=p, process_count=count))
        for p in range(count)
    ]
    assert len({len(b) for b in per_process}) == 1
    index = np.concatenate([b["index"] for bs in per_process for b in bs])
    mask = np.concatenate([b["mask"] for bs in per_process for b in bs])
    assert sorted(index[mask].tolist()) == list(range(n))


def test_record_source_matches_array_source():
    source = _source(n=11)
    records = [{k: v[i] for k, v in source.items()} for i in range(11)]
    np.testing.assert_array_equal(data.to_arrays(records)["inputs"], source["inputs"])
    a = _take(data.train_batches(source, 3, seed=2), 7)
    b = _take(data.train_batches(records, 3, seed=2), 7)
    _assert_batches_equal(a, b)
    _assert_batches_equal(list(data.eval_batches(source, 4)), list(data.eval_batches(records, 4)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, "positive"),
        ({"batch_size": 50}, "exceeds"),
        ({"batch_size": 4, "start_step": -1}, "start_step"),
        ({"batch_size": 4, "process_count": 3}, "divisible"),
        ({"batch_size": 4, "process_index": 2, "process_count": 2}, "process_index"),
    ],
)
def test_train_batches_bad_input_raises_eagerly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.train_batches(_source(), seed=0, **kwargs)


def test_bad_sources_raise():
    with pytest.raises(ValueError, match="leading dimension"):
        data.eval_batches({"a": np.zeros(3), "b": np.zeros(4)}, 2)
    with pytest.raises(ValueError, match="mask"):
        data.eval_batches({"a": np.zeros(3), "mask": np.zeros(3)}, 2)


def test_sequence_accuracy_known_answers_and_mask():
    targets = np.array([[0, 1, 1], [1, 0, 0], [1, 1, 1]], np.int32)  # [B=3, L=3]
    logits = np.eye(2, dtype=np.float32)[targets]  # perfect, [3, 3, 2]
    logits[1, 2] = logits[1, 2, ::-1]  # one wrong bit in example 1
    m = data.sequence_accuracy(logits, targets)
    np.testing.assert_allclose(m["bit_accuracy"], 8 / 9, rtol=1e-6)
    np.testing.assert_allclose(m["string_accuracy"], 2 / 3, rtol=1e-6)
    assert float(m["count"]) == 3
    masked = jax.jit(data.sequence_accuracy)(logits, targets, np.array([True, False, True]))
    np.testing.assert_allclose(masked["bit_accuracy"], 1.0)
    np.testing.assert_allclose(masked["string_accuracy"], 1.0)
    assert float(masked["count"]) == 2
    empty = data.sequence_accuracy(logits, targets, np.zeros(3, bool))
    assert float(empty["bit_accuracy"]) == 0.0 and bool(jnp.isfinite(empty["string_accuracy"]))


def test_sequence_accuracy_shape_mismatch_raises():
    with pytest.raises(ValueError, match="logits"):
        data.sequence_accuracy(np.zeros((2, 3, 2)), np.zeros((2, 4), np.int32))


def test_weighted_mean_equals_whole_set_accuracy_over_padded_batches():
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 2, size=(10, 6)).astype(np.int32)
    logits = rng.normal(size=(10, 6, 2)).astype(np.float32)
    source = {"logits": logits, "targets": targets}
    per_batch = [
        data.sequence_accuracy(b["logits"], b["targets"], b["mask"])
        for b in data.eval_batches(source, 4)
    ]
    merged = data.weighted_mean(per_batch)
    whole = data.sequence_accuracy(logits, targets)
    assert merged["count"] == 10
    np.testing.assert_allclose(merged["bit_accuracy"], whole["bit_accuracy"], rtol=1e-6)
    np.testing.assert_allclose(merged["string_accuracy"], whole["string_accuracy"], rtol=1e-6)
    with pytest.raises(ValueError):
        data.weighted_mean([])


class _StepStamped(Task):
    """A task whose augmentation writes the global step and row into the inputs."""

    name = "step_stamped"
    eval_splits = ()

    def __init__(self, augments):
        self._augments = augments

    def source(self, split):
        return _source(n=20)

    @property
    def augments_training(self):
        return self._augments

    def augment_train_batch(
        self, batch, *, seed, step, batch_size, process_index=0, process_count=1
    ):
        first = process_index * (batch_size // process_count)
        rows = first + np.arange(len(batch["mask"]), dtype=np.float32)
        stamp = 1000 * seed + 100 * step + rows
        return {**batch, "inputs": batch["inputs"] + stamp[:, None, None]}

    @staticmethod
    def metrics(predictions, targets, mask=None):
        return {}


def test_task_train_iterator_applies_the_augmentation_with_global_step_and_row():
    plain = _take(_StepStamped(False).train_iterator(8, seed=1), 3)
    stamped = _take(_StepStamped(True).train_iterator(8, seed=1), 3)
    for step, (p, s) in enumerate(zip(plain, stamped, strict=True)):
        np.testing.assert_array_equal(p["index"], s["index"])
        expected = 1000 + 100 * step + np.arange(8, dtype=np.float32)
        np.testing.assert_allclose(
            s["inputs"] - p["inputs"], np.broadcast_to(expected[:, None, None], p["inputs"].shape)
        )
    resumed = next(_StepStamped(True).train_iterator(8, seed=1, start_step=2))
    np.testing.assert_array_equal(resumed["inputs"], stamped[2]["inputs"])
    halves = [
        next(_StepStamped(True).train_iterator(8, seed=1, process_index=p, process_count=2))
        for p in (0, 1)
    ]
    np.testing.assert_array_equal(
        np.concatenate([h["inputs"] for h in halves]), stamped[0]["inputs"]
    )
