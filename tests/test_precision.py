"""The cell's arithmetic (`deq_jax.precision`, issue 78): ``DEQSpec.precision`` and
``fixed_point(precision=)``; bfloat16 operands with float32 accumulation in every matmul
and convolution of any cell, the rest float32; the residual floor a reduced-precision
solve measures and stops at (`deq_jax.solvers.floor`), forward and IFT backward; the
language model and the MDEQ in bfloat16; the config key and a short training run.
Measured numbers: ``python -m experiments.precision.measure``
(docs/solvers_and_gradients.md, docs/results/precision.md)."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import tanh_cell, tanh_problem

import deq_jax as dj
from configs import default, synthetic_1d
from deq_jax import models
from deq_jax import precision as P
from deq_jax.nn import DEQ, DEQSpec
from deq_jax.nn.cells import MLPCell
from deq_jax.solvers.floor import Floor, floor_of, moved_by_one_rounding
from deq_jax.training import make_train_step, setup
from deq_jax.training.families.evaluate import device_batch
from deq_jax.training.run import build
from experiments.precision.measure import (
    LM_FIELDS,
    MDEQ_FIELDS,
    bf16_share,
    cell_share,
    contractive,
    cosine,
    rel_error,
)

BF16 = "bfloat16"
pytestmark = pytest.mark.filterwarnings("ignore:deq_jax. precision='bfloat16' is emulated")


def _matrix_eqns(fn, *args):
    """Every dot_general / conv_general_dilated of ``fn``'s jaxpr, sub-jaxprs included."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive in (jax.lax.dot_general_p, jax.lax.conv_general_dilated_p):
                found.append(eqn)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


# The names


def test_unknown_precision_is_one_line_listing_the_valid_ones():
    message = r"^Unknown precision 'half'\. Valid precisions: default, float32, bfloat16\.$"
    with pytest.raises(ValueError, match=message):
        DEQSpec(precision="half")
    with pytest.raises(ValueError, match=message):
        P.in_precision(jnp.sin, "half")
    w, x = tanh_problem(jax.random.key(0))
    with pytest.raises(ValueError, match=message):
        dj.fixed_point(tanh_cell, x, (w, x), solver=dj.solvers.anderson(), precision="half")
    assert DEQSpec().precision == "default"
    assert hash(DEQSpec(precision=BF16)) != hash(DEQSpec())
    with pytest.raises(ValueError, match="floor_margin must be positive"):
        DEQSpec(floor_margin=0.0)


def test_the_arithmetic_of_each_precision_on_each_backend():
    assert P.arithmetic("default", "cpu") == "float32"
    assert P.arithmetic("default", "gpu") == P.arithmetic("default", "cuda") == "tensorfloat32"
    assert P.arithmetic("default", "tpu") == "bfloat16"
    assert P.arithmetic("float32", "tpu") == "float32"
    assert P.unit_roundoff("default", "cpu") is None
    assert P.unit_roundoff(BF16, "cpu") == 2.0**-8
    assert P.unit_roundoff("default", "gpu") == 2.0**-11
    assert floor_of("float32", "tpu") is None
    assert floor_of(BF16, "cpu") == Floor(2.0**-8)
    with pytest.raises(ValueError, match="unit must be in"):
        Floor(0.0)
    with pytest.raises(TypeError, match="floor must be None or a Floor"):
        dj.solvers.anderson(floor=1e-3)


# The rewrite of a cell's matmuls


def _nested(x, w):
    """A cell with a matmul in a jitted call, a custom derivative, a branch and a loop."""
    sine = jax.custom_jvp(jnp.sin)
    sine.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
    y = sine(jax.jit(lambda a: a @ w)(x))
    y = jax.lax.cond(y.sum() > 0, lambda y: y @ w, lambda y: 2 * y, y)
    y, _ = jax.lax.scan(lambda y, _: (jnp.tanh(y @ w), None), y, None, length=2)
    img = y.reshape(y.shape[0], 4, 4, 1)
    kernel = jnp.ones((3, 3, 1, 1)) / 9
    dims = ("NHWC", "HWIO", "NHWC")
    return jax.lax.conv_general_dilated(img, kernel, (1, 1), "SAME", dimension_numbers=dims)


