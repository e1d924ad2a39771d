"""What ``pip install deq_jax`` (no extras) is enough for: solve, differentiate, train.

Run it in a fresh virtual environment::

    python -m venv /tmp/venv_light && /tmp/venv_light/bin/pip install .
    /tmp/venv_light/bin/python examples/light_install.py

It solves the README's fixed point ("A fixed point in five lines") and its gradient,
then trains a `deq_jax.nn.DEQ` layer (an `MLPCell` and a linear readout) to regress a
smooth function of its input for a few optax Adam steps, and prints one JSON line:
the solver steps, the loss before and after, and any training, data or plotting
package that the run imported (there should be none). It exits non-zero if the loss
did not fall or such a package was imported.
"""

from __future__ import annotations

import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import deq_jax as dj

HEAVY = ("tensorflow", "tensorflow_datasets", "array_record", "orbax", "matplotlib")
HEAVY += ("tensorboardX", "ml_collections", "jaxopt", "sklearn")
STEPS = 30


def readme_fixed_point() -> dict:
    """The README's fixed point and its gradient (the README's code, unchanged)."""

    def f(z, args):  # a cell: same pytree structure in and out
        params, x = args
        return jnp.tanh(z @ params["W"] + x)

    key = jax.random.PRNGKey(0)
    params = {"W": 0.1 * jax.random.normal(key, (16, 16))}
    x = jax.random.normal(key, (8, 16))  # a batch of 8 independent problems
    sol = dj.fixed_point(
        f,
        jnp.zeros_like(x),
        (params, x),
        solver=dj.solvers.anderson(m=5, tol=1e-4, stop_mode="rel"),
        backward=dj.backward.ift(),
        max_iter=50,
    )
    loss = lambda p: dj.fixed_point(
        f, jnp.zeros_like(x), (p, x), solver=dj.solvers.anderson()
    ).value.sum()
    grads = jax.grad(loss)(params)
    residual = float(jnp.max(jnp.abs(f(sol.value, (params, x)) - sol.value)))
    return {
        "nstep": [int(n) for n in sol.stats.nstep],
        "residual": residual,
        "grad_finite": bool(jnp.all(jnp.isfinite(grads["W"]))),
    }


class Regressor(nn.Module):
    """A DEQ layer between a linear injection and a linear readout."""

    features: int = 16

    @nn.compact
    def __call__(self, x, *, train: bool):
        deq = dj.nn.DEQ(
            dj.nn.MLPCell(features=self.features),
            solver=dj.solvers.anderson(m=5, tol=1e-4),
            backward=dj.backward.ift(),
            train_max_iter=30,
            eval_max_iter=30,
        )
        z_star, stats = deq(nn.Dense(self.features)(x), train=train)
        return nn.Dense(1)(z_star)[:, 0], stats


def train_layer() -> dict:
    """Fits ``y = sin(3 x_0) + x_1^2`` with `STEPS` Adam steps; the losses and steps."""
    key_x, key_init = jax.random.split(jax.random.PRNGKey(1))
    x = jax.random.uniform(key_x, (64, 2), minval=-1.0, maxval=1.0)
    y = jnp.sin(3.0 * x[:, 0]) + x[:, 1] ** 2
    model = Regressor()
    params = model.init(key_init, x, train=False)["params"]
    optimizer = optax.adam(1e-2)

    def loss_fn(p):
        prediction, stats = model.apply({"params": p}, x, train=True)
        return jnp.mean((prediction - y) ** 2), stats

    @jax.jit
    def step(p, opt_state):
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss, stats

    opt_state, losses = optimizer.init(params), []
    for _ in range(STEPS):
        params, opt_state, loss, stats = step(params, opt_state)
        losses.append(float(loss))
    return {
        "steps": STEPS,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "mean_solver_steps": float(jnp.mean(stats.nstep)),
    }


def main() -> int:
    report = {"fixed_point": readme_fixed_point(), "deq_layer": train_layer()}
    report["heavy_imported"] = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    report["jax"], report["python"] = jax.__version__, sys.version.split()[0]
    print(json.dumps(report))
    layer = report["deq_layer"]
    ok = layer["loss_last"] < layer["loss_first"] and not report["heavy_imported"]
    return 0 if ok and report["fixed_point"]["grad_finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
