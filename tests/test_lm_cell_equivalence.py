"""The language model's cell after the speed work of issue 70 (the memory's keys and
values, the positions and the mask prepared once per solve; heads-first layouts)
computes what the cell before it computed: same parameters, outputs and gradients, in
float64 where rounding would blur a difference, and through the DEQ's prepared path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_cell_reference import ReferenceCell

import deq_jax as dj
from deq_jax.models.language import DEQTransformerCell, Memory, attention
from deq_jax.nn import DEQ, DEQSpec

B, L, M, D, H, DH, DI = 2, 5, 4, 8, 2, 4, 16


def _cells(ln_placement, dtype):
    kw = dict(dropout=0.2, dropatt=0.1, ln_placement=ln_placement, weight_norm=True, dtype=dtype)
    return DEQTransformerCell(D, H, DH, DI, **kw), ReferenceCell(D, H, DH, DI, **kw)


def _inputs(dtype, count):
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    memory = Memory(
        jax.random.normal(k[0], (B, M, D), dtype),
        0.3 * jax.random.normal(k[1], (B, M, 3 * H * DH), dtype),
        jnp.asarray(count, jnp.int32),
    )
    x = {"injection": 0.3 * jax.random.normal(k[2], (B, L, 3 * H * DH), dtype), "memory": memory}
    return jax.random.normal(k[3], (B, L, D), dtype), x


@pytest.mark.parametrize("ln_placement", ["post", "pre"])
@pytest.mark.parametrize("train", [False, True])
def test_cell_outputs_and_gradients_match_the_reference(ln_placement, train):
    with jax.enable_x64(True):
        cell, reference = _cells(ln_placement, jnp.float64)
        z, x = _inputs(jnp.float64, [M, 2])
        variables = cell.init(jax.random.PRNGKey(0), z, x)
        ref_variables = reference.init(jax.random.PRNGKey(0), z, x)
        assert jax.tree_util.tree_structure(variables) == jax.tree_util.tree_structure(
            ref_variables
        )  # a checkpoint of either restores into the other
        rngs = {"dropout": jax.random.PRNGKey(7)} if train else None

        def loss(module, v, z, inj):
            out = module.apply(v, z, {**x, "injection": inj}, rngs=rngs)
            return jnp.sum(jnp.sin(out)), out

        grad = jax.grad(loss, argnums=(1, 2, 3), has_aux=True)
        (g_new, out_new), (g_ref, out_ref) = [
            grad(m, variables, z, x["injection"]) for m in (cell, reference)
        ]
        np.testing.assert_allclose(out_new, out_ref, rtol=1e-12, atol=1e-12)
        for a, b in zip(
            jax.tree_util.tree_leaves(g_new), jax.tree_util.tree_leaves(g_ref), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_prepared_input_gives_the_unprepared_cell_in_float32():
    cell, _ = _cells("post", jnp.float32)
    z, x = _inputs(jnp.float32, [0, 3])
    variables = cell.init(jax.random.PRNGKey(0), z, x)
    rngs = {"dropout": jax.random.PRNGKey(1)}
    prepared = cell.apply(variables, x, rngs=rngs, method=DEQTransformerCell.prepare)
    np.testing.assert_array_equal(
        cell.apply(variables, z, prepared, rngs=rngs), cell.apply(variables, z, x, rngs=rngs)
    )


def test_deq_solves_the_prepared_cell_and_differentiates_through_the_preparation():
    with jax.enable_x64(True):
        cell, reference = _cells("post", jnp.float64)
        z, x = _inputs(jnp.float64, [M, M])
        spec = DEQSpec(solver=dj.solvers.anderson(tol=1e-11, max_iter=80))
        deqs = [DEQ(c, spec=spec) for c in (cell, reference)]
        variables = deqs[0].init(jax.random.PRNGKey(0), x, train=False)

        def loss(deq, v):
            z_star, _ = deq.apply(v, x, train=True, rngs={"dropout": jax.random.PRNGKey(2)})
            return jnp.sum(z_star**2)

        (l_new, g_new), (l_ref, g_ref) = [
            jax.value_and_grad(loss, argnums=1)(d, variables) for d in deqs
        ]
        np.testing.assert_allclose(l_new, l_ref, rtol=1e-9)
        for a, b in zip(
            jax.tree_util.tree_leaves(g_new), jax.tree_util.tree_leaves(g_ref), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_the_cpu_fusion_barrier_leaves_outputs_and_gradients_unchanged(monkeypatch):
    cell, _ = _cells("post", jnp.float32)
    z, x = _inputs(jnp.float32, [M, 1])
    variables = cell.init(jax.random.PRNGKey(0), z, x)
    rngs = {"dropout": jax.random.PRNGKey(4)}
    value_and_grad = lambda: jax.value_and_grad(
        lambda v: jnp.sum(jnp.sin(cell.apply(v, z, x, rngs=rngs)))
    )(variables)
    barrier = value_and_grad()  # the CPU path: behind the barrier
    monkeypatch.setattr(attention, "unfused_on_cpu", lambda probs: probs)  # the general path
    general = value_and_grad()
    for a, b in zip(
        jax.tree_util.tree_leaves(barrier), jax.tree_util.tree_leaves(general), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
