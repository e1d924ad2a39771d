"""The arithmetic a DEQ's cell computes in: one name, ``"default"``, ``"float32"`` or
``"bfloat16"``.

* ``"default"``: the backend's own arithmetic for float32 matmuls and convolutions
  (true float32 on the CPU, TensorFloat-32 on recent NVIDIA GPUs, one bfloat16 pass on
  TPUs). The cell is traced as written.
* ``"float32"``: true float32 matmuls and convolutions on every backend (the cell is
  traced under `jax.default_matmul_precision` ``"float32"``).
* ``"bfloat16"``: every matmul and convolution of the cell takes bfloat16 operands and
  accumulates in float32 (``preferred_element_type``); everything else (norms,
  softmax, activations, the state, the output) stays in its own dtype, float32. This
  is the TPU's default arithmetic, asked for on any backend. It is applied to the
  cell's traced program (`jax.make_jaxpr`), so any cell gets it, whatever layers it is
  written with: each ``dot_general`` and ``conv_general_dilated`` with operands wider
  than bfloat16 has them cast, inside jitted calls, custom derivatives' primal
  functions, loops and branches too (a custom derivative's own rule keeps its
  arithmetic). Matmuls whose operands are bfloat16 already are left as they are. On a
  backend without bfloat16 matrix units (the CPU) the arithmetic is emulated: the
  numbers are bfloat16's, the speed is not (one note says so).

The state a solver keeps, its history, the residuals and the backward solve never leave
float32: only the cell's inside changes. What the reduced arithmetic costs in accuracy,
the residual floor under which no solver can push ``||f(z) - z||``, is measured by the
solve itself (`deq_jax.solvers.floor`), with the unit roundoff `unit_roundoff` gives.

`current_precision` tells a layer, while its cell is traced, which arithmetic the DEQ
asked for, so that it can pick a kernel for it (the language model's attention takes
cuDNN's fused kernel in bfloat16 on NVIDIA GPUs).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

PRECISIONS = ("default", "float32", "bfloat16")

# The unit roundoff (2^-p for p significand bits) of each arithmetic a cell's matmuls
# can run in: bfloat16 8 bits, TensorFloat-32 11, float32 24.
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "tensorfloat32": 2.0**-11, "float32": 2.0**-24}

# What "default" is on each backend (float32 matmul operands): JAX leaves the choice to
# the backend, which takes TF32 on NVIDIA GPUs since Ampere and one bfloat16 pass on TPUs.
DEFAULT_ARITHMETIC = {"cpu": "float32", "gpu": "tensorfloat32", "tpu": "bfloat16"}

# Backends with bfloat16 matrix units: elsewhere "bfloat16" is emulated.
NATIVE_BFLOAT16 = ("gpu", "tpu")

_ACTIVE: contextvars.ContextVar[str] = contextvars.ContextVar(
    "deq_jax_precision", default="default"
)


def check_precision(name: str) -> str:
    """``name`` if it is a precision's name.

    Raises:
      ValueError: naming the valid precisions.
    """
    if name not in PRECISIONS:
        raise ValueError(f"Unknown precision {name!r}. Valid precisions: {', '.join(PRECISIONS)}.")
    return name


def current_precision() -> str:
    """The precision of the cell being traced: ``"default"`` outside a DEQ's cell."""
    return _ACTIVE.get()


@contextlib.contextmanager
def computing_in(name: str) -> Iterator[None]:
    """Within the block, `current_precision` answers ``name``."""
    token = _ACTIVE.set(check_precision(name))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _platform(backend: str | None) -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"`` for a backend name (``None``: JAX's default)."""
    name = backend or jax.default_backend()
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def arithmetic(name: str, backend: str | None = None) -> str:
    """The arithmetic of a cell's float32 matmuls under precision ``name`` on
    ``backend`` (``None``: JAX's default backend): ``"float32"``, ``"tensorfloat32"``
    or ``"bfloat16"`` (``"bfloat16"`` for an unknown backend's default, the coarsest)."""
    check_precision(name)
    if name != "default":
        return name
    return DEFAULT_ARITHMETIC.get(_platform(backend), "bfloat16")


