"""The neural solver on trained task models: LearnedInit in the DEQ, the least-squares
alpha ablation, FrozenDEQ targets, the hypersolver run, solver_pareto, alternating mode."""

import dataclasses
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deq_jax as dj
from configs import (
    digits,
    digits_hypersolver,
    lm_shakespeare_hypersolver,
    mazes_hypersolver,
    prefix_sum_hypersolver,
)
from deq_jax.neural_solver import hyper_anderson_init, hyper_anderson_step, init_neural_solver
from deq_jax.neural_solver.initializer import LearnedInit, make_initializer
from deq_jax.neural_solver.loss import neural_solver_loss
from deq_jax.solvers.anderson import anderson, anderson_weights
from deq_jax.training import train_and_evaluate
from deq_jax.training.families.setup import setup
from deq_jax.training.solver_fit.alternating import AlternatingSolver
from deq_jax.training.solver_fit.frozen_deq import FrozenDEQ, initializer_kind
from deq_jax.training.solver_fit.hypersolver import (
    TASKS,
    load_hypersolver,
    solver_family,
    train_hypersolver,
)
from deq_jax.training.solver_fit.language import LANGUAGE
from deq_jax.training.solver_fit.runs import compare
from deq_jax.training.solver_fit.spec import NeuralSolverSpec, SolverFit


def _affine(d=6, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    a = 0.6 * a / np.linalg.norm(a, 2)
    b = rng.normal(size=(d,))
    return jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)


def test_learned_init_is_hashable_and_maps_x_to_state():
    module = make_initializer("sequence", 4)
    params = module.init(jax.random.PRNGKey(0), jnp.ones((1, 5, 3)))
    params = jax.tree_util.tree_map(lambda p: p + 0.1, params)
    a, b = LearnedInit("sequence", 4, params), LearnedInit("sequence", 4, params)
    assert hash(a) == hash(b) and a == b
    z0 = a(jnp.ones((2, 5, 3)))
    chex.assert_shape(z0, (2, 5, 4))
    assert float(jnp.abs(z0).sum()) > 0
    with pytest.raises(ValueError, match="kind"):
        LearnedInit("graph", 4, params)


def test_deq_starts_at_a_callable_z_init():
    cell = dj.nn.MLPCell(features=3) if hasattr(dj.nn, "MLPCell") else None
    if cell is None:
        pytest.skip("no MLPCell")
    seen = []

    class Start:
        def __call__(self, x):
            seen.append(x.shape)
            return jnp.full(x.shape[:-1] + (3,), 0.5)

        def __hash__(self):
            return 1

    x = jnp.ones((2, 3))
    deq = dj.nn.DEQ(cell, z_init=Start(), solver=dj.solvers.anderson(max_iter=1))
    variables = deq.init(jax.random.PRNGKey(0), x, train=False)
    z, _ = deq.apply(variables, x, train=False)
    assert seen and seen[-1] == (2, 3)
    chex.assert_shape(z, (2, 3))
    with pytest.raises(ValueError, match="callable"):
        dj.nn.DEQ(cell, z_init="ones")


def test_least_squares_alpha_matches_anderson_weights():
    a, b = _affine()
    solver = init_neural_solver(jax.random.PRNGKey(0), (6,), m=3, alpha_mode="least_squares")
    z = jnp.zeros((2, 6))
    aux = hyper_anderson_init(z, 3, 6)
    gs = []
    for k in range(1, 4):
        fz = z @ a.T + b
        out = hyper_anderson_step(
            solver.net, solver.variables, aux, z, fz, jnp.int32(k), (6,), "mean", "least_squares"
        )
        gs.append(fz - z)
        aux, z = out.state, out.z_next
    g = jnp.stack(gs, axis=1)  # [B, 3, D], ring slots 0..2
    gram = jnp.einsum("bmd,bnd->bmn", g, g)
    valid = jnp.array([True, True, True, False])
    gram = jnp.pad(gram, ((0, 0), (0, 1), (0, 1)))
    expected = anderson_weights(gram, valid, 1e-4)
    # float32 solves of a 3x3 system with weights of size ~3: agree to ~1e-5 relative.
    chex.assert_trees_all_close(out.alpha, expected, rtol=1e-4, atol=1e-5)


