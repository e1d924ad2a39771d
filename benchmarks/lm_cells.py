"""The language model's cell at the sizes that `benchmarks.lm_attention` and
`benchmarks.lm_cell_hlo` measure, and a way to force its attention kernel (no flags).

Sizes (batch, segment, memory, d_model, heads, d_head, d_inner): ``gpu`` is
``configs/lm_shakespeare.py:gpu``'s (64, 256, 256, 512, 8, 64, 2048), ``twin`` the
torchdeq twins' (16, 128, 128, 256, 4, 64, 1024), ``smoke`` a tiny one for tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from deq_jax.models.language import DEQTransformerCell, Memory, attention

SIZES = {
    "gpu": (64, 256, 256, 512, 8, 64, 2048),
    "twin": (16, 128, 128, 256, 4, 64, 1024),
    "smoke": (2, 8, 8, 32, 2, 16, 64),
}


def cell_and_inputs(size: str) -> tuple[DEQTransformerCell, Any, jax.Array, dict]:
    """The cell of ``SIZES[size]`` (dropout 0.1, no attention dropout), its variables, a
    state and an input whose memory is full in the first row and half full in the
    others."""
    b, q_len, mem_len, d, h, dh, di = SIZES[size]
    cell = DEQTransformerCell(d, h, dh, di, dropout=0.1)
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    count = jnp.full((b,), mem_len // 2, jnp.int32).at[0].set(mem_len)
    memory = Memory(
        jax.random.normal(k[0], (b, mem_len, d)),
        0.3 * jax.random.normal(k[1], (b, mem_len, 3 * h * dh)),
        count,
    )
    x = {"injection": 0.3 * jax.random.normal(k[2], (b, q_len, 3 * h * dh)), "memory": memory}
    z = jax.random.normal(k[3], (b, q_len, d))
    return cell, jax.jit(cell.init)(jax.random.PRNGKey(1), z, x), z, x


@contextlib.contextmanager
def kernel_forced(implementation: str) -> Iterator[None]:
    """Within the block, the cell's attention takes ``implementation`` (``"xla"`` or
    ``"cudnn"``) wherever `attention.attention_implementation` would allow a fused
    kernel on an NVIDIA GPU (bfloat16 precision, no attention dropout); ``""`` changes
    nothing."""
    chosen = attention.attention_implementation
    if implementation:
        attention.attention_implementation = lambda platform, precision, dropout: (
            "unfused" if dropout or precision != "bfloat16" else implementation
        )
    try:
        yield
    finally:
        attention.attention_implementation = chosen
