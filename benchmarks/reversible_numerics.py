"""How exact the reversible DEQ's backward pass is, as its steps grow.

The backward pass rebuilds each point of the forward iteration from the two after it,
``x_{k-1} = (x_{k+1} - b f(x_k)) / (1 - b)`` (`deq_jax.solvers.reversible_unstep`), and
so amplifies rounding errors. For each cell, dtype, ``beta`` and number of steps this
prints:

* ``recon``: the largest error ``||x_k' - x_k||`` of a rebuilt point against the one the
  forward pass computed (and stored, here only), relative to the largest ``||x_k||``;
* ``grad``: the relative error of `deq_jax.backward.reversible`'s gradient against
  autodiff through the same steps with every state stored, in the same dtype;
* ``autodiff``: for float32, that autodiff gradient's own error against float64's (the
  level of plain rounding, which ``grad`` is to be read against).

Three precisions: ``float64`` and ``float32`` (state, cell and parameters in one dtype)
and ``mixed``, McCallum et al.'s: the states (and so the reversible step's arithmetic)
in float64, the cell and its parameters in float32.

Cells: ``tanh`` (``tanh(z W + x)``, 16 x 64, ``W``'s spectral norm ``--rho``), ``lm``
(the DEQ-Transformer's cell at d_model 64, dropout on) and ``mdeq`` (MDEQ's cell at the
smoke size, 2 resolutions of 8 channels), each at its initial weights. Run from the
repository root::

    python -m benchmarks.reversible_numerics --cells tanh,lm,mdeq --steps 8,16,32,64 \\
        --betas 0.5,0.8 > /tmp/reversible_numerics.jsonl

``--memory`` prints instead XLA's compiled temporary memory of a gradient against the
steps, reversible against backprop through the steps and the IFT.

Results: docs/results/reversible.md.
"""

from __future__ import annotations

import argparse
import functools
import json

import jax
import jax.numpy as jnp

import deq_jax as dj
from deq_jax.solvers import reversible_step, reversible_unstep

tmap = jax.tree_util.tree_map


def _float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _cast(tree, dtype):
    return tmap(lambda x: x.astype(dtype) if _float(x) else x, tree)


def mixed(f):
    """``f`` on a float64 state computing in float32 (McCallum et al.'s setting: float32
    weights, float64 states): the state is cast down on the way in, the image up."""
    return lambda z, args: _cast(f(_cast(z, jnp.float32), args), jnp.float64)


def tanh_problem(rho: float, dtype=jnp.float32):
    del dtype  # computes in its input's dtype
    k = jax.random.split(jax.random.key(0), 2)
    w = jax.random.normal(k[0], (64, 64))
    w = rho * w / jnp.linalg.norm(w, 2)
    x = jax.random.normal(k[1], (16, 64))
    f = lambda z, args: jnp.tanh(z @ args[0] + args[1])
    return f, jnp.zeros((16, 64)), (w, x)


