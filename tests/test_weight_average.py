"""Weight averaging (``train.ema_decay``): the moving average of the parameters against
its formula, skipped steps, checkpoints (old ones included), the evaluation reading it,
and a run with the raw weights scored beside it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from configs import default, prefix_sum
from deq_jax.training import setup, train_and_evaluate
from deq_jax.training.families.evaluate import RAW_SUFFIX, device_batch
from deq_jax.training.families.steps import make_train_step
from deq_jax.training.run import sharding
from deq_jax.training.run.checkpoint import Checkpointer, CheckpointMismatchError
from deq_jax.training.run.nonfinite import SKIPPED, apply_if_finite
from deq_jax.training.run.optim import averaged_params, make_optimizer, weight_average
from deq_jax.training.run.selection import read_best_record
from deq_jax.training.run.state import TrainState
from deq_jax.training.run.writers import read_metrics


def _toy_state(decay, **train):
    config = default.get_config().train
    config.update(dict(ema_decay=decay, warmup_steps=0, grad_clip_norm=0.0, **train))
    tx, _ = make_optimizer(config)
    params = {"w": jnp.arange(4.0), "b": jnp.ones((2,), jnp.float32)}
    state = TrainState.create(apply_fn=None, params=params, tx=tx, model_state={}, rng=None)
    return state.replace(step=jnp.zeros((), jnp.int32))


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(tree))]


def test_the_average_follows_its_formula_with_the_warm_up():
    decay = 0.8
    state = _toy_state(decay)
    expected = jax.tree_util.tree_map(np.asarray, state.params)
    rng = np.random.default_rng(0)
    step = jax.jit(apply_if_finite)
    for t in range(12):
        grads = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in expected.items()}
        state, skipped = step(state, jnp.float32(1.0), grads, {})
        assert float(skipped) == 0.0
        d = min(decay, (1 + t) / (10 + t))  # 0.1, 0.18, ...: the decay itself from t = 26
        expected = {k: d * expected[k] + (1 - d) * np.asarray(state.params[k]) for k in expected}
    average = averaged_params(state.opt_state)
    for key in expected:
        np.testing.assert_allclose(average[key], expected[key], rtol=1e-6)
    assert state.has_average and state.eval_params is average
    assert state.variables()["params"] is average
    assert state.variables(state.params)["params"] is state.params
    raw = state.without_average()
    assert raw.eval_params is raw.params and raw.variables()["params"] is raw.params


def test_the_decay_reaches_its_value_after_the_warm_up():
    tx = weight_average(0.5)
    params = {"w": jnp.arange(4.0)}
    state = tx.init(params)._replace(count=jnp.asarray(1_000, jnp.int32))
    updates = {"w": -jnp.arange(4.0)}  # the parameters become 0
    same, state = tx.update(updates, state, params)
    assert same is updates
    np.testing.assert_allclose(state.average["w"], 0.5 * np.arange(4.0))
    with pytest.raises(ValueError, match="needs the parameters"):
        tx.update(updates, state)


def test_a_skipped_step_keeps_the_average_bit_for_bit():
    state = _toy_state(0.9)
    state, _ = apply_if_finite(state, jnp.float32(1.0), {"w": jnp.ones(4), "b": jnp.ones(2)}, {})
    before = _leaves(state.opt_state)
    grads = {"w": jnp.full((4,), jnp.nan), "b": jnp.ones(2)}
    after, skipped = apply_if_finite(state, jnp.float32(1.0), grads, {})
    assert float(skipped) == 1.0
    assert [x.tobytes() for x in _leaves(after.opt_state)] == [x.tobytes() for x in before]


def test_without_averaging_the_optimiser_state_is_as_before():
    state = _toy_state(0.0)
    assert not state.has_average and state.eval_params is state.params
    plain = optax.adamw(lambda count: 1e-3, weight_decay=2e-4).init(state.params)
    assert jax.tree_util.tree_structure(state.opt_state) == jax.tree_util.tree_structure(plain)


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5])
def test_a_decay_outside_zero_one_is_refused(bad):
    train = ConfigDict(dict(default.get_config().train))
    train.ema_decay = bad
    with pytest.raises(ValueError, match=r"train.ema_decay=.* must lie in \[0, 1\)"):
        make_optimizer(train)


def test_the_average_is_checkpointed_and_a_config_without_it_is_refused_with_a_hint(tmp_path):
    state = _toy_state(0.9)
    state, _ = apply_if_finite(state, jnp.float32(1.0), {"w": jnp.ones(4), "b": jnp.ones(2)}, {})
    ckpt = Checkpointer(str(tmp_path / "averaged"), every_steps=1, keep=1)
    ckpt.maybe_save(1, state, force=True)
    ckpt.wait()
    restored, step = ckpt.restore_or_init(_toy_state(0.9))
    assert step == 1
    np.testing.assert_array_equal(restored.eval_params["w"], state.eval_params["w"])
    with pytest.raises(CheckpointMismatchError, match="train.ema_decay 0 against > 0"):
        ckpt.restore_or_init(_toy_state(0.0))
    ckpt.close()
    # A checkpoint of a run without averaging (as every one before it) still restores.
    plain = Checkpointer(str(tmp_path / "plain"), every_steps=1, keep=1)
    plain.maybe_save(1, _toy_state(0.0), force=True)
    plain.wait()
    assert plain.restore_or_init(_toy_state(0.0))[1] == 1
    plain.close()


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
    config = prefix_sum.get_config("smoke")
    config.task.data_dir = str(tmp_path_factory.mktemp("data"))
    config.train.ema_decay = 0.5
    return config, setup(config, str(tmp_path_factory.mktemp("run")))


def test_the_train_step_trains_the_raw_weights_and_averages_them(averaged_run):
    config, run = averaged_run
    run.checkpointer.close()
    assert run.state.has_average
    step = make_train_step(run.model, run.task.metrics, run.schedule, run.mesh)
    batches = run.task.train_iterator(config.train.batch_size)
    state = sharding.replicate(jax.device_get(run.state), run.mesh)  # the step donates it
    expected = jax.device_get(state.params)
    for t in range(3):
        state, metrics = step(state, device_batch(next(batches), run.mesh))
        assert float(metrics[SKIPPED]) == 0.0
        d = min(0.5, (1 + t) / (10 + t))
        new = jax.device_get(state.params)
        expected = jax.tree_util.tree_map(lambda e, p, d=d: d * e + (1 - d) * p, expected, new)
    average = _leaves(state.eval_params)
    for got, want in zip(average, _leaves(expected), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    # the average lags the trained weights
    trained = _leaves(state.params)
    assert any(not np.allclose(a, b) for a, b in zip(average, trained, strict=True))


def test_a_run_scores_the_average_and_logs_the_raw_weights_beside_it(tmp_path):
    config = prefix_sum.get_config("smoke")
    config.task.data_dir = str(tmp_path / "data")
    config.train.ema_decay = 0.5
    config.eval.update(dict(score_raw_weights=True, splits=("test_16",), budget_multipliers=(1,)))
    lines = []
    result = train_and_evaluate(config, str(tmp_path / "run"), emit=lines.append)
    records = read_metrics(str(tmp_path / "run"))
    assert {"test_16", f"test_16{RAW_SUFFIX}"} <= {r["split"] for r in records}
    assert any(f"test_16{RAW_SUFFIX}:" in line for line in lines)
    # the averaged and the raw weights answer differently after a few steps
    at = {(r["step"], r["split"]): r for r in records}
    step = config.eval.every_steps
    assert at[(step, "test_16")] != at[(step, f"test_16{RAW_SUFFIX}")]
    assert read_best_record(str(tmp_path / "run"))["split"] == "valid"  # never a raw split
    assert set(result.eval_metrics) == {"test_16"}
    ckpt = Checkpointer(str(tmp_path / "run"), every_steps=1, keep=1)
    restored, step = ckpt.restore_or_init(result.state)
    ckpt.close()
    assert step == config.train.steps
    saved, kept = _leaves(restored.eval_params), _leaves(result.state.eval_params)
    for got, want in zip(saved, kept, strict=True):
        np.testing.assert_array_equal(got, want)
