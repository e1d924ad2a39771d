"""The benchmark problems of the solver launches, without command-line flags.

The DEQ cell z = tanh(W z + U x + b) on a batch of independent problems: ``easy`` (W
Gaussian with spectral norm 0.9), ``hard`` (W symmetric with spectral norm 0.99 and a
weak injection: plain iteration is slow) and ``norm<value>`` (the easy draw of W scaled
to that spectral norm); `over_active`, the price of a composed solver's step; and the
output the launches share (`json_lines`, `header`).
`benchmarks.solvers`, `benchmarks.composed` and
`benchmarks.solver_step_cost` share them; flags live in those launches, so importing this
module (as the tests do) defines none.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics

import jax
import jax.numpy as jnp


def cell(z, args):
    """The benchmark cell, batched: ``tanh(z W^T + inj)`` with ``inj = x U^T + b``."""
    w, inj = args
    return jnp.tanh(z @ w.T + inj)


def _spectral_norm_of(kind: str) -> float | None:
    """The value of a ``norm<value>`` problem name (``norm2.5`` -> 2.5), else ``None``."""
    if not kind.startswith("norm"):
        return None
    try:
        return float(kind[len("norm") :])
    except ValueError:
        raise ValueError(
            f"Bad problem name {kind!r}: a norm problem is 'norm' and a number, e.g. norm2.5."
        ) from None


def make_problem(kind: str, width: int, batch: int, seed: int):
    """(W, inj) of the easy, hard or ``norm<value>`` problem.

    ``norm<value>`` is the easy problem with W scaled to spectral norm ``value`` (the same
    Gaussian draw, U, x and b): above 1 the cell need not contract.
    """
    kw, ku, kx, kb = jax.random.split(jax.random.PRNGKey(seed), 4)
    g = jax.random.normal(kw, (width, width))
    norm = _spectral_norm_of(kind)
    if kind == "easy" or norm is not None:
        w = (0.9 if norm is None else norm) * g / jnp.linalg.norm(g, 2)
    elif kind == "hard":  # symmetric, eigenvalues up to 0.99, weak injection: tanh' ~ 1
        sym = g + g.T
        w = 0.99 * sym / jnp.linalg.norm(sym, 2)
    else:
        raise ValueError(
            f"Unknown problem {kind!r}. Valid problems: easy, hard, norm<value> (e.g. norm2.5)."
        )
    u = jax.random.normal(ku, (width, width)) / jnp.sqrt(width)
    x = jax.random.normal(kx, (batch, width))
    b = 0.1 * jax.random.normal(kb, (width,))
    return w, (0.2 if kind == "hard" else 0.5) * (x @ u.T + b)


def over_active(times: dict, name: str, parts: dict, steps: int) -> float:
    """The composed solver's time over its active parts' (1.0: no overhead).

    Per round, the parts' own runs price the steps each part makes (``None``: the rest
    of the budget); the median over rounds of the ratio is returned, which a load that
    drifts between rounds disturbs less than a ratio of medians.
    """
    fixed = sum(n for n in parts.values() if n is not None)
    counts = {part: (steps - fixed if n is None else n) for part, n in parts.items()}
    ratios = [
        total / sum(counts[part] * times[part][i] / steps for part in counts)
        for i, total in enumerate(times[name])
    ]
    return statistics.median(ratios)


@contextlib.contextmanager
def json_lines(path: str):
    """Yields ``emit(row)``: prints ``row`` as one JSON line, and writes it to ``path`` too.

    The launches' output format: one JSON object per line on stdout and, with a
    ``path`` (empty: none; its folder is created), the same lines in that file.
    """
    out_file = None
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        out_file = open(path, "w")

    def emit(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if out_file:
            out_file.write(line + "\n")

    try:
        yield emit
    finally:
        if out_file:
            out_file.close()


def header(width: int, batch: int, max_iter: int, repeats: int) -> dict:
    """The first line of a benchmark's output: the machine, jax and the sizes."""
    return dict(
        device=str(jax.devices()[0]),
        jax=jax.__version__,
        width=width,
        batch=batch,
        max_iter=max_iter,
        repeats=repeats,
    )
