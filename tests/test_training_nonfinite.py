"""Non-finite training steps: skipped with the state bit-for-bit unchanged, counted, and
too many in a row stop the run (the end-to-end runs are in test_training_run.py)."""

import jax
import numpy as np
import pytest
from conftest import run_on_devices
from test_lm_training import smoke_config as lm_smoke_config
from test_lm_training import write_corpus

from configs import prefix_sum
from deq_jax.training import setup
from deq_jax.training.families.evaluate import device_batch
from deq_jax.training.families.lm_evaluate import lm_device_batch
from deq_jax.training.families.lm_setup import setup_language_model
from deq_jax.training.families.lm_steps import make_lm_train_step
from deq_jax.training.families.steps import make_train_step
from deq_jax.training.loop.train import interval_mean
from deq_jax.training.run import sharding
from deq_jax.training.run.nonfinite import (
    SKIPPED,
    NonFiniteLossError,
    NonFiniteSteps,
    finite_memory,
    logged,
)


def _identical(a, b):
    """Bit-for-bit equality of two pytrees (NaN payloads and signed zeros included)."""
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


class _Checkpointer:
    directory = "/runs/x/checkpoints"

    def latest_step(self):
        return 2


def test_nonfinite_steps_counts_in_a_row_and_stops_at_the_limit():
    lines = []
    guard = NonFiniteSteps(3, _Checkpointer(), lines.append, "Lower the learning rate.")
    bad = {SKIPPED: 1.0, "loss": float("nan"), "grad_norm": float("inf")}
    good = {SKIPPED: 0.0, "loss": 1.0, "grad_norm": 1.0}
    assert guard.skipped(bad, 3) and guard.skipped(bad, 4)
    assert not guard.skipped(good, 5) and guard.in_a_row == 0
    assert guard.skipped(bad, 6) and guard.skipped(bad, 7)
    assert len(lines) == 4 and "step 7" in lines[-1] and "2 in a row of at most 3" in lines[-1]
    assert "update skipped (parameters and optimiser state unchanged)" in lines[-1]
    with pytest.raises(NonFiniteLossError) as err:
        guard.skipped(bad, 8)
    message = str(err.value)
    assert "at step 8, 3 step(s) in a row (steps 6 to 8; train.max_nonfinite_steps=3)" in message
    assert "last good checkpoint is step 2 in /runs/x/checkpoints" in message
    assert message.endswith("Lower the learning rate.")
    assert guard.total == 5


def test_max_nonfinite_steps_must_be_positive():
    with pytest.raises(ValueError, match="train.max_nonfinite_steps must be an integer >= 1"):
        NonFiniteSteps(0, _Checkpointer(), print, "")


def test_interval_counts_skipped_steps_and_averages_the_applied_ones():
    history = [
        logged({SKIPPED: 0.0, "loss": 2.0}, False),
        logged({SKIPPED: 1.0, "loss": float("nan")}, True),
        logged({SKIPPED: 0.0, "loss": 4.0}, False),
        logged({SKIPPED: 1.0, "loss": float("inf")}, True),
    ]
    assert interval_mean(history) == {SKIPPED: 2.0, "loss": 3.0}


@pytest.fixture(scope="module")
def prefix_run(tmp_path_factory):
    config = prefix_sum.get_config("smoke")
    config.task.data_dir = str(tmp_path_factory.mktemp("data"))
    run = setup(config, str(tmp_path_factory.mktemp("run")))
    run.checkpointer.close()
    step = make_train_step(run.model, run.task.metrics, run.schedule, run.mesh)
    batch = next(run.task.train_iterator(config.train.batch_size))
    return run, step, batch


def _fresh(run):
    return sharding.replicate(jax.device_get(run.state), run.mesh)


def test_train_step_skips_an_infinite_input_bit_for_bit(prefix_run):
    run, step, batch = prefix_run
    before = jax.device_get(run.state)
    inputs = np.array(batch["inputs"], dtype=np.float32)
    inputs.flat[3] = np.inf  # one entry of one example
    bad = device_batch(dict(batch, inputs=inputs.astype(batch["inputs"].dtype)), run.mesh)
    after, metrics = step(_fresh(run), bad)
    after = jax.device_get(after)
    assert float(metrics[SKIPPED]) == 1.0
    assert not np.isfinite(float(metrics["grad_norm"]))
    _identical(after.params, before.params)
    _identical(after.opt_state, before.opt_state)
    _identical(after.model_state, before.model_state)
    assert int(after.step) == int(before.step) + 1


