"""Tests of the multiscale DEQ (`deq_jax.models.mdeq`) and the unroll it shares with the
language model (`deq_jax.nn.unroll`)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.test_util import check_grads

import deq_jax as dj
from deq_jax import models
from deq_jax.models.mdeq import (
    LARGE,
    MDEQ,
    SMALL,
    TINY,
    ClassificationHead,
    Downsample,
    MultiscaleCell,
    ResidualBlock,
    Stem,
    Upsample,
)
from deq_jax.nn import DEQSpec, deq_call
from deq_jax.regularizers.terms import JacobianTerm

# A tiny MDEQ: 2 resolutions of 4 and 8 channels, 8x8 images.
FIELDS = dict(
    channels=(4, 8),
    head_channels=(2, 4),
    final_channels=8,
    num_groups=2,
    expansion=2,
    dropout_rate=0.0,
    n_layer=3,
)
SPEC = DEQSpec(solver=dj.solvers.anderson(tol=1e-4, max_iter=60))


def _x(shape=(2, 8, 8, 3), seed=1, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def _count(tree):
    return sum(a.size for a in jax.tree_util.tree_leaves(tree))


def _init(model, x):
    return _jit_init(model, x)


# One program per (model, shape) for the whole module: the models are hashable, so the
# tests that build the same MDEQ share its compiled `init` and eval `apply` (each a few
# CPU seconds) instead of compiling their own.
@functools.partial(jax.jit, static_argnums=0)
def _jit_init(model, x):
    return model.init(jax.random.key(0), x, train=False)


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, variables, x):
    """The model's eval logits and stats."""
    return model.apply(variables, x, train=False)


@pytest.fixture(scope="module")
def mdeq_variables():
    """`_init` of the tiny DEQ MDEQ on `_x()`: the parameters of every mode and depth
    (the modes share them, `test_modes_share_parameters_and_clone_switches_the_mode`;
    ``n_layer`` and dropout add none)."""
    return _init(MDEQ(deq=SPEC, **FIELDS), _x())


def _contractive(variables):
    """The variables with the post-fusion norms' scales shrunk to 0.2 and their biases
    drawn from N(0, 1): the cell's output is then a fixed offset plus a small part that
    depends on ``z``, and the group norms (which undo any scale of ``z``) see mostly the
    offset, so the cell contracts (by about 0.2). A fresh MDEQ is not contractive."""
    flat = flatten_dict(variables["params"])
    for i, (path, value) in enumerate(sorted(flat.items())):
        if path[-2].startswith("post_gn"):
            draw = jax.random.normal(jax.random.key(100 + i), value.shape, value.dtype)
            flat[path] = 0.2 * value if path[-1] == "scale" else draw
    return {**variables, "params": unflatten_dict(flat)}


def _cell_params(channels, expansion):
    """Parameter count of a `MultiscaleCell` (weight norm on), computed by hand."""
    n = 0
    for c in channels:  # conv1 (+ scale), gn1, conv2 (+ scale), gn2, gn3
        e = expansion * c
        n += 9 * c * e + e + 2 * e + 9 * e * c + c + 4 * c
    if len(channels) == 1:
        return n
    for j, c_j in enumerate(channels):
        for i, c_i in enumerate(channels):
            if i < j:  # (j - i - 1) convs c_i -> c_i, then c_i -> c_j, each with a norm
                n += (j - i - 1) * (9 * c_i * c_i + 2 * c_i) + 9 * c_i * c_j + 2 * c_j
            elif i > j:  # 1x1 conv and a norm
                n += c_i * c_j + 2 * c_j
        n += c_j * c_j + c_j + 2 * c_j  # post-fusion conv (+ scale) and norm
    return n


def test_state_spec_and_cell_output_structure():
    cell = MultiscaleCell((4, 8, 8), expansion=2, num_groups=2)
    x = _x((2, 16, 16, 4))
    spec = cell.state_spec(x)
    assert isinstance(spec, tuple)
    assert [s.shape for s in spec] == [(2, 16, 16, 4), (2, 8, 8, 8), (2, 4, 4, 8)]
    assert all(s.dtype == jnp.float32 for s in spec)
    z = tuple(jnp.zeros(s.shape, s.dtype) for s in spec)
    variables = jax.jit(cell.init)(jax.random.key(0), z, x)
    assert _count(variables["params"]) == _cell_params((4, 8, 8), 2)
    out = jax.eval_shape(lambda v, z: cell.apply(v, z, x), variables, z)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(spec)
    assert [o.shape for o in out] == [s.shape for s in spec]


