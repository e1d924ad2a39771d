"""The solver benchmarks' problems and the per-step cost launcher."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_module

from benchmarks import solver_problems
from benchmarks.solver_problems import make_problem


def test_norm_problem_scales_the_easy_draw():
    w_easy, inj_easy = make_problem("easy", 16, 4, seed=0)
    w, inj = make_problem("norm2.5", 16, 4, seed=0)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(w), 2), 2.5, rtol=1e-5)
    np.testing.assert_allclose(w * 0.9 / 2.5, w_easy, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(inj, inj_easy)
    w_other_seed, _ = make_problem("norm2.5", 16, 4, seed=1)
    assert not jnp.allclose(w, w_other_seed)


@pytest.mark.parametrize(
    "name, message",
    [("norm", "Bad problem name 'norm'.*e.g. norm2.5"), ("medium", "Valid problems: easy, hard")],
)
def test_unknown_problem_names(name, message):
    with pytest.raises(ValueError, match=message):
        make_problem(name, 8, 2, seed=0)


def test_over_active_prices_each_part_by_its_own_runs():
    # 10 steps: 3 at part a's cost, 7 at b's; per round a = 10, b = 20 per 10 steps
    # (1 and 2 per step): active 3 * 1 + 7 * 2 = 17; rounds 17, 34, 18.7 -> 1.0, 2.0, 1.1
    times = {"a": [10.0, 10.0, 10.0], "b": [20.0, 20.0, 20.0], "c": [17.0, 34.0, 18.7]}
    got = solver_problems.over_active(times, "c", {"a": 3, "b": None}, steps=10)
    np.testing.assert_allclose(got, 1.1)
    # a drifting load: both the part and the composed run twice as slow in round 2
    times = {"b": [20.0, 40.0, 20.0], "c": [21.0, 42.0, 22.0]}
    np.testing.assert_allclose(solver_problems.over_active(times, "c", {"b": None}, 10), 1.05)


def test_solver_step_cost_prints_one_ratio_per_solver():
    # A subprocess: the launch defines absl flags, which other launches imported by the
    # suite also define (the tests import only the flag-free benchmarks.solver_problems).
    proc = run_module(
        "benchmarks.solver_step_cost", "--width=8", "--batch=2", "--steps=4", "--repeats=1"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(rows) == 9 and rows[0]["solver"] == "fixed_point_iteration"
    assert "fallback(anderson, broyden)" in [r["solver"] for r in rows]
    priced = [r["solver"] for r in rows if "cpu_over_active" in r]
    assert priced == [
        "sequence(fixed_point_iteration:3, anderson)",
        "fallback(anderson, broyden), no switch",
        "restart(anderson), no restart",
    ]
    assert rows[0]["wall_ratio"] == rows[0]["cpu_ratio"] == 1.0
    for r in rows:
        assert r["wall_us"] > 0 and r["cpu_us"] > 0
        np.testing.assert_allclose(r["wall_ratio"], r["wall_us"] / rows[0]["wall_us"])


def test_branch_cost_times_conv_gradients_and_both_jacobian_draws(tmp_path):
    # The prefix-sum smoke model: the cheapest conv DEQ to compile twice (the maze one
    # took 60 s here, this 47 s); both draws' results agree in test_training_jacobian.
    proc = run_module(
        "benchmarks.branch_cost",
        "--config",
        "configs/prefix_sum.py:smoke",
        "--config.regularizer.jacobian_weight=0.1",
        "--config.regularizer.jacobian_freq=0.5",
        f"--workdir={tmp_path}",
        "--shape=2,5,5,4",
        "--repeats=1",
        "--budget=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "branch_cost.json").read_text())
    assert report["shape"] == [2, 5, 5, 4]
    assert set(report["conv_gradient_ms"]) == {"lax", "deq_jax"}
    for ms in report["conv_gradient_ms"].values():
        assert set(ms) == {"plain", "in_cond", "in_scan"} and all(v > 0 for v in ms.values())
    assert set(report["train_step_seconds"]) == {"masked", "cond"}
    assert all(v > 0 for v in report["train_step_seconds"].values())
    assert "lax.cond" in proc.stdout


def test_conv_cost_times_both_derivatives_train_steps_and_spectral_steps(tmp_path):
    # the prefix-sum smoke model: 1-d convolutions, the cheapest conv DEQ to compile
    proc = run_module(
        "benchmarks.conv_cost",
        "--config",
        "configs/prefix_sum.py:smoke",
        f"--workdir={tmp_path}",
        "--shapes=2,5,5,3,4",
        "--loop_steps=2",
        "--repeats=1",
        "--step_budget=2",
        "--spectral_iters=2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "conv_cost.json").read_text())
    ms = report["convolutions"]["2,5,5,3,4"]
    assert set(ms) == {"lax", "deq_jax"}
    for times in ms.values():
        assert set(times) == {"forward", "input_vjp_in_loop", "weight_vjp"}
        assert all(t > 0 for t in times.values())
    step = report["train_step"]
    assert step["budget"] == 2 and step["backward"] == "ift"
    assert all(step[k]["train_seconds"] > 0 and step[k]["temp_bytes"] > 0 for k in ms)
    assert all(step[k]["spectral_seconds"] > 0 for k in ms)
    assert "train step (batch" in proc.stdout
    assert "spectral radius (2 power iterations)" in proc.stdout


def test_conv_cost_times_lax_with_the_fast_path_off():
    import jax

    from benchmarks import conv_cost
    from deq_jax.nn import conv as conv_lib

    x, w = jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 2))
    conv = lambda x: conv_lib.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    traced = lambda: str(jax.make_jaxpr(lambda x: conv(x))(x))  # a new function: no cache
    assert "custom_jvp_call" in traced()
    with conv_cost.lax_derivatives():
        assert "custom_jvp_call" not in traced()
    assert "custom_jvp_call" in traced()
