"""What a program moves: per kind of operation, how many and how many MiB they write,
in a jaxpr (any backend) and in a compiled XLA program (the backend's own fusions), for
reading where a cell's time goes without a profiler (`benchmarks.lm_attention`).

The compiled program's top-level instructions (the entry and the loop bodies; a fusion
counts once) are classed as ``matmul`` (a dot, a custom call, or a fusion around one),
``movement`` (a fusion or instruction of copies, transposes, concatenations, pads and
slices only), ``elementwise`` or ``reduction``.
"""

from __future__ import annotations

import collections
import re
from typing import Any

from jax.extend import core as jax_core

MIB = 2**20
MOVEMENT = {"transpose", "copy", "concatenate", "pad", "slice", "dynamic-slice"}
PLUMBING = {"parameter", "constant", "bitcast", "broadcast", "reshape", "convert"}
PLUMBING |= {"tuple", "get-tuple-element"}
_BYTES = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "pred": 1, "s8": 1}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (\S+) ([\w\-]+)\((.*)$")


def _shape_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * _BYTES.get(dtype, 4)
    return total


def _computations(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """``{computation: [(shape, opcode, rest of the line)]}`` of an HLO module's text."""
    found, current = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            current = "ENTRY" if line.startswith("ENTRY") else line.split(" ")[0].lstrip("%")
            found[current] = []
        elif current and (match := _INSTRUCTION.match(line)):
            found[current].append(match.groups())
    return found


def _kind(computations, opcode: str, rest: str) -> str:
    if opcode != "fusion":
        ops = {opcode}
    else:
        ops = {op for _, op, _ in computations[re.search(r"calls=%?([\w.\-]+)", rest)[1]]}
    if ops & {"dot", "convolution", "custom-call"}:
        return "matmul"
    if not ops - MOVEMENT - PLUMBING:
        return "movement (" + ", ".join(sorted(ops & MOVEMENT)) + ")"
    return "reduction" if "reduce" in ops else "elementwise"


def compiled_table(text: str) -> dict[str, dict[str, float]]:
    """``{kind: {"count", "mib"}}`` over the top-level instructions of the entry and the
    loop bodies of a compiled module's text (custom calls by their target)."""
    computations = _computations(text)
    names = ["ENTRY", *re.findall(r"body=%?([\w.\-]+)", text)]
    table = collections.defaultdict(lambda: {"count": 0, "mib": 0.0})
    for name in names:
        for shape, opcode, rest in computations.get(name, []):
            if opcode in PLUMBING | {"while"}:
                continue
            kind = _kind(computations, opcode, rest)
            if opcode == "custom-call":
                kind = "custom-call " + re.search(r'custom_call_target="([^"]+)"', rest)[1]
            table[kind]["count"] += 1
            table[kind]["mib"] += _shape_bytes(shape) / MIB
    return {k: {"count": v["count"], "mib": round(v["mib"], 1)} for k, v in sorted(table.items())}


def jaxpr_table(jaxpr: Any, minimum_mib: float = 1.0) -> dict[str, Any]:
    """``{primitive: {"count", "mib"}}`` of the equations of a closed jaxpr (sub-jaxprs
    entered) writing at least ``minimum_mib`` in all, and the matmuls' ``gflop``."""
    table = collections.defaultdict(lambda: {"count": 0, "mib": 0.0})
    flop = 0

    def walk(inner):
        nonlocal flop
        for eqn in inner.eqns:
            subs = [
                p.jaxpr if isinstance(p, jax_core.ClosedJaxpr) else p
                for p in eqn.params.values()
                if isinstance(p, jax_core.ClosedJaxpr | jax_core.Jaxpr)
            ]
            for sub in subs:
                walk(sub)
            if subs:
                continue
            if eqn.primitive.name == "dot_general":
                (contract, _), _ = eqn.params["dimension_numbers"]
                depth = 1
                for axis in contract:
                    depth *= eqn.invars[0].aval.shape[axis]
                flop += 2 * eqn.outvars[0].aval.size * depth
            row = table[eqn.primitive.name]
            row["count"] += 1
            row["mib"] += sum(v.aval.size * v.aval.dtype.itemsize for v in eqn.outvars) / MIB

    walk(jaxpr.jaxpr)
    rows = {k: {"count": v["count"], "mib": round(v["mib"], 1)} for k, v in table.items()}
    rows = {k: v for k, v in sorted(rows.items()) if v["mib"] >= minimum_mib}
    return {"gflop": round(flop / 1e9, 6), "primitives": rows}
