"""The language model's attention through `jax.nn.dot_product_attention` (issue 78):
which path a call takes, and that the fused path computes what the written-out path
computes (outputs and gradients in float64, with memory partly filled, both layer-norm
placements; in bfloat16 precision within bfloat16 rounding of float32).

The fused path runs here on jax's XLA composition (``implementation="xla"``), the code
that cuDNN's kernel replaces on an NVIDIA GPU. That composition computes its softmax in
float32 whatever its inputs' dtype, so the float64 comparisons to 1e-12 swap in
`exact_attention`, its documented formula in the inputs' dtype, and a separate test
holds jax's own composition to float32 rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import lm_attention
from deq_jax.models.language import DEQTransformerCell, Memory, attention
from deq_jax.precision import computing_in

B, L, M, D, H, DH, DI = 2, 6, 4, 16, 2, 8, 32


def exact_attention(query, key, value, bias=None, mask=None, *, scale=None, implementation=None):
    """`jax.nn.dot_product_attention`'s formula (``[B, T, N, H]`` operands, ``bias`` and
    ``mask`` ``[B, N, T, S]``), every step in the operands' dtype."""
    logits = jnp.einsum("btnh,bsnh->bnts", query, key) * scale + bias
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(logits, axis=-1), value)


def _fused_where_allowed(platform, precision, dropout_active):
    """`attention_implementation` with the fused path on any backend (as on cuDNN)."""
    return "unfused" if dropout_active else "xla"


def _cell_and_inputs(ln_placement, dtype, count, dropatt=0.0):
    cell = DEQTransformerCell(
        D, H, DH, DI, dropout=0.2, dropatt=dropatt, ln_placement=ln_placement, dtype=dtype
    )
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    memory = Memory(
        jax.random.normal(k[0], (B, M, D), dtype),
        0.3 * jax.random.normal(k[1], (B, M, 3 * H * DH), dtype),
        jnp.asarray(count, jnp.int32),
    )
    x = {"injection": 0.3 * jax.random.normal(k[2], (B, L, 3 * H * DH), dtype), "memory": memory}
    z = jax.random.normal(k[3], (B, L, D), dtype)
    return cell, cell.init(jax.random.PRNGKey(0), z, x), z, x


def _attention(module, z, x):
    return module.attn(z, module.prepare(x)["context"])


def _outputs_and_gradients(cell, variables, z, x, rngs):
    """The attention block's output, the cell's output and the gradient of a loss on the
    latter w.r.t. the parameters, ``z`` and the injection."""

    def loss(v, z, inj):
        out = cell.apply(v, z, {**x, "injection": inj}, rngs=rngs)
        return jnp.sum(jnp.sin(out)), out

    attn = cell.apply(variables, z, x, rngs=rngs, method=_attention)
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        variables, z, x["injection"]
    )
    return attn, out, grads


def _both_paths(monkeypatch, cell, variables, z, x, rngs):
    unfused = _outputs_and_gradients(cell, variables, z, x, rngs)
    with monkeypatch.context() as patch:
        patch.setattr(attention, "attention_implementation", _fused_where_allowed)
        fused = _outputs_and_gradients(cell, variables, z, x, rngs)
    return fused, unfused


@pytest.mark.parametrize(
    "platform, precision, dropout_active, expected",
    [
        ("cuda", "bfloat16", False, "cudnn"),
        ("cuda", "bfloat16", True, "unfused"),
        ("cuda", "default", False, "unfused"),
        ("cuda", "float32", False, "unfused"),
        ("rocm", "bfloat16", False, "unfused"),
        ("cpu", "bfloat16", False, "unfused"),
        ("cpu", "default", False, "unfused"),
        ("tpu", "bfloat16", False, "unfused"),
    ],
)
def test_the_fused_kernel_is_chosen_on_nvidia_gpus_in_bfloat16_without_dropout(
    platform, precision, dropout_active, expected
):
    assert attention.attention_implementation(platform, precision, dropout_active) == expected
    assert expected in attention.IMPLEMENTATIONS


