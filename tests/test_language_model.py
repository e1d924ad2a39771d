"""DEQTransformerLM: shapes, relative positions, causality, memory, adaptive softmax,
gradients, dropout, the explicit and unrolled modes, and bad input."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import deq_jax as dj
from deq_jax import models
from deq_jax.models.language import (
    DEQTransformerLM,
    LMOutput,
    Memory,
    attention_mask,
    correction_steps,
    rel_shift,
    sinusoid_positions,
)
from deq_jax.nn import DEQ, DEQSpec, deq_call

V, B, L = 13, 2, 5
TIGHT = DEQSpec(
    solver=dj.solvers.anderson(tol=1e-5, max_iter=80, stop_mode="abs"),
    backward=dj.backward.ift(solver=dj.solvers.anderson(tol=1e-9, max_iter=80)),
)


def tiny(**fields) -> DEQTransformerLM:
    kw = dict(vocab_size=V, d_model=8, n_head=2, d_head=4, d_inner=16, mem_len=4, n_layer=2)
    kw.update(fields)
    kw.setdefault("deq", DEQSpec(solver=dj.solvers.anderson(tol=1e-4, max_iter=30)))
    return models.get("deq_transformer_lm", **kw)


def tokens(seed=0, length=L, batch=B):
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 0, V)


def init(model, toks=None):
    toks = tokens() if toks is None else toks
    return _jit_init(model, toks)


@functools.partial(jax.jit, static_argnums=0)
def _jit_init(model, toks):
    # One program per model: eager `init` compiled each op on its own (8 tests of this
    # module: 635 -> 526 compiles, 86.5 -> 75.9 CPU s).
    return model.init(jax.random.PRNGKey(1), toks, mems=model.init_mems(toks.shape[0]), train=False)


def count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


# Shapes and parameters


def test_shapes_and_parameter_count():
    model = tiny()
    variables = init(model)
    d, h, dh, di = 8, 2, 4, 16
    qkv = 3 * h * dh
    cell = (d * qkv + qkv) + (d * h * dh + h * dh) + (h * dh * d + 2 * d) + 2 * h * dh
    cell += (d * di + 2 * di) + (di * d + 2 * d)  # ff1, ff2 (kernel, scale, bias)
    expected = cell + (d * qkv + qkv) + (V * d + V)  # + injection + tied embedding/softmax
    assert count(variables["params"]) == expected
    out = model.apply(variables, tokens(), targets=tokens(1), train=False)
    assert isinstance(out, LMOutput)
    chex.assert_shape(out.nll, (B, L))
    chex.assert_shape(out.z_star, (B, L, d))
    chex.assert_shape(out.stats.nstep, (B,))
    assert out.log_probs is None and out.correction_nll is None
    chex.assert_shape(out.mems.z, (B, 4, d))
    chex.assert_shape(out.mems.injection, (B, 4, qkv))
    untied_io = init(tiny(tie_weights=False))
    assert count(untied_io["params"]) == expected + V * d  # the softmax's own table


def test_modes_share_or_own_parameters():
    shapes = lambda v: jax.tree_util.tree_map(jnp.shape, v)
    deq = init(tiny(mode="deq"))
    assert shapes(init(tiny(mode="weight_tied"))) == shapes(deq)
    assert shapes(init(tiny(mode="unrolled"))) == shapes(deq)
    untied = init(tiny(mode="untied", n_layer=3))["params"]
    assert set(untied) == {"block_0", "block_1", "block_2", "inject", "io"}
    assert shapes(untied["block_2"]) == shapes(deq["params"]["cell"])
    # the warm-up mode runs on the DEQ's parameters: the same model in another mode
    warmup = tiny().clone(mode="weight_tied")
    out = warmup.apply(deq, tokens(), targets=tokens(1), train=True)
    np.testing.assert_array_equal(out.stats.nstep, [2, 2])


# Relative positions


def test_rel_shift_matches_naive_relative_scores():
    q_len, mem, d = 4, 3, 6
    k_len = q_len + mem
    kq, kr = jax.random.split(jax.random.PRNGKey(0))
    q = jax.random.normal(kq, (2, q_len, d))
    r = jax.random.normal(kr, (k_len, d))  # r[c] embeds the distance k_len - 1 - c
    shifted = rel_shift(jnp.einsum("bid,cd->bic", q, r))
    for i in range(q_len):
        for j in range(mem + i + 1):  # the visible keys
            naive = q[:, i] @ r[k_len - 1 - (mem + i - j)]
            np.testing.assert_allclose(shifted[:, i, j], naive, rtol=1e-5, atol=1e-6)
    pos = sinusoid_positions(k_len, 8)
    np.testing.assert_allclose(pos[-1], [0, 0, 0, 0, 1, 1, 1, 1], atol=1e-7)  # distance 0


def test_attention_mask_is_causal_and_hides_empty_memory():
    mask = attention_mask(3, 2, jnp.array([0, 1, 2]))
    np.testing.assert_array_equal(mask[0], [[0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(mask[1, 0], [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(mask[2, 0], [1, 1, 1, 0, 0])


# Causality


@pytest.mark.parametrize(
    "mode, spec",
    [
        ("weight_tied", None),
        ("untied", None),
        pytest.param(
            "deq",
            DEQSpec(solver=dj.solvers.fixed_point_iteration(max_iter=12, full_budget=True)),
            marks=pytest.mark.slow,
        ),
        ("deq", TIGHT),
    ],
)
def test_changing_a_token_leaves_earlier_positions_unchanged(mode, spec):
    model = tiny(mode=mode, **({} if spec is None else {"deq": spec}))
    variables = init(model)
    a = tokens()
    b = a.at[:, 3].set((a[:, 3] + 1) % V)
    nll_a = model.apply(variables, a, targets=a, train=False).nll
    nll_b = model.apply(variables, b, targets=a, train=False).nll
    if mode == "deq" and spec is TIGHT:
        np.testing.assert_allclose(nll_a[:, :3], nll_b[:, :3], atol=1e-5)
    else:
        np.testing.assert_array_equal(nll_a[:, :3], nll_b[:, :3])
    assert not np.allclose(nll_a[:, 3:], nll_b[:, 3:])


# Memory


@pytest.mark.parametrize("mode", ["weight_tied", "deq"])
def test_empty_memory_equals_no_memory(mode):
    with_mem, without = tiny(mode=mode, mem_len=4), tiny(mode=mode, mem_len=0)
    variables = init(with_mem)
    toks = tokens()
    a = with_mem.apply(variables, toks, mems=with_mem.init_mems(B), targets=toks, train=False)
    b = without.apply(variables, toks, targets=toks, train=False)
    np.testing.assert_allclose(a.nll, b.nll, rtol=1e-5, atol=1e-6)
    assert b.mems.z.shape == (B, 0, 8)


def test_memory_keeps_the_last_mem_len_positions():
    model = tiny(mode="weight_tied", mem_len=7)
    variables = init(model)
    first = model.apply(variables, tokens(0), mems=model.init_mems(B), train=False)
    np.testing.assert_array_equal(first.mems.count, [5, 5])
    np.testing.assert_array_equal(first.mems.z[:, 2:], first.z_star)
    second = model.apply(variables, tokens(1), mems=first.mems, train=False)
    np.testing.assert_array_equal(second.mems.count, [7, 7])
    np.testing.assert_array_equal(second.mems.z[:, :2], first.z_star[:, -2:])
    np.testing.assert_array_equal(second.mems.z[:, 2:], second.z_star)
    np.testing.assert_array_equal(second.mems.injection[:, :2], first.mems.injection[:, -2:])


def test_segment_with_memory_equals_one_long_sequence_at_the_fixed_point():
    """Memory holds the fixed points (locuslab/deq): at z* the model is Transformer-XL
    exact, so segment B after segment A is [A, B] solved at once."""
    model = tiny(mode="deq", mem_len=5, deq=TIGHT)
    joint = tiny(mode="deq", mem_len=0, deq=TIGHT)
    variables = init(model)
    a, b = tokens(0), tokens(1)
    ab = jnp.concatenate([a, b], axis=1)
    first = model.apply(variables, a, train=False)
    second = model.apply(variables, b, mems=first.mems, targets=b, train=False)
    whole = joint.apply(variables, ab, targets=ab, train=False)
    assert bool(jnp.all(second.stats.converged)) and bool(jnp.all(whole.stats.converged))
    np.testing.assert_allclose(second.nll, whole.nll[:, L:], atol=1e-4)


# Adaptive softmax


@pytest.mark.parametrize(
    "cutoffs, div_val, tie",
    [((), 1, True), ((5, 9), 2, True), pytest.param((5, 9), 1, False, marks=pytest.mark.slow)],
)
def test_adaptive_softmax_normalises_and_matches_nll(cutoffs, div_val, tie):
    model = tiny(mode="weight_tied", cutoffs=cutoffs, div_val=div_val, tie_weights=tie)
    variables = init(model)
    toks, targets = tokens(0), tokens(1)
    lp = model.apply(variables, toks, train=False).log_probs
    chex.assert_shape(lp, (B, L, V))
    np.testing.assert_allclose(jnp.exp(lp).sum(-1), 1.0, rtol=1e-5)
    nll = model.apply(variables, toks, targets=targets, train=False).nll
    expected = -jnp.take_along_axis(lp, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(nll, expected, rtol=1e-5, atol=1e-6)
    if div_val == 2:
        params = variables["params"]["io"]
        assert params["emb_2"].shape == (4, 2) and params["emb_proj_2"].shape == (2, 8)


# Gradients


@pytest.mark.slow
def test_stacked_gradient_matches_finite_differences(x64):
    model = tiny(mode="weight_tied", dtype=jnp.float64, cutoffs=(6,), div_val=2)
    variables = init(model)
    toks, targets = tokens(0), tokens(1)
    loss = jax.jit(
        lambda p: model.apply({"params": p}, toks, targets=targets, train=False).nll.mean()
    )
    check_grads(loss, (variables["params"],), order=1, modes=["rev"], atol=1e-5, rtol=1e-5)


def test_implicit_gradient_matches_unrolled_to_convergence(x64):
    spec = DEQSpec(
        solver=dj.solvers.anderson(tol=1e-11, max_iter=100, stop_mode="abs"),
        backward=dj.backward.ift(solver=dj.solvers.anderson(tol=1e-11, max_iter=100)),
    )
    # post-LN at initialisation contracts (about 0.6 per step): 60 steps converge
    model = tiny(mode="deq", dtype=jnp.float64, deq=spec, unroll_steps=60)
    params = init(model)["params"]
    toks, targets = tokens(0), tokens(1)

    def loss(p, mode):
        out = model.clone(mode=mode).apply({"params": p}, toks, targets=targets, train=True)
        return out.nll.mean(), out.stats

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, stats), g_deq = grad(params, "deq")
    (_, unrolled), g_unr = grad(params, "unrolled")
    assert bool(jnp.all(stats.converged)) and float(unrolled.abs_residual.max()) < 1e-9
    chex.assert_trees_all_close(g_deq, g_unr, rtol=1e-6, atol=1e-8)


# Dropout


def _solve_in_training(model, variables, toks, rngs):
    """Applies the model in training with its DEQ's problem solved here; returns the
    problem and the fixed point."""
    seen = []

    def interceptor(next_fun, args, kwargs, context):
        if not isinstance(context.module, DEQ) or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        problem = context.module.problem(args[0], None, train=True)
        sol = dj.fixed_point(problem.f, problem.z0, problem.args, solver=problem.solver)
        seen.append((problem, sol.value))
        return sol.value, sol.stats

    with nn.intercept_methods(interceptor):
        model.apply(variables, toks, train=True, rngs=rngs)
    return seen[0]


def test_dropout_mask_is_fixed_within_a_solve_and_off_in_eval():
    spec = DEQSpec(solver=dj.solvers.anderson(tol=1e-6, max_iter=80, stop_mode="abs"))
    model = tiny(mode="deq", dropout=0.3, dropatt=0.2, dropouti=0.2, deq=spec)
    variables = init(model)
    toks = tokens()
    problem, z = _solve_in_training(model, variables, toks, {"dropout": jax.random.PRNGKey(3)})
    cell_vars, x, key = problem.args
    assert key is not None
    np.testing.assert_allclose(problem.f(z, problem.args), z, atol=1e-5)  # same mask throughout
    no_drop = problem.f(z, (cell_vars, x, None))
    assert float(jnp.abs(no_drop - z).max()) > 1e-2  # dropout was active in the solve
    plain = model.apply(variables, toks, targets=toks, train=False)
    with_rng = model.apply(
        variables, toks, targets=toks, train=False, rngs={"dropout": jax.random.PRNGKey(3)}
    )
    np.testing.assert_array_equal(plain.nll, with_rng.nll)  # eval ignores the rng
    trained = model.apply(
        variables, toks, targets=toks, train=True, rngs={"dropout": jax.random.PRNGKey(3)}
    )
    assert not np.allclose(trained.nll, plain.nll)


# The unrolled mode and the fixed point


def test_unrolled_mode_returns_the_correction_loss_and_solves_in_eval():
    assert correction_steps(6, 2) == (3, 6) and correction_steps(5, 3) == (2, 4, 5)
    model = tiny(mode="unrolled", unroll_steps=6, correction_states=3, correction_gamma=0.5)
    variables = init(model)
    toks, targets = tokens(0), tokens(1)
    out = model.apply(variables, toks, targets=targets, train=True)
    chex.assert_shape(out.correction_nll, (3, B, L))
    np.testing.assert_allclose(out.correction_nll[-1], out.nll, rtol=1e-6)
    at_4 = tiny(mode="weight_tied", n_layer=4).apply(variables, toks, targets=targets, train=False)
    np.testing.assert_allclose(out.correction_nll[1], 0.5 * at_4.nll, rtol=1e-5)
    np.testing.assert_array_equal(out.stats.nstep, [6, 6])
    evaluated = model.apply(variables, toks, targets=targets, train=False)
    assert evaluated.correction_nll is None
    assert int(evaluated.stats.nstep.max()) > 6 and bool(jnp.all(evaluated.stats.converged))


def _eval_with_problem(model, variables, toks, **kwargs):
    """Applies the model in eval mode; returns its outputs and its DEQ's problem and
    result."""
    seen = []

    def interceptor(next_fun, args, call_kwargs, context):
        out = next_fun(*args, **call_kwargs)
        if isinstance(context.module, DEQ) and context.method_name == "__call__":
            seen.append((context.module.problem(args[0], None, train=False), out))
        return out

    with nn.intercept_methods(interceptor):
        outputs = model.apply(variables, toks, train=False, **kwargs)
    return outputs, *seen[0]


@pytest.mark.parametrize("ln_placement", ["post", "pre"])
def test_fixed_point_satisfies_the_cell(ln_placement):
    tol = 1e-4  # float32: the pre-LN cell's solves stall between 1e-5 and 2e-4 by rounding
    spec = DEQSpec(solver=dj.solvers.anderson(tol=tol, max_iter=60))
    model = tiny(mode="deq", ln_placement=ln_placement, deq=spec)
    variables = init(model)
    mems = model.apply(variables, tokens(2), train=False).mems
    outputs, problem, (z_star, stats) = _eval_with_problem(
        model, variables, tokens(), mems=mems, targets=tokens(1)
    )
    np.testing.assert_array_equal(z_star, outputs.z_star)
    assert bool(jnp.all(stats.converged))
    fz = problem.f(z_star, problem.args)
    rel = jnp.linalg.norm((fz - z_star).reshape(B, -1), axis=1) / jnp.linalg.norm(
        fz.reshape(B, -1), axis=1
    )
    assert float(rel.max()) <= tol
    assert set(problem.args[1]) == {"injection", "memory", "context"}  # prepared once
    chex.assert_shape(problem.args[1]["injection"], (B, L, 24))


def test_deq_call_finds_the_deq():
    model = tiny(mode="deq")
    variables = init(model)
    call = deq_call(model, variables, tokens(), mems=model.init_mems(B), targets=tokens(1))
    np.testing.assert_array_equal(call.z_star, call.outputs.z_star)


def test_explicit_z0_and_max_iter_reach_the_deq():
    model = tiny(mode="deq")
    variables = init(model)
    toks = tokens()
    out = model.apply(variables, toks, train=False, max_iter=3)
    np.testing.assert_array_equal(out.stats.nstep, [3, 3])
    warm = model.apply(variables, toks, train=False, z0=out.z_star)
    cold = model.apply(variables, toks, train=False)
    assert int(warm.stats.nstep.max()) < int(cold.stats.nstep.max())


# Bad input


def test_bad_input_is_refused():
    model = tiny(mode="weight_tied")
    variables = init(model)
    toks = tokens()
    with pytest.raises(ValueError, match="integer"):
        model.apply(variables, toks.astype(jnp.float32), train=False)
    with pytest.raises(ValueError, match="vocab_size"):
        model.apply(variables, toks.at[0, 0].set(V), train=False)
    with pytest.raises(ValueError, match="vocab_size"):
        model.apply(variables, toks, targets=toks.at[0, 0].set(-1), train=False)
    with pytest.raises(ValueError, match="targets"):
        model.apply(variables, toks, targets=toks[:, :3], train=False)
    with pytest.raises(ValueError, match="init_mems"):
        model.apply(variables, toks, mems=model.init_mems(B + 1), train=False)
    with pytest.raises(ValueError, match="mode"):
        tiny(mode="recurrent")
    with pytest.raises(TypeError, match="mode"):  # the mode is the field, not an argument
        model.apply(variables, toks, train=False, mode="deq")
    with pytest.raises(ValueError, match="cutoffs"):
        tiny(cutoffs=(5, 5))
    with pytest.raises(ValueError, match="ln_placement"):
        init(tiny(ln_placement="middle"))


def test_out_of_range_ids_under_jit_give_nan():
    model = tiny(mode="weight_tied", cutoffs=(5,), div_val=2)
    variables = init(model)
    toks = tokens()
    run = jax.jit(lambda t, y: model.apply(variables, t, targets=y, train=False).nll)
    assert bool(jnp.all(jnp.isfinite(run(toks, toks))))
    assert bool(jnp.isnan(run(toks, toks.at[1, 2].set(V))[1, 2]))
    assert bool(jnp.all(jnp.isnan(run(toks.at[1, 0].set(V + 3), toks)[1])))  # seen by all later


def test_memory_is_a_memory_and_jits():
    model = tiny(mode="deq")
    variables = init(model)
    step = jax.jit(lambda t, m: model.apply(variables, t, mems=m, targets=t, train=False))
    out = step(tokens(), model.init_mems(B))
    assert isinstance(out.mems, Memory) and out.mems.count.dtype == jnp.int32
    out = step(tokens(1), out.mems)
    np.testing.assert_array_equal(out.mems.count, [4, 4])
