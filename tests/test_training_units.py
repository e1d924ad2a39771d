"""Unit tests of the training pieces: optimiser, loss, metrics, writers, checkpoints."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from configs import default
from deq_jax.solvers.base import SolverStats
from deq_jax.training.families import metrics
from deq_jax.training.run import checkpoint, optim, sharding, writers
from deq_jax.training.run.state import TrainState


def _train(**changes):
    train = default.get_config().train
    train.update(changes)
    return train


def test_cosine_schedule_with_warmup():
    schedule = optim.make_schedule(_train(steps=100, warmup_steps=10, learning_rate=1e-2))
    np.testing.assert_allclose(schedule(0), 0.0)
    np.testing.assert_allclose(schedule(5), 5e-3, rtol=1e-6)
    np.testing.assert_allclose(schedule(10), 1e-2, rtol=1e-6)
    np.testing.assert_allclose(schedule(100), 1e-4, rtol=1e-5)
    assert schedule(50) < schedule(20)


def test_constant_schedule():
    schedule = optim.make_schedule(_train(schedule="constant", warmup_steps=0))
    np.testing.assert_allclose(schedule(500), 1e-3)


@pytest.mark.parametrize("name", optim.OPTIMIZERS)
def test_optimizers_reduce_a_quadratic(name):
    tx, _ = optim.make_optimizer(_train(optimizer=name, warmup_steps=0, learning_rate=0.05))
    params = {"w": jnp.array([1.0, -2.0])}
    opt_state = tx.init(params)
    for _ in range(50):
        grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
    assert float(jnp.sum(params["w"] ** 2)) < 1.0


def _clipped_sgd(grad_clip_norm):
    """Plain SGD at learning rate 1 after clipping: its update is minus the clipped
    gradient."""
    train = _train(optimizer="sgd", momentum=0.0, schedule="constant", warmup_steps=0)
    train.update(learning_rate=1.0, grad_clip_norm=grad_clip_norm)
    return optim.make_optimizer(train)[0]


def test_gradient_clipping():
    tx = _clipped_sgd(0.5)
    params = {"w": jnp.zeros(2)}
    updates, _ = tx.update({"w": jnp.array([30.0, 40.0])}, tx.init(params), params)
    np.testing.assert_allclose(jnp.linalg.norm(updates["w"]), 0.5, rtol=1e-6)


def test_global_norm_does_not_overflow():
    # Entries of 3e20 and 4e20 square past float32's largest value: optax's norm is
    # infinite although every entry is finite; the norm is 5e20.
    grads = {"a": jnp.array([3e20, -4e20], jnp.float32), "b": jnp.ones((2, 2), jnp.float32)}
    assert not np.isfinite(float(optax.tree.norm(grads)))
    np.testing.assert_allclose(float(optim.global_norm(grads)), 5e20, rtol=1e-6)
    # Where the plain norm is finite it is returned bit for bit; NaN and inf stay.
    normal = {"w": jax.random.normal(jax.random.PRNGKey(0), (100, 7)) * 3.0}
    assert optim.global_norm(normal) == optax.tree.norm(normal)
    assert np.isinf(float(optim.global_norm({"a": jnp.array([1.0, jnp.inf])})))
    assert np.isnan(float(optim.global_norm({"a": jnp.array([jnp.nan, 1.0])})))
    assert float(optim.global_norm({})) == 0.0
    # Jitted and vmapped (the rescaled branch is a cond, a select under vmap): per row.
    rows = {"a": jnp.array([[3e20, -4e20], [3.0, -4.0]], jnp.float32)}
    np.testing.assert_allclose(jax.jit(jax.vmap(optim.global_norm))(rows), [5e20, 5.0], rtol=1e-6)


def test_clipping_scales_an_overflowing_gradient_instead_of_zeroing_it():
    tx = _clipped_sgd(1.0)
    params = {"a": jnp.zeros(2), "b": jnp.zeros((2, 2))}
    grads = {"a": jnp.array([3e20, -4e20], jnp.float32), "b": jnp.ones((2, 2), jnp.float32)}
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["a"], [-0.6, 0.8], rtol=1e-6)  # sgd: minus the step
    np.testing.assert_allclose(updates["b"], -2e-21 * np.ones((2, 2)), rtol=1e-5)
    zeroed, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    assert not np.any(np.asarray(zeroed["a"]))  # what optax's clipping does with it
    # Below the overflow it is optax's clipping, bit for bit, with optax's state.
    normal = {"a": jnp.array([30.0, 40.0]), "b": jnp.full((2, 2), 7.0)}
    ours, state = optim.clip_by_global_norm(0.5).update(normal, optax.EmptyState())
    theirs, _ = optax.clip_by_global_norm(0.5).update(normal, optax.EmptyState())
    assert all(np.array_equal(ours[k], theirs[k]) for k in normal)
    assert isinstance(state, optax.EmptyState)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("optimizer", "lamb", "adamw"),
        ("schedule", "linear", "cosine"),
        ("warmup_steps", 10**6, "warmup"),
    ],
)
def test_bad_optimizer_config(field, value, match):
    with pytest.raises(ValueError, match=match):
        optim.make_optimizer(_train(**{field: value}))


def test_classification_loss_ignores_padding():
    logits = jnp.zeros((3, 4, 2)).at[2].set(jnp.array([100.0, -100.0]))
    targets = jnp.ones((3, 4), jnp.int32)
    mask = jnp.array([True, True, False])
    np.testing.assert_allclose(
        metrics.classification_loss(logits, targets, mask), np.log(2), rtol=1e-6
    )
    assert float(metrics.classification_loss(logits, targets, jnp.ones(3, bool))) > 60


def test_solver_metrics_over_real_examples():
    stats = SolverStats(
        nstep=jnp.array([3, 5, 30]),
        abs_residual=jnp.array([1.0, jnp.inf, 9.0]),
        rel_residual=jnp.array([0.1, 0.3, 0.9]),
        converged=jnp.array([True, False, False]),
        diverged=jnp.array([False, True, False]),
        trace=jnp.zeros((3, 30)),
    )
    m = metrics.solver_metrics(stats, jnp.array([True, True, False]))
    assert float(m["nstep_mean"]) == 4.0 and int(m["nstep_max"]) == 5
    np.testing.assert_allclose(m["abs_residual"], 0.5)  # non-finite counted as 0
    np.testing.assert_allclose(m["converged"], 0.5)
    np.testing.assert_allclose(m["diverged"], 0.5)


def test_combine_weights_by_count():
    out = metrics.combine(
        [
            {"count": 3, "acc": 1.0, "nstep_max": 4},
            {"count": 1, "acc": 0.0, "nstep_max": 9},
            {"count": 0, "acc": 0.5, "nstep_max": 50},
        ]
    )
    assert out == {"count": 4.0, "acc": 0.75, "nstep_max": 9.0}


def test_batch_size_must_split_over_devices():
    mesh = sharding.make_mesh()
    n = mesh.devices.size
    sharding.check_batch_size(4 * n, mesh)
    with pytest.raises(
        ValueError, match=rf"train.batch_size=0 must be a multiple of data x fsdp = {n}"
    ):
        sharding.check_batch_size(0, mesh)


def test_shard_batch_places_global_arrays():
    mesh = sharding.make_mesh()
    n = mesh.devices.size
    batch = sharding.shard_batch({"x": np.arange(2 * n, dtype=np.float32)}, mesh)
    assert batch["x"].shape == (2 * n,)
    assert batch["x"].sharding == sharding.batch_sharding(mesh)


def test_metric_writer_jsonl_and_tensorboard(tmp_path):
    writer = writers.MetricWriter(str(tmp_path))
    writer.write(1, "train", {"loss": np.float32(0.5), "nstep_max": np.int32(7)})
    writer.write(2, "test_32", {"loss": jnp.array(float("nan"))})
    writer.close()
    records = writers.read_metrics(str(tmp_path))
    assert records[0] == {"step": 1, "split": "train", "loss": 0.5, "nstep_max": 7}
    assert records[1]["split"] == "test_32" and np.isnan(records[1]["loss"])
    for split in ("train", "test_32"):
        files = os.listdir(tmp_path / writers.TENSORBOARD_DIR / split)
        assert any(f.startswith("events.out.tfevents") for f in files)


def test_metric_writer_disabled_writes_nothing(tmp_path):
    writer = writers.MetricWriter(str(tmp_path / "w"), enabled=False)
    writer.write(1, "train", {"loss": 1.0})
    assert not (tmp_path / "w").exists()


def test_to_python_rejects_arrays():
    with pytest.raises(ValueError, match="not a scalar"):
        writers.to_python({"loss": np.zeros(3)})


def test_progress_line():
    now = iter([0.0, 10.0])
    lines = []
    logger = writers.ProgressLogger(100, start_step=0, emit=lines.append, clock=lambda: next(now))
    text = logger.line(20, {"loss": 0.25, "accuracy": 0.9, "nstep_mean": 12.5, "nstep_max": 30})
    assert lines == [text]
    for part in (
        "step 20/100",
        "2.00 steps/s",
        "ETA 0m40s",
        "loss 0.2500",
        "acc 0.9000",
        "solver steps 12.5 (max 30)",
    ):
        assert part in text


def test_describe_mismatch_names_every_difference():
    saved = {"params": {"a": jnp.zeros((3, 4)), "b": jnp.zeros(2)}, "step": jnp.int32(0)}
    model = {"params": {"a": jnp.zeros((3, 8)), "c": jnp.zeros(2)}, "step": jnp.int32(0)}
    lines = checkpoint.describe_mismatch(saved, model)
    assert lines == [
        "params/a: checkpoint float32[3, 4], model float32[3, 8]",
        "params/b: in the checkpoint, not in the model",
        "params/c: in the model, not in the checkpoint",
    ]
    assert checkpoint.describe_mismatch(saved, saved) == []


def _state(w):
    import optax

    return TrainState.create(
        apply_fn=None,
        params={"w": w},
        tx=optax.adam(1e-3),
        model_state={},
        rng=jax.random.PRNGKey(0),
    )


def test_checkpointer_roundtrip_keep_and_mismatch(tmp_path):
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=2, keep=2)
    state = _state(jnp.arange(3.0))
    assert ckpt.restore_or_init(state) == (state, 0)
    assert not ckpt.maybe_save(1, state)
    for step in (2, 4, 6):
        assert ckpt.maybe_save(step, state.replace(step=jnp.int32(step)))
    ckpt.close()
    assert ckpt.all_steps() == [4, 6]
    again = checkpoint.Checkpointer(str(tmp_path), every_steps=2, keep=2)
    restored, step = again.restore_or_init(_state(jnp.zeros(3)))
    assert step == 6 and int(restored.step) == 6
    chex.assert_trees_all_close(restored.params, state.params)
    with pytest.raises(
        checkpoint.CheckpointMismatchError,
        match=r"params/w: checkpoint float32\[3\], model float32\[5\]",
    ):
        again.restore_or_init(_state(jnp.zeros(5)))
    again.close()


def test_checkpointer_rejects_bad_intervals(tmp_path):
    with pytest.raises(ValueError, match="every_steps"):
        checkpoint.Checkpointer(str(tmp_path), every_steps=0, keep=1)


def test_config_json_is_written_by_default_sections():
    config = default.get_config()
    assert json.loads(config.to_json_best_effort())["train"]["steps"] == config.train.steps
    assert isinstance(config.train, ConfigDict)


def test_prefix_sum_model_shapes_and_parameter_count():
    from deq_jax import backward, models, solvers
    from deq_jax.nn import DEQSpec

    spec = DEQSpec(solver=solvers.anderson(max_iter=5), backward=backward.jacobian_free())
    model = models.get("prefix_sum_deq", width=8, num_blocks=1, deq=spec)
    x = jnp.zeros((2, 16, 1))
    variables = jax.jit(lambda k, x: model.init(k, x, train=False))(jax.random.PRNGKey(0), x)
    n_params = sum(p.size for p in jax.tree_util.tree_leaves(variables["params"]))
    w = 8  # project + cell (input conv, one residual block) + head
    assert n_params == 3 * w + (3 * 2 * w * w + 2 * 3 * w * w) + (3 * w * w + 3 * w * 4 + 3 * 4 * 2)
    for length in (16, 40):  # length-agnostic
        logits, stats = model.apply(variables, jnp.ones((3, length, 1)), train=False)
        chex.assert_shape(logits, (3, length, 2))
        chex.assert_shape(stats.nstep, (3,))
    with pytest.raises(ValueError, match=r"\[B, L, C\]"):
        model.apply(variables, jnp.ones((3, 16)), train=False)
    with pytest.raises(ValueError, match="prefix_sum_deq"):
        models.get("resnet")


def test_report_title_fits_the_splits_and_metrics():
    from deq_jax.training.families.evaluate import report_title

    lengths = ("test_16", "test_32")
    assert report_title(lengths, ["bit_accuracy", "string_accuracy"]) == "Per-length accuracy"
    assert report_title(("valid", "test"), ["accuracy"]) == "Accuracy per split"
    assert report_title(("test",), ["mse"]) == "Scores per split"
    assert report_title(lengths, ["score"]) == "Per-length scores"


def test_every_family_is_one_loop_with_a_family_of_its_own():
    from configs import lm_shakespeare, mdeq_fashion_mnist, prefix_sum
    from deq_jax.training import Family, LanguageModelFamily, TaskFamily, family_for

    assert isinstance(family_for(lm_shakespeare.get_config("smoke")), LanguageModelFamily)
    for config in (prefix_sum.get_config("smoke"), mdeq_fashion_mnist.get_config("smoke")):
        assert isinstance(family_for(config), TaskFamily)
    assert issubclass(TaskFamily, Family) and issubclass(LanguageModelFamily, Family)
    # what differs between the families is theirs; the loop is shared
    assert TaskFamily.report_file != LanguageModelFamily.report_file