def test_the_cpu_keeps_the_written_out_attention_in_bfloat16_precision(monkeypatch):
    assert attention.platform() == jax.default_backend() == "cpu"

    def refuse(*args, **kwargs):
        raise AssertionError("the CPU path called jax.nn.dot_product_attention")

    monkeypatch.setattr(jax.nn, "dot_product_attention", refuse)
    cell, variables, z, x = _cell_and_inputs("post", jnp.float32, [M, 2])
    with computing_in("bfloat16"):
        assert cell.apply(variables, z, x).shape == z.shape


@pytest.mark.parametrize("ln_placement", ["post", "pre"])
@pytest.mark.parametrize("train", [False, True])
def test_the_fused_path_matches_the_written_out_path_in_float64(monkeypatch, ln_placement, train):
    monkeypatch.setattr(jax.nn, "dot_product_attention", exact_attention)
    with jax.enable_x64(True):
        cell, variables, z, x = _cell_and_inputs(ln_placement, jnp.float64, [M, 2])
        rngs = {"dropout": jax.random.PRNGKey(7)} if train else None
        fused, unfused = _both_paths(monkeypatch, cell, variables, z, x, rngs)
    for a, b in zip(*(jax.tree_util.tree_leaves(p) for p in (fused, unfused)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_jax_fused_kernel_agrees_to_its_float32_softmax(monkeypatch):
    with jax.enable_x64(True):
        cell, variables, z, x = _cell_and_inputs("pre", jnp.float64, [1, M])
        fused, unfused = _both_paths(monkeypatch, cell, variables, z, x, None)
    for a, b in zip(*(jax.tree_util.tree_leaves(p) for p in (fused, unfused)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_attention_dropout_keeps_the_written_out_path(monkeypatch):
    monkeypatch.setattr(attention, "attention_implementation", _fused_where_allowed)
    cell, variables, z, x = _cell_and_inputs("post", jnp.float32, [M, 2], dropatt=0.3)
    rngs = {"dropout": jax.random.PRNGKey(7)}
    monkeypatch.setattr(jax.nn, "dot_product_attention", None)  # any call would fail
    assert cell.apply(variables, z, x, rngs=rngs).shape == z.shape


def _relative_error(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("ln_placement", ["post", "pre"])
def test_the_fused_path_in_bfloat16_is_within_bfloat16_rounding_of_float32(
    monkeypatch, ln_placement
):
    cell, variables, z, x = _cell_and_inputs(ln_placement, jnp.float32, [M, 2])
    float32 = cell.apply(variables, z, x, method=_attention)
    monkeypatch.setattr(attention, "attention_implementation", _fused_where_allowed)
    with computing_in("bfloat16"):
        fused = cell.apply(variables, z, x, method=_attention)
    assert fused.dtype == jnp.float32
    # bfloat16 keeps 8 bits (eps 2^-7): rounding q, k, v, the bias and the probabilities
    # moved the block's output by 1.6e-3 (post-LN) and 2.6e-3 (pre-LN); the fused path
    # in float32 is 1e-7 from the written-out one
    assert 1e-4 < _relative_error(fused, float32) < float(jnp.finfo(jnp.bfloat16).eps)


def test_the_device_check_compiles_both_paths_at_the_smoke_size():
    record = lm_attention.measure("smoke", "xla", repeats=0, deq_iters=2)
    assert record["kernel"] == "xla" and not record["checks"]["kernel_is_cudnn"]  # the CPU
    for path in ("written_out", "fused"):
        programs = record[path]["programs"]
        assert programs["f"]["jaxpr"]["gflop"] > 0 < programs["vjp"]["jaxpr"]["gflop"]
        assert programs["f"]["compiled"]["matmul"]["count"] >= 4
    assert "ms" not in record["fused"] and "errors" not in record


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:IFT backward solve did not converge")  # 2 iterations
def test_the_device_check_passes_on_the_fused_path_at_the_smoke_size():
    record = lm_attention.measure("smoke", "xla", repeats=1, deq_iters=2)
    assert record["checks"]["outputs_within_bfloat16"]
    assert record["checks"]["gradients_within_bfloat16"]
    assert set(record["fused"]["ms"]) == {"f", "vjp", "deq_train_solve"}
