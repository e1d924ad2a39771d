"""A run saved on one device count resumes on another and continues the uninterrupted run.

The protocol, for each change of devices: run A trains to step ``K`` on the old count
(``train.stop_at_step=K``), then the same workdir is continued to ``2K`` on the new
count; run B trains from scratch to ``2K`` on the new count without a break. The train
losses of steps ``K+1..2K`` and the final parameters of A and B agree to float rounding
(the language model's parameters in norm, `LM_PARAMS_NORM_RTOL`).
Both stop early (``train.steps`` is beyond ``2K``) so that they share the learning-rate
schedule and skip the final report. The device counts are simulated CPU devices in
subprocesses (`conftest.run_on_devices`), since JAX fixes the count when it starts:

* prefix sums, 8 devices -> 1 and 1 -> 8;
* the language model, 8 devices -> 1: its checkpoint holds the segment memory of the
  global batch, split along the batch over the 8 devices; and the same checkpoint
  restored for sampling (`restore_language_model`, no mesh) in this process;
* (``slow``) prefix sums, two processes of 4 devices each (`launch.multiprocess`) -> one
  process of 1 device: the process count and the device count change at once.
"""

import inspect
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import ROOT, run_on_devices

from configs import lm_shakespeare, prefix_sum
from deq_jax.training.families.lm_setup import restore_language_model
from deq_jax.training.run.checkpoint import Checkpointer, saved_steps
from launch import multiprocess

K = 3  # the step the runs are interrupted at; they end at 2K
STEPS = 8  # train.steps: the schedule's length, beyond 2K so that no report runs
RTOL, ATOL = 1e-5, 1e-6  # float rounding (the 1-vs-8-device runs agree to 1e-5)
# The language model's parameters, by the norm of the difference over the norm: Adam
# turns the rounding of near-zero gradient entries into steps of up to the learning
# rate, so two uninterrupted runs on 1 and on 8 devices, whose losses agree to 5e-6,
# differ by up to 1e-3 in an entry and 7e-5 in norm. A resume that loses the segment
# memory or the optimiser state is 2.5e-3 and 3.6e-3 off in norm (measured).
LM_PARAMS_NORM_RTOL = 5e-4

OVERRIDES = {
    "prefix_sum": {
        "train.steps": STEPS,
        "log.every_steps": 1,
        "log.tensorboard": False,
        "eval.every_steps": 0,
        "ckpt.every_steps": 100,  # only the forced save at the stop
        "task.test_lengths": (16,),
    },
    "lm_shakespeare": {
        "train.steps": STEPS,
        "train.batch_size": 8,  # splits over 8 devices
        "train.pretrain_steps": 0,  # one train program, the DEQ's
        "log.every_steps": 1,
        "log.tensorboard": False,
        "eval.every_steps": 0,
        "eval.batch_size": 8,
        "ckpt.every_steps": 100,
    },
}


def make_config(name: str, overrides: dict):
    """The smoke config ``name`` with ``overrides`` ({"section.field": value}); the
    subprocesses run this same source (`_SCRIPT`)."""
    config = {"prefix_sum": prefix_sum, "lm_shakespeare": lm_shakespeare}[name].get_config("smoke")
    for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = tuple(value) if isinstance(value, list) else value
    return config


# Runs `train_and_evaluate` for each (config name, workdir, overrides) of argv[1], in
# order, and prints each run's last step, train losses and final parameters.
_SCRIPT = (
    """
import json, sys
import jax
import numpy as np
from configs import lm_shakespeare, prefix_sum
from deq_jax.training import train_and_evaluate
from deq_jax.training.run import writers
"""
    + inspect.getsource(make_config)
    + """

runs = []
for name, workdir, overrides in json.loads(sys.argv[1]):
    result = train_and_evaluate(make_config(name, overrides), workdir, emit=lambda line: None)
    records = writers.read_metrics(workdir)
    losses = {r["step"]: r["loss"] for r in records if r["split"] == "train"}
    leaves = jax.tree_util.tree_leaves(jax.device_get(result.state.params))
    params = np.concatenate([np.ravel(x) for x in leaves]).tolist()
    runs.append({"step": result.step, "losses": losses, "params": params})
print("RESULT " + json.dumps({"devices": jax.device_count(), "runs": runs}))
"""
)


def _train(devices: int, *jobs) -> list[dict]:
    """Trains ``jobs`` (config name, workdir, overrides) in turn in one process of
    ``devices`` devices; returns each run's ``step``, ``losses`` ({step: loss}) and
    ``params`` (flat)."""
    jobs = json.dumps([[name, str(workdir), o] for name, workdir, o in jobs])
    out = run_on_devices(_SCRIPT, jobs, devices=devices)
    assert out["devices"] == devices
    for run in out["runs"]:
        run["losses"] = {int(step): loss for step, loss in run["losses"].items()}
    return out["runs"]


def _prefix(workdir, data_dir, stop: int):
    extra = {"task.data_dir": str(data_dir), "train.stop_at_step": stop}
    return "prefix_sum", workdir, {**OVERRIDES["prefix_sum"], **extra}


def _lm(workdir, corpus, stop: int):
    extra = {"task.path": corpus, "train.stop_at_step": stop}
    return "lm_shakespeare", workdir, {**OVERRIDES["lm_shakespeare"], **extra}


