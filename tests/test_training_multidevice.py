"""Data parallelism: the same smoke training on 1 and on 8 simulated CPU devices.

Each run is a subprocess because the device count is fixed when JAX starts
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``).
"""

import numpy as np
import pytest
from conftest import run_on_devices

_SCRIPT = """
import json, sys
import jax
from configs import prefix_sum
from deq_jax.training import (
    Evaluator,
    SettleRule,
    restore_trained,
    setup,
    train_and_evaluate,
)
from deq_jax.training.run import writers

workdir, data_dir = sys.argv[1], sys.argv[2]
config = prefix_sum.get_config("smoke")
config.task.data_dir = data_dir
config.task.test_lengths = (16,)
config.train.steps = 4
config.log.every_steps = 1
config.eval.every_steps = 0
config.eval.budget_multipliers = (1,)
train_and_evaluate(config, workdir, emit=lambda line: None)
losses = [r["loss"] for r in writers.read_metrics(workdir) if r["split"] == "train"]
run = restore_trained(config, workdir, "to evaluate")  # the answer stop, sharded
settled = Evaluator(
    run.model, run.task, run.mesh, config.eval.batch_size, settle=SettleRule(1)
).evaluate(run.state, run.task.eval_splits[0])
settled = [settled[k] for k in ("loss", "nstep_mean", "nstep_max", "converged")]
# 13 rows a batch: padded to 16 on 8 devices, the padding masked out of the metrics;
# solved to the tolerance, where the rows' rounding (2 a device against 13) has died out
padded = Evaluator(run.model, run.task, run.mesh, 13).evaluate(
    run.state, run.task.eval_splits[0], max_iter=40
)
padded = [padded[k] for k in ("loss", "converged", "count")]
config.train.batch_size = 12
try:
    setup(config, workdir + "_bad")
    error = ""
except ValueError as e:
    error = str(e)
result = {
    "devices": jax.device_count(),
    "losses": losses,
    "settled": settled,
    "padded": padded,
    "error": error,
}
print("RESULT " + json.dumps(result))
"""


def _run(devices, workdir, data_dir):
    return run_on_devices(_SCRIPT, workdir, data_dir, devices=devices)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    one = _run(1, tmp_path_factory.mktemp("one"), data_dir)
    eight = _run(8, tmp_path_factory.mktemp("eight"), data_dir)
    return one, eight


def test_same_losses_on_one_and_eight_devices(runs):
    one, eight = runs
    assert (one["devices"], eight["devices"]) == (1, 8)
    assert len(one["losses"]) == 4
    np.testing.assert_allclose(eight["losses"], one["losses"], atol=1e-5, rtol=0)
    # the eval that stops each sample when its answer settles, sharded over 8 devices
    np.testing.assert_allclose(eight["settled"], one["settled"], atol=1e-5, rtol=0)


def test_an_eval_batch_that_eight_devices_do_not_divide_is_padded(runs):
    one, eight = runs
    np.testing.assert_allclose(eight["padded"], one["padded"], rtol=1e-5, atol=0)
    assert one["padded"][1:] == [1.0, 64]  # converged; every example counted once


def test_batch_not_divisible_by_devices_fails_clearly(runs):
    one, eight = runs
    assert one["error"] == ""  # 12 splits over one device
    assert "train.batch_size=12 must be a multiple of data x fsdp = 8" in eight["error"]
    nearest = "nearest valid sizes: --config.train.batch_size=8 or --config.train.batch_size=16"
    assert nearest in eight["error"]
