"""CLRS model (deq_jax.models.clrs): processors, encoders, decoders, losses, loops, modes."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deq_jax import models
from deq_jax.models import clrs
from deq_jax.models.clrs.decoders import FeatureDecoder, feedback
from deq_jax.models.clrs.encoders import FeatureSpec, parse_spec
from deq_jax.models.clrs.loops import run_fixed_steps, unroll_to_fixed_point
from deq_jax.models.clrs.losses import feature_loss
from deq_jax.models.clrs.model import AUX_LOSS, ClrsModel
from deq_jax.models.clrs.processors import (
    MPNN,
    ProcessorInputs,
    TripletMPNN,
    max_reduce,
)
from deq_jax.nn import DEQSpec, with_terms
from deq_jax.regularizers import JacobianTerm, SpectralHinge, SpectralRadius
from deq_jax.solvers.anderson import anderson

KEY = jax.random.PRNGKey(0)
RNGS = {"params": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)}
H = 8


def processor_inputs(seed=0, batch=2, n=5, features=H):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    adj = jax.random.bernoulli(k[3], 0.5, (batch, n, n)).astype(jnp.float32)
    adj = jnp.maximum(adj, jnp.eye(n))  # self-loops, as CLRS's `adj`
    x = ProcessorInputs(
        jax.random.normal(k[0], (batch, n, features)),
        jax.random.normal(k[1], (batch, n, n, features)),
        jax.random.normal(k[2], (batch, features)),
        adj,
    )
    return x, jax.random.normal(jax.random.PRNGKey(seed + 1), (batch, n, H))


def permute(x: ProcessorInputs, perm) -> ProcessorInputs:
    return ProcessorInputs(
        x.node[:, perm], x.edge[:, perm][:, :, perm], x.graph, x.adjacency[:, perm][:, :, perm]
    )


def task_batch(algorithm="bellman_ford", split="train", n=6, size=8):
    task = clrs.ClrsTask(
        clrs.ClrsConfig(algorithm, train_nodes=n, test_nodes=(n + 3,), train_size=16, eval_size=8)
    )
    batch = next(task.eval_iterator(split, size))
    extras = {k: jnp.asarray(batch[k]) for k in task.batch_extras}
    return task, jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"]), extras


def clrs_model(algorithm="bellman_ford", **kw):
    deq = {"solver": anderson(tol=1e-4, max_iter=12), "train_max_iter": 12}
    deq |= {k: kw.pop(k) for k in ("solver", "backward", "z_init", "eval_max_iter") if k in kw}
    kw = {"hidden": H, "deq": DEQSpec(**deq)} | kw
    return ClrsModel(spec=clrs.model_spec(algorithm), **kw)


def init(model, n=6):
    return _jit_init(model, n)


# One program per model for the module (the models are hashable): a model built by
# several tests compiles its `init` once, and `apply` runs one compiled program instead
# of each op compiled eagerly and each of its loops again on every call. (`sown_aux`
# stays eager: its six models share their ops, compiled once, where jitted each would
# compile a program of its own.)
@functools.partial(jax.jit, static_argnums=(0, 1))
def _jit_init(model, n):
    return model.init(RNGS, jnp.zeros((1, n, n)), train=False)


@functools.partial(jax.jit, static_argnums=0)
def apply(model, variables, adj, **extras):
    """``model.apply`` in eval, jitted."""
    return model.apply(variables, adj, train=False, **extras)


# --- processors -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", [MPNN, TripletMPNN])
def test_processors_shape_and_permutation_equivariance(cls):
    x, z = processor_inputs()
    cell = cls(hidden=H, triplet_features=4)
    variables = cell.init(KEY, z, x)
    out = cell.apply(variables, z, x)
    chex.assert_shape(out, z.shape)
    assert cell.state_spec(x).shape == z.shape
    perm = jnp.array([3, 0, 4, 1, 2])
    permuted = cell.apply(variables, z[:, perm], permute(x, perm))
    np.testing.assert_allclose(permuted, out[:, perm], atol=1e-5)


def test_adjacency_aggregation_ignores_non_neighbours():
    x, z = processor_inputs(n=4)
    adj = jnp.broadcast_to(jnp.eye(4), (2, 4, 4))  # self-loops only
    x = x._replace(adjacency=adj)
    cell = MPNN(hidden=H)
    variables = cell.init(KEY, z, x)
    out = cell.apply(variables, z, x)
    # Changing a node's state changes no other node's update when nobody hears it.
    other = cell.apply(variables, z.at[:, 0].add(5.0), x)
    np.testing.assert_allclose(out[:, 1:], other[:, 1:], atol=1e-6)


def test_edge_state_processor_carries_a_pair_equivariantly():
    x, z = processor_inputs(n=5)
    s = jax.random.normal(jax.random.PRNGKey(7), (2, 5, 5, 3))
    cell = TripletMPNN(hidden=H, triplet_features=4, edge_state=3)
    spec = cell.state_spec(x)
    assert spec[0].shape == z.shape and spec[1].shape == s.shape
    variables = cell.init(KEY, (z, s), x)
    out, out_s = cell.apply(variables, (z, s), x)
    chex.assert_shape([out, out_s], [z.shape, s.shape])
    perm = jnp.array([3, 0, 4, 1, 2])
    moved, moved_s = cell.apply(variables, (z[:, perm], s[:, perm][:, :, perm]), permute(x, perm))
    np.testing.assert_allclose(moved, out[:, perm], atol=1e-5)
    np.testing.assert_allclose(moved_s, out_s[:, perm][:, :, perm], atol=1e-5)
    # Self-loops only: the state of the edge 0 -> 1 reaches node 1 through its message.
    x = x._replace(adjacency=jnp.broadcast_to(jnp.eye(5), (2, 5, 5)))
    plain, _ = cell.apply(variables, (z, s), x)
    changed, _ = cell.apply(variables, (z, s.at[:, 1, 1].add(5.0)), x)
    np.testing.assert_allclose(plain[:, 2:], changed[:, 2:], atol=1e-6)
    assert not np.allclose(plain[:, 1], changed[:, 1])
    with pytest.raises(ValueError, match="state pair"):
        cell.apply(variables, z, x)
    with pytest.raises(ValueError, match="edge_state"):
        MPNN(hidden=H, edge_state=3)


def test_max_reduce_matches_max_and_sends_the_gradient_to_one_maximiser():
    x = jnp.array([[1.0, 3.0, 3.0], [2.0, -1.0, 0.0]])
    np.testing.assert_allclose(max_reduce(x, 1), [3.0, 2.0])
    grad = jax.grad(lambda x: max_reduce(x, 1).sum())(x)
    np.testing.assert_allclose(grad, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


# --- codec ----------------------------------------------------------------------------


def test_pointer_decoder_rows_are_distributions_and_feedback_modes():
    spec = (FeatureSpec("pi", "output", "node", "pointer"),)
    x, z = processor_inputs()
    h = jnp.concatenate([x.node, z], axis=-1)
    decoder = FeatureDecoder(spec, H)
    logits = decoder.apply(decoder.init(KEY, h, x.edge, x.graph), h, x.edge, x.graph)["pi"]
    chex.assert_shape(logits, (2, 5, 5))
    soft = feedback(spec[0], logits, "soft")
    np.testing.assert_allclose(soft.sum(-1), 1.0, atol=1e-6)
    hard = feedback(spec[0], logits, "hard")
    np.testing.assert_array_equal(hard.argmax(-1), logits.argmax(-1))
    np.testing.assert_allclose(hard.sum(-1), 1.0)
    gumbel = feedback(spec[0], logits, "gumbel", key=KEY)
    np.testing.assert_allclose(gumbel, jax.nn.one_hot(gumbel.argmax(-1), 5), atol=1e-6)
    # Straight-through: the sample's gradient is the (noisy) softmax's.
    w = jax.random.normal(KEY, logits.shape)
    g_st = jax.grad(lambda y: jnp.sum(w * feedback(spec[0], y, "gumbel", key=KEY)))(logits)
    noise = jax.random.gumbel(KEY, logits.shape)
    g_soft = jax.grad(lambda y: jnp.sum(w * jax.nn.softmax(y + noise, -1)))(logits)
    np.testing.assert_allclose(g_st, g_soft, atol=1e-5)
    with pytest.raises(ValueError, match="key"):
        feedback(spec[0], logits, "gumbel")


def test_feature_losses_known_answers():
    mask = FeatureSpec("m", "hint", "node", "mask")
    np.testing.assert_allclose(feature_loss(mask, jnp.zeros((2, 3)), jnp.ones((2, 3))), math.log(2))
    scalar = FeatureSpec("d", "hint", "node", "scalar")
    np.testing.assert_allclose(feature_loss(scalar, jnp.ones((1, 2)), jnp.array([[1.0, 3.0]])), 2.0)
    pointer = FeatureSpec("pi", "hint", "node", "pointer")
    uniform = jnp.zeros((1, 4, 4))
    np.testing.assert_allclose(
        feature_loss(pointer, uniform, jnp.array([[0, 1, 2, 3]])), math.log(4)
    )
    cat = FeatureSpec("c", "hint", "graph", "categorical", 3)
    np.testing.assert_allclose(
        feature_loss(cat, jnp.zeros((1, 3)), jnp.eye(3)[:1]), math.log(3), 1e-6
    )


def test_parse_spec_rejects_bad_rows():
    with pytest.raises(ValueError, match="pointer"):
        parse_spec([("pi", "output", "node", "vector", 0)])
    with pytest.raises(ValueError, match="categories"):
        parse_spec([("c", "hint", "node", "categorical", 0)])
    with pytest.raises(ValueError, match="twice"):
        parse_spec([("a", "input", "node", "scalar"), ("a", "input", "edge", "scalar")])


# --- loops ----------------------------------------------------------------------------


def test_unroll_to_fixed_point_known_answer_penalty_and_gradient():
    b = jnp.array([[1.0, -2.0], [0.5, 0.0]])
    f = lambda z, b: 0.5 * z + b  # fixed point 2b

    def solve(b):
        return unroll_to_fixed_point(
            f, jnp.zeros_like(b), b, max_iter=60, tol=1e-6, stop_mode="abs"
        )

    z, stats, penalty = solve(b)
    np.testing.assert_allclose(z, 2 * b, atol=1e-5)
    assert np.all(stats.converged) and np.all(stats.nstep < 60) and stats.trace.shape == (2, 60)
    # Steps z_{t+1} - z_t = b / 2^t: the penalty is |b|^2 sum 4^-t = |b|^2 * 4 / 3.
    np.testing.assert_allclose(penalty, jnp.sum(b**2, 1) * 4 / 3, rtol=1e-4)
    grad = jax.grad(lambda b: solve(b)[0].sum())(b)  # backprop through time: dz*/db = 2
    np.testing.assert_allclose(grad, 2.0, atol=1e-4)


def test_run_fixed_steps_counts_freezes_scores_and_forces():
    spec = (FeatureSpec("m", "hint", "node", "mask"),)
    truth = jnp.stack([jnp.full((2, 3), float(t % 2)) for t in range(4)], axis=1)  # [B, T=4, n]
    lengths = jnp.array([4, 1], jnp.int32)

    def step(z, fed):  # adds the fed hint; decodes logits 0 (probability 1/2)
        return z + fed["m"][..., None], {"m": jnp.zeros((2, 3))}

    z0 = jnp.zeros((2, 3, 1))
    z, stats, hint_loss, _ = run_fixed_steps(step, z0, {"m": truth}, lengths, spec, train=True)
    np.testing.assert_array_equal(stats.nstep, [3, 1])  # max(length - 1, 1)
    np.testing.assert_allclose(z[0, :, 0], 0.0 + 0.5 + 0.5)  # truth at 0, then fed 1/2
    np.testing.assert_allclose(z[1, :, 0], 0.0)  # one step from the truth at 0, then frozen
    np.testing.assert_allclose(hint_loss, [math.log(2), 0.0], rtol=1e-6)  # no valid step
    forced = run_fixed_steps(
        step, z0, {"m": truth}, lengths, spec, train=True, key=KEY, teacher_forcing=1.0
    )[0]
    np.testing.assert_allclose(forced[0, :, 0], 0.0 + 1.0 + 0.0)  # the truth at t = 0, 1, 2
    evaluated = run_fixed_steps(step, z0, {"m": truth[:, :1]}, lengths, spec, train=False)
    np.testing.assert_allclose(evaluated[0], z)  # the same run from step 0's hints only
    with pytest.raises(ValueError, match="T >= 2"):
        run_fixed_steps(step, z0, {"m": truth[:, :1]}, lengths, spec, train=True)


# --- model ----------------------------------------------------------------------------


def test_registered_and_model_shapes():
    assert isinstance(models.get("clrs_deq", spec=clrs.model_spec("bfs")), ClrsModel)
    _, adj, targets, extras = task_batch()
    model = clrs_model()
    logits, stats = apply(model, init(model), adj, **extras)
    chex.assert_shape(logits, (8, 6, 6))
    chex.assert_shape(stats.nstep, (8,))
    _, adj, targets, extras = task_batch("mst_kruskal")
    model = clrs_model("mst_kruskal")
    logits, _ = apply(model, init(model), adj, **extras)
    chex.assert_shape(logits, (8, 6, 6, 2))
    np.testing.assert_array_equal(logits[..., 0], 0.0)


@pytest.mark.parametrize(
    "mode, options",
    [
        ("deq", {}),
        ("fixed_steps", {}),
        # Plain iteration: Anderson is equivariant too, but this random triplet cell does
        # not converge in 12 steps and rounding then moves its iterates apart.
        (
            "hint_propagation",
            dict(processor="triplet_mpnn", triplet_features=4, decode_edge_latents=True),
        ),
    ],
)
def test_model_is_permutation_equivariant(mode, options):
    task, adj, _, extras = task_batch(split="val")
    model = clrs_model(mode=mode, eval_max_iter=12, **options)
    variables = init(model)
    perm = jnp.array([4, 2, 0, 5, 1, 3])
    logits, _ = apply(model, variables, adj, **extras)
    inverse = jnp.argsort(perm)

    def relabel(key, value):  # node axes of every feature; pointer values renamed too
        if key == "lengths":
            return value
        value = value[:, :, perm] if key.startswith("hint_") else value[:, perm]
        if key in ("input_A",):
            value = value[:, :, perm]
        return inverse[value] if key == "hint_pi_h" else value

    permuted = {k: relabel(k, v) for k, v in extras.items()}
    out, _ = apply(model, variables, adj[:, perm][:, :, perm], **permuted)
    np.testing.assert_allclose(out, logits[:, perm][:, :, perm], atol=2e-4)


@pytest.mark.parametrize(
    "algorithm, mode, processor",
    [
        ("bellman_ford", "deq", "triplet_mpnn"),
        ("bellman_ford", "hint_propagation", "mpnn"),
        ("bellman_ford", "fixed_steps", "mpnn"),
        # Long hint runs through triplets: once 0 / 0 = NaN in `jnp.max`'s derivative.
        pytest.param("mst_kruskal", "fixed_steps", "triplet_mpnn", marks=pytest.mark.slow),
        pytest.param(
            "mst_kruskal", "hint_propagation", "triplet_mpnn+edges", marks=pytest.mark.slow
        ),
        pytest.param("mst_prim", "deq", "triplet_mpnn+edges", marks=pytest.mark.slow),
        pytest.param("dfs", "deq", "mpnn", marks=pytest.mark.slow),
    ],
)
def test_every_mode_has_finite_gradients(algorithm, mode, processor):
    _, adj, targets, extras = task_batch(algorithm)
    processor, _, edges = processor.partition("+")
    model = clrs_model(
        algorithm,
        mode=mode,
        processor=processor,
        triplet_features=4,
        step_penalty=0.1,
        decode_edge_latents=bool(edges),
    )
    variables = init(model)

    def loss(params):
        (logits, _), state = model.apply(
            {"params": params}, adj, train=True, rngs=RNGS, mutable=["intermediates"], **extras
        )
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1).mean()
        aux = state.get("intermediates", {}).get(AUX_LOSS, (jnp.zeros(()),))[0]
        return ce + aux.mean()

    value, grads = jax.jit(jax.value_and_grad(loss))(variables["params"])
    assert np.isfinite(value)
    chex.assert_tree_all_finite(grads)
    assert sum(float(jnp.abs(g).sum()) > 0 for g in jax.tree_util.tree_leaves(grads)) > 0.9 * len(
        jax.tree_util.tree_leaves(grads)
    )


def sown_aux(model, variables, adj, extras):
    _, state = model.apply(
        variables, adj, train=True, rngs=RNGS, mutable=["intermediates"], **extras
    )
    return state.get("intermediates", {}).get(AUX_LOSS)


def test_options_sow_the_losses_they_should():
    _, adj, _, extras = task_batch()
    deq = clrs_model(mode="deq")
    assert sown_aux(deq, init(deq), adj, extras) is None
    fixed = clrs_model(mode="fixed_steps")
    variables = init(fixed)  # the loss options change no parameter
    hint = sown_aux(fixed, variables, adj, extras)[0]
    assert hint.shape == (8,)
    np.testing.assert_array_equal(hint > 0, extras["lengths"] > 1)  # no hint step to score
    weighted = clrs_model(mode="fixed_steps", hint_loss_weight=2.0, step_penalty=0.5)
    np.testing.assert_array_less(2 * hint, sown_aux(weighted, variables, adj, extras)[0] + 1e-6)
    gumbel = clrs_model(mode="fixed_steps", gumbel_hints=True)
    assert not np.allclose(sown_aux(gumbel, variables, adj, extras)[0], hint)  # samples fed back
    unrolled = clrs_model(mode="hint_propagation")
    variables = init(unrolled)
    assert sown_aux(unrolled, variables, adj, extras) is None
    penalised = clrs_model(mode="hint_propagation", step_penalty=0.5)
    penalty = sown_aux(penalised, variables, adj, extras)[0]
    assert penalty.shape == (8,) and np.all(penalty > 0)


@pytest.mark.slow
def test_decode_edge_latents_feeds_the_triplet_latents_to_the_output_decoder():
    _, adj, _, extras = task_batch("mst_kruskal")
    kw = dict(processor="triplet_mpnn", triplet_features=4)
    plain, decoding = (
        clrs_model("mst_kruskal", **kw),
        clrs_model("mst_kruskal", decode_edge_latents=True, **kw),
    )
    variables = init(decoding)
    edge_kernel = variables["params"]["output_decoder"]["decode_in_mst_edge"]["kernel"]
    assert edge_kernel.shape == (2 * H, 1)  # input edge embedding + triplet latent
    assert init(plain)["params"]["output_decoder"]["decode_in_mst_edge"]["kernel"].shape == (H, 1)
    # The latents' half of the kernel is what the output depends on through them.
    zeroed = jax.tree_util.tree_map(lambda v: v, variables)
    zeroed["params"]["output_decoder"]["decode_in_mst_edge"]["kernel"] = edge_kernel.at[H:].set(0)
    run = lambda v: decoding.apply(v, adj, train=False, **extras)[0]
    assert not np.allclose(run(variables), run(zeroed))
    with pytest.raises(ValueError, match="triplet"):
        clrs_model(decode_edge_latents=True)
    with pytest.raises(ValueError, match="fixed_steps"):
        clrs_model(mode="fixed_steps", decode_edge_latents=True, **kw)
    # With the step penalty too, the one cell call at z* gives the same penalty as the
    # plain decoder's model (same processor parameters).
    penalised = [
        clrs_model("mst_kruskal", step_penalty=0.5, decode_edge_latents=d, **kw)
        for d in (False, True)
    ]
    plain_vars, decoding_vars = init(penalised[0]), init(penalised[1])
    plain_vars["params"] = {
        **decoding_vars["params"],
        "output_decoder": plain_vars["params"]["output_decoder"],
    }
    plain_penalty = sown_aux(penalised[0], plain_vars, adj, extras)[0]
    decoding_penalty = sown_aux(penalised[1], decoding_vars, adj, extras)[0]
    assert np.all(decoding_penalty > 0)
    np.testing.assert_allclose(decoding_penalty, plain_penalty, rtol=1e-5)
    x, z = processor_inputs()
    cell = MPNN(hidden=H)
    with pytest.raises(ValueError, match="no triplet edge latents"):
        cell.init(KEY, z, x, return_edges=True)


@pytest.mark.slow
def test_jacobian_terms_per_mode():
    _, adj, _, extras = task_batch()
    rngs = {**RNGS, "jacobian": KEY}
    terms = (JacobianTerm(samples=1), SpectralRadius(iters=3), SpectralHinge(iters=2))
    # the DEQ mode's come from `deq_jax.nn.DEQ`
    model = with_terms(clrs_model(mode="hint_propagation"), terms)
    _, state = model.apply(
        init(model), adj, train=True, rngs=rngs, mutable=["intermediates"], **extras,
    )  # fmt: skip
    terms = state["intermediates"]
    assert terms["jacobian_term"][0].shape == terms["spectral_radius"][0].shape == (8,)
    assert terms["spectral_estimate"][0].shape == (8,)
    assert np.all(terms["jacobian_term"][0] > 0) and np.all(terms["spectral_estimate"][0] > 0)
    model = with_terms(clrs_model(mode="deq"), (SpectralHinge(iters=2),))
    _, state = model.apply(
        init(model), adj, train=True, rngs=rngs, mutable=["intermediates"], **extras,
    )  # fmt: skip
    assert list(state["intermediates"]) == ["deq"]  # sown by the DEQ it solves with
    assert state["intermediates"]["deq"]["spectral_estimate"][0].shape == (8,)
    plain = clrs_model(mode="fixed_steps")
    for term in (JacobianTerm(), SpectralHinge()):
        model = with_terms(plain, (term,))
        with pytest.raises(ValueError, match="fixed point"):
            model.apply(init(plain), adj, train=True, rngs=rngs, **extras)


def test_edge_state_model_solves_the_pair_with_finite_gradients():
    task, adj, targets, extras = task_batch("mst_prim", split="val")
    model = clrs_model("mst_prim", processor="triplet_mpnn", triplet_features=4, edge_state=3)
    variables = init(model)
    assert variables["params"]["cell"]["edge_gate"]["kernel"].shape[-1] == 3

    def loss(params):
        logits, stats = model.apply({"params": params}, adj, train=True, rngs=RNGS, **extras)
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)
        return ce.mean(), stats

    (value, stats), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"])
    assert np.isfinite(value) and np.all(stats.nstep >= 1)
    chex.assert_tree_all_finite(grads)
    assert float(jnp.abs(grads["cell"]["edge_update"]["kernel"]).sum()) > 0
    for bad in (dict(mode="hint_propagation"), dict(step_penalty=0.1), dict(processor="gmpnn")):
        with pytest.raises(ValueError, match="edge_state"):
            clrs_model("mst_prim", **(dict(processor="triplet_mpnn", edge_state=3) | bad))


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="mode"):
        clrs_model(mode="forever")
    with pytest.raises(ValueError, match="output"):
        ClrsModel(spec=(("x", "output", "node", "scalar", 0),))
    _, adj, _, extras = task_batch()
    model = clrs_model(mode="fixed_steps")
    variables = init(model)
    with pytest.raises(ValueError, match="Unknown ClrsModel features"):
        model.apply(variables, adj, train=False, hint_typo=adj, **extras)
    with pytest.raises(ValueError, match="lengths"):
        model.apply(
            variables, adj, train=False, **{k: v for k, v in extras.items() if k != "lengths"}
        )
    with pytest.raises(ValueError, match="input_s"):
        model.apply(
            variables, adj, train=False, **{k: v for k, v in extras.items() if k != "input_s"}
        )
    with pytest.raises(ValueError, match="adjacency"):
        model.apply(variables, adj[:, :, :3], train=False, **extras)
