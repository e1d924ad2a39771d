"""The solver benchmarks' problems and the per-step cost launcher."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_module

from launch.solver_problems import make_problem


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


def test_solver_step_cost_prints_one_ratio_per_solver():
    # A subprocess: the launch defines absl flags, which other launches imported by the
    # suite also define (the tests import only the flag-free launch.solver_problems).
    proc = run_module(
        "launch.solver_step_cost", "--width=8", "--batch=2", "--steps=4", "--repeats=1"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(rows) == 7 and rows[0]["solver"] == "fixed_point_iteration"
    assert "fallback(anderson, broyden)" in [r["solver"] for r in rows]
    assert rows[0]["wall_ratio"] == rows[0]["cpu_ratio"] == 1.0
    for r in rows:
        assert r["wall_us"] > 0 and r["cpu_us"] > 0
        np.testing.assert_allclose(r["wall_ratio"], r["wall_us"] / rows[0]["wall_us"])
