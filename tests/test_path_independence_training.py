"""Path-independence interventions in training and the whole-model analysis tools."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import prefix_sum
from deq_jax import analysis, solvers
from deq_jax.nn import DEQ, MLPCell
from deq_jax.regularizers import Alignment
from deq_jax.training import PathIndependence, train_and_evaluate
from deq_jax.training.run import build
from deq_jax.training.run.writers import read_metrics


def test_budgets_are_evenly_spaced_and_validated():
    assert PathIndependence().budgets == ()
    assert PathIndependence(budget_min=10, budget_max=40, budget_choices=4).budgets == (
        10,
        20,
        30,
        40,
    )
    assert PathIndependence(budget_min=3, budget_max=4, budget_choices=5).budgets == (3, 4)
    with pytest.raises(ValueError, match="budget_min <= budget_max"):
        PathIndependence(budget_min=5, budget_max=4)
    with pytest.raises(ValueError, match="alignment_weight"):
        PathIndependence(alignment_weight=-1.0)
    with pytest.raises(ValueError, match="Valid keys"):
        PathIndependence.from_config({"budget": 3})


def test_draw_budget_covers_every_choice():
    pi = PathIndependence(budget_min=2, budget_max=8, budget_choices=3)
    draws = {int(pi.draw_budget(k)) for k in jax.random.split(jax.random.key(0), 64)}
    assert draws == {0, 1, 2}


def _toy_model():
    return DEQ(MLPCell(features=4), solver=solvers.anderson(tol=1e-6, max_iter=40))


def test_problem_reproduces_the_forward_solve():
    model = _toy_model()
    x = jax.random.normal(jax.random.key(0), (5, 3))
    variables = model.init(jax.random.key(1), x, train=False)
    z_star, _ = model.apply(variables, x, train=False)
    problem = model.apply(variables, x, train=False, method=DEQ.problem)
    from deq_jax import fixed_point

    again = fixed_point(problem.f, problem.z0, problem.args, solver=problem.solver).value
    np.testing.assert_allclose(again, z_star, atol=1e-6)
    assert problem.solver.max_iter == 40


def test_alignment_term_is_sown_and_differentiable():
    model = DEQ(
        MLPCell(features=4),
        solver=solvers.anderson(tol=1e-5, max_iter=40),
        terms=(Alignment(),),
    )
    x = jax.random.normal(jax.random.key(0), (5, 3))
    variables = jax.jit(lambda x: model.init(jax.random.key(1), x, train=False))(x)

    @jax.jit  # one program for the term and its gradient, not each op compiled eagerly
    def penalty(params):
        _, state = model.apply(
            {"params": params},
            x,
            train=True,
            rngs={"z0": jax.random.key(2)},
            mutable=["intermediates"],
        )
        (term,) = state["intermediates"]["alignment_term"]
        return term

    term = penalty(variables["params"])
    assert term.shape == (5,)
    # A contractive cell reaches the same fixed point from any start: no penalty.
    np.testing.assert_allclose(term, 0.0, atol=1e-4)
    grads = jax.grad(lambda p: penalty(p).sum())(variables["params"])
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))
    with pytest.raises(ValueError, match="'z0' rng"):
        model.apply(variables, x, train=True, mutable=["intermediates"])


@pytest.fixture(scope="module")
def smoke_model():
    config = prefix_sum.get_config("smoke")
    config.deq.z_init = "mixed"
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    x = jax.random.bernoulli(jax.random.key(0), 0.5, (6, 16, 1)).astype(jnp.float32)
    variables = model.init({"params": jax.random.key(1), "z0": jax.random.key(2)}, x, train=False)
    return model, variables, x


def test_deq_call_captures_the_fixed_point_and_readout(smoke_model):
    model, variables, x = smoke_model
    rngs = {"z0": jax.random.key(3)}
    call = analysis.deq_call(model, variables, x, rngs=rngs)
    outputs, stats = model.apply(variables, x, train=False, rngs=rngs)
    np.testing.assert_allclose(call.outputs, outputs)
    np.testing.assert_array_equal(call.stats.nstep, stats.nstep)
    assert call.z_star.shape == (6, 16, 8)
    np.testing.assert_allclose(analysis.outputs_at(model, variables, x, call.z_star), outputs)
    short = analysis.deq_call(model, variables, x, max_iter=2, rngs=rngs)
    assert int(short.stats.nstep.max()) <= 2 and short.problem.solver.max_iter == 2


def test_model_aa_score_matches_the_cell_level_score(smoke_model):
    model, variables, x = smoke_model
    key, rngs = jax.random.key(4), {"z0": jax.random.key(3)}
    mean, per = analysis.model_aa_score(model, variables, x, key=key, rngs=rngs)
    p = analysis.deq_call(model, variables, x, rngs=rngs).problem
    ref_mean, ref_per = analysis.aa_score(p.f, p.z0, p.args, solver=p.solver, key=key)
    np.testing.assert_allclose(per, ref_per, atol=1e-5)
    assert per.shape == (6,) and abs(float(mean) - float(ref_mean)) < 1e-5


def test_model_adversarial_aa_reads_out_attacked_fixed_points(smoke_model):
    model, variables, x = smoke_model
    rngs = {"z0": jax.random.key(3)}
    attack, outputs = analysis.model_adversarial_aa(
        model, variables, x, key=jax.random.key(5), rngs=rngs, steps=4, restarts=1, lbfgs_iters=2
    )
    assert outputs.shape == (6, 16, 2) and attack.per_instance.shape == (6,)
    expected = analysis.outputs_at(model, variables, x, attack.fixed_points)
    np.testing.assert_allclose(outputs, expected)


def test_train_with_random_budget_and_alignment(tmp_path):
    config = prefix_sum.get_config("smoke")
    config.deq.z_init = "normal"
    config.path_independence.budget_min = 2
    config.path_independence.budget_max = 6
    config.path_independence.budget_choices = 3
    config.path_independence.alignment_weight = 0.5
    config.log.every_steps = 1
    # Only the training metrics are checked: no periodic evaluation, a one-length,
    # one-budget final report (each length and budget compiles an eval program).
    config.eval.update(dict(every_steps=0, budget_multipliers=(1,), report_max_batches=1))
    config.task.test_lengths = (16,)
    train_and_evaluate(config, str(tmp_path), emit=lambda line: None)
    train = [m for m in read_metrics(str(tmp_path)) if "train_budget" in m]
    assert train and all(m["train_budget"] in (2.0, 4.0, 6.0) for m in train)
    assert all(np.isfinite(m["alignment_term"]) and m["alignment_term"] >= 0 for m in train)
    assert all(m["nstep_max"] <= m["train_budget"] for m in train)
