"""Mixed precision in the DEQ cells (`DEQSpec.compute_dtype`, issue 70): accuracy and
CPU step time of bfloat16 compute against float32.

Prints one JSON object: for a tanh cell, the tiny DEQ-Transformer LM and the tiny MDEQ
(the sizes of ``tests/test_mixed_precision.py``), the relative error of the fixed point
or logits, the loss difference, the cosine of the parameter gradients, the solver steps
and the share of the matmul and convolution multiply-adds of one cell evaluation that
run in bfloat16; and for the prefix-sum model of ``configs/prefix_sum.py`` the time of
a jitted train step (forward solve and backward) in each precision, interleaved, the
median of ``--repeats``::

    python -m experiments.mixed_precision.measure --repeats 15
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import optax
from flax.traverse_util import flatten_dict, unflatten_dict

import deq_jax as dj
from configs import prefix_sum
from deq_jax import models
from deq_jax.nn import DEQ, DEQSpec
from deq_jax.nn.cells import MLPCell
from deq_jax.training import build

BF16 = "bfloat16"
# The accuracy runs: a forward tolerance below bfloat16's rounding (the bfloat16 solve
# runs its budget and returns its best iterate), a backward one that it reaches.
SPEC = DEQSpec(
    solver=dj.solvers.anderson(tol=1e-5, max_iter=100), backward=dj.backward.ift(tol=1e-3)
)
# A training tolerance, for the solver steps each precision needs.
LOOSE = dj.solvers.anderson(tol=1e-3, max_iter=100)
# The tiny models of tests/test_language_model.py and tests/test_mdeq.py.
LM_FIELDS = dict(vocab_size=13, d_model=8, n_head=2, d_head=4, d_inner=16, mem_len=4, n_layer=2)
MDEQ_FIELDS = dict(
    channels=(4, 8),
    head_channels=(2, 4),
    final_channels=8,
    num_groups=2,
    expansion=2,
    dropout_rate=0.0,
    n_layer=3,
)


def _flat(tree: Any) -> jax.Array:
    return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(tree)])


def rel_error(a: Any, b: Any) -> float:
    """``||a - b|| / ||b||`` over all leaves."""
    a, b = _flat(a), _flat(b)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def cosine(a: Any, b: Any) -> float:
    """The cosine between two pytrees flattened to vectors."""
    a, b = _flat(a), _flat(b)
    return float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))


def _macs(eqn: Any) -> float:
    """Multiply-adds of a ``dot_general`` or ``conv_general_dilated`` equation."""
    out = float(np.prod(eqn.outvars[0].aval.shape))
    if eqn.primitive.name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return out * float(np.prod([lhs[d] for d in contract]))
    rhs = eqn.invars[1].aval.shape
    out_features = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
    return out * float(np.prod(rhs)) / out_features


def bf16_share(fn: Callable[..., Any], *args: Any) -> float:
    """The share of the matmul and convolution multiply-adds of ``fn(*args)`` (its jaxpr,
    sub-jaxprs included) whose operands are both bfloat16."""
    totals = {True: 0.0, False: 0.0}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
                bf16 = all(v.aval.dtype == jnp.bfloat16 for v in eqn.invars[:2])
                totals[bf16] += _macs(eqn)
            for sub in jex.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return totals[True] / max(totals[True] + totals[False], 1.0)


def cell_share(model: nn.Module, variables: Any, *inputs: Any, **kw: Any) -> float:
    """`bf16_share` of one evaluation of the ``f`` of the model's `DEQ` (`DEQ.problem`)."""
    problems = []

    def capture(next_fun, args, kwargs, context):
        if isinstance(context.module, DEQ) and context.method_name == "__call__":
            problems.append(context.module.problem(args[0], train=False))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(capture):
        model.apply(variables, *inputs, **kw)
    f, z0, args, _ = problems[0]
    return bf16_share(f, z0, args)