def _group_norm(h, p, groups, eps=1e-5):
    b, hh, ww, c = h.shape
    g = h.reshape(b, hh, ww, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    return ((g - mean) / jnp.sqrt(var + eps)).reshape(h.shape) * p["scale"] + p["bias"]


def _wn_conv3x3(h, p):
    v, g = p["kernel"], p["scale"]
    w = v * g / jnp.sqrt(jnp.sum(v**2, axis=(0, 1, 2)))
    dims = ("NHWC", "HWIO", "NHWC")
    return jax.lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dims)


def test_residual_block_is_locuslabs_basic_block():
    """``gn3(relu(gn2(conv2(relu(gn1(conv1(z)))) + injection) + z))``, written out with
    PyTorch's padding=1 and group-norm epsilon."""
    z, inj = _x((2, 6, 6, 4)), _x((2, 6, 6, 4), seed=2)
    block = ResidualBlock(4, expansion=3, num_groups=2)
    p = jax.jit(block.init)(jax.random.key(0), z, inj)["params"]
    p = jax.tree_util.tree_map(lambda a: a + 0.3 * _x(a.shape, seed=a.size), p)  # not 1 and 0

    @jax.jit  # one program, not each op compiled eagerly
    def block_and_by_hand(p):
        h = jax.nn.relu(_group_norm(_wn_conv3x3(z, p["conv1"]), p["gn1"], 2))  # [2, 6, 6, 12]
        h = _group_norm(_wn_conv3x3(h, p["conv2"]) + inj, p["gn2"], 2)
        return block.apply({"params": p}, z, inj), _group_norm(jax.nn.relu(h + z), p["gn3"], 2)

    np.testing.assert_allclose(*block_and_by_hand(p), atol=2e-5)


def test_fusion_paths_resample_by_powers_of_two():
    h = _x((2, 8, 8, 4))
    up = Upsample(6, levels=2, num_groups=2)
    out = up.apply(up.init(jax.random.key(0), h), h)
    assert out.shape == (2, 32, 32, 6)
    blocks = out.reshape(2, 8, 4, 8, 4, 6)  # nearest: constant on each 4x4 block
    np.testing.assert_array_equal(blocks, jnp.broadcast_to(blocks[:, :, :1, :, :1], blocks.shape))
    down = Downsample(6, levels=2, num_groups=2)
    variables = down.init(jax.random.key(0), h)
    assert down.apply(variables, h).shape == (2, 2, 2, 6)
    # two stride-2 convolutions, the first keeping the input's 4 channels
    assert variables["params"]["conv0"]["kernel"].shape == (3, 3, 4, 4)
    assert variables["params"]["conv1"]["kernel"].shape == (3, 3, 4, 6)


def test_mdeq_logits_stats_and_parameter_count():
    model = MDEQ(num_classes=7, deq=SPEC, **FIELDS)
    x = _x()
    variables = _init(model, x)
    assert set(variables) == {"params", "batch_stats"}
    assert set(variables["params"]) == {"stem", "cell", "head"}
    assert _count(variables["params"]["cell"]) == _cell_params((4, 8), 2)
    logits, stats = _apply(model, variables, x)
    assert logits.shape == (2, 7) and logits.dtype == jnp.float32
    assert isinstance(stats, dj.SolverStats)
    assert stats.nstep.shape == stats.rel_residual.shape == (2,)
    assert bool(jnp.all(jnp.isfinite(logits)))


def test_sizes_parameter_counts():
    """The sizes of locuslab's configs; the totals are this implementation's."""
    count = lambda size, shape: _count(
        jax.eval_shape(lambda: MDEQ(**size).init(jax.random.key(0), jnp.zeros(shape), train=False))[
            "params"
        ]
    )
    assert MDEQ().channels == TINY["channels"] == (24, 24)
    assert count(TINY, (1, 28, 28, 1)) == 158554
    assert _cell_params(SMALL["channels"], 5) == _cell_params(LARGE["channels"], 5) == 8716192
    assert count(SMALL, (1, 32, 32, 3)) == 14779338


