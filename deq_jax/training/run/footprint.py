"""What a placed run costs a device: bytes of its arrays, its compiled step's memory, and
the collectives its compiled program runs inside loops.

* `state_bytes`: the bytes of a pytree of `jax.Array`s on each device, read from the
  arrays' addressable shards (what the device really holds, padding excluded).
* `compiled_memory`: XLA's memory analysis of a compiled step, per device (its
  arguments, outputs, temporaries and the arguments it aliases to outputs).
* `loop_collectives` and `loop_carries`: the collectives (all-gather, all-reduce, ...)
  inside every ``while`` loop of a compiled program's HLO, and the shapes each loop
  carries. A DEQ's solver is such a loop: with its state and history sharded like
  activations (the batch over data x fsdp) its carry holds a device's rows only, and
  the parameters it needs are gathered once before it, so no collective inside it
  grows with the history length (`tests/test_training_mesh.py` checks both).

References:
  XLA, "HLO text format" (``Compiled.as_text``) and ``Compiled.memory_analysis``.
"""

from __future__ import annotations

import collections
import re
from typing import Any, NamedTuple

import jax
import numpy as np

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_HEAD = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{$")
_CALLED = "condition|body|to_apply|calls|true_computation|false_computation"
_CALLS = re.compile(r"(?:" + _CALLED + r")=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_COLLECTIVE = re.compile(r"= (.+?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_ARRAY = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2}


def state_bytes(tree: Any) -> dict[str, int]:
    """Bytes of ``tree``'s arrays per device, from their addressable shards.

    Returns:
      ``{"max_per_device", "min_per_device", "total"}``: the most and fewest bytes a
      device of this process holds, and the bytes of the global arrays (each once).
    """
    per_device: dict[Any, int] = collections.Counter()
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        total += int(x.nbytes)
        for shard in x.addressable_shards:
            per_device[shard.device] += int(shard.data.nbytes)
    counts = per_device.values() or [0]
    return {"max_per_device": max(counts), "min_per_device": min(counts), "total": total}


def compiled_memory(compiled: Any) -> dict[str, int]:
    """A compiled step's memory analysis per device: ``argument``, ``output``, ``temp``,
    ``alias`` bytes and ``peak`` (arguments + outputs + temporaries - aliased)."""
    stats = compiled.memory_analysis()
    out = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
    }
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def computations(hlo: str) -> dict[str, list[str]]:
    """The instructions of every computation of an HLO module's text, by name."""
    out: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        head = _HEAD.match(line)
        if head:
            name = head.group(1)
            out[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            out[name].append(line)
    return out


def _reachable(comps: dict[str, list[str]], roots: list[str]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for line in comps[name]:
            todo.extend(_CALLS.findall(line))
            for group in _BRANCHES.findall(line):
                todo.extend(x.strip().lstrip("%") for x in group.split(","))
    return seen


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (``f32[8,16]{1,0}``, or a tuple of them)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
        total += size * _DTYPE_BYTES.get(dtype, 8 if dtype.endswith("64") else 4)
    return total


class LoopCollective(NamedTuple):
    """One collective inside a ``while`` loop: the loop's op name (where in the program
    it comes from), the collective and its result shape and bytes."""

    loop: str
    kind: str
    shape: str
    bytes: int


def _loops(hlo: str):
    comps = computations(hlo)
    for lines in comps.values():
        for line in lines:
            if " while(" not in line:
                continue
            op = re.search(r'op_name="([^"]*)"', line)
            roots = re.findall(r"(?:body|condition)=%([\w.\-]+)", line)
            yield comps, line, (op.group(1) if op else ""), roots


def loop_collectives(hlo: str) -> list[LoopCollective]:
    """Every collective inside every ``while`` loop of a compiled program's HLO text
    (``compiled.as_text()``), nested computations included."""
    found = []
    for comps, _, op, roots in _loops(hlo):
        for name in sorted(_reachable(comps, roots)):
            for line in comps[name]:
                match = _COLLECTIVE.search(line)
                if match:
                    shape = match.group(1)
                    found.append(LoopCollective(op, match.group(2), shape, shape_bytes(shape)))
    return found


def loop_carries(hlo: str) -> list[tuple[str, list[str]]]:
    """``(op name, [array shapes])`` of what each ``while`` loop carries, e.g.
    ``f32[2,6,128]`` for a device's rows of an Anderson history."""
    out = []
    for _, line, op, _ in _loops(hlo):
        carry = line.split("=", 1)[1].split(" while(", 1)[0]
        out.append((op, [f"{d}[{s}]" for d, s in _ARRAY.findall(carry)]))
    return out