def test_least_squares_alpha_solver_converges():
    a, b = _affine()
    solver = init_neural_solver(
        jax.random.PRNGKey(0), (6,), m=4, alpha_mode="least_squares", tol=1e-5, max_iter=60
    )
    sol = dj.fixed_point(lambda z, p: z @ p[0].T + p[1], jnp.zeros((3, 6)), (a, b), solver=solver)
    assert bool(jnp.all(sol.stats.converged))
    with pytest.raises(ValueError, match="alpha_mode"):
        init_neural_solver(jax.random.PRNGKey(0), (6,), alpha_mode="softmax")


def test_loss_without_initializer_starts_at_zero():
    a, b = _affine()
    solver = init_neural_solver(jax.random.PRNGKey(0), (6,))
    z_star = jnp.tile(jnp.linalg.solve(jnp.eye(6) - a, b)[None], (2, 1))
    params = {"solver": solver.variables, "init": None}
    f = lambda z, p: z @ p[0].T + p[1]
    loss, metrics = neural_solver_loss(
        params, solver, None, f, (a, b), jnp.ones((2, 6)), z_star, steps=3
    )
    assert jnp.isfinite(loss)
    chex.assert_trees_all_close(metrics["init"], jnp.mean(jnp.sum(z_star**2, -1)), rtol=1e-5)


def test_spec_validates_and_lists_keys():
    with pytest.raises(ValueError, match="unroll_steps"):
        NeuralSolverSpec.from_config({"unroll_step": 3})
    with pytest.raises(ValueError, match=">= 1"):
        NeuralSolverSpec(train_steps=0)
    with pytest.raises(ValueError, match="detached_steps"):
        NeuralSolverSpec(train_steps=10, detached_steps=11)
    # A fit of another length (a fine-tuning) detaches the same fraction of its steps.
    spec = NeuralSolverSpec(train_steps=1_500, detached_steps=1_200)
    assert [spec.detached_count(n) for n in (1_500, 50, 1)] == [1_200, 40, 1]
    assert NeuralSolverSpec(train_steps=300).detached_count(300) == 0
    # learn_beta=False fixes beta = 1, except for the least-squares ablation.
    fixed = NeuralSolverSpec(learn_beta=False)
    assert fixed.untrained_solver(jax.random.PRNGKey(0), (4,)).beta == 1.0
    assert fixed.untrained_solver(jax.random.PRNGKey(0), (4,), "least_squares").beta is None
    assert NeuralSolverSpec().untrained_solver(jax.random.PRNGKey(0), (4,)).beta is None
    assert initializer_kind((8, 8, 4)) == "image"
    with pytest.raises(ValueError, match="per-sample shape"):
        initializer_kind((2, 2, 2, 2))


@pytest.fixture(scope="module")
def trained_digits(tmp_path_factory):
    """A smoke-sized digits DEQ trained once for the tests below.

    They need its checkpoint and train time only, so the Jacobian regulariser, the
    spectral probe and the periodic evaluation are off (each compiles a program of its
    own; the regularised digits run is `test_training_jacobian.py`'s), and the final
    report runs at one budget."""
    workdir = str(tmp_path_factory.mktemp("digits_deq"))
    config = digits.get_config("smoke")
    config.regularizer.update(dict(jacobian_weight=0.0, spectral_every=0))
    config.eval.update(dict(every_steps=0, budget_multipliers=(1,)))
    train_and_evaluate(config, workdir, emit=lambda line: None)
    return workdir