def _nested_by_casting(x, w):
    """`_nested` written with explicit bfloat16 operands and float32 accumulation."""
    b = lambda a: a.astype(jnp.bfloat16)
    dot = lambda a, c: jnp.dot(b(a), b(c), preferred_element_type=jnp.float32)
    y = jnp.sin(dot(x, w))
    y = jax.lax.cond(y.sum() > 0, lambda y: dot(y, w), lambda y: 2 * y, y)
    for _ in range(2):
        y = jnp.tanh(dot(y, w))
    img = y.reshape(y.shape[0], 4, 4, 1)
    dims = ("NHWC", "HWIO", "NHWC")
    return jax.lax.conv_general_dilated(
        b(img),
        b(jnp.ones((3, 3, 1, 1)) / 9),
        (1, 1),
        "SAME",
        dimension_numbers=dims,
        preferred_element_type=jnp.float32,
    )


def test_bfloat16_takes_bfloat16_operands_everywhere_and_keeps_the_rest():
    x = jax.random.normal(jax.random.key(0), (3, 16))
    w = jax.random.normal(jax.random.key(1), (16, 16)) / 4
    fn = P.in_precision(_nested, BF16)
    eqns = _matrix_eqns(fn, x, w)
    assert len(eqns) == 4  # three in sub-jaxprs: the jitted call, a branch, the loop
    for eqn in eqns:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16] * 2
        assert eqn.outvars[0].aval.dtype == jnp.float32
    out = jax.jit(fn)(x, w)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, _nested_by_casting(x, w))
    assert rel_error(out, _nested(x, w)) > 1e-4  # the rounding is real
    # differentiable, and vmap-able, as the cell is
    grad = jax.grad(lambda w: fn(x, w).sum())(w)
    assert (
        grad.dtype == jnp.float32
        and cosine(grad, jax.grad(lambda w: _nested(x, w).sum())(w)) > 0.99
    )
    assert jax.vmap(fn, in_axes=(0, None))(x[:, None], w).shape == (3, 1, 4, 4, 1)


def test_default_leaves_the_cell_alone_and_float32_asks_for_full_precision():
    x, w = jnp.ones((2, 16)), jnp.eye(16)
    as_written = str(jax.make_jaxpr(_nested)(x, w))
    assert str(jax.make_jaxpr(P.in_precision(_nested, "default"))(x, w)) == as_written
    eqns = _matrix_eqns(P.in_precision(_nested, "float32"), x, w)
    assert len(eqns) == 4
    for eqn in eqns:
        assert eqn.params["precision"] == (jax.lax.Precision.HIGHEST,) * 2


def test_current_precision_is_what_the_cell_is_traced_in():
    seen = []

    def cell(z):
        seen.append(P.current_precision())
        return z

    for name in P.PRECISIONS:
        P.in_precision(cell, name)(jnp.ones(2))
    assert seen == list(P.PRECISIONS) and P.current_precision() == "default"


def test_emulated_bfloat16_is_noted_once_on_the_cpu():
    P._note_emulated_on.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            P.in_precision(jnp.sin, BF16)(jnp.ones(2))
    notes = [w for w in caught if "emulated on the cpu backend" in str(w.message)]
    assert len(notes) == 1 and "\n" not in str(notes[0].message)


# The residual floor


TANH = dict(batch=64, d=256, norm=0.9)  # the tanh problem


def _solve(precision, tol=1e-4, solver=dj.solvers.anderson, loop_solver=None, **kw):
    w, x = tanh_problem(jax.random.key(3), **TANH)
    solver = loop_solver or solver(tol=tol, max_iter=40)
    run = lambda w: dj.fixed_point(
        tanh_cell, jnp.zeros_like(x), (w, x), solver=solver, **kw, precision=precision
    )
    return jax.jit(run)(w)


