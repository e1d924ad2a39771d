"""The language model's attention paths on this backend (issue 78): which kernel the cell
takes in bfloat16, whether the compiled cell and its VJP call cuDNN's fused attention,
what their programs write (`benchmarks.program_inventory`), how far the fused path's
outputs and gradients lie from the written-out float32 path, and the time of one cell
evaluation, one VJP and one DEQ train solve in each path::

    python -m benchmarks.lm_attention --size gpu --out /tmp/lm_attention.json   # a GPU
    python -m benchmarks.lm_attention --size gpu --norun                        # programs only
    python -m benchmarks.lm_attention --size smoke --implementation xla          # anywhere

The paths: ``written_out``, the cell in default precision (the attention written out;
TensorFloat-32 matmuls on NVIDIA GPUs), and ``fused``, the cell traced in bfloat16
precision (`deq_jax.precision.computing_in`), where
`deq_jax.models.language.attention.attention_implementation` picks the kernel
(``--implementation`` forces one, e.g. ``xla`` where cuDNN is absent). The reference of
the errors is the written-out path with true float32 matmuls. The VJP is w.r.t. ``z``,
its pullback made once, as the implicit backward applies it. Sizes:
`benchmarks.lm_cells`. Prints one JSON record (``--out`` also writes it): ``kernel``,
``checks`` (each true or false) and ``errors``, and per path its ``custom_calls``,
``programs`` (of ``f`` and the VJP, jaxpr and compiled) and ``ms``; ``--norun`` compiles
only (``programs`` and ``custom_calls``).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

import deq_jax as dj
from benchmarks.lm_cells import SIZES, cell_and_inputs, kernel_forced
from benchmarks.program_inventory import compiled_table, jaxpr_table
from deq_jax.models.language import DEQTransformerCell, attention
from deq_jax.nn import DEQ, DEQSpec
from deq_jax.precision import computing_in

# bfloat16 keeps 8 significant bits (eps 2^-7): the fused path's outputs lie within a
# few roundings of float32 (1.5e-3 at the smoke size on jax's XLA composition), its
# gradients within a few more (2e-3 to 3.5e-2 per leaf there, cosines above 0.9994)
OUTPUT_TOLERANCE = 1e-2
GRADIENT_TOLERANCE = 5e-2
GRADIENT_COSINE = 0.999


def define_flags() -> None:
    """The command line's flags, defined when it runs (tests import this module beside
    other benchmarks that define flags of the same names)."""
    flags.DEFINE_enum("size", "gpu", list(SIZES), "The cell's size.")
    flags.DEFINE_enum(
        "implementation", "", ["", "xla", "cudnn"], "Force the fused path's kernel ('': chosen)."
    )
    flags.DEFINE_integer("repeats", 10, "Timed calls of each function (medians).")
    flags.DEFINE_integer("deq_iters", 20, "Forward and backward iterations of the timed DEQ solve.")
    flags.DEFINE_bool("run", True, "Time the paths and compare them (else compile only).")
    flags.DEFINE_string("out", "", "Also write the JSON record to this file.")


def _relative(a: jax.Array, b: jax.Array) -> float:
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.maximum(jnp.linalg.norm(b.ravel()), 1e-30))


def _cosine(a: jax.Array, b: jax.Array) -> float:
    a, b = a.ravel(), b.ravel()
    return float(a @ b / jnp.maximum(jnp.linalg.norm(a) * jnp.linalg.norm(b), 1e-30))


def _attention(module, z, x):
    return module.attn(z, module.prepare(x)["context"])


def outputs_and_gradients(cell, variables, z, x) -> tuple[jax.Array, jax.Array, Any]:
    """The attention block's output, the cell's output (train mode) and the gradient of
    ``sum(sin(cell))`` w.r.t. the parameters, ``z`` and the injection, jitted."""
    rngs = {"dropout": jax.random.PRNGKey(2)}

    def loss(v, z, inj):
        out = cell.apply(v, z, {**x, "injection": inj}, rngs=rngs)
        return jnp.sum(jnp.sin(out)), out

    @jax.jit
    def run(v, z, inj):
        attn = cell.apply(v, z, {**x, "injection": inj}, rngs=rngs, method=_attention)
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(v, z, inj)
        return attn, out, grads

    return run(variables, z, x["injection"])


def _timed(call: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls after two untimed ones."""
    for _ in range(2):
        jax.block_until_ready(call())
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(call())
        seconds.append(time.perf_counter() - began)
    return 1e3 * statistics.median(seconds)


def _custom_calls(compiled_text: str) -> list[str]:
    return sorted(set(re.findall(r'custom_call_target="([^"]+)"', compiled_text)))