def lm_problem(dtype=jnp.float32):
    from deq_jax.models.language import DEQTransformerCell, Memory
    from deq_jax.nn import DEQ, DEQSpec

    b, length, m, d, h, dh, di = 4, 16, 16, 64, 4, 16, 256
    k = jax.random.split(jax.random.key(3), 4)
    memory = Memory(
        jax.random.normal(k[0], (b, m, d), dtype),
        0.3 * jax.random.normal(k[1], (b, m, 3 * h * dh), dtype),
        jnp.asarray([m, m // 2, m, 0], jnp.int32),
    )
    x = {
        "injection": 0.3 * jax.random.normal(k[2], (b, length, 3 * h * dh), dtype),
        "memory": memory,
    }
    cell = DEQTransformerCell(d, h, dh, di, dropout=0.1, weight_norm=True, dtype=dtype)
    deq = DEQ(cell, spec=DEQSpec(solver=dj.solvers.reversible()))
    z0 = jnp.zeros((b, length, d), dtype)
    variables = deq.init(jax.random.key(0), x, z0, train=False)
    p = deq.apply(variables, x, z0, train=True, method=DEQ.problem, rngs={"dropout": k[3]})
    return p.f, p.z0, p.args


def mdeq_problem(dtype=jnp.float32):
    del dtype  # MDEQ computes in its input's dtype
    from configs import mdeq_fashion_mnist
    from deq_jax.nn import deq_call
    from deq_jax.training.run import build

    config = mdeq_fashion_mnist.get_config("smoke")
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    x = jax.random.normal(jax.random.key(0), (4, 28, 28, 1), jnp.float32)
    variables = model.init(jax.random.key(1), x, train=False)
    p = deq_call(model, variables, x).problem
    return p.f, p.z0, p.args


def _norm(tree):
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def _diff(a, b):
    return tmap(lambda x, y: x - y, a, b)


def _loss(z):
    return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree.leaves(z))


def reconstruction_error(f, z0, args, beta, steps):
    """The largest relative error of the rebuilt points against the stored ones."""

    def fwd(carry, _):
        prev, cur = carry
        nxt = tmap(lambda p, fx: reversible_step(p, fx, beta), prev, f(cur, args))
        return (cur, nxt), nxt

    (prev, cur), stored = jax.lax.scan(fwd, (z0, z0), None, length=steps)  # x_1 .. x_n

    def back(carry, _):
        prev, cur = carry  # (x_{k-1}, x_k) -> (x_{k-2}, x_{k-1})
        before = tmap(lambda n, fx: reversible_unstep(n, fx, beta), cur, f(prev, args))
        return (before, prev), before

    _, rebuilt = jax.lax.scan(back, (prev, cur), None, length=steps)  # x_{n-2} .. x_{-1}
    # rebuilt[j] is x_{n-2-j}; compare x_{n-2} .. x_1 with the stored, then x_0, x_{-1}
    stored_rev = tmap(lambda s, z: jnp.concatenate([s[::-1][2:], z[None], z[None]]), stored, z0)
    per_step = jax.vmap(lambda a, b: _norm(_diff(a, b)))(rebuilt, stored_rev)
    scale = jnp.max(jax.vmap(_norm)(stored))  # z_0 may be 0: relative to the largest point
    return jnp.max(per_step) / scale


def gradients(f, z0, args, beta, steps):
    """(reversible gradient, autodiff gradient through the stored steps)."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    floats = [x for x in leaves if _float(x)]

    def full(fl):
        it = iter(fl)
        return jax.tree_util.tree_unflatten(treedef, [next(it) if _float(x) else x for x in leaves])

    solver = dj.solvers.reversible(beta=beta, tol=1e-30, max_iter=steps + 1, full_budget=True)
    exact = lambda fl: _loss(
        dj.fixed_point(f, z0, full(fl), solver=solver, backward=dj.backward.reversible()).value
    )

    def unrolled(fl):
        a = full(fl)

        def body(carry, _):
            prev, cur = carry
            return (cur, tmap(lambda p, fx: reversible_step(p, fx, beta), prev, f(cur, a))), None

        (_, z), _ = jax.lax.scan(body, (z0, z0), None, length=steps)
        return _loss(z)

    return jax.jit(jax.grad(exact))(floats), jax.jit(jax.grad(unrolled))(floats)


PROBLEMS = {"tanh": None, "lm": lm_problem, "mdeq": mdeq_problem}


def memory(steps_list: list[int]) -> None:
    """XLA's compiled temporary memory of one gradient of a tanh solve (batch 16 x 1,024,
    float32, the whole budget run) against the steps, for the reversible backward,
    backprop through the steps (``unrolled``) and the IFT."""
    k = jax.random.split(jax.random.key(0), 2)
    w = jax.random.normal(k[0], (1024, 1024))
    args = (0.5 * w / jnp.linalg.norm(w, 2), jax.random.normal(k[1], (16, 1024)))
    f = lambda z, a: jnp.tanh(z @ a[0] + a[1])
    z0 = jnp.zeros((16, 1024))
    for steps in steps_list:
        row = {"memory": "temp_bytes", "steps": steps}
        solver = dj.solvers.reversible(beta=0.8, tol=1e-30, max_iter=steps, full_budget=True)
        for name in ("reversible", "unrolled", "ift"):
            backward = dj.backward.get(name)

            def loss(a, b=backward, s=solver):
                return _loss(dj.fixed_point(f, z0, a, solver=s, backward=b).value)

            compiled = jax.jit(jax.grad(loss)).lower(args).compile()
            row[name] = int(compiled.memory_analysis().temp_size_in_bytes)
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="tanh,lm,mdeq")
    parser.add_argument("--steps", default="8,16,32,64")
    parser.add_argument("--betas", default="0.5,0.8")
    parser.add_argument("--rho", type=float, default=0.6, help="tanh W's spectral norm")
    parser.add_argument("--memory", action="store_true", help="Print the memory table only.")
    args = parser.parse_args()
    steps_list = [int(s) for s in args.steps.split(",")]
    if args.memory:
        memory(steps_list)
        return
    betas = [float(b) for b in args.betas.split(",")]
    jax.config.update("jax_enable_x64", True)
    for cell in args.cells.split(","):
        build = functools.partial(tanh_problem, args.rho) if cell == "tanh" else PROBLEMS[cell]
        # the cell in float64 for the float64 rows, in float32 for the others; the same
        # weights and inputs (the float32 problem's, cast up)
        problems = {jnp.float32: build(jnp.float32)}
        f64 = build(jnp.float64)[0]
        problems[jnp.float64] = (f64, *(_cast(x, jnp.float64) for x in problems[jnp.float32][1:]))
        for beta in betas:
            for steps in steps_list:
                row = {"cell": cell, "beta": beta, "steps": steps}
                g64 = None
                for name in ("float64", "float32", "mixed"):
                    state = jnp.float32 if name == "float32" else jnp.float64
                    f, z0, a = problems[jnp.float64 if name == "float64" else jnp.float32]
                    z = _cast(z0, state)
                    p = _cast(a, jnp.float64 if name == "float64" else jnp.float32)
                    fn = f if name != "mixed" else mixed(f)
                    recon = reconstruction_error(fn, z, p, beta, steps)
                    g_rev, g_ad = gradients(fn, z, p, beta, steps)
                    row[f"recon_{name}"] = float(recon)
                    row[f"grad_{name}"] = float(_norm(_diff(g_rev, g_ad)) / _norm(g_ad))
                    if g64 is None:
                        g64 = g_ad
                    elif name == "float32":
                        g32 = _cast(g_ad, jnp.float64)
                        row["autodiff_float32"] = float(_norm(_diff(g32, g64)) / _norm(g64))
                print(
                    json.dumps(
                        {
                            k: (f"{v:.2e}" if isinstance(v, float) and k != "beta" else v)
                            for k, v in row.items()
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
