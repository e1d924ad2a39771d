"""Whether the function being traced is traced to push tangents forward through it.

Some layers write their derivatives for reverse mode. `deq_jax.nn.conv` on the CPU is
one: its input tangent is the transpose of a plain convolution, so a VJP (what an
implicit backward solve evaluates) is one plain convolution. Evaluated forward inside a
loop, the same tangent runs ~7x slower than lax's on XLA:CPU (BUILD_NOTES,
"Convolution gradients on XLA:CPU"). Code that traces a function only to evaluate
Jacobian-vector products, such as the power iterations of
`deq_jax.regularizers.jacobian`, traces it inside `forward_products()`; such layers
read `active()` when they are traced and take their forward-friendly form. The values
and derivatives are the same either way; only the compiled program differs.

The flag is read at trace time: a function already traced and cached by `jax.jit`
outside the block keeps the program it was traced with.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_STATE = threading.local()


def active() -> bool:
    """Whether the current thread is tracing inside `forward_products`."""
    return getattr(_STATE, "depth", 0) > 0


@contextlib.contextmanager
def forward_products() -> Iterator[None]:
    """Within the block (per thread, nestable), `active()` is true."""
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1