def test_frozen_deq_targets_are_fixed_points(trained_digits):
    run = setup(digits.get_config("smoke"), trained_digits)
    run.checkpointer.close()
    frozen = FrozenDEQ(run.model, jax.device_get(run.state.variables()))
    batch = next(run.task.train_iterator(8))
    t = frozen.targets(batch)
    chex.assert_shape(t.z_star, (8, 8, 8, 8))
    chex.assert_shape(t.x, (8, 8, 8, 8))
    fz = frozen.f(t.z_star, t.args)
    rel = jnp.linalg.norm((fz - t.z_star).reshape(8, -1), axis=1) / jnp.linalg.norm(
        fz.reshape(8, -1), axis=1
    )
    assert float(jnp.max(rel)) < 1e-3
    np.testing.assert_allclose(t.rel_residual, rel, rtol=0.05, atol=1e-6)


@pytest.fixture(scope="module")
def hypersolver_run(trained_digits, tmp_path_factory):
    """The smoke hypersolver (and its ablations) fitted once on `trained_digits`, with
    ``beta`` fixed to one (the ablation with least-squares alpha still learns it)."""
    workdir = tmp_path_factory.mktemp("hypersolver")
    config = digits_hypersolver.get_config("smoke")
    config.neural_solver.deq_workdir = trained_digits
    config.neural_solver.learn_beta = False
    run = train_hypersolver(config, str(workdir), emit=lambda line: None)
    return config, workdir, run


def test_hypersolver_run_checkpoints_and_reloads(hypersolver_run):
    config, workdir, run = hypersolver_run
    lines = []
    report = json.load(open(workdir / "neural_solver.json"))
    assert report["solver_params"] > 0 and report["deq_params"] > 0
    assert set(report["eval"]) == {"anderson", "neural"}
    assert set(report["fit_seconds"]) == {"hyper_anderson", "no_init", "ls_alpha"}
    assert report["time_fraction"] is not None  # the DEQ run recorded train_seconds
    assert os.path.isdir(workdir / "ablations" / "ls_alpha" / "checkpoints")
    loaded = load_hypersolver(config, str(workdir), emit=lines.append)
    assert set(loaded.solvers) == {"hyper_anderson", "no_init", "ls_alpha"}
    solver, init = loaded.solvers["hyper_anderson"]
    assert solver == run.solvers["hyper_anderson"][0] and init == run.solvers["hyper_anderson"][1]
    assert loaded.solvers["no_init"][1] is None
    assert loaded.solvers["ls_alpha"][0].alpha_mode == "least_squares"
    assert solver.anderson_after == config.neural_solver.unroll_steps  # the Anderson tail
    assert solver.beta == loaded.solvers["no_init"][0].beta == 1.0
    assert loaded.solvers["ls_alpha"][0].beta is None


def test_spec_of_a_run_reads_its_budgets_from_deq():
    config = mazes_hypersolver.get_config()
    spec = NeuralSolverSpec.from_run_config(config)
    assert (spec.max_iter, spec.tol) == (config.deq.eval_max_iter, 1e-3)
    assert (spec.target_max_iter, spec.target_tol) == (80, 1e-6)
    assert spec.unroll_steps == config.neural_solver.unroll_steps == 20
    smoke = NeuralSolverSpec.from_run_config(mazes_hypersolver.get_config("smoke"))
    assert (smoke.max_iter, smoke.target_max_iter) == (6, 20)
    config.neural_solver.tol = 1e-2  # a config written for the old layout
    with pytest.raises(ValueError, match="neural_solver.tol has moved to config.deq.neural_solver"):
        NeuralSolverSpec.from_run_config(config)


def test_spec_anderson_tail_hands_over_after_the_trained_k():
    section = digits_hypersolver.get_config().neural_solver.to_dict()
    tailed = NeuralSolverSpec.from_config(section).untrained_solver(jax.random.PRNGKey(0), (4,))
    assert tailed.anderson_after == section["unroll_steps"] == 10  # the default
    learned = NeuralSolverSpec.from_config(dict(section, anderson_tail=False))
    assert learned.untrained_solver(jax.random.PRNGKey(0), (4,)).anderson_after is None
    previous = digits_hypersolver.get_config("previous").neural_solver
    assert previous.anderson_tail is False