def tanh_cell() -> dict[str, float]:
    """The fixed point and parameter gradients of ``DEQ(MLPCell(32))`` on ``x [16, 8]``."""
    x = jax.random.normal(jax.random.key(0), (16, 8))
    w = jax.random.normal(jax.random.key(1), (16, 32))
    make = lambda dtype, solver=SPEC.solver: DEQ(
        MLPCell(features=32), spec=SPEC.replace(compute_dtype=dtype, solver=solver)
    )
    params = make(None).init(jax.random.key(2), x, train=False)["params"]
    out, nsteps = {}, {}
    for dtype in (None, BF16):
        model = make(dtype)
        loss = lambda p, m=model: jnp.sum(m.apply({"params": p}, x, train=False)[0] * w)
        z, stats = jax.jit(lambda p, m=model: m.apply({"params": p}, x, train=False))(params)
        out[dtype] = (z, stats, jax.jit(jax.grad(loss))(params))
        _, loose = make(dtype, LOOSE).apply({"params": params}, x, train=False)
        nsteps[dtype] = float(loose.nstep.mean())
    (z32, _, g32), (z16, s16, g16) = out[None], out[BF16]
    return dict(
        fixed_point_rel_error=rel_error(z16, z32),
        grad_cosine=cosine(g16, g32),
        grad_rel_error=rel_error(g16, g32),
        rel_residual_bf16=float(s16.rel_residual.max()),
        nstep_tol_1e3_f32=nsteps[None],
        nstep_tol_1e3_bf16=nsteps[BF16],
        bf16_share=cell_share(make(BF16), {"params": params}, x, train=False),
    )


def _lm_loss(model: nn.Module, params: Any, *, toks: jax.Array, targets: jax.Array):
    """The mean nll of ``model`` on one segment; its output as the aux."""
    mems = model.init_mems(toks.shape[0])
    out = model.apply({"params": params}, toks, mems=mems, targets=targets, train=False)
    return out.nll.mean(), out


def language_model() -> dict[str, float]:
    """The loss, fixed point and gradients of the tiny `DEQTransformerLM` on ``[2, 5]``
    tokens."""
    toks = jax.random.randint(jax.random.key(0), (2, 5), 0, 13)
    targets = jax.random.randint(jax.random.key(1), (2, 5), 0, 13)
    make = lambda dtype, solver=SPEC.solver: models.get(
        "deq_transformer_lm", deq=SPEC.replace(compute_dtype=dtype, solver=solver), **LM_FIELDS
    )
    model = make(None)
    mems = model.init_mems(2)
    params = model.init(jax.random.key(2), toks, mems=mems, train=False)["params"]
    out, nsteps = {}, {}
    for dtype in (None, BF16):
        loss = functools.partial(_lm_loss, make(dtype), toks=toks, targets=targets)
        out[dtype] = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        loose = functools.partial(_lm_loss, make(dtype, LOOSE), toks=toks, targets=targets)
        nsteps[dtype] = float(jax.jit(loose)(params)[1].stats.nstep.mean())
    ((l32, y32), g32), ((l16, y16), g16) = out[None], out[BF16]
    share = cell_share(make(BF16), {"params": params}, toks, mems=mems, train=False)
    return dict(
        loss_f32=float(l32),
        loss_abs_diff=float(abs(l16 - l32)),
        nll_max_abs_diff=float(jnp.abs(y16.nll - y32.nll).max()),
        fixed_point_rel_error=rel_error(y16.z_star, y32.z_star),
        grad_cosine=cosine(g16, g32),
        nstep_tol_1e3_f32=nsteps[None],
        nstep_tol_1e3_bf16=nsteps[BF16],
        bf16_share=share,
    )


def contractive(params: Any) -> Any:
    """The MDEQ's parameters with the post-fusion norms' scales shrunk to 0.2 and their
    biases drawn from N(0, 1), so its cell contracts (as `tests/test_mdeq.py` does)."""
    flat = flatten_dict(params)
    for i, (path, value) in enumerate(sorted(flat.items())):
        if path[-2].startswith("post_gn"):
            draw = jax.random.normal(jax.random.key(100 + i), value.shape, value.dtype)
            flat[path] = 0.2 * value if path[-1] == "scale" else draw
    return unflatten_dict(flat)


