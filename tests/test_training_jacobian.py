"""The Jacobian regulariser in training, regression support and the issue-4 models."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default, digits, synthetic_1d
from deq_jax import models
from deq_jax.nn import DEQ, DEQSpec, MLPCell
from deq_jax.regularizers import Alignment, JacobianTerm, SpectralHinge, SpectralRadius
from deq_jax.training import (
    JacobianRegularizer,
    make_spectral_step,
    make_train_step,
    regression_loss,
    setup,
    train_and_evaluate,
)
from deq_jax.training.families.evaluate import device_batch
from deq_jax.training.families.metrics import is_regression
from deq_jax.training.run import sharding, writers
from experiments.jacobian import plots as jacobian_plots
from experiments.jacobian import report as jacobian_report

quiet = lambda line: None

BACKWARD_KEYS = (
    "bwd_nstep_mean",
    "bwd_nstep_max",
    "bwd_abs_residual_max",
    "bwd_converged_fraction",
)


def test_unknown_regularizer_key_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"gama.*Valid keys: jacobian_weight, .*jacobian_freq"):
        JacobianRegularizer.from_config({"gama": 1.0})


@pytest.mark.parametrize(
    "field, value",
    [
        ("jacobian_weight", -1.0),
        ("jacobian_freq", 1.5),
        ("jacobian_samples", 0),
        ("jacobian_stop_step", -1),
        ("spectral_weight", -1.0),
        ("spectral_target", 0.0),
        ("spectral_penalty_iters", 0),
    ],
)
def test_bad_regularizer_values(field, value):
    with pytest.raises(ValueError, match=field):
        JacobianRegularizer(**{field: value})


def test_default_config_has_the_regularizer_off():
    reg = JacobianRegularizer.from_config(default.get_config().regularizer)
    assert not reg.enabled
    assert JacobianRegularizer(jacobian_weight=1.0).enabled
    assert not JacobianRegularizer(jacobian_weight=1.0, jacobian_freq=0.0).enabled
    assert not reg.spectral_enabled and JacobianRegularizer(spectral_weight=1.0).spectral_enabled


def test_spectral_hinge():
    reg = JacobianRegularizer(spectral_weight=1.0, spectral_target=0.9, spectral_penalty_iters=4)
    (hinge,) = reg.spectral_terms()
    assert hinge == SpectralHinge(iters=4, target=0.9, weight=1.0)
    assert JacobianRegularizer().spectral_terms() == ()
    # On f(z) = A z with A = diag(rho): the estimate is rho, the hinge (rho - 0.9)^2.
    rho = jnp.array([0.5, 0.9, 1.2])
    f = lambda z, a: z * a[:, None]
    z = jnp.ones((3, 4))
    got = hinge(f, z, rho, jax.random.key(0), resolve=None)
    np.testing.assert_allclose(got["spectral_estimate"], rho, rtol=1e-5)
    np.testing.assert_allclose(got["spectral_hinge"], [0, 0, 0.09], rtol=1e-4, atol=1e-7)


def test_linear_weight_schedule():
    reg = JacobianRegularizer(
        jacobian_weight=4.0, jacobian_weight_start=1.0, jacobian_weight_steps=10
    )
    term = reg.jacobian_term()
    assert term == JacobianTerm(samples=1, weight=4.0, weight_start=1.0, weight_steps=10)
    got = [float(term.weight_at(jnp.asarray(t))) for t in (0, 5, 10, 20)]
    np.testing.assert_allclose(got, [1.0, 2.5, 4.0, 4.0])
    constant = JacobianRegularizer(jacobian_weight=2.0).jacobian_term()
    assert float(constant.weight_at(jnp.asarray(0))) == 2.0
    assert JacobianRegularizer().jacobian_term() is None


def test_stop_step_ends_the_term():
    reg = JacobianRegularizer(jacobian_weight=2.0, jacobian_weight_steps=4, jacobian_stop_step=6)
    assert reg.drawn and not JacobianRegularizer(jacobian_weight=2.0).drawn
    got = [float(reg.weight_at(jnp.asarray(t))) for t in (0, 2, 5, 6, 9)]
    np.testing.assert_allclose(got, [0.0, 1.0, 2.0, 0.0, 0.0])
    key = jax.random.key(0)
    assert [bool(reg.draw(key, jnp.asarray(t))) for t in (0, 5, 6, 7)] == [1, 1, 0, 0]
    assert float(JacobianRegularizer().weight_at(jnp.asarray(3))) == 0.0
    # p < 1 and a stop: the Bernoulli draw before the stop, nothing after it.
    half = JacobianRegularizer(jacobian_weight=1.0, jacobian_freq=0.5, jacobian_stop_step=50)
    keys = jax.random.split(key, 200)
    draws = np.array([bool(half.draw(k, jnp.asarray(t))) for t, k in enumerate(keys)])
    assert 10 < draws[:50].sum() < 40 and not draws[50:].any()


def test_terms_are_checked():
    with pytest.raises(ValueError, match="share a name"):
        DEQSpec(terms=(JacobianTerm(), JacobianTerm(samples=2)))
    with pytest.raises(TypeError, match="Term objects"):
        DEQSpec(terms=("jacobian",))
    with pytest.raises(ValueError, match="weight must be 0"):
        SpectralRadius(weight=1.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        Alignment(weight=-1.0)


def test_regression_loss_ignores_padding():
    out = jnp.array([[1.0], [2.0], [100.0]])
    target = jnp.array([[0.0], [0.0], [0.0]])
    mask = jnp.array([True, True, False])
    assert float(regression_loss(out, target, mask)) == pytest.approx(2.5)


def test_deq_sows_the_jacobian_term_and_spectral_radius():
    terms = (JacobianTerm(samples=2), SpectralRadius(iters=5), SpectralHinge(iters=3))
    model = DEQ(MLPCell(features=6), terms=terms)
    x = jax.random.normal(jax.random.key(0), (3, 6))
    variables = model.init(jax.random.key(1), x, train=False)

    def term(params):
        _, sown = model.apply(
            {"params": params},
            x,
            train=True,
            rngs={"jacobian": jax.random.key(2)},
            mutable=["intermediates"],
        )
        return sown["intermediates"]

    term = jax.jit(term)
    sown = term(variables["params"])
    assert sown["jacobian_term"][0].shape == (3,)
    assert sown["spectral_radius"][0].shape == (3,)
    assert sown["spectral_estimate"][0].shape == (3,)
    assert np.all(np.asarray(sown["jacobian_term"][0]) > 0)
    for name in ("jacobian_term", "spectral_estimate"):
        grads = jax.grad(lambda p, name=name: jnp.sum(term(p)[name][0]))(variables["params"])
        assert float(jnp.abs(grads["cell"]["recurrent"]["kernel"]).sum()) > 0
    with pytest.raises(ValueError, match="'jacobian' rng"):
        model.apply(variables, x, train=True, mutable=["intermediates"])


def test_synthetic_model_has_the_paper_parameter_count():
    model = models.get("synthetic_1d_deq")
    x = jnp.linspace(-2, 2, 5)[:, None]
    variables = model.init(jax.random.key(0), x, train=False)
    assert sum(v.size for v in jax.tree_util.tree_leaves(variables)) == 200
    z, stats = model.apply(variables, x, train=False)
    assert z.shape == (5, 1) and stats.nstep.shape == (5,)
    with pytest.raises(ValueError, match=r"\[B, 1\]"):
        model.apply(variables, jnp.ones((5, 2)), train=False)


def test_digits_model_shapes():
    model = models.get("digits_deq", width=8, deq=DEQSpec(train_max_iter=3))
    x = jnp.ones((2, 8, 8, 1))
    variables = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(x)
    logits, stats = jax.jit(lambda v, x: model.apply(v, x, train=True))(variables, x)
    assert logits.shape == (2, 10) and stats.nstep.shape == (2,)


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """The smoke synthetic model's run components (no training)."""
    config = synthetic_1d.get_config("smoke")
    run = setup(config, str(tmp_path_factory.mktemp("syn")))
    run.checkpointer.close()
    batch = device_batch(next(run.task.train_iterator(config.train.batch_size)), run.mesh)
    return run, batch