def test_hypersolver_without_checkpoint_says_what_to_do(tmp_path):
    config = prefix_sum_hypersolver.get_config("smoke")
    config.neural_solver.deq_workdir = str(tmp_path / "empty")
    with pytest.raises(ValueError, match="No checkpoint in .*empty: train the DEQ there first"):
        train_hypersolver(config, str(tmp_path / "solver"), emit=lambda line: None)
    config.neural_solver.deq_workdir = ""
    with pytest.raises(ValueError, match="Set --config.neural_solver.deq_workdir"):
        train_hypersolver(config, str(tmp_path / "solver"), emit=lambda line: None)


def test_one_entry_point_fits_every_family(tmp_path):
    assert solver_family(prefix_sum_hypersolver.get_config("smoke")) is TASKS
    assert solver_family(digits_hypersolver.get_config("smoke")) is TASKS
    config = lm_shakespeare_hypersolver.get_config("smoke")
    assert solver_family(config) is LANGUAGE and LANGUAGE.twice_unroll
    config.neural_solver.deq_workdir = ""
    with pytest.raises(ValueError, match="workdir of a trained language model"):
        train_hypersolver(config, str(tmp_path / "solver"), emit=lambda line: None)


class _Frozen:
    """A stand-in `FrozenDEQ`: a model is the (solver, z_init) pair it would run."""

    def with_solver(self, solver, z_init="keep"):
        return solver, z_init


def test_compare_scores_each_solver_at_its_budget():
    spec = NeuralSolverSpec(tol=1e-2, max_iter=7, unroll_steps=3)
    fitted = SolverFit(solver="fitted", init=None, losses=np.zeros(1), seconds=0.0)
    scored = []

    def score(config, run, model, max_iter):
        scored.append((model, max_iter))
        return {"nstep_mean": np.float32(max_iter), "splits": {"test": jnp.ones(())}}

    family = dataclasses.replace(TASKS, score=score)
    out = compare(family, None, None, _Frozen(), fitted, spec)
    assert list(out) == ["anderson", "neural"]
    assert out["neural"] == {"nstep_mean": 7.0, "splits": {"test": 1.0}}
    assert type(out["neural"]["nstep_mean"]) is float  # JSON-ready
    assert scored == [((anderson(tol=1e-2, max_iter=7), "keep"), 7), (("fitted", "keep"), 7)]
    family = dataclasses.replace(family, twice_unroll=True)
    out = compare(family, None, None, _Frozen(), fitted, spec)
    assert out["neural_2K"]["nstep_mean"] == 6.0 and scored[-1] == (("fitted", "keep"), 6)