def mdeq() -> dict[str, float]:
    """The logits, loss and gradients of the tiny MDEQ on ``[2, 8, 8, 3]`` images."""
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
    labels = jnp.array([3, 7])
    make = lambda dtype: models.get("mdeq", deq=SPEC.replace(compute_dtype=dtype), **MDEQ_FIELDS)
    variables = make(None).init(jax.random.key(0), x, train=False)
    params = contractive(variables["params"])
    out = {}
    for dtype in (None, BF16):
        model = make(dtype)

        def loss(p, m=model):
            logits, stats = m.apply({**variables, "params": p}, x, train=False)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return ce, (logits, stats)

        (value, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        out[dtype] = (value, *aux, grads)
    (l32, y32, _, g32), (l16, y16, s16, g16) = out[None], out[BF16]
    return dict(
        loss_f32=float(l32),
        loss_abs_diff=float(abs(l16 - l32)),
        logits_rel_error=rel_error(y16, y32),
        grad_cosine=cosine(g16, g32),
        rel_residual_bf16=float(s16.rel_residual.max()),
        bf16_share=cell_share(make(BF16), {**variables, "params": params}, x, train=False),
    )


def _prefix_sum_step(dtype: str, batch: int, length: int) -> tuple[Any, ...]:
    """``(step, params, key, model, x)``: the jitted loss-and-gradient step of
    ``configs/prefix_sum.py``'s model, its arguments, the model and its input."""
    config = prefix_sum.get_config()
    config.deq.compute_dtype = dtype
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    bits = jax.random.bernoulli(jax.random.key(0), 0.5, (batch, length)).astype(jnp.int32)
    x, targets = bits[..., None].astype(jnp.float32), jnp.cumsum(bits, axis=1) % 2
    init_rngs = {"params": jax.random.key(1), "z0": jax.random.key(2)}
    params = model.init(init_rngs, x, train=False)["params"]

    def loss(p, key):
        logits, stats = model.apply({"params": p}, x, train=True, rngs={"z0": key})
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
        return ce, stats.nstep.mean()

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    return step, params, jax.random.key(3), model, x


def step_time(repeats: int, batch: int = 32, length: int = 32) -> dict[str, float]:
    """Median wall and CPU (all threads) seconds of the prefix-sum train step in
    float32 and bfloat16, the two interleaved."""
    steps = {d: _prefix_sum_step(d, batch, length) for d in ("", BF16)}
    wall, cpu = ({d: [] for d in steps} for _ in range(2))
    nsteps = {}
    for fn, params, key, _, _ in steps.values():
        jax.block_until_ready(fn(params, key))  # compile
    for _ in range(repeats):
        for d, (fn, params, key, _, _) in steps.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            (_, nsteps[d]), _ = jax.block_until_ready(fn(params, key))
            wall[d].append(time.perf_counter() - start)
            cpu[d].append(time.process_time() - start_cpu)
    median = lambda times, d: float(np.median(times[d]))
    _, params, key, model, x = steps[BF16]
    share = cell_share(model, {"params": params}, x, train=False, rngs={"z0": key})
    return dict(
        batch=batch,
        length=length,
        f32_wall_s=median(wall, ""),
        bf16_wall_s=median(wall, BF16),
        wall_ratio_bf16_over_f32=median(wall, BF16) / median(wall, ""),
        cpu_ratio_bf16_over_f32=median(cpu, BF16) / median(cpu, ""),
        nstep_f32=float(nsteps[""]),
        nstep_bf16=float(nsteps[BF16]),
        bf16_share=share,
    )


PARTS = dict(tanh_cell=tanh_cell, language_model=language_model, mdeq=mdeq)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs every measurement and prints (and returns) them as one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per precision")
    parser.add_argument(
        "--parts",
        default=",".join((*PARTS, "prefix_sum_step")),
        help="comma-separated measurements to run",
    )
    args = parser.parse_args(argv)
    result = dict(device=jax.devices()[0].device_kind)
    for part in args.parts.split(","):
        result[part] = step_time(args.repeats) if part == "prefix_sum_step" else PARTS[part]()
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
