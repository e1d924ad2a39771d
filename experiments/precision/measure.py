"""The cell's precision (`DEQSpec.precision`, issue 78): the residual floor, the solver
iterations, the fixed point and the gradient in bfloat16 against float32.

For three problems, the same weights and inputs in each precision:

* ``tanh``: the issue's tanh problem, ``tanh(z W + x)`` with ``d = 256``, batch 64,
  ``||W|| = 0.9``; Anderson at ``tol=1e-4`` (relative, per sample);
* ``lm``: the Shakespeare DEQ-Transformer's cell (``configs/lm_shakespeare.py``'s size),
  trained weights from ``--lm_workdir`` (a finished ``launch.main`` run; fresh weights
  without one), on 4 rows x 64 characters of the corpus with the memory of the 64 before;
  its config's solver (Anderson ``tol=1e-3``, budget 30 as in evaluation);
* ``mdeq``: the tiny MDEQ of ``tests/test_mdeq.py`` made contractive (`contractive`), on
  ``[8, 8, 8, 3]`` images; Anderson ``tol=1e-3``.

Each row is one precision (and floor margin): the mean floor the solve measured, the
forward iterations (``nstep``, plus the floor's one evaluation, ``evals``), the share of
samples that ran the whole budget (``burn``), the relative distance of ``z*`` to float32's
``z*`` at the same tolerance (``z_err``) and to a float32 solve at ``tol=1e-6``
(``z_err_ref``), and the cosine of the parameter gradient (IFT backward, its
tolerance the forward one) with float32's (``grad_cos``) and with the reference's
(``grad_cos_ref``)::

    python -m experiments.precision.measure --lm_workdir /tmp/lm78/f32 --out DIR

Prints a table per problem and writes ``DIR/precision.json``. ``--parts mdeq_tols``: the
MDEQ's float32 gradient against the reference's as its solve stops at larger residuals.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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
from configs import lm_shakespeare
from deq_jax import models
from deq_jax.nn import DEQ, DEQSpec
from deq_jax.training.families.lm_setup import restore_language_model

BF16 = "bfloat16"
# (precision, floor margin) of each row; "float32" is true float32 on every backend
ROWS = (("float32", 1.0), (BF16, 1.0), (BF16, 0.5))
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


def bf16_share(fn: Callable[..., Any], *args: Any) -> float:
    """The share of the ``dot_general`` and ``conv_general_dilated`` equations of
    ``fn(*args)`` (its jaxpr, sub-jaxprs included) whose operands are both bfloat16."""
    totals = {True: 0, False: 0}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
                totals[all(v.aval.dtype == jnp.bfloat16 for v in eqn.invars[:2])] += 1
            for sub in jex.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return totals[True] / max(totals[True] + totals[False], 1)


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


def contractive(params: Any) -> Any:
    """The MDEQ's parameters with the post-fusion norms' scales shrunk to 0.2 and their
    biases drawn from N(0, 1), so its cell contracts (as `tests/test_mdeq.py` does)."""
    flat = flatten_dict(params)
    for i, (path, value) in enumerate(sorted(flat.items())):
        if path[-2].startswith("post_gn"):
            draw = jax.random.normal(jax.random.key(100 + i), value.shape, value.dtype)
            flat[path] = 0.2 * value if path[-1] == "scale" else draw
    return unflatten_dict(flat)


def _spec(precision: str, margin: float, tol: float, budget: int) -> DEQSpec:
    return DEQSpec(
        solver=dj.solvers.anderson(tol=tol, max_iter=budget),
        backward=dj.backward.ift(),
        precision=precision,
        floor_margin=margin,
    )


def compare(run: Callable[[DEQSpec], tuple[Any, Any, Any]], tol: float, budget: int) -> list:
    """The rows of one problem; ``run(spec) -> (z_star, stats, grads)``."""
    z_ref, _, g_ref = run(_spec("float32", 1.0, 1e-6, 4 * budget))
    z32, _, g32 = run(_spec("float32", 1.0, tol, budget))
    rows = []
    for precision, margin in ROWS:
        z, stats, g = run(_spec(precision, margin, tol, budget))
        nstep = np.asarray(stats.nstep, np.float64)
        floor = None if stats.floor is None else float(np.mean(stats.floor))
        rows.append(
            dict(
                precision=precision,
                margin=margin,
                floor=floor,
                nstep=float(nstep.mean()),
                evals=float(nstep.mean()) + (floor is not None),
                burn=float(np.mean(nstep >= budget)),
                z_err=rel_error(z, z32),
                z_err_ref=rel_error(z, z_ref),
                grad_cos=cosine(g, g32),
                grad_cos_ref=cosine(g, g_ref),
            )
        )
    return rows


def tanh_problem() -> list:
    """The issue's tanh problem (module docstring)."""
    kw, kx, kv = jax.random.split(jax.random.key(0), 3)
    w = jax.random.normal(kw, (256, 256))
    w = 0.9 * w / jnp.linalg.norm(w, 2)
    x = jax.random.normal(kx, (64, 256))
    v = jax.random.normal(kv, (64, 256))
    cell = lambda z, a: jnp.tanh(z @ a[0] + a[1])

    def run(spec):
        def loss(w):
            sol = _deq_solve(spec, cell, w, x)
            return jnp.sum(sol.value * v), sol

        (_, sol), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(w)
        return sol.value, sol.stats, grads

    return compare(run, 1e-4, 40)