def _write_corpus(path) -> str:
    lines = (
        "ROMEO: But soft, what light through yonder window breaks?",
        "JULIET: O Romeo, Romeo, wherefore art thou Romeo?",
        "FRIAR: These violent delights have violent ends.",
    )
    rng = np.random.default_rng(0)
    path.write_text("\n".join(lines[i] for i in rng.integers(0, 3, 120)) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The single-process runs, in three subprocesses (1, 8, then 1 device)."""
    tmp = tmp_path_factory.mktemp
    data, corpus = tmp("data"), _write_corpus(tmp("text") / "plays.txt")
    a1, b1, a8, b8, lm_a8, lm_b1 = (tmp(n) for n in ("a1", "b1", "a8", "b8", "lm_a8", "lm_b1"))
    first_1, ref_1 = _train(1, _prefix(a1, data, K), _prefix(b1, data, 2 * K))
    first_8, ref_8, from_1, lm_first_8 = _train(
        8,
        _prefix(a8, data, K),
        _prefix(b8, data, 2 * K),
        _prefix(a1, data, 2 * K),
        _lm(lm_a8, corpus, K),
    )
    lm_saved_8 = tmp("lm_saved_8")
    shutil.copytree(lm_a8, lm_saved_8, dirs_exist_ok=True)  # the 8-device checkpoint
    from_8, lm_ref_1, lm_from_8 = _train(
        1, _prefix(a8, data, 2 * K), _lm(lm_b1, corpus, 2 * K), _lm(lm_a8, corpus, 2 * K)
    )
    assert first_1["step"] == first_8["step"] == lm_first_8["step"] == K
    return {
        "8->1": (from_8, ref_1),
        "1->8": (from_1, ref_8),
        "lm 8->1": (lm_from_8, lm_ref_1),
        "lm saved on 8": (lm_saved_8, corpus, lm_first_8),
        "data": data,
    }


def _assert_continues(continued: dict, uninterrupted: dict, params_norm_rtol=None) -> None:
    """The continued run ends at 2K with the uninterrupted run's losses of steps
    K+1..2K and its parameters (elementwise, or in norm to ``params_norm_rtol``)."""
    assert continued["step"] == uninterrupted["step"] == 2 * K
    steps = list(range(1, 2 * K + 1))
    assert sorted(continued["losses"]) == sorted(uninterrupted["losses"]) == steps
    np.testing.assert_allclose(
        [continued["losses"][s] for s in steps[K:]],
        [uninterrupted["losses"][s] for s in steps[K:]],
        rtol=RTOL,
        atol=0,
    )
    got, want = np.asarray(continued["params"]), np.asarray(uninterrupted["params"])
    if params_norm_rtol is None:
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    else:
        assert np.linalg.norm(got - want) <= params_norm_rtol * np.linalg.norm(want)


def test_eight_devices_resume_on_one(runs):
    _assert_continues(*runs["8->1"])


def test_one_device_resumes_on_eight(runs):
    _assert_continues(*runs["1->8"])


def test_language_model_and_its_memory_resume_from_eight_devices_on_one(runs):
    _assert_continues(*runs["lm 8->1"], params_norm_rtol=LM_PARAMS_NORM_RTOL)


def test_language_model_saved_on_eight_devices_restores_for_sampling(runs):
    workdir, corpus, saved = runs["lm saved on 8"]
    config = make_config("lm_shakespeare", _lm(workdir, corpus, K)[2])
    _, variables, _, step = restore_language_model(config, str(workdir))
    assert step == K and jax.device_count() == 1
    leaves = jax.tree_util.tree_leaves(variables["params"])
    np.testing.assert_array_equal(np.concatenate([np.ravel(x) for x in leaves]), saved["params"])


@pytest.mark.slow
def test_two_processes_of_four_devices_resume_in_one_process_of_one(runs, tmp_path):
    """A checkpoint written by two processes of 4 devices each (8 in all), continued in
    one process of 1 device."""
    name, _, overrides = _prefix(tmp_path, runs["data"], K)
    args = ["--config", f"configs/{name}.py:smoke", "--workdir", str(tmp_path)]
    args += [f"--config.{key}={value}" for key, value in overrides.items()]
    cmd = [sys.executable, "-m", "launch.multiprocess", "--num_processes=2"]
    cmd += ["--devices_per_process=4", "--", *args]
    env = multiprocess.process_env(0)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "[1] PrefixSumDEQ: 1152 parameters, 8 device(s), starting from scratch" in proc.stdout
    (continued,) = _train(1, _prefix(tmp_path, runs["data"], 2 * K))
    _assert_continues(continued, runs["8->1"][1])


_SAVE_ON_EIGHT = """
import sys
import jax, jax.numpy as jnp
from deq_jax.training import sharding
from deq_jax.training.run.checkpoint import Checkpointer

ckpt = Checkpointer(sys.argv[1], every_steps=1, keep=2)
state = sharding.replicate({"w": jnp.arange(8.0)}, sharding.make_mesh())
ckpt.maybe_save(1, state)
ckpt.close()
print("RESULT " + str(jax.device_count()))
"""


def test_a_template_without_this_runs_shardings_is_refused_not_set_aside(tmp_path):
    """Orbax refuses an unsharded template for a checkpoint saved on other devices: that
    is the caller's mistake, said in one error, and the checkpoint is not moved aside as
    if it were damaged."""
    assert run_on_devices(_SAVE_ON_EIGHT, tmp_path, devices=8) == 8
    ckpt = Checkpointer(str(tmp_path), every_steps=1, keep=2)
    with pytest.raises(ValueError, match="saved on other devices.*this run's shardings"):
        ckpt.restore_or_init({"w": np.zeros(8, np.float32)})
    ckpt.close()
    assert saved_steps(str(tmp_path)) == [1]
    assert not os.path.exists(tmp_path / "checkpoints_unreadable")