def measure_path(cell, variables, z, x, repeats: int, deq_iters: int) -> dict[str, Any]:
    """The custom calls and programs of ``f(z)`` (eval) and of one VJP of ``f`` w.r.t.
    ``z``; with ``repeats``, their milliseconds and a DEQ train step's (``deq_iters``
    forward and IFT backward iterations, full budgets)."""
    prepared = jax.jit(lambda v, x: cell.apply(v, x, method=DEQTransformerCell.prepare))(
        variables, x
    )
    f = lambda z, v, xp: cell.apply(v, z, xp)
    vjp = lambda z, v, xp: jax.vjp(lambda z: f(z, v, xp), z)[1](z)[0]
    record = {"custom_calls": [], "programs": {}}
    for name, fn in (("f", f), ("vjp", vjp)):
        text = jax.jit(fn).lower(z, variables, prepared).compile().as_text()
        record["custom_calls"] += _custom_calls(text)
        record["programs"][name] = {
            "jaxpr": jaxpr_table(jax.make_jaxpr(fn)(z, variables, prepared)),
            "compiled": compiled_table(text),
        }
    record["custom_calls"] = sorted(set(record["custom_calls"]))
    if not repeats:
        return record
    pullback = jax.jit(lambda z, v, xp: jax.vjp(lambda z: f(z, v, xp), z)[1])
    apply_pullback = jax.jit(lambda pb, u: pb(u)[0])
    pb = pullback(z, variables, prepared)
    solver = dj.solvers.anderson(tol=1e-12, max_iter=deq_iters)
    deq = DEQ(cell, spec=DEQSpec(solver=solver, backward=dj.backward.ift(solver=solver)))
    deq_vars = {"params": {"cell": variables["params"]}}
    rngs = {"dropout": jax.random.PRNGKey(3)}
    step = jax.jit(jax.grad(lambda v, x: jnp.sum(deq.apply(v, x, train=True, rngs=rngs)[0] ** 2)))
    f = jax.jit(f)
    record["ms"] = {
        "f": _timed(lambda: f(z, variables, prepared), repeats),
        "vjp": _timed(lambda: apply_pullback(pb, z), repeats),
        "deq_train_solve": _timed(lambda: step(deq_vars, x), max(1, repeats // 5)),
    }
    return record


def measure(size: str, implementation: str, repeats: int, deq_iters: int) -> dict[str, Any]:
    """The record of the module docstring (``implementation``: '' or a forced kernel;
    ``repeats`` 0: compile only)."""
    cell, variables, z, x = cell_and_inputs(size)
    chosen = attention.attention_implementation(attention.platform(), "bfloat16", False)
    record = {
        "size": size,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "kernel": implementation or chosen,
    }
    with kernel_forced(implementation):
        with computing_in("bfloat16"):
            fused = measure_path(cell, variables, z, x, repeats, deq_iters)
        written_out = measure_path(cell, variables, z, x, repeats, deq_iters)
        if repeats:
            with jax.default_matmul_precision("float32"):
                reference = outputs_and_gradients(cell, variables, z, x)
            with computing_in("bfloat16"):
                outputs = outputs_and_gradients(cell, variables, z, x)
    fmha = [c for c in fused["custom_calls"] if "fmha" in c.lower()]
    record["checks"] = {
        "kernel_is_cudnn": chosen == "cudnn",
        "cudnn_forward_and_backward": any("backward" in c.lower() for c in fmha)
        and any("backward" not in c.lower() for c in fmha),
    }
    if repeats:
        record["errors"] = errors = _errors(outputs, reference)
        record["checks"]["outputs_within_bfloat16"] = (
            max(errors["attention"], errors["cell"]) < OUTPUT_TOLERANCE
        )
        record["checks"]["gradients_within_bfloat16"] = (
            errors["gradient_max"] < GRADIENT_TOLERANCE
            and errors["gradient_min_cosine"] > GRADIENT_COSINE
        )
    return {**record, "written_out": written_out, "fused": fused}


def _errors(outputs, reference) -> dict[str, float]:
    """The fused path's relative errors against the float32 reference: the attention's
    and the cell's outputs, the largest of the gradients' and their smallest cosine."""
    grads = zip(*(jax.tree_util.tree_leaves(r[2]) for r in (outputs, reference)), strict=True)
    grads = list(grads)
    return {
        "attention": _relative(outputs[0], reference[0]),
        "cell": _relative(outputs[1], reference[1]),
        "gradient_max": max(_relative(a, b) for a, b in grads),
        "gradient_min_cosine": min(_cosine(a, b) for a, b in grads),
    }


def main(argv: list[str]) -> None:
    del argv
    f = flags.FLAGS
    record = measure(f.size, f.implementation, f.repeats if f.run else 0, f.deq_iters)
    text = json.dumps(record, indent=1)
    print(text)
    if f.out:
        with open(f.out, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    define_flags()
    app.run(main)
