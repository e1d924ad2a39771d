"""`benchmarks.step_cost` on the MDEQ smoke model: the implicit backward's memory is flat in
the forward budget, backprop's is not, and the timings (slow).

Apart from `test_mdeq_training.py` so that xdist's ``loadscope`` can run it beside that
module's smoke training. Each MDEQ train step compiles for about half a minute of CPU;
the default suite measures a one-resolution MDEQ (half the compile time of the smoke
config's two), the smoke config itself is ``slow``.
"""

import pytest

from benchmarks import step_cost
from configs import mdeq_fashion_mnist

SIZE = 8  # synthetic 8x8 images, as in test_mdeq_training.py
SHAPE = [SIZE, SIZE, 1]


def _config(resolutions: int):
    """The MDEQ smoke config on 8x8 images with its first ``resolutions`` branches
    (synthetic batches: no data are read)."""
    config = mdeq_fashion_mnist.get_config("smoke")
    config.task.update(dict(image_size=SIZE, crop_padding=1))
    config.model.channels = config.model.channels[:resolutions]
    config.model.head_channels = config.model.head_channels[:resolutions]
    return config


@pytest.mark.parametrize("resolutions", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_step_cost_reports_memory_flat_for_the_implicit_backward(resolutions, tmp_path):
    config = _config(resolutions)
    assert len(config.model.channels) == resolutions
    ift = step_cost.measure(config, str(tmp_path), [2, 4], ["ift"], 0, True, SHAPE)
    assert all("train_seconds" not in r for r in ift)  # repeats=0: compile only
    (unrolled,) = step_cost.measure(config, str(tmp_path), [4], ["unrolled"], 0, True, SHAPE)
    # The implicit backward's memory is flat in the budget; backprop keeps every iterate.
    assert ift[0]["temp_bytes"] == ift[1]["temp_bytes"] < unrolled["temp_bytes"]
    with pytest.raises(ValueError, match="--input_shape"):
        step_cost.measure(config, str(tmp_path), [2], ["ift"], 1, synthetic=True)


@pytest.mark.slow
def test_step_cost_times_train_and_eval(tmp_path):
    (row,) = step_cost.measure(_config(2), str(tmp_path), [2], ["ift"], 1, True, SHAPE)
    assert row["train_images_per_second"] > 0 and row["eval_images_per_second"] > 0


def test_spectral_step_leaves_the_batch_statistics_alone():
    """The spectral diagnostic solves in training mode, where MDEQ's batch norms update
    their statistics: the step runs (it used to fail on the immutable collection) and
    the state it reads is unchanged."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from deq_jax.training.families.steps import make_spectral_step
    from deq_jax.training.run import build, sharding
    from deq_jax.training.run.optim import make_optimizer
    from deq_jax.training.run.state import create_train_state

    config = _config(1)
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    tx, _ = make_optimizer(config.train)
    state = create_train_state(model, tx, jnp.zeros((1, *SHAPE)), jax.random.PRNGKey(0))
    assert "batch_stats" in state.model_state
    before = jax.tree.map(np.asarray, state.model_state)
    mesh = sharding.make_mesh()
    batch = {
        "inputs": jax.random.normal(jax.random.PRNGKey(1), (4, *SHAPE)),
        "mask": jnp.ones(4, bool),
    }
    rho = make_spectral_step(model, mesh, 3)(sharding.replicate(state, mesh), batch)
    assert np.isfinite(rho["spectral_radius"]) and rho["spectral_radius"] > 0
    jax.tree.map(np.testing.assert_array_equal, state.model_state, before)
