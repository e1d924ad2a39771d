"""The solver's per-iteration trace costs nothing when a run does not read it: XLA's
while-loop simplifier drops the unread ``[B, max_iter]`` buffer from the compiled loop
(forward and the IFT's backward), so no flag is needed to switch it off. A budget of 37
makes the buffer's shape recognisable in the compiled HLO."""

import jax
import jax.numpy as jnp
import pytest

import deq_jax as dj

B, D, BUDGET = 4, 32, 37
TRACE = f"f32[{B},{BUDGET}]"


def _loss(w, read_trace):
    x = jnp.linspace(-1.0, 1.0, B * D).reshape(B, D)
    solver = dj.solvers.get("anderson", max_iter=BUDGET)
    sol = dj.fixed_point(
        lambda z, p: jnp.tanh(z @ p[0] + p[1]),
        jnp.zeros_like(x),
        (w, x),
        solver=solver,
        backward=dj.backward.ift(),
    )
    loss = jnp.sum(sol.value**2)
    return loss + jnp.sum(sol.stats.trace) if read_trace else loss


def _loop_buffers(read_trace: bool) -> str:
    w = 0.1 * jax.random.normal(jax.random.PRNGKey(0), (D, D))
    hlo = jax.jit(jax.value_and_grad(lambda w: _loss(w, read_trace))).lower(w).compile().as_text()
    return "\n".join(line for line in hlo.splitlines() if " while(" in line)


@pytest.mark.parametrize("read_trace", [False, True])
def test_an_unread_trace_leaves_the_compiled_loop(read_trace):
    loops = _loop_buffers(read_trace)
    assert loops, "no while loop compiled"
    assert (TRACE in loops) == read_trace
