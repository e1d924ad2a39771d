"""Stopping a solve when its read-out answer settles: the loop rule, `solve_until_settled`,
`analysis.settled_apply` on a whole model, and the evaluator's ``settle_patience``."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from configs import prefix_sum
from deq_jax import analysis
from deq_jax.fixed_point import solve_until_settled
from deq_jax.solvers import iterate
from deq_jax.training.run import build

BUDGET = 20  # the smoke model's eval budget is smaller
B = jnp.array([[1.0, -2.0], [3.0, 0.5]])


def _halving(z, b):
    return 0.5 * z + b


def test_known_answer_with_plain_iteration():
    """``z_k = 2b (1 - 2^(1-k))``: rounded, sample 0 reads (0, 0), (1, -2), (2, -3),
    (2, -4) from k = 4 on; sample 1's first coordinate settles at 6 from k = 5."""
    solver = dj.solvers.fixed_point_iteration(tol=1e-8, max_iter=60)
    sol = solve_until_settled(
        _halving, jnp.zeros_like(B), B, solver=solver, readout=jnp.round, patience=2
    )
    np.testing.assert_array_equal(sol.stats.nstep, [6, 7])
    assert bool(sol.stats.converged.all())
    # returned where it stopped: the 6th and 7th iterates
    expected = np.stack([2 * B[0] * (1 - 2.0**-5), 2 * B[1] * (1 - 2.0**-6)])
    np.testing.assert_allclose(sol.value, expected, rtol=1e-6)
    np.testing.assert_array_equal(jnp.round(sol.value), [[2, -4], [6, 1]])
    # patience 1 stops one evaluation earlier on each sample
    one = solve_until_settled(
        _halving, jnp.zeros_like(B), B, solver=solver, readout=jnp.round, patience=1
    )
    np.testing.assert_array_equal(one.stats.nstep, [5, 6])


def test_residual_rule_still_stops_first():
    """A readout that never settles leaves the solve as `fixed_point` does it."""
    w, x = tanh_problem(jax.random.PRNGKey(0), batch=5, d=8)
    solver = dj.solvers.anderson(tol=1e-5, max_iter=40)
    z0 = jnp.zeros_like(x)
    plain = dj.fixed_point(tanh_cell, z0, (w, x), solver=solver)
    counter = lambda z: z * 1e6  # changes at every step until converged
    sol = solve_until_settled(tanh_cell, z0, (w, x), solver=solver, readout=counter, patience=3)
    np.testing.assert_array_equal(sol.stats.nstep, plain.stats.nstep)
    np.testing.assert_allclose(sol.value, plain.value, atol=1e-6)


@pytest.mark.parametrize("loop", ["while", "scan", "python"])
def test_loops_agree(loop):
    solver = dj.solvers.fixed_point_iteration(tol=1e-8, max_iter=20)
    z, stats = iterate(
        solver, lambda z: _halving(z, B), jnp.zeros_like(B), loop, readout=jnp.round, patience=2
    )
    np.testing.assert_array_equal(stats.nstep, [6, 7])
    np.testing.assert_array_equal(jnp.round(z), [[2, -4], [6, 1]])


def test_pytree_state_unbatched_and_no_gradient():
    solver = dj.solvers.anderson(tol=1e-9, max_iter=50)
    f = lambda z, b: {"a": 0.5 * z["a"] + b, "c": 0.5 * z["c"]}
    z0 = {"a": jnp.zeros(2), "c": jnp.ones(3)}
    sol = solve_until_settled(
        f, z0, B[0], solver=solver, readout=lambda z: jnp.round(z["a"]), patience=2, batched=False
    )
    assert sol.stats.nstep.shape == () and bool(sol.stats.converged)
    np.testing.assert_array_equal(jnp.round(sol.value["a"]), [2, -4])
    grad = jax.jit(  # one program, not each op compiled eagerly
        jax.grad(
            lambda b: solve_until_settled(
                _halving, jnp.zeros_like(B), b, solver=solver, readout=jnp.round
            ).value.sum()
        )
    )(B)
    np.testing.assert_array_equal(grad, 0.0)  # forward only: detached, and no error


def test_errors():
    solver = dj.solvers.anderson()
    with pytest.raises(ValueError, match="patience must be an integer >= 1"):
        solve_until_settled(
            _halving, jnp.zeros_like(B), B, solver=solver, readout=jnp.round, patience=0
        )
    with pytest.raises(TypeError, match="deq_jax Solver"):
        solve_until_settled(_halving, jnp.zeros_like(B), B, solver="anderson", readout=jnp.round)
    with pytest.raises(ValueError, match="structure, shapes and dtypes"):
        solve_until_settled(
            lambda z, b: z[:, :1], jnp.zeros_like(B), B, solver=solver, readout=jnp.round
        )


@pytest.fixture(scope="module")
def smoke_model():
    config = prefix_sum.get_config("smoke")
    config.deq.z_init = "mixed"
    config.deq.solver.tol = 1e-6
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    x = jax.random.bernoulli(jax.random.key(0), 0.5, (8, 16, 1)).astype(jnp.float32)
    variables = model.init({"params": jax.random.key(1), "z0": jax.random.key(2)}, x, train=False)
    return model, variables, x


