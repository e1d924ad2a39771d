"""What `deq_jax.nn.conv` saves on this machine: convolution derivatives and a config's
train step, each against `jax.lax.conv_general_dilated` in the same run.

On the CPU backend deq_jax's convolution layers build their derivatives from plain
convolutions and matrix products (`deq_jax.nn.conv`), because XLA:CPU runs the input
gradient of lax's transpose rule on a generic kernel inside loop bodies (an implicit
backward solve evaluates one per iteration) and its weight gradient slowly everywhere
(jax-ml/jax#12868). This tool times, for each ``--shapes`` entry ``B,H,W,in,out`` (a
3x3 convolution padded by one pixel; the default is MDEQ-TINY's two at batch 32):

* the forward convolution;
* the input VJP, per step of a ``lax.fori_loop`` of ``--loop_steps`` (what the
  implicit backward solve runs);
* the weight VJP (once per train step);

with lax's derivatives and with deq_jax's, and then the config's whole train step
(`benchmarks.step_cost`, the whole budget run) at forward budget ``--step_budget`` with
backward ``--step_backward``, both ways: the lax way by turning
`deq_jax.nn.conv.fast_path_applies` off for that compile; with ``--spectral_iters``
also the spectral-radius diagnostic (power iterations of JVPs, which the library traces
with lax's forward-mode rules: `deq_jax._forward_mode`). Medians of ``--repeats`` after
a warm-up. Writes ``{workdir}/conv_cost.json``.

Usage (as recorded in BUILD_NOTES.md)::

    python -m benchmarks.conv_cost --config configs/mdeq_fashion_mnist.py \\
        --config.train.batch_size=32 --workdir /tmp/conv_cost --synthetic \\
        --input_shape=28,28,1
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence

from absl import flags

from benchmarks import step_cost
from deq_jax.training.run.writers import write_json
from launch import flags as launch_flags

_SHAPES = flags.DEFINE_multi_string(
    "shapes",
    ["32,28,28,24,120", "32,28,28,120,24"],
    "B,H,W,in,out of a 3x3 convolution (repeat the flag for more).",
)
_LOOP_STEPS = flags.DEFINE_integer("loop_steps", 4, "Steps of the input-VJP loop.")
_BUDGET = flags.DEFINE_integer("step_budget", 12, "Forward budget of the train step.")
_BACKWARD = flags.DEFINE_string("step_backward", "ift", "Backward mode of the train step.")
_SKIP_TRAIN_STEP = flags.DEFINE_bool(
    "skip_train_step", False, "Time the convolutions only, not the config's train step."
)

CONVOLUTIONS = ("lax", "deq_jax")


@contextlib.contextmanager
def lax_derivatives() -> Iterator[None]:
    """Within the block, `deq_jax.nn.conv.conv_general_dilated` traces as lax's."""
    from deq_jax.nn import conv as conv_lib

    patched = conv_lib.fast_path_applies
    conv_lib.fast_path_applies = lambda *args, **kwargs: False
    try:
        yield
    finally:
        conv_lib.fast_path_applies = patched


def convolution(name: str) -> Callable:
    """The convolution one of `CONVOLUTIONS` names: lax's or deq_jax's (same signature)."""
    import jax

    from deq_jax.nn import conv as conv_lib

    return {"lax": jax.lax.conv_general_dilated, "deq_jax": conv_lib.conv_general_dilated}[name]