def test_train_step_applies_a_finite_update(prefix_run):
    run, step, batch = prefix_run
    after, metrics = step(_fresh(run), device_batch(batch, run.mesh))
    assert float(metrics[SKIPPED]) == 0.0
    # the warm-up's first learning rate is 0: the update shows in the optimiser's moments
    old, new = (
        jax.tree_util.tree_leaves(run.state.opt_state),
        jax.tree_util.tree_leaves(jax.device_get(after.opt_state)),
    )
    n_changed = sum(not np.array_equal(a, b) for a, b in zip(old, new, strict=True))
    assert n_changed >= len(jax.tree_util.tree_leaves(run.state.params))


def test_finite_memory_keeps_the_old_one_when_the_new_is_not_finite():
    old = {"z": np.zeros((2, 3), np.float32), "count": np.array([1, 1], np.int32)}
    new = {"z": np.ones((2, 3), np.float32), "count": np.array([2, 2], np.int32)}
    _identical(finite_memory(new, old), new)
    new["z"][1, 2] = np.nan
    _identical(finite_memory(new, old), old)


@pytest.mark.slow  # builds and compiles the language model (about 55 s on a shared CPU)
def test_lm_train_step_skips_and_keeps_the_memory(tmp_path):
    corpus = write_corpus(tmp_path / "plays.txt")
    config = lm_smoke_config(corpus)
    run = setup_language_model(config, str(tmp_path / "run"))
    run.checkpointer.close()
    template = jax.tree_util.tree_map(np.asarray, run.model.init_mems(config.train.batch_size))
    step = make_lm_train_step(run.model, run.schedule, run.mesh, template)
    batches = run.task.train_iterator(config.train.batch_size, config.train.seq_len)
    state, mems, first = step(run.state, run.carry, lm_device_batch(next(batches), run.mesh))
    assert float(first[SKIPPED]) == 0.0
    before, mems_before = jax.device_get(state), jax.device_get(mems)
    nan_params = jax.tree_util.tree_map(lambda p: np.full_like(p, np.nan), before.params)
    poisoned = sharding.replicate(before.replace(params=nan_params), run.mesh)  # NaN memory too
    after, mems_after, metrics = step(poisoned, mems, lm_device_batch(next(batches), run.mesh))
    assert float(metrics[SKIPPED]) == 1.0 and not np.isfinite(float(metrics["loss"]))
    after = jax.device_get(after)
    _identical(after.params, nan_params)
    _identical(after.opt_state, before.opt_state)
    _identical(jax.device_get(mems_after), mems_before)
    assert int(after.step) == int(before.step) + 1


_SHARDED_SCRIPT = """
import json, sys
import jax, numpy as np
from configs import prefix_sum
from deq_jax.training import setup, sharding
from deq_jax.training.families.evaluate import device_batch
from deq_jax.training.families.steps import make_train_step

config = prefix_sum.get_config("smoke")
config.task.data_dir = sys.argv[2]
run = setup(config, sys.argv[1])
run.checkpointer.close()
step = make_train_step(run.model, run.task.metrics, run.schedule, run.mesh)
batch = next(run.task.train_iterator(config.train.batch_size))
inputs = np.array(batch["inputs"], dtype=np.float32)
inputs[-1].flat[0] = np.inf  # one example, on the last device's shard
before = jax.device_get(run.state.params)
after, metrics = step(run.state, device_batch(dict(batch, inputs=inputs), run.mesh))
same = [
    all(np.asarray(s.data).tobytes() == np.asarray(b).tobytes() for s in a.addressable_shards)
    for a, b in zip(jax.tree_util.tree_leaves(after.params), jax.tree_util.tree_leaves(before))
]
skipped = float(metrics["skipped_steps"])
result = {"devices": jax.device_count(), "skipped": skipped, "same": all(same)}
print("RESULT " + json.dumps(result))
"""


@pytest.mark.slow  # a subprocess with 4 simulated devices compiles the step (about 40 s)
def test_sharded_step_skips_on_every_device(tmp_path):
    # run_on_devices keeps the suite's XLA_FLAGS (optimisation level 0) and adds the count.
    result = run_on_devices(
        _SHARDED_SCRIPT, tmp_path / "run", tmp_path / "data", devices=4, timeout=900
    )
    assert result == {"devices": 4, "skipped": 1.0, "same": True}
