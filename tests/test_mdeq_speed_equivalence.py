"""MDEQ computes what it computed before its CPU speed-ups (`deq_jax.models.mdeq`).

The reference is the previous implementation: flax's `flax.linen.GroupNorm` in every
group norm of the cell (monkeypatched into `deq_jax.models.mdeq.blocks.group_norm`) and
`jax.lax.conv_general_dilated` with lax's own derivatives in every convolution (the
general path of `deq_jax.nn.conv`, which takes over wherever ``fast_path_applies`` is
false). A small MDEQ-TINY-like model with seeded weights, in float64, gives the same
logits, batch statistics and parameter gradients both ways, in its weight-tied and its
DEQ mode, training (with dropout and batch statistics).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deq_jax as dj
from deq_jax.models.mdeq import MDEQ, blocks
from deq_jax.nn import conv as conv_lib
from deq_jax.nn.spec import DEQSpec

# MDEQ-TINY's structure (two resolutions, expansion 5, 8 groups, dropout), narrower and
# on 8x8 images.
FIELDS = dict(
    channels=(8, 16),
    head_channels=(2, 4),
    final_channels=8,
    num_groups=8,
    expansion=5,
    dropout_rate=0.25,
    n_layer=2,
)
# Every solve runs its whole budget, so that both ways iterate alike (and the backward
# solve cannot converge, which is no failure here).
SPEC = DEQSpec(
    solver=dj.solvers.anderson(tol=1e-30, max_iter=4),
    backward=dj.backward.ift(
        solver=dj.solvers.anderson(tol=1e-30, max_iter=4), on_failure="ignore"
    ),
)


def _previous_group_norm(num_groups, name=None):
    return nn.GroupNorm(num_groups=num_groups, epsilon=blocks.GROUP_NORM_EPS, name=name)


@pytest.fixture
def previous(monkeypatch):
    """A context in which the model traces as its previous implementation."""

    def enter():
        monkeypatch.setattr(blocks, "group_norm", _previous_group_norm)
        monkeypatch.setattr(conv_lib, "fast_path_applies", lambda *args, **kwargs: False)

    return enter


def _float64(tree):
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), tree)


def _run(model, variables, x, labels):
    """Training logits, updated batch statistics and the parameter gradients of a loss."""

    def loss(params):
        (logits, _), updates = model.apply(
            {**variables, "params": params},
            x,
            train=True,
            rngs={"dropout": jax.random.key(7)},
            mutable=["batch_stats"],
        )
        return jnp.sum(jax.nn.log_softmax(logits) * labels), (logits, updates)

    (_, (logits, updates)), grads = jax.value_and_grad(loss, has_aux=True)(variables["params"])
    return logits, updates, grads


def _close(new, old, rtol=1e-10):
    """Each leaf of ``new`` within ``rtol`` of ``old``'s largest entry; a leaf that is
    zero up to rounding (below 1e-13 of the tree's largest entry, e.g. the gradient of a
    bias that a norm cancels) is only checked to be as small."""
    largest = max(float(np.max(np.abs(b))) for b in jax.tree_util.tree_leaves(old))
    pairs = zip(
        jax.tree_util.tree_leaves_with_path(new), jax.tree_util.tree_leaves(old), strict=True
    )
    for (path, a), b in pairs:
        atol = max(rtol * float(np.max(np.abs(b))), 1e-13 * largest)
        np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))


# The weight-tied mode runs the same modules unrolled: slow (24 s in CI), the DEQ in CI.
@pytest.mark.parametrize("mode", [pytest.param("weight_tied", marks=pytest.mark.slow), "deq"])
def test_outputs_and_gradients_are_the_previous_implementations(x64, previous, mode):
    model = MDEQ(num_classes=5, deq=SPEC, mode=mode, **FIELDS)
    x = jax.random.normal(jax.random.key(1), (3, 8, 8, 1), jnp.float64)
    labels = jax.nn.one_hot(jnp.arange(3) % 5, 5, dtype=jnp.float64)
    variables = _float64(model.init(jax.random.key(0), x, train=False))
    new = jax.jit(functools.partial(_run, model))(variables, x, labels)
    previous()
    old = jax.jit(functools.partial(_run, model))(variables, x, labels)
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(old)
    assert new[0].dtype == jnp.float64
    _close(new[0], old[0])  # logits
    _close(new[1], old[1])  # batch statistics
    _close(new[2], old[2])  # parameter gradients
    cell_grads = jax.tree_util.tree_leaves(new[2]["cell"])
    assert sum(float(jnp.max(jnp.abs(g))) > 1e-8 for g in cell_grads) > 0.8 * len(cell_grads)