def test_a_tolerance_below_the_floor_stops_at_the_floor_not_the_budget():
    f32, bf16 = _solve(None), _solve(BF16)
    assert f32.stats.floor is None and f32.stats.at_floor is None
    floor, nstep = np.asarray(bf16.stats.floor), np.asarray(bf16.stats.nstep)
    assert np.all((floor > 1e-4) & (floor < 1e-2))  # bfloat16's: about 2.4e-3
    assert np.all(bf16.stats.converged) and np.all(bf16.stats.at_floor)
    assert nstep.max() < 40 and nstep.mean() <= 1.25 * float(f32.stats.nstep.mean())
    assert np.all(np.asarray(bf16.stats.rel_residual) <= floor)
    assert rel_error(bf16.value, f32.value) < 2 * floor.mean() / (1 - TANH["norm"])
    # a tolerance above the floor is met as before, and no sample is said to be on it
    loose = _solve(BF16, tol=5e-2)
    assert np.all(loose.stats.converged) and not np.any(loose.stats.at_floor)


def test_the_margin_trades_iterations_for_accuracy():
    w, x = tanh_problem(jax.random.key(3), **TANH)
    reference = _solve(None, tol=1e-6).value
    errors, steps = [], []
    for margin in (1.0, 0.5):
        solver = dj.solvers.anderson(tol=1e-4, max_iter=40, floor=Floor(2.0**-8, margin))
        sol = _solve(BF16, loop_solver=solver)
        errors.append(rel_error(sol.value, reference))
        steps.append(float(sol.stats.nstep.mean()))
    assert errors[1] < errors[0] and steps[1] > steps[0]


@pytest.mark.parametrize("loop", ["scan", "python"])
def test_every_loop_measures_the_same_floor(loop):
    w, x = tanh_problem(jax.random.key(3), batch=4, d=32, norm=0.9)
    solver = dj.solvers.anderson(tol=1e-5, max_iter=30, floor=Floor(2.0**-8))
    fn = lambda z: P.in_precision(tanh_cell, BF16)(z, (w, x))
    z0 = jnp.zeros_like(x)
    z_while, s_while = dj.solvers.iterate(solver, fn, z0)
    z_other, s_other = dj.solvers.iterate(solver, fn, z0, loop=loop)
    np.testing.assert_allclose(s_other.floor, s_while.floor, rtol=1e-6)
    np.testing.assert_array_equal(s_other.nstep, s_while.nstep)
    np.testing.assert_allclose(z_other, z_while, rtol=1e-6, atol=1e-6)
    # a floor given (the backward solve's) is used as it is, and nothing is measured
    given = jnp.full((4,), 0.5)
    _, s_given = dj.solvers.iterate(solver, fn, z0, floor=given, loop=loop)
    np.testing.assert_array_equal(s_given.floor, given)
    assert int(s_given.nstep.max()) <= 2


def test_composed_solvers_measure_the_floor_too():
    solver = dj.solvers.get("sequence(fixed_point_iteration:3, anderson)", tol=1e-5, max_iter=40)
    sol = _solve(BF16, loop_solver=solver)
    assert sol.stats.floor is not None and np.all(sol.stats.at_floor)
    assert int(sol.stats.nstep.max()) < 40


def test_the_floor_is_measured_one_rounding_away():
    z = jnp.array([[1.0, -2.0, 0.0, 4.0]])
    moved = moved_by_one_rounding(z, 2.0**-8)
    np.testing.assert_allclose(jnp.abs(moved - z), jnp.abs(z) * 2.0**-8)


def test_the_ift_backward_solve_stops_at_the_forward_floor():
    w, x = tanh_problem(jax.random.key(3), **TANH)
    solver = dj.solvers.anderson(tol=1e-5, max_iter=40)

    def loss(w, probe, precision):
        sol = dj.fixed_point(
            tanh_cell,
            jnp.zeros_like(x),
            (w, x),
            solver=solver,
            precision=precision,
            stats_probe=probe,
        )
        return jnp.sum(sol.value), sol.stats

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    (g32, p32), _ = grad(w, dj.backward.stats_probe(), None)
    (g16, p16), stats = grad(w, dj.backward.stats_probe(), BF16)
    bwd32, bwd16 = dj.backward.read_stats_probe(p32), dj.backward.read_stats_probe(p16)
    assert float(bwd32["floor_mean"]) == 0.0 and float(bwd32["at_floor_fraction"]) == 0.0
    np.testing.assert_allclose(bwd16["floor_mean"], stats.floor.mean(), rtol=1e-5)
    assert float(bwd16["at_floor_fraction"]) == 1.0 and float(bwd16["nstep_max"]) < 40
    assert cosine(g16, g32) > 0.999