def _step(run, batch, regularizer, backward=None):
    model = (
        run.model
        if backward is None
        else run.model.clone(deq=run.model.deq.replace(backward=backward))
    )
    step = make_train_step(
        model, run.task.metrics, run.schedule, run.mesh, regression=True, regularizer=regularizer
    )
    state = sharding.replicate(jax.device_get(run.state), run.mesh)
    return step(state, batch)


def test_regularizer_adds_gamma_times_the_term(synthetic_run):
    run, batch = synthetic_run
    assert is_regression(run.task)
    _, off = _step(run, batch, JacobianRegularizer())
    _, on = _step(run, batch, JacobianRegularizer(jacobian_weight=2.0, jacobian_samples=3))
    assert "jacobian_term" not in off and "accuracy" not in off
    assert float(on["jacobian_term"]) > 0 and float(on["jacobian_applied"]) == 1.0
    np.testing.assert_allclose(on["task_loss"], off["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        on["loss"], off["loss"] + 2.0 * on["jacobian_term"], rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(on["mse"], off["mse"], rtol=1e-6)
    assert not np.allclose(on["grad_norm"], off["grad_norm"])


def test_spectral_weight_adds_the_weighted_hinge(synthetic_run):
    run, batch = synthetic_run
    _, off = _step(run, batch, JacobianRegularizer())
    low = JacobianRegularizer(spectral_weight=3.0, spectral_target=1e-3)  # hinge on
    _, on = _step(run, batch, low)
    assert "spectral_hinge" not in off
    assert float(on["spectral_estimate"]) > 1e-3 and float(on["spectral_hinge"]) > 0
    np.testing.assert_allclose(on["task_loss"], off["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        on["loss"], off["loss"] + 3.0 * on["spectral_hinge"], rtol=1e-6, atol=1e-7
    )
    assert not np.allclose(on["grad_norm"], off["grad_norm"])
    _, idle = _step(run, batch, JacobianRegularizer(spectral_weight=3.0, spectral_target=1e3))
    assert float(idle["spectral_hinge"]) == 0.0
    np.testing.assert_allclose(idle["loss"], off["loss"], rtol=1e-6)
    np.testing.assert_allclose(idle["grad_norm"], off["grad_norm"], rtol=1e-5)


def test_a_task_loss_replaces_the_default_and_sees_the_inputs(synthetic_run):
    run, batch = synthetic_run
    seen = {}

    def loss_fn(outputs, targets, mask, inputs, **extras):
        seen["inputs"], seen["extras"] = inputs.shape, sorted(extras)
        return 3.0 * regression_loss(outputs, targets, mask)

    state = sharding.replicate(jax.device_get(run.state), run.mesh)
    _, off = _step(run, batch, JacobianRegularizer())
    step = make_train_step(
        run.model, run.task.metrics, run.schedule, run.mesh, regression=True, loss_fn=loss_fn
    )
    _, tripled = step(state, batch)
    np.testing.assert_allclose(tripled["task_loss"], 3.0 * off["task_loss"], rtol=1e-6)
    assert seen == {"inputs": batch["inputs"].shape, "extras": []}


def test_aux_outputs_need_a_task_loss(synthetic_run):
    import flax.linen as nn

    run, batch = synthetic_run

    class SowsAuxOutputs(nn.Module):  # the inner model's variables, unnested
        inner: nn.Module

        def setup(self):
            nn.share_scope(self, self.inner)

        def __call__(self, x, **options):
            outputs, stats = self.inner(x, **options)
            self.sow("intermediates", "aux_outputs", 2.0 * outputs)
            return outputs, stats

    model = SowsAuxOutputs(run.model)
    state = sharding.replicate(jax.device_get(run.state), run.mesh)
    make = lambda **kw: make_train_step(
        model, run.task.metrics, run.schedule, run.mesh, regression=True, **kw
    )
    with pytest.raises(ValueError, match="aux_outputs"):
        make()(state, batch)
    seen = {}

    def loss_fn(outputs, targets, mask, inputs, aux_outputs):
        seen["aux"] = aux_outputs
        return regression_loss(outputs, targets, mask)

    _, metrics = make(loss_fn=loss_fn)(state, batch)
    assert seen["aux"].shape[0] == batch["inputs"].shape[0] and np.isfinite(metrics["loss"])


def test_backward_stats_in_the_metrics(synthetic_run):
    from deq_jax import backward

    run, batch = synthetic_run
    _, ift = _step(run, batch, JacobianRegularizer())
    _, free = _step(run, batch, JacobianRegularizer(), backward=backward.jacobian_free())
    for key in BACKWARD_KEYS:
        assert key in ift and key in free
    assert float(ift["bwd_nstep_mean"]) >= 1 and float(ift["bwd_converged_fraction"]) > 0
    assert float(free["bwd_nstep_mean"]) == 0 and float(free["bwd_nstep_max"]) == 0


def _train(run, batch, regularizer, steps: int):
    """``steps`` train steps from the run's initial state: ``(params, [metrics])``."""
    step = make_train_step(
        run.model,
        run.task.metrics,
        run.schedule,
        run.mesh,
        regression=True,
        regularizer=regularizer,
    )
    state = sharding.replicate(jax.device_get(run.state), run.mesh)
    history = []
    for _ in range(steps):
        state, m = step(state, batch)
        history.append(jax.device_get(m))
    return jax.device_get(state.params), history


def test_frequency_draws_the_term_on_some_steps(synthetic_run):
    reg = JacobianRegularizer(jacobian_weight=1.0, jacobian_freq=0.5)
    _, history = _train(*synthetic_run, reg, 12)
    applied = [float(m["jacobian_applied"]) for m in history]
    for m in history:
        if m["jacobian_applied"]:
            assert np.isfinite(m["jacobian_term"]) and m["loss"] > m["task_loss"]
        else:
            assert np.isnan(m["jacobian_term"]) and m["loss"] == m["task_loss"]
    assert 0 < sum(applied) < 12


def test_masked_draw_matches_the_conditional(synthetic_run, monkeypatch):
    # On CPU (branches_are_slow) the drawn term is masked instead of skipped by a
    # lax.cond: the same draws, losses, metrics and parameters either way.
    from deq_jax.training.families import steps as steps_module

    assert steps_module.branches_are_slow(synthetic_run[0].mesh)  # the suite runs on CPU
    reg = JacobianRegularizer(jacobian_weight=1.0, jacobian_freq=0.5)
    runs = {}
    for gated in (True, False):
        monkeypatch.setattr(steps_module, "branches_are_slow", lambda mesh, g=gated: g)
        runs[gated] = _train(*synthetic_run, reg, 12)
    (p_gate, h_gate), (p_cond, h_cond) = runs[True], runs[False]
    applied = [float(m["jacobian_applied"]) for m in h_gate]
    assert applied == [float(m["jacobian_applied"]) for m in h_cond] and 0 < sum(applied) < 12
    for m_gate, m_cond in zip(h_gate, h_cond, strict=True):
        assert set(m_gate) == set(m_cond)
        for key in ("loss", "task_loss", "jacobian_term", "grad_norm"):
            np.testing.assert_allclose(m_gate[key], m_cond[key], rtol=1e-5, err_msg=key)
    chex.assert_trees_all_close(p_gate, p_cond, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("masked", [True, False])
def test_stop_step_trains_on_the_task_loss_after_it(synthetic_run, monkeypatch, masked):
    # Both ways of skipping the term (masked on CPU, `lax.cond` elsewhere) stop it.
    from deq_jax.training.families import steps as steps_module

    monkeypatch.setattr(steps_module, "branches_are_slow", lambda mesh: masked)
    reg = JacobianRegularizer(jacobian_weight=1.0, jacobian_stop_step=3)
    _, history = _train(*synthetic_run, reg, 5)
    assert [float(m["jacobian_applied"]) for m in history] == [1, 1, 1, 0, 0]
    assert [float(m["jacobian_weight"]) for m in history] == [1, 1, 1, 0, 0]
    for m in history[:3]:
        assert np.isfinite(m["jacobian_term"]) and m["loss"] > m["task_loss"]
    for m in history[3:]:
        assert np.isnan(m["jacobian_term"]) and m["loss"] == m["task_loss"]


def test_spectral_step(synthetic_run):
    run, batch = synthetic_run
    rho = make_spectral_step(run.model, run.mesh, 4)(run.state, batch)["spectral_radius"]
    assert np.isfinite(rho) and rho >= 0


def test_synthetic_smoke_end_to_end(tmp_path):
    config = synthetic_1d.get_config("smoke")
    lines = []
    result = train_and_evaluate(config, str(tmp_path), emit=lines.append)
    assert result.step == config.train.steps
    records = writers.read_metrics(str(tmp_path))
    train = [r for r in records if r["split"] == "train"]
    for key in ("mse", "task_loss", "jacobian_term", "spectral_radius", *BACKWARD_KEYS):
        assert any(key in r and np.isfinite(r[key]) for r in train), key
    assert np.isfinite(result.eval_metrics["validation"]["mse"])
    assert any(" mse " in line for line in lines if line.startswith("step "))


@pytest.mark.slow
def test_digits_smoke_end_to_end(tmp_path):
    config = digits.get_config("smoke")
    result = train_and_evaluate(config, str(tmp_path), emit=quiet)
    train = [r for r in writers.read_metrics(str(tmp_path)) if r["split"] == "train"]
    for key in ("accuracy", "jacobian_term", "spectral_radius", *BACKWARD_KEYS):
        assert np.isfinite(train[-1][key]), key
    assert 0 <= result.eval_metrics["test"]["accuracy"] <= 1


def test_digits_smoke_train_steps(tmp_path):
    """The fast version of the digits end-to-end run: two regularised train steps."""
    config = digits.get_config("smoke")
    run = setup(config, str(tmp_path))
    run.checkpointer.close()
    reg = JacobianRegularizer.from_config(config.regularizer)
    step = make_train_step(run.model, run.task.metrics, run.schedule, run.mesh, regularizer=reg)
    it = run.task.train_iterator(config.train.batch_size)
    state = run.state
    for _ in range(2):
        state, m = step(state, device_batch(next(it), run.mesh))
    assert np.isfinite(m["jacobian_term"]) and 0 <= m["accuracy"] <= 1
    for key in BACKWARD_KEYS:
        assert np.isfinite(m[key])


@pytest.mark.parametrize("module", [synthetic_1d, digits])
def test_configs_document_their_commands(module):
    name = module.__name__.split(".")[-1]
    assert f"python -m launch.main --config configs/{name}.py --workdir" in module.__doc__
    assert f"--config configs/{name}.py:smoke" in module.__doc__
    smoke, full = module.get_config("smoke"), module.get_config()
    assert smoke.train.steps < full.train.steps
    assert not JacobianRegularizer.from_config(full.regularizer).enabled
    with pytest.raises(ValueError, match="smoke"):
        module.get_config("huge")


@pytest.mark.slow
def test_report_synthetic_core_and_plots(tmp_path):
    config = synthetic_1d.get_config("smoke")
    section = jacobian_report.synthetic_section(config, str(tmp_path), [1.0], quiet, seeds=2)
    for gamma in ("1",):
        got = section[gamma]
        assert np.isfinite(got["mse"]) and got["nstep_mean"] >= 1
        assert len(got["convergence"]) == 30 and got["spectral_radius"]
        assert len(got["surface"]["0"]) == len(section["z_grid"])
        # Seed 1 is its own run: another initialisation, so another MSE.
        assert [s["seed"] for s in got["seeds"]] == [0, 1]
        assert got["seeds"][0]["mse"] == got["mse"] != got["seeds"][1]["mse"]
        assert got["mse_seed_mean"] == pytest.approx(np.mean([s["mse"] for s in got["seeds"]]))
    assert os.path.isdir(tmp_path / "synthetic_1d_gamma1_seed1")
    assert "goal" not in section  # no gamma = 0 run
    # A second call loads the finished runs instead of training again.
    metrics = os.path.join(tmp_path, "synthetic_1d_gamma1", "metrics.jsonl")
    mtime = os.path.getmtime(metrics)
    jacobian_report.synthetic_section(config, str(tmp_path), [1.0], quiet)
    assert os.path.getmtime(metrics) == mtime
    png = jacobian_plots.plot_convergence({"synthetic_1d": section}, str(tmp_path / "c.png"))
    assert os.path.getsize(png) > 0
    png = jacobian_plots.plot_surface({"synthetic_1d": section}, str(tmp_path / "s.png"))
    assert os.path.getsize(png) > 0
    png = jacobian_plots.plot_seeds({"synthetic_1d": section}, str(tmp_path / "seeds.png"))
    assert os.path.getsize(png) > 0


def test_synthetic_goal_on_seed_means():
    def entry(mses, steps):
        seeds = [
            dict(seed=i, mse=m, nstep_mean=n)
            for i, (m, n) in enumerate(zip(mses, steps, strict=True))
        ]
        return dict(seeds=seeds, **jacobian_report.seed_statistics(seeds))

    # The third unregularised seed diverged: the medians ignore it, a mean would not.
    section = {
        "0": entry([0.01, 0.03, 5e6], [8.0, 12.0, 60.0]),
        "4": entry([0.012, 0.02, 0.01], [4.0, 3.0, 3.5]),
    }
    goal = jacobian_report.synthetic_goal(section, [0.0, 4.0])
    assert goal["steps_ratio"] == pytest.approx(3.5 / 12.0)
    assert goal["mse_ratio"] == pytest.approx(0.012 / 0.03)
    assert goal["met"] and goal["seeds"] == 3
    assert goal["steps_ratio_per_seed"] == pytest.approx([0.5, 0.25, 3.5 / 60])
    assert section["0"]["nstep_mean_seed_mean"] == pytest.approx(80.0 / 3)
    assert section["4"]["mse_seed_std"] == pytest.approx(np.std([0.012, 0.02, 0.01]))
    section["4"]["seeds"][0]["mse"] = section["4"]["seeds"][1]["mse"] = 0.1
    section["4"].update(jacobian_report.seed_statistics(section["4"]["seeds"]))
    assert not jacobian_report.synthetic_goal(section, [0.0, 4.0])["met"]  # 0.1 > 1.1 x 0.03
    assert jacobian_report.synthetic_goal(section, [4.0]) is None


def test_best_gamma():
    results = {
        "0": {"accuracy": 0.95, "nstep_mean": 20.0},
        "1": {"accuracy": 0.945, "nstep_mean": 8.0},
        "2": {"accuracy": 0.90, "nstep_mean": 4.0},
    }
    assert jacobian_report.best_gamma(results, [0.0, 1.0, 2.0]) == "1"
    results["1"]["accuracy"] = 0.5
    assert jacobian_report.best_gamma(results, [0.0, 1.0, 2.0]) == "2"
    assert jacobian_report.best_gamma(results, [0.0]) is None


@pytest.mark.slow
def test_full_report_on_smoke_settings(tmp_path):
    report = jacobian_report.run_report(
        str(tmp_path),
        synthetic_config=synthetic_1d.get_config("smoke"),
        digits_config=digits.get_config("smoke"),
        gammas=[0.0, 1.0],
        digits_gammas=[0.0, 1.0],
        timing_steps=2,
        emit=quiet,
    )
    assert report["step_time"]["digits_gamma1"]["ratio"] > 0
    with open(tmp_path / jacobian_report.REPORT_FILE) as f:
        assert set(json.load(f)) == {"synthetic_1d", "digits", "step_time"}
    names = ("synthetic_surface", "synthetic_convergence", "synthetic_seeds", "digits_budget")
    for name in (*names, "spectral_radius"):
        assert os.path.getsize(tmp_path / f"{name}.png") > 0