def test_deq_output_is_a_fixed_point(mdeq_variables):
    model = MDEQ(deq=SPEC, **FIELDS)
    x = _x()
    variables = _contractive(mdeq_variables)

    @jax.jit
    def solve(variables, x):
        call = deq_call(model, variables, x)
        fz = call.problem.f(call.z_star, call.problem.args)
        diff = jax.tree_util.tree_map(jnp.subtract, fz, call.z_star)
        rel = dj.nn.unroll.row_norm(diff) / dj.nn.unroll.row_norm(fz)
        return call.z_star, call.stats, rel

    z_star, stats, rel = solve(variables, x)
    assert bool(jnp.all(stats.converged))
    np.testing.assert_array_less(rel, 1e-4)
    np.testing.assert_allclose(rel, stats.rel_residual, rtol=1e-3, atol=1e-6)
    # and the model's logits are the head's at that fixed point
    logits, _ = _apply(model, variables, x)
    head = ClassificationHead(FIELDS["head_channels"], FIELDS["final_channels"], 10)
    head_vars = {k: v["head"] for k, v in variables.items()}
    by_hand = jax.jit(lambda v, z: head.apply(v, z, train=False))(head_vars, z_star)
    np.testing.assert_allclose(logits, by_hand, rtol=1e-5, atol=1e-5)


def _by_hand(variables, x, steps):
    """The weight-tied network assembled from its parts: stem, ``steps`` cell
    applications from zeros, head; returns the logits and the last step's residual."""
    part = lambda name: {k: v[name] for k, v in variables.items() if name in v}
    u = Stem(FIELDS["channels"][0]).apply(part("stem"), x, train=False)
    cell = MultiscaleCell(FIELDS["channels"], FIELDS["expansion"], FIELDS["num_groups"])
    z = tuple(jnp.zeros(s.shape, s.dtype) for s in cell.state_spec(u))
    for _ in range(steps):
        z, previous = cell.apply(part("cell"), z, u), z
    residual = dj.nn.unroll.row_norm(jax.tree_util.tree_map(jnp.subtract, z, previous))
    head = ClassificationHead(FIELDS["head_channels"], FIELDS["final_channels"], 10)
    return head.apply(part("head"), z, train=False), residual


@pytest.mark.parametrize("jit", [False, True])
def test_weight_tied_is_the_cell_applied_n_layer_times(jit, mdeq_variables):
    model = MDEQ(deq=SPEC, **dict(FIELDS, n_layer=4), mode="weight_tied")
    x = _x()
    variables = mdeq_variables
    apply = lambda v, x: model.apply(v, x, train=False)
    logits, stats = (jax.jit(apply) if jit else apply)(variables, x)
    expected, residual = _by_hand(variables, x, 4)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(stats.nstep, [4, 4])
    np.testing.assert_allclose(stats.abs_residual, residual, rtol=1e-5)
    assert stats.trace.shape == (2, 4) and bool(jnp.all(stats.converged))
    # one step fewer is a different network
    assert not np.allclose(logits, _by_hand(variables, x, 3)[0], atol=1e-4)


def test_modes_share_parameters_and_clone_switches_the_mode(mdeq_variables):
    x = _x()
    deq = MDEQ(deq=SPEC, **FIELDS)
    tied = deq.clone(mode="weight_tied")
    v_deq, v_tied = mdeq_variables, _init(tied, x)
    shapes = lambda t: jax.tree_util.tree_map(jnp.shape, t)
    assert shapes(v_deq) == shapes(v_tied)
    jax.tree_util.tree_map(np.testing.assert_array_equal, v_deq, v_tied)
    variables = _contractive(v_deq)
    from_deq, s_deq = _apply(deq, variables, x)
    from_tied, s_tied = _apply(tied, variables, x)
    np.testing.assert_array_equal(s_tied.nstep, [3, 3])
    assert bool(jnp.all(s_deq.nstep > 3))
    np.testing.assert_array_equal(_apply(tied.clone(mode="deq"), variables, x)[0], from_deq)
    np.testing.assert_array_equal(_apply(deq.clone(mode="weight_tied"), variables, x)[0], from_tied)
    assert not np.allclose(from_deq, from_tied, atol=1e-6)