def test_solver_pareto_writes_curves_and_summary(hypersolver_run):
    from experiments.neural_solver.pareto import run_pareto, solver_lineup

    config, workdir, _ = hypersolver_run
    hyper = load_hypersolver(config, str(workdir), emit=lambda line: None)
    assert set(solver_lineup(hyper)) == {  # the classic solvers, the neural one, its ablations
        "anderson",
        "broyden",
        "fixed_point_iteration",
        "hyper_anderson",
        "hyper_anderson_no_tail",
        "init_only",
        "no_init",
        "ls_alpha",
    }
    # The sweep of a few of them (every one compiles its solves: the whole lineup doubles
    # this test's time without testing more of the sweep).
    swept = ("anderson", "hyper_anderson", "init_only")
    report = run_pareto(
        config,
        str(workdir),
        budgets=(1, 3),
        repeats=1,
        max_batches=1,
        solvers=swept,
        emit=lambda line: None,
    )
    assert set(report["table"]) == set(swept)
    for rows in report["table"].values():
        assert [r["budget"] for r in sorted(rows, key=lambda r: r["budget"])] == [1, 3]
        assert all(r["seconds"] > 0 and np.isfinite(r["rel_residual"]) for r in rows)
    curve = report["residual_curves"]["hyper_anderson"]
    assert len(curve) == max(3, 4 * report["unroll_steps"])
    assert report["summary"]["anderson"]["speedup_metric_vs_anderson"] == 1.0
    assert os.path.exists(workdir / "solver_pareto.png")
    # Some solvers only, on every batch of the split (max_batches=0).
    report = run_pareto(
        config,
        str(workdir),
        budgets=(2,),
        repeats=1,
        max_batches=0,
        solvers=("anderson", "hyper_anderson"),
        emit=lambda line: None,
    )
    assert set(report["table"]) == {"anderson", "hyper_anderson"}
    assert report["summary"]["hyper_anderson"]["evals_ratio_metric_vs_anderson"] in (None, 1.0)
    # The classic solvers' metrics reused from that sweep, only timed again.
    earlier = workdir / "earlier.json"
    os.replace(workdir / "solver_pareto.json", earlier)
    again = dict(budgets=(2,), repeats=1, max_batches=0, emit=lambda line: None)
    reused = run_pareto(config, str(workdir), reuse_classic=str(earlier), **again)
    assert reused["table"]["anderson"][0]["accuracy"] == report["table"]["anderson"][0]["accuracy"]
    assert reused["reused_classic"] == str(earlier) and "broyden" in reused["table"]
    with pytest.raises(ValueError, match="swept max_batches=0, not 1: it cannot be reused"):
        run_pareto(config, str(workdir), reuse_classic=str(earlier), **dict(again, max_batches=1))
    with pytest.raises(ValueError, match="Unknown solvers \\['newton'\\]; the lineup: anderson"):
        run_pareto(config, str(workdir), budgets=(2,), solvers=("newton",), emit=print)


def test_diagnose_unrolls_the_solvers_on_the_fits_and_held_out_batches(hypersolver_run):
    from experiments.neural_solver.diagnose import diagnose

    config, workdir, _ = hypersolver_run
    lines = []
    report = diagnose(config, str(workdir), batches=2, emit=lines.append)
    k = report["unroll_steps"]
    assert report["steps"] == 2 * k
    for where in ("fit", "held_out"):
        part = report[where]
        assert part["examples"] == 2 * config.neural_solver.batch_size
        for name in ("hyper_anderson", "anderson_from_init", "anderson_from_zero"):
            assert len(part[name]) == 2 * k + 1 and all(np.isfinite(part[name]))
        # The same start: the learned solver and Anderson from h(x) share step 0.
        assert part["hyper_anderson"][0] == pytest.approx(part["anderson_from_init"][0])
        assert part["beta"] == pytest.approx([1.0] * 2 * k)  # the fixture fixes beta
    shares = report["fit"]["loss_share"]
    assert len(shares) == k and sum(shares) == pytest.approx(1.0)
    assert len(lines) == 2 * k + 6 and lines[-1].startswith("Wrote")  # restored, 2 + 2K + 1, 2
    assert os.path.exists(workdir / "diagnose.png")


def test_alternating_schedule():
    spec = NeuralSolverSpec(alternating=True, alt_warmup_steps=4, alt_deq_steps=3)
    alt = AlternatingSolver.__new__(AlternatingSolver)
    alt.spec = spec
    due = [s for s in range(1, 15) if alt.due(s, start=0)]
    assert due == [5, 8, 11, 14]
    assert alt.due(7, start=6)  # a resumed run refits at once past the warm-up
    assert not alt.due(3, start=2)


@pytest.mark.slow
def test_alternating_training_fits_and_fine_tunes(tmp_path):
    config = digits.get_config("smoke")
    config.train.steps = 6
    ns = config.neural_solver
    ns.alternating, ns.alt_warmup_steps, ns.alt_deq_steps = True, 2, 2
    ns.train_steps, ns.alt_finetune_steps, ns.batch_size, ns.target_batches = 2, 1, 8, 1
    ns.hidden = 8
    lines = []
    result = train_and_evaluate(config, str(tmp_path), emit=lines.append)
    assert sum("neural solver fitted" in line for line in lines) == 1
    assert sum("neural solver fine-tuned" in line for line in lines) == 1
    assert result.step == 6
    chex.assert_tree_all_finite(result.state.params)