def unit_roundoff(name: str, backend: str | None = None) -> float | None:
    """The unit roundoff of precision ``name``'s matmuls on ``backend``, or ``None``
    where they are true float32 (a residual floor far below any tolerance a DEQ uses,
    which a solve then does not measure)."""
    kind = arithmetic(name, backend)
    return None if kind == "float32" else UNIT_ROUNDOFF[kind]


def in_precision(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` computed in precision ``name`` (module docstring); same signature and
    outputs, differentiable like ``fn``.

    Raises:
      ValueError: for an unknown precision (naming the valid ones).
    """
    check_precision(name)

    @functools.wraps(fn)
    def computed(*args: Any) -> Any:
        with computing_in(name):
            if name == "default":
                return fn(*args)
            if name == "float32":
                with jax.default_matmul_precision("float32"):
                    return fn(*args)
            _note_emulated()
            closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        outs = _eval_bfloat16(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)

    return computed


@functools.cache
def _note_emulated_on(platform: str) -> None:
    if platform not in NATIVE_BFLOAT16:
        warnings.warn(
            f"deq_jax: precision='bfloat16' is emulated on the {platform} backend (no "
            "bfloat16 matrix units): the numbers are bfloat16's, the speed is not.",
            stacklevel=4,
        )


def _note_emulated() -> None:
    """One note per process and backend where bfloat16 matmuls are emulated."""
    _note_emulated_on(_platform(None))


def _wider_than_bfloat16(x: Any) -> bool:
    dtype = jnp.result_type(x)
    return jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize > 2


def _bfloat16_operands(prim: jcore.Primitive, lhs: Any, rhs: Any, params: dict) -> Any:
    """A ``dot_general`` or ``conv_general_dilated`` with bfloat16 operands and its own
    output dtype as the accumulation type."""
    if not (_wider_than_bfloat16(lhs) and _wider_than_bfloat16(rhs)):
        return prim.bind(lhs, rhs, **params)
    out = params.get("preferred_element_type") or jnp.result_type(lhs, rhs)
    params = dict(params, precision=None, preferred_element_type=jnp.dtype(out))
    return prim.bind(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), **params)


_MATRIX_PRIMITIVES = (jax.lax.dot_general_p, jax.lax.conv_general_dilated_p)


def _rewrite_closed(closed: jcore.ClosedJaxpr) -> jcore.ClosedJaxpr:
    """``closed`` with its matmuls and convolutions in bfloat16 (same avals)."""
    avals = [v.aval for v in closed.jaxpr.invars]
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    run = lambda *args: _eval_bfloat16(closed.jaxpr, closed.consts, list(args))
    return jax.make_jaxpr(run)(*specs)


def _rewrite_param(value: Any) -> Any:
    """A primitive's parameter with any jaxpr in it rewritten; others unchanged. An open
    jaxpr whose rewrite needs constants of its own is left as it was."""
    if type(value) is tuple:  # e.g. a cond's branches; never a NamedTuple (a PRNG impl)
        return tuple(_rewrite_param(v) for v in value)
    if isinstance(value, jcore.ClosedJaxpr):
        return _rewrite_closed(value)
    if isinstance(value, jcore.Jaxpr) and not value.constvars:
        rewritten = _rewrite_closed(jcore.ClosedJaxpr(value, []))
        return value if rewritten.consts else rewritten.jaxpr
    return value


def _eval_bfloat16(jaxpr: jcore.Jaxpr, consts: list[Any], args: list[Any]) -> list[Any]:
    """Evaluates ``jaxpr`` (as `jax.core.eval_jaxpr` does) with every matmul and
    convolution taking bfloat16 operands, in sub-jaxprs too."""
    env: dict[Any, Any] = {}
    read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]
    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive in _MATRIX_PRIMITIVES:
            outs = _bfloat16_operands(eqn.primitive, *invals, eqn.params)
        else:
            params = {k: _rewrite_param(v) for k, v in eqn.params.items()}
            bound = eqn.primitive.get_bind_params(params)
            # (sub-functions, params) in JAX < 0.7, the params alone since
            subfuns, bound = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *invals, **bound)
        outs = outs if eqn.primitive.multiple_results else [outs]
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]