def _deq_solve(spec: DEQSpec, cell, w, x):
    """The solve a `DEQ` with ``spec`` runs: its solver and backward at its floor."""
    return dj.fixed_point(
        dj.precision.in_precision(cell, spec.precision),
        jnp.zeros_like(x),
        (w, x),
        solver=spec.solver_for(train=True),
        backward=spec.backward_for(),
    )


def lm_problem(workdir: str | None) -> list:
    """The Shakespeare LM's cell (module docstring)."""
    config = lm_shakespeare.get_config()
    seq, rows = 64, 4
    if workdir:
        model, variables, vocab, _ = restore_language_model(config, workdir)
        path = os.path.expanduser(os.path.join(config.task.path, "shakespeare.txt"))
        with open(path) as f:
            text = f.read()
        start = len(text) - 20 * rows * seq  # the corpus's last characters (test split)
        ids = vocab.encode(text[start : start + rows * 2 * seq + 1])
        tokens = jnp.asarray(ids[: rows * 2 * seq + 1])
        fields = dict(config.model, vocab_size=vocab.size)
    else:
        fields = dict(config.model, vocab_size=96)
        tokens = jax.random.randint(jax.random.key(0), (rows * 2 * seq + 1,), 0, 96)
        variables = None
    fields.pop("name")
    toks = tokens[:-1].reshape(rows, 2 * seq)
    targets = tokens[1:].reshape(rows, 2 * seq)
    make = lambda spec: models.get("deq_transformer_lm", deq=spec, **fields)
    if variables is None:
        fresh = make(_spec("float32", 1.0, 1e-3, 30))
        variables = fresh.init(
            jax.random.key(1), toks[:, :seq], mems=fresh.init_mems(rows), train=False
        )
    params = {"params": variables["params"]}
    base = make(_spec("float32", 1.0, 1e-6, 120))
    mems = base.apply(params, toks[:, :seq], mems=base.init_mems(rows), train=False).mems

    def run(spec):
        model = make(spec)

        def loss(p):
            out = model.apply(
                {"params": p}, toks[:, seq:], mems=mems, targets=targets[:, seq:], train=False
            )
            return out.nll.mean(), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params["params"])
        return out.z_star, out.stats, grads

    return compare(run, 1e-3, 30)


def _mdeq_run() -> Callable[[DEQSpec], tuple[Any, Any, Any]]:
    """``run(spec) -> (logits, stats, grads)`` of the tiny contractive MDEQ."""
    x = jax.random.normal(jax.random.key(1), (8, 8, 8, 3))
    labels = jnp.arange(8) % 10
    make = lambda spec: models.get("mdeq", deq=spec, **MDEQ_FIELDS)
    variables = make(_spec("float32", 1.0, 1e-3, 30)).init(jax.random.key(0), x, train=False)
    params = contractive(variables["params"])

    def run(spec):
        model = make(spec)

        def loss(p):
            logits, stats = model.apply({**variables, "params": p}, x, train=False)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return ce, (logits, stats)

        (_, (logits, stats)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return logits, stats, grads

    return run


def mdeq_problem() -> list:
    """The tiny contractive MDEQ (module docstring)."""
    return compare(_mdeq_run(), 1e-3, 60)


def mdeq_tolerances() -> list:
    """The MDEQ's float32 gradient against the reference's as its solve stops at larger
    residuals: how much of bfloat16's gradient error the residual alone explains."""
    run = _mdeq_run()
    _, _, g_ref = run(_spec("float32", 1.0, 1e-6, 240))
    rows = []
    for tol in (1e-3, 1.5e-3, 2e-3, 3e-3):
        _, stats, g = run(_spec("float32", 1.0, tol, 60))
        rows.append(
            dict(
                precision="float32",
                tol=tol,
                rel_residual=float(np.mean(stats.rel_residual)),
                nstep=float(np.mean(stats.nstep)),
                grad_cos_ref=cosine(g, g_ref),
            )
        )
    return rows


def table(name: str, rows: list) -> str:
    """One problem's rows as a markdown table."""
    keys = (
        tuple(rows[0])
        if "margin" not in rows[0]
        else (
            "precision",
            "margin",
            "floor",
            "evals",
            "burn",
            "z_err",
            "z_err_ref",
            "grad_cos",
            "grad_cos_ref",
        )
    )

    def fmt(key, v):
        if v is None:
            return "-"
        if key.startswith("grad_cos"):
            return f"{v:.6f}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = [f"{name}", "| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(fmt(k, row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the problems, prints their tables and writes them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm_workdir", default="", help="a trained configs/lm_shakespeare.py run")
    parser.add_argument("--parts", default="tanh,lm,mdeq", help="comma-separated problems")
    parser.add_argument("--out", default="", help="a directory for precision.json")
    args = parser.parse_args(argv)
    parts = dict(
        tanh=tanh_problem,
        lm=functools.partial(lm_problem, args.lm_workdir),
        mdeq=mdeq_problem,
        mdeq_tols=mdeq_tolerances,
    )
    result = dict(device=jax.devices()[0].device_kind, lm_workdir=args.lm_workdir)
    for part in args.parts.split(","):
        result[part] = parts[part]()
        print(table(part, result[part]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "precision.json"), "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