def test_implicit_gradient_matches_finite_differences(x64):
    """The IFT gradient of a readout of the multiscale fixed point, w.r.t. the stem's and
    the cell's parameters, against central differences (float64, tight solves). The
    readout is linear in ``z*``: the head's ReLUs sit exactly at their kink in a model
    this small (a zero bias on an all-zero input), where differences are meaningless."""
    solver = dj.solvers.fixed_point_iteration(tol=1e-12, max_iter=80, stop_mode="abs")
    spec = DEQSpec(solver=solver, backward=dj.backward.ift())
    model = MDEQ(deq=spec, **dict(FIELDS, channels=(4, 4)))
    x = _x((2, 4, 4, 2), dtype=jnp.float64)
    variables = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float64), _contractive(_init(model, x))
    )
    spec_z = MultiscaleCell((4, 4)).state_spec(_x((2, 4, 4, 4), dtype=jnp.float64))
    w = tuple(_x(s.shape, seed=2 + i, dtype=s.dtype) for i, s in enumerate(spec_z))

    def solve(params):
        return deq_call(model, {**variables, "params": params}, x)

    @jax.jit
    def loss_and_converged(params):
        call = solve(params)
        loss = sum(jnp.sum(z * w_i) for z, w_i in zip(call.z_star, w, strict=True))
        return loss, call.stats.converged

    params = variables["params"]
    assert bool(jnp.all(loss_and_converged(params)[1]))
    # One jitted loss for the convergence check, the differences, the checked gradient
    # and the one below: its forward and gradient programs compile once each (a fresh
    # jit(grad(loss)) compiled it again, a jitted check of convergence once more).
    jit_loss = lambda p: loss_and_converged(p)[0]
    check_grads(jit_loss, (params,), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)
    g_cell = jax.grad(jit_loss)(params)["cell"]
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(g_cell)) > 1e-3


def test_dropout_one_mask_per_solve_and_none_at_eval(mdeq_variables):
    model = MDEQ(deq=SPEC, **dict(FIELDS, dropout_rate=0.5))
    no_dropout = model.clone(dropout_rate=0.0)
    x = _x()
    variables = _contractive(mdeq_variables)

    @jax.jit
    def run(key):
        train = lambda m, rngs: m.apply(
            variables, x, train=True, rngs=rngs, mutable=["batch_stats"]
        )[0]
        rngs = {"dropout": key}
        return (
            train(model, rngs),
            train(no_dropout, rngs)[0],
            model.apply(variables, x, train=False, rngs=rngs)[0],
            no_dropout.apply(variables, x, train=False)[0],
        )

    (a, s_a), without, at_eval, eval_without = run(jax.random.key(1))
    (b, _), *_ = run(jax.random.key(1))
    (c, s_c), *_ = run(jax.random.key(2))
    # a mask that changed between iterations would leave no fixed point to converge to
    assert bool(jnp.all(s_a.converged)) and bool(jnp.all(s_c.converged))
    np.testing.assert_array_equal(a, b)  # one key, one mask: deterministic
    assert not np.allclose(a, c, atol=1e-4)
    assert not np.allclose(a, without, atol=1e-4)
    np.testing.assert_allclose(at_eval, eval_without, atol=1e-6)  # no mask at eval


def test_weight_tied_sows_penalty_terms_and_refuses_unknown_options(mdeq_variables):
    spec = SPEC.replace(terms=(JacobianTerm(weight=1.0),))
    model = MDEQ(deq=spec, mode="weight_tied", **FIELDS)
    x = _x()
    variables = mdeq_variables

    @jax.jit
    def run(variables, probe):
        return model.apply(
            variables,
            x,
            train=False,
            stats_probe=probe,  # accepted, left without gradient
            rngs={"jacobian": jax.random.key(3)},
            mutable=["intermediates"],
        )

    (logits, _), state = run(variables, dj.backward.stats_probe())
    assert logits.shape == (2, 10)
    (value,) = state["intermediates"]["jacobian_term"]
    assert value.shape == (2,) and bool(jnp.all(value > 0))
    with pytest.raises(TypeError, match="unexpected keyword"):
        model.apply(variables, x, train=False, budget=3)


