"""The pieces of MDEQ-TINY's cell, timed one by one on the current code.

At the sizes of the torchdeq twin's comparison (`MDEQ-TINY`: 28x28x1 images, channels
24/24 at resolutions 28/14, expansion 5, 8 groups, batch 64; the config
``configs/mdeq_fashion_mnist.py`` with ``head_channels=(1, 1)`` and
``final_channels=4``), this prints one JSON line of median milliseconds (``--repeats``
calls after a warm-up) of:

* ``gn{24,120}`` / ``gn{24,120}_vjp``: one group norm of the MDEQ blocks
  (`deq_jax.models.mdeq.blocks.group_norm`) on ``[64, 28, 28, C]``, and the pullback
  of its input cotangent;
* ``conv_24_120`` / ``conv_120_24`` and their ``_vjp``: the blocks' weight-normalised
  3x3 convolutions at 28x28, and the pullback to their input;
* ``f`` / ``vjp``: one evaluation of the cell (the DEQ problem's ``f``, eval mode) at
  the fixed point of an 18-step solve, and one pullback ``u -> u^T df/dz`` there with
  the linearisation done once (what each iteration of the implicit backward solve
  evaluates); ``f_loop`` / ``vjp_loop``: the same per step of a 4-step
  ``lax.fori_loop``, the context the solvers run them in.

Each piece is a jitted function of its arguments; the pullbacks close over their
residuals (a `jax.vjp` outside the timed call). The pieces are timed in turns (one call
of each, ``--repeats`` rounds), so a busy machine slows all of them alike. With
``--reference`` every piece is also built as the code computed it before its CPU
speed-ups (`reference`: flax's `flax.linen.GroupNorm`, no widened convolutions) and
timed in the same turns, its name suffixed ``_ref``. Prints medians (``ms``) and minima
(``min_ms``). Run from the repository root::

    python -m benchmarks.mdeq_pieces --repeats 20 --reference

To compare two commits instead, run this file against each in turns (e.g. a
``git worktree`` of the older commit on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator

import flax.linen as nn
import jax

from configs import mdeq_fashion_mnist
from deq_jax.models.mdeq import blocks
from deq_jax.nn import conv as conv_lib
from deq_jax.nn import deq_call
from deq_jax.training.run import build

BATCH, SIZE, GROUPS = 64, 28, 8


def tiny_model():
    """MDEQ-TINY of the twin comparison, from the Fashion-MNIST config."""
    config = mdeq_fashion_mnist.get_config()
    config.model.head_channels = (1, 1)
    config.model.final_channels = 4
    return build.build_model(config.model, build.build_deq_spec(config.deq))


@contextlib.contextmanager
def reference() -> Iterator[None]:
    """Within the block, MDEQ's cell traces as before its CPU speed-ups: flax's
    `flax.linen.GroupNorm` in every group norm and no convolution computed with extra
    rows (`deq_jax.nn.conv.wide_rows_apply`)."""
    patched = blocks.group_norm, conv_lib.wide_rows_apply
    blocks.group_norm = lambda num_groups, name=None: nn.GroupNorm(
        num_groups=num_groups, epsilon=blocks.GROUP_NORM_EPS, name=name
    )
    conv_lib.wide_rows_apply = lambda *args: False
    try:
        yield
    finally:
        blocks.group_norm, conv_lib.wide_rows_apply = patched


def _layer_pieces(name: str, module, x: jax.Array) -> dict[str, tuple[Callable, tuple]]:
    """``name``: the jitted layer on ``x``; ``name_vjp``: its input pullback."""
    variables = jax.jit(module.init)(jax.random.key(0), x)
    apply = jax.jit(module.apply)
    _, pullback = jax.vjp(lambda h: module.apply(variables, h), x)
    u = jax.random.normal(jax.random.key(1), apply(variables, x).shape)
    return {
        name: (apply, (variables, x)),
        f"{name}_vjp": (jax.jit(lambda pb, u: pb(u)), (pullback, u)),
    }


def _cell_pieces(model, x: jax.Array) -> dict[str, tuple[Callable, tuple]]:
    """The cell's ``f`` and pullback at the fixed point, straight and in a loop."""
    variables = jax.jit(model.init, static_argnames="train")(jax.random.key(0), x, train=False)
    z = jax.jit(lambda v, x: deq_call(model, v, x).z_star)(variables, x)
    problem = deq_call(model, variables, x, max_iter=1).problem
    f, args = problem.f, problem.args
    _, pullback = jax.vjp(lambda z: f(z, args), z)
    u = jax.tree_util.tree_map(lambda a: jax.random.normal(jax.random.key(2), a.shape), z)

    def looped(step):
        return jax.jit(lambda c, *a: jax.lax.fori_loop(0, 4, lambda _, c: step(c, *a), c))

    return {
        "f": (jax.jit(f), (z, args)),
        "vjp": (jax.jit(lambda pb, u: pb(u)), (pullback, u)),
        "f_loop": (looped(f), (z, args)),
        "vjp_loop": (looped(lambda u, pb: pb(u)[0]), (u, pullback)),
    }


def pieces(which: set[str]) -> dict[str, tuple[Callable, tuple]]:
    """Every timed piece: name -> (jitted function, its arguments)."""
    out = {}
    for c in (24, 120):
        if "gn" in which:
            x = 2.0 * jax.random.normal(jax.random.key(c), (BATCH, SIZE, SIZE, c)) + 0.5
            out.update(_layer_pieces(f"gn{c}", blocks.group_norm(GROUPS), x))
    for c_in, c_out in ((24, 120), (120, 24)):
        if "conv" in which:
            x = jax.random.normal(jax.random.key(c_in), (BATCH, SIZE, SIZE, c_in))
            layer = blocks.conv(c_out, 3, weight_norm=True)
            out.update(_layer_pieces(f"conv_{c_in}_{c_out}", layer, x))
    if "cell" in which:
        x = jax.random.normal(jax.random.key(3), (BATCH, SIZE, SIZE, 1))
        out.update(_cell_pieces(tiny_model(), x))
    return out


def compiled(todo: dict[str, tuple[Callable, tuple]]) -> dict[str, tuple[Callable, tuple]]:
    """``todo`` after one call of each piece (its compile and warm-up)."""
    for fn, args in todo.values():
        jax.block_until_ready(fn(*args))
    return todo


def time_pieces(todo: dict[str, tuple[Callable, tuple]], repeats: int) -> dict[str, dict]:
    """Median and minimum milliseconds per piece (a loop's per step), the pieces called
    in turns."""
    times = {name: [] for name in todo}
    for _ in range(repeats):
        for name, (fn, args) in todo.items():
            began = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(1e3 * (time.perf_counter() - began))
    per_call = {k: 4 if "_loop" in k else 1 for k in todo}
    summary = {"ms": statistics.median, "min_ms": min}
    return {
        key: {k: round(stat(v) / per_call[k], 2) for k, v in times.items()}
        for key, stat in summary.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pieces", default="gn,conv,cell", help="Comma-separated subset.")
    parser.add_argument("--reference", action="store_true", help="Also time `reference`.")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    which = set(args.pieces.split(","))
    todo = compiled(pieces(which))
    if args.reference:
        with reference():
            todo.update(compiled({f"{k}_ref": v for k, v in pieces(which).items()}))
    result = time_pieces(todo, args.repeats)
    print(json.dumps({"tag": args.tag, "repeats": args.repeats, **result}), flush=True)


if __name__ == "__main__":
    main()