def test_an_explicit_backward_solver_gets_the_floor():
    explicit = dj.backward.ift(solver=dj.solvers.anderson(tol=1e-6))
    assert explicit.with_floor(Floor(2.0**-8)).solver.floor == Floor(2.0**-8)
    assert explicit.with_floor(None) is explicit
    assert dj.backward.phantom().with_floor(Floor(2.0**-8)) == dj.backward.phantom()
    spec = DEQSpec(backward=explicit, precision=BF16, floor_margin=0.5)
    assert spec.backward_for().solver.floor == Floor(2.0**-8, 0.5)
    assert spec.solver_for(train=True).floor == Floor(2.0**-8, 0.5)
    assert DEQSpec().solver_for(train=True).floor is None  # the CPU's default is float32


# A DEQ layer, the language model and the MDEQ


X = jax.random.normal(jax.random.key(0), (16, 8))
SPEC = DEQSpec(solver=dj.solvers.anderson(tol=1e-4, max_iter=60))


@functools.partial(jax.jit, static_argnums=0)
def _tanh_deq(precision, params):
    w = jax.random.normal(jax.random.key(1), (16, 32))
    model = DEQ(MLPCell(features=32), spec=SPEC.replace(precision=precision))

    def loss(p):
        z, stats = model.apply({"params": p}, X, train=False)
        return jnp.sum(z * w), (z, stats)

    (_, (z, stats)), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return z, stats, grads


def test_a_deq_layer_in_bfloat16_keeps_its_state_and_gradients_float32():
    model = DEQ(MLPCell(features=32), spec=SPEC.replace(precision=BF16))
    params = jax.jit(lambda key: model.init(key, X, train=False))(jax.random.key(2))["params"]
    problem = model.apply({"params": params}, X, train=False, method=DEQ.problem)
    assert bf16_share(problem.f, problem.z0, problem.args) == 1.0
    assert problem.solver.floor == Floor(2.0**-8)
    z32, s32, g32 = _tanh_deq("default", params)
    z16, s16, g16 = _tanh_deq(BF16, params)
    assert z16.dtype == s16.rel_residual.dtype == jnp.float32
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(g16))
    assert bool(jnp.all(s16.converged)) and int(s16.nstep.max()) < 60
    assert rel_error(z16, z32) < 1e-2  # measured 2.8e-3
    assert cosine(g16, g32) > 0.999  # measured 0.99999


def test_a_cell_with_dropout_keys_runs_in_bfloat16():
    # the cell's keys (random_wrap's PRNG impl parameter) pass the rewrite unchanged
    model = DEQ(MLPCell(features=32, dropout_rate=0.3), spec=SPEC.replace(precision=BF16))
    params = model.init(jax.random.key(2), X, train=False)["params"]
    apply = lambda key: model.apply({"params": params}, X, train=True, rngs={"dropout": key})
    z, stats = jax.jit(apply)(jax.random.key(3))
    assert z.dtype == jnp.float32 and bool(jnp.all(stats.converged))
    z_other, _ = jax.jit(apply)(jax.random.key(4))
    assert not np.allclose(z, z_other)  # the masks differ with the key


@functools.partial(jax.jit, static_argnums=0)
def _lm_apply(precision, params, toks, targets):
    spec = SPEC.replace(precision=precision)
    model = models.get("deq_transformer_lm", deq=spec, **LM_FIELDS)
    return model.apply(
        {"params": params},
        toks,
        mems=model.init_mems(toks.shape[0]),
        targets=targets,
        train=False,
    )


def test_language_model_in_bfloat16_stops_at_its_floor():
    toks = jax.random.randint(jax.random.key(0), (2, 5), 0, 13)
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 13)
    model = models.get("deq_transformer_lm", deq=SPEC.replace(precision=BF16), **LM_FIELDS)
    mems = model.init_mems(2)
    params = jax.jit(lambda key: model.init(key, toks, mems=mems, train=False))(jax.random.key(2))[
        "params"
    ]
    out32 = _lm_apply("default", params, toks, targets)
    out16 = _lm_apply(BF16, params, toks, targets)
    assert out16.z_star.dtype == out16.nll.dtype == jnp.float32
    assert int(out16.stats.nstep.max()) < 60 and bool(jnp.all(out16.stats.converged))
    assert float(jnp.abs(out16.nll - out32.nll).max()) < 2e-2
    # every multiply-add of the cell, its attention and feed-forward, in bfloat16
    assert cell_share(model, {"params": params}, toks, mems=mems, train=False) == 1.0