def test_invalid_fields_and_inputs(mdeq_variables):
    with pytest.raises(ValueError, match="mode must be one of"):
        MDEQ(mode="unrolled")
    with pytest.raises(ValueError, match="head_channels needs one width per resolution"):
        MDEQ(channels=(8, 16), head_channels=(4, 8, 16))
    with pytest.raises(ValueError, match="must divide every resolution"):
        MDEQ(channels=(8, 12), head_channels=(4, 8), num_groups=8)
    with pytest.raises(ValueError, match="needs group norms of 2 groups"):  # 5 // 2 for post-fusion
        MultiscaleCell((5, 10), num_groups=5)
    with pytest.raises(ValueError, match="channels must be a non-empty"):
        MultiscaleCell(())
    with pytest.raises(ValueError, match="n_layer must be an integer"):
        MDEQ(n_layer=0)
    with pytest.raises(ValueError, match="expansion must be an integer"):
        MDEQ(expansion=0)
    model = MDEQ(deq=SPEC, **FIELDS)
    variables = mdeq_variables
    with pytest.raises(TypeError, match="unexpected keyword"):  # the mode is a field only
        model.apply(variables, _x(), train=False, mode="weight_tied")
    with pytest.raises(ValueError, match=r"images \[B, H, W, C\]"):
        model.apply(variables, _x((2, 8, 8)), train=False)
    with pytest.raises(ValueError, match="divisible by 2"):
        model.apply(variables, _x((2, 8, 7, 3)), train=False)
    with pytest.raises(ValueError, match="divisible by 4"):
        MDEQ(channels=(4, 4, 4), head_channels=(1, 1, 1), num_groups=2).init(
            jax.random.key(0), _x((1, 6, 8, 3)), train=False
        )
    cell = MultiscaleCell((4, 8), num_groups=2)
    with pytest.raises(ValueError, match="highest resolution's 4 channels"):
        cell.state_spec(_x((2, 8, 8, 3)))
    with pytest.raises(ValueError, match="one map per resolution"):
        cell.init(jax.random.key(0), (jnp.zeros((2, 8, 8, 4)),), _x((2, 8, 8, 4)))


def test_registry_builds_the_sizes():
    assert "mdeq" in models.names()
    for size in (TINY, SMALL, LARGE):
        model = models.get("mdeq", deq=SPEC, **size)
        assert isinstance(model, MDEQ) and model.deq is SPEC
        assert model.channels == size["channels"] and model.n_layer == size["n_layer"]
    assert len(SMALL["channels"]) == 4 and SMALL["channels"] == (32, 64, 128, 256)


def test_run_tied_on_a_pytree_state():
    class Pair(nn.Module):
        @nn.compact
        def __call__(self, z, x):
            a, b = z
            return (0.5 * b + x, nn.Dense(3, use_bias=False)(a) * 0.1)

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            z0 = (jnp.zeros_like(x), jnp.zeros_like(x))
            return dj.nn.run_tied(self, Pair(name="cell"), 5, x, z0, None, keep=(2, 5))

    x = _x((4, 3))
    variables = Net().init(jax.random.key(0), x)
    (z, stats, states) = Net().apply(variables, x)
    cell = Pair()
    by_hand = [(jnp.zeros_like(x), jnp.zeros_like(x))]
    for _ in range(5):
        by_hand.append(cell.apply({"params": variables["params"]["cell"]}, by_hand[-1], x))
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    jax.tree_util.tree_map(close, z, by_hand[5])
    jax.tree_util.tree_map(close, states, [by_hand[2], by_hand[5]])
    last = jax.tree_util.tree_map(jnp.subtract, by_hand[5], by_hand[4])
    np.testing.assert_allclose(stats.abs_residual, dj.nn.unroll.row_norm(last), rtol=1e-5)
    assert stats.nstep.shape == (4,) and stats.trace.shape == (4, 5)
