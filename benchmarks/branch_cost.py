"""What a convolution's gradient costs inside a conditional or a loop body, and what the
train step's masked Jacobian draw saves on this machine.

XLA's CPU backend runs a convolution's weight gradient inside a `jax.lax.cond` branch
or a loop body on a generic kernel instead of its fast one (jax-ml/jax#12868), so
gradients computed inside control flow cost several times more than the same program
outside it. deq_jax avoids the two places where a training step would hit this:

* `deq_jax.backward.phantom_steps` (the Jacobian-free and phantom backward modes)
  unrolls its few steps in Python rather than in a ``lax.scan``;
* `deq_jax.training.make_train_step` with ``jacobian_freq < 1`` masks the drawn
  Jacobian term on CPU devices instead of branching (`branches_are_slow`).

This tool measures both, so the workarounds can be re-checked on a new JAX:

1. the gradient of two 3x3 convolutions (``--shape``, ``[B, H, W, C]``) plain, inside
   ``lax.cond`` and inside a one-step ``lax.scan`` (median of ``--repeats``, default 3,
   after a warm-up), with `jax.lax.conv_general_dilated` and with deq_jax's
   (`deq_jax.nn.conv`, whose derivatives are plain convolutions and matrix products);
2. the config's train step at forward budget ``--budget`` (whole
   budget, `benchmarks.step_cost`) with the Jacobian draw masked and as ``lax.cond``.

Usage (as recorded in BUILD_NOTES.md)::

    python -m benchmarks.branch_cost --config configs/mazes.py:benchmark \\
        --config.model.width=64 --config.regularizer.jacobian_weight=0.1 \\
        --config.regularizer.jacobian_freq=0.5 --workdir /tmp/branch_cost
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from absl import flags

from benchmarks import conv_cost, step_cost
from deq_jax.training.run.writers import write_json
from launch import flags as launch_flags

_SHAPE = flags.DEFINE_list("shape", ["32", "11", "11", "64"], "B,H,W,C of the convolutions.")
_BUDGET = flags.DEFINE_integer("budget", 8, "Forward budget of the train step.")
_BACKWARD = flags.DEFINE_string("backward", "jacobian_free", "Backward mode of the train step.")


def conv_gradient_ms(shape: Sequence[int], repeats: int, convolution: str) -> dict[str, float]:
    """Milliseconds of the gradient of ``sum(tanh(conv(tanh(conv(x, w)), w)))`` w.r.t.
    ``w`` and ``x``: ``plain``, inside ``lax.cond`` and inside a one-step ``lax.scan``,
    with ``convolution`` (one of `benchmarks.conv_cost.CONVOLUTIONS`) as ``conv``."""
    import jax
    import jax.numpy as jnp

    b, h, w_, c = (int(s) for s in shape)
    x = jax.random.normal(jax.random.key(0), (b, h, w_, c))
    kernel = 0.05 * jax.random.normal(jax.random.key(1), (3, 3, c, c))
    conv_fn = conv_cost.convolution(convolution)

    def conv(x, w):
        dims = ("NHWC", "HWIO", "NHWC")
        return conv_fn(x, w, (1, 1), "SAME", dimension_numbers=dims)

    def loss(w, x):
        return jnp.sum(jnp.tanh(conv(jnp.tanh(conv(x, w)), w)))

    grad = jax.grad(loss, argnums=(0, 1))

    def in_scan(w, x):
        (w, x), g = jax.lax.scan(lambda carry, _: (carry, grad(*carry)), (w, x), None, length=1)
        return g

    programs = {
        "plain": jax.jit(grad),
        "in_cond": jax.jit(lambda w, x, p: jax.lax.cond(p, grad, grad, w, 2 * x)),
        "in_scan": jax.jit(in_scan),
    }
    args = {"plain": (kernel, x), "in_cond": (kernel, x, True), "in_scan": (kernel, x)}
    timed = {k: (lambda f=f, k=k: f(*args[k])) for k, f in programs.items()}
    return {k: step_cost.median_ms(call, repeats) for k, call in timed.items()}


def train_step_seconds(config, workdir: str, budget: int, backward: str, repeats: int) -> dict:
    """The config's train step (`benchmarks.step_cost`) with the Jacobian draw masked and as
    a `jax.lax.cond`: ``{"masked": s, "cond": s}``."""
    from deq_jax.training.families import steps

    patched = steps.branches_are_slow
    seconds = {}
    try:
        for name, masked in (("masked", True), ("cond", False)):
            steps.branches_are_slow = lambda mesh, m=masked: m
            (row,) = step_cost.measure(config, workdir, [budget], [backward], repeats)
            seconds[name] = row["train_seconds"]
    finally:
        steps.branches_are_slow = patched
    return seconds


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    import jax

    report = {"device": jax.devices()[0].device_kind, "shape": [int(s) for s in _SHAPE.value]}
    report["conv_gradient_ms"] = {}
    for convolution in conv_cost.CONVOLUTIONS:
        ms = conv_gradient_ms(_SHAPE.value, step_cost._REPEATS.value, convolution)
        report["conv_gradient_ms"][convolution] = ms
        print(
            f"conv gradient {'x'.join(_SHAPE.value)} ({convolution}): "
            + ", ".join(f"{k} {v:.1f} ms ({v / ms['plain']:.1f}x)" for k, v in ms.items())
        )
    config, workdir = launch_flags.CONFIG.value, launch_flags.WORKDIR.value
    os.makedirs(workdir, exist_ok=True)
    step = train_step_seconds(
        config, workdir, _BUDGET.value, _BACKWARD.value, step_cost._REPEATS.value
    )
    report["train_step_seconds"] = step
    print(
        f"train step (budget {_BUDGET.value}, {_BACKWARD.value}): masked draw "
        f"{step['masked']:.3f} s, lax.cond {step['cond']:.3f} s "
        f"({step['cond'] / step['masked']:.1f}x)"
    )
    path = os.path.join(workdir, "branch_cost.json")
    write_json(path, report, indent=2)
    print(f"Wrote {path}", flush=True)


if __name__ == "__main__":
    launch_flags.run(main)
