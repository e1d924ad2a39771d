"""The arithmetic a DEQ's cell computes in: one name, ``"default"``, ``"float32"`` or
``"bfloat16"``.

* ``"default"``: the backend's own arithmetic for float32 matmuls and convolutions
  (true float32 on the CPU, TensorFloat-32 on recent NVIDIA GPUs, one bfloat16 pass on
  TPUs).
* ``"float32"``: true float32 everywhere (`jax.default_matmul_precision` ``"float32"``).
* ``"bfloat16"``: every matmul and convolution of the cell takes bfloat16 operands and
  accumulates in float32 (``preferred_element_type``); everything else (norms, softmax,
  activations, the state) stays float32. This is the TPU's default arithmetic, here
  asked for on any backend.

`current_precision` tells a layer, while its cell is traced, which arithmetic the DEQ
asked for, so that it can pick a kernel for it (the language model's attention takes
cuDNN's fused kernel in bfloat16 on NVIDIA GPUs).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

PRECISIONS = ("default", "float32", "bfloat16")

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