def _expected_stops(answers, residual_nstep, patience: int):
    """Per sample, the evaluation at which the answer has repeated ``patience`` times in
    a row, or the residual stop if that comes first (a plain reading of the rule), and
    whether the answer rule stopped it."""
    stops, settled = [], []
    for seq, limit in zip(answers, residual_nstep, strict=True):
        stop, run = int(limit), 0
        for k in range(1, int(limit)):
            run = run + 1 if np.array_equal(seq[k], seq[k - 1]) else 0
            if run >= patience:
                stop = k + 1
                break
        stops.append(stop)
        settled.append(run >= patience)
    return np.asarray(stops), np.asarray(settled)


@pytest.mark.parametrize("patience", [1, 3])
def test_settled_apply_matches_a_replay_of_the_solve(smoke_model, patience):
    model, variables, x = smoke_model
    rngs = {"z0": jax.random.key(3)}
    call = analysis.deq_call(model, variables, x, rngs=rngs, max_iter=BUDGET)
    p = call.problem
    answers = analysis.solver_trajectory(
        p.f,
        p.z0,
        p.args,
        solver=p.solver,
        observe=lambda z, fz: analysis.outputs_at(model, variables, x, z).argmax(-1),
    )
    plain = np.asarray(call.stats.nstep)
    expected, settled = _expected_stops(np.asarray(answers), plain, patience)
    assert np.any(expected < plain)  # the rule does stop some early
    outputs, stats = analysis.settled_apply(
        model, variables, x, patience=patience, max_iter=BUDGET, rngs=rngs
    )
    np.testing.assert_array_equal(stats.nstep, expected)
    np.testing.assert_array_equal(stats.converged, settled | np.asarray(call.stats.converged))
    # the outputs are read out where each sample stopped
    at_stop = np.asarray(answers)[np.arange(len(expected)), expected - 1]
    np.testing.assert_array_equal(np.asarray(outputs).argmax(-1), at_stop)


def test_settled_apply_with_a_long_patience_is_the_plain_call(smoke_model):
    model, variables, x = smoke_model
    rngs = {"z0": jax.random.key(3)}
    outputs, stats = model.apply(variables, x, train=False, rngs=rngs, max_iter=7)
    s_outputs, s_stats = analysis.settled_apply(
        model, variables, x, patience=50, max_iter=7, rngs=rngs
    )
    np.testing.assert_array_equal(s_stats.nstep, stats.nstep)
    np.testing.assert_allclose(s_outputs, outputs, atol=1e-6)


class _NoDEQ(nn.Module):
    """A model returning ``(outputs, stats)`` without a DEQ."""

    @nn.compact
    def __call__(self, x, *, train):
        del train
        return nn.Dense(2)(x), None


def test_settled_apply_needs_a_deq():
    model, x = _NoDEQ(), jnp.ones((2, 3))
    variables = model.init(jax.random.key(0), x, train=False)
    with pytest.raises(ValueError, match="called no deq_jax.nn.DEQ"):
        analysis.settled_apply(model, variables, x)
    outputs, stats = analysis.settled_apply(model, variables, x, strict=False)  # as usual
    np.testing.assert_allclose(outputs, model.apply(variables, x, train=False)[0])
    assert stats is None


def test_evaluator_with_settle_patience(tmp_path):
    """The eval step's answer stop: fewer steps than the residual stop, the same
    metrics with a patience longer than the budget, and clear errors."""
    from deq_jax.training import Evaluator, SettleRule, make_eval_step, setup

    config = prefix_sum.get_config("smoke")
    config.deq.solver.tol = 1e-6  # the residual stop alone runs to the budget
    run = setup(config, str(tmp_path))
    run.checkpointer.close()
    split = run.task.eval_splits[0]
    evaluate = lambda p: Evaluator(
        run.model, run.task, run.mesh, config.eval.batch_size, settle=SettleRule(p)
    ).evaluate(run.state, split, max_iter=BUDGET)
    plain, settled, patient = evaluate(0), evaluate(1), evaluate(BUDGET)
    assert settled.keys() == plain.keys()
    assert settled["nstep_mean"] < plain["nstep_mean"]
    assert settled["converged"] >= plain["converged"]
    for key in ("loss", "nstep_mean", "nstep_max"):
        assert patient[key] == pytest.approx(plain[key], rel=1e-5)
    with pytest.raises(ValueError, match="settle_patience must be an integer >= 0"):
        SettleRule(-1)
    with pytest.raises(ValueError, match="settle_tol must be >= 0"):
        SettleRule.from_config({"settle_patience": 2, "settle_tol": -1.0})
    with pytest.raises(ValueError, match="no discrete answer"):
        make_eval_step(run.model, run.task.metrics, run.mesh, regression=True, settle=SettleRule(2))


@pytest.mark.slow
def test_training_evaluates_with_the_configured_patience(tmp_path):
    from deq_jax.training import Evaluator, SettleRule, restore_trained, train_and_evaluate
    from deq_jax.training.run.selection import restore_selected

    config = prefix_sum.get_config("smoke")
    config.deq.solver.tol = 1e-6
    config.deq.settle_patience = 1
    result = train_and_evaluate(config, str(tmp_path), emit=lambda line: None)
    run = restore_trained(config, str(tmp_path), "to check")
    # The final report scores the checkpoint chosen on validation, not the last one.
    state, _, _ = restore_selected(str(tmp_path), run.state, run.start_step)
    split = run.task.eval_splits[0]
    budget = config.deq.train_max_iter
    for patience in (0, 1):
        metrics = Evaluator(
            run.model, run.task, run.mesh, config.eval.batch_size, settle=SettleRule(patience)
        ).evaluate(state, split, max_iter=budget)
        same = metrics["nstep_mean"] == pytest.approx(result.report["1x"][split]["nstep_mean"])
        assert same == (patience == 1)