@functools.partial(jax.jit, static_argnums=0)
def _mdeq_apply(precision, variables, x):
    model = models.get("mdeq", deq=SPEC.replace(precision=precision), **MDEQ_FIELDS)
    return model.apply(variables, x, train=False)


def test_mdeq_in_bfloat16_stays_close_and_stops_at_its_floor():
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
    model = models.get("mdeq", deq=SPEC.replace(precision=BF16), **MDEQ_FIELDS)
    variables = jax.jit(lambda key: model.init(key, x, train=False))(jax.random.key(0))
    variables = {**variables, "params": contractive(variables["params"])}
    logits32, _ = _mdeq_apply("default", variables, x)
    logits16, s16 = _mdeq_apply(BF16, variables, x)
    assert logits16.dtype == s16.rel_residual.dtype == jnp.float32
    assert rel_error(logits16, logits32) < 2e-2  # measured 3e-3
    assert int(s16.nstep.max()) < 60 and bool(jnp.all(s16.at_floor))
    assert cell_share(model, variables, x, train=False) == 1.0


# The config and a training run


def test_config_keys_build_the_spec():
    config = default.get_config()
    spec = build.build_deq_spec(config.deq)
    assert spec.precision == "default" and spec.floor_margin == 1.0
    config.deq.precision, config.deq.floor_margin = BF16, 0.5
    spec = build.build_deq_spec(config.deq)
    assert spec.precision == BF16 and spec.floor() == Floor(2.0**-8, 0.5)
    config.deq.precision = "half"
    with pytest.raises(ValueError, match=r"^Unknown precision 'half'\. Valid precisions: "):
        build.build_deq_spec(config.deq)


def _train_losses(tmp_path, precision, steps=20):
    """The losses of ``steps`` train steps of the smoke synthetic 1-D config on one batch."""
    config = synthetic_1d.get_config("smoke")
    config.deq.precision = precision
    config.train.update(dict(steps=steps, learning_rate=1e-2))
    run = setup(config, str(tmp_path / precision))
    run.checkpointer.close()
    assert run.model.deq.precision == precision
    batch = device_batch(next(run.task.train_iterator(config.train.batch_size)), run.mesh)
    step = make_train_step(run.model, run.task.metrics, run.schedule, run.mesh, regression=True)
    state, losses = run.state, []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(state.params))
    if precision == BF16:
        assert 0 < float(metrics["floor"]) < 1e-2 and 0 <= float(metrics["at_floor"]) <= 1
    else:
        assert "floor" not in metrics
    return np.array(losses)


def test_training_with_bfloat16_cells_decreases_the_loss(tmp_path):
    bf16 = _train_losses(tmp_path, BF16)
    f32 = _train_losses(tmp_path, "default")
    assert bf16[-1] < 0.6 * bf16[0]
    np.testing.assert_allclose(bf16, f32, rtol=0.1)


def test_a_run_says_once_when_its_tolerance_is_below_the_floor():
    from deq_jax.training.loop.floor_notice import FloorNotice

    lines = []
    notice = FloorNotice(1e-3, BF16, lines.append)
    assert not notice.check(10, {"loss": 1.0})  # no floor measured: float32
    assert not notice.check(20, {"floor": 5e-4, "at_floor": 0.0})  # below the tolerance
    assert notice.check(30, {"floor": 2.4e-3, "at_floor": 0.75, "bwd_at_floor_fraction": 1.0})
    assert not notice.check(40, {"floor": 3e-3, "at_floor": 1.0})  # once per run
    assert len(lines) == 1 and "\n" not in lines[0]
    assert (
        "step 30" in lines[0]
        and "2.4e-03" in lines[0]
        and "2e-03" in lines[0]
        and "75%" in lines[0]
    )
    assert "deq.solver.tol" in lines[0] and "deq.precision=float32" in lines[0]