def convolution_ms(shape: Sequence[int], loop_steps: int, repeats: int) -> dict[str, dict]:
    """``{"lax" | "deq_jax": {"forward", "input_vjp_in_loop", "weight_vjp"}}`` in
    milliseconds for a 3x3 convolution ``[B, H, W, in] -> [B, H, W, out]``."""
    import jax
    import jax.numpy as jnp

    b, h, w, c_in, c_out = (int(s) for s in shape)
    x = jax.random.normal(jax.random.key(0), (b, h, w, c_in))
    kernel = 0.05 * jax.random.normal(jax.random.key(1), (3, 3, c_in, c_out))
    numbers = ("NHWC", "HWIO", "NHWC")
    pads = ((1, 1), (1, 1))

    report = {}
    for name in CONVOLUTIONS:
        conv = functools.partial(
            convolution(name), window_strides=(1, 1), padding=pads, dimension_numbers=numbers
        )

        def input_loop(x, k, u, conv=conv):
            _, pullback = jax.vjp(lambda x: conv(x, k), x)
            # each step's cotangent depends on the last, as in a backward solve
            step = lambda _, u: u + 1e-3 * jnp.mean(pullback(u)[0], -1, keepdims=True)
            return jax.lax.fori_loop(0, loop_steps, step, u)

        def weight_vjp(x, k, u, conv=conv):
            return jax.vjp(lambda k: conv(x, k), k)[1](u)[0]

        u = jnp.ones((b, h, w, c_out))
        programs = {
            "forward": (jax.jit(conv), (x, kernel), 1),
            "input_vjp_in_loop": (jax.jit(input_loop), (x, kernel, u), loop_steps),
            "weight_vjp": (jax.jit(weight_vjp), (x, kernel, u), 1),
        }
        report[name] = {
            key: step_cost.median_ms(lambda f=f, a=a: f(*a), repeats) / per
            for key, (f, a, per) in programs.items()
        }
    return report


def train_step_seconds(config, workdir: str, budget: int, backward: str, repeats: int) -> dict:
    """The config's train step (`benchmarks.step_cost`) with each convolution's derivatives:
    ``{"lax" | "deq_jax": {"train_seconds", "temp_bytes", "batch_size"}}``, with
    ``spectral_seconds`` (the spectral-radius diagnostic's step) for ``--spectral_iters``
    above 0."""
    synthetic, shape = step_cost._SYNTHETIC.value, [int(s) for s in step_cost._INPUT_SHAPE.value]
    spectral_iters = step_cost._SPECTRAL_ITERS.value
    keys = ("train_seconds", "temp_bytes", "batch_size", "spectral_seconds")
    rows = {}
    for name in CONVOLUTIONS:
        context = lax_derivatives() if name == "lax" else contextlib.nullcontext()
        with context:
            (row,) = step_cost.measure(
                config, workdir, [budget], [backward], repeats, synthetic, shape, spectral_iters
            )
        rows[name] = {k: row[k] for k in keys if k in row}
    return rows


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    import jax

    repeats = step_cost._REPEATS.value
    report = {"device": jax.devices()[0].device_kind, "convolutions": {}}
    print(f"{'convolution':<22}{'what':<20}{'lax ms':>10}{'deq_jax ms':>12}{'speed-up':>10}")
    for shape in _SHAPES.value:
        ms = convolution_ms(shape.split(","), _LOOP_STEPS.value, repeats)
        report["convolutions"][shape] = ms
        for key in ms["lax"]:
            lax, ours = ms["lax"][key], ms["deq_jax"][key]
            print(f"{shape:<22}{key:<20}{lax:>10.1f}{ours:>12.1f}{lax / ours:>9.1f}x")
    if not _SKIP_TRAIN_STEP.value:
        config, workdir = launch_flags.CONFIG.value, launch_flags.WORKDIR.value
        os.makedirs(workdir, exist_ok=True)
        step = train_step_seconds(config, workdir, _BUDGET.value, _BACKWARD.value, repeats)
        report["train_step"] = {"budget": _BUDGET.value, "backward": _BACKWARD.value, **step}
        lax, ours = step["lax"]["train_seconds"], step["deq_jax"]["train_seconds"]
        b = step["lax"]["batch_size"]
        print(
            f"train step (batch {b}, budget {_BUDGET.value}, {_BACKWARD.value}): lax "
            f"{lax:.3f} s ({b / lax:.1f} img/s, {step['lax']['temp_bytes'] / 2**20:.0f} MiB), "
            f"deq_jax {ours:.3f} s ({b / ours:.1f} img/s, "
            f"{step['deq_jax']['temp_bytes'] / 2**20:.0f} MiB): {lax / ours:.1f}x"
        )
        if "spectral_seconds" in step["lax"]:
            lax, ours = step["lax"]["spectral_seconds"], step["deq_jax"]["spectral_seconds"]
            print(
                f"spectral radius ({step_cost._SPECTRAL_ITERS.value} power iterations): lax "
                f"{lax:.3f} s, deq_jax {ours:.3f} s: {lax / ours:.1f}x"
            )
    path = os.path.join(launch_flags.WORKDIR.value, "conv_cost.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, report, indent=2)
    print(f"Wrote {path}", flush=True)


if __name__ == "__main__":
    launch_flags.run(main)
