"""Train steps of the smoke configs on any mesh, for `test_training_mesh.py` and the mesh
benchmarks: one process runs a list of jobs on the devices it was started with.

A job is ``(family, workdir, overrides[, kind])``: ``family`` one of `CONFIGS`,
``overrides`` ``{"section.field": value}`` (``train.mesh`` as ``{"data": .., "fsdp": ..,
"tensor": ..}``), ``kind`` one of `JOBS`: `train_losses` runs train steps through the
family's own step (the loop's `deq_jax.training.families.family.Phase.step`: the mesh, the
partition rules, the sharded batch) and returns each step's loss; `solver_loops` reads
the compiled train step's loops; `checkpoint_hop` moves a checkpoint to this mesh.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from typing import Any

import jax
import numpy as np

from configs import clrs, lm_shakespeare, mdeq_fashion_mnist, prefix_sum
from deq_jax.training import family_for
from deq_jax.training.run import footprint

STEPS = 20
CONFIGS = {
    "prefix_sum": lambda: prefix_sum.get_config("smoke"),
    "lm": lambda: lm_shakespeare.get_config("smoke"),
    "lm_reversible": lambda: lm_shakespeare.get_config("smoke,reversible"),
    "mdeq": lambda: mdeq_fashion_mnist.get_config("smoke"),
    "clrs": lambda: clrs.get_config("bfs,smoke"),
}
# What every job shares: a batch of 8 rows (one a device on 8), no weight-tied warm-up,
# the schedule of `STEPS` steps, and every array over fsdp (the smoke models are small).
COMMON = {
    "train.steps": STEPS,
    "train.batch_size": 8,
    "train.warmup_steps": 2,
    "train.pretrain_steps": 0,
    "train.fsdp_min_size": 0,
}
# The backward modes of the matrix, as overrides of any family's smoke config.
BACKWARDS = {
    "ift": {"deq.backward.name": "ift"},
    "phantom": {"deq.backward.name": "phantom"},
    "reversible": {
        "deq.solver.name": "reversible",
        "deq.backward.name": "reversible",
        "deq.solver.full_budget": True,
    },
}
# The meshes of the matrix, and the families with tensor partition rules.
MESHES = {
    "data8": {"data": 8, "fsdp": 1, "tensor": 1},
    "fsdp8": {"data": 1, "fsdp": 8, "tensor": 1},
    "data2_fsdp4": {"data": 2, "fsdp": 4, "tensor": 1},
    "fsdp4_tensor2": {"data": 1, "fsdp": 4, "tensor": 2},
}
TENSOR_FAMILIES = ("lm", "mdeq")
MATRIX_FAMILIES = ("prefix_sum", "lm", "mdeq", "clrs")


def matrix(families=MATRIX_FAMILIES):
    """``(family, mesh, backward)``: every mesh with ift, phantom and reversible on fsdp 8."""
    for family in families:
        for mesh in MESHES:
            if mesh != "fsdp4_tensor2" or family in TENSOR_FAMILIES:
                yield family, mesh, "ift"
        for backward in ("phantom", "reversible"):
            yield family, "fsdp8", backward


def make_config(family: str, overrides: dict):
    config = CONFIGS[family]()
    for key, value in {**COMMON, **overrides}.items():
        section, _, field = key.rpartition(".")
        node = config
        for part in section.split("."):
            node = node[part]
        node[field] = tuple(value) if isinstance(value, list) else value
    return config


def nudged(params: Any, ulps: int) -> Any:
    """``params`` with every float32 entry moved ``ulps`` units in the last place away
    from zero: a perturbation the size of one rounding, for telling rounding's growth
    under training from a real difference."""
    step = lambda p: np.nextafter(p, np.copysign(np.inf, p)).astype(p.dtype)

    def nudge(x):
        p = np.asarray(x)
        for _ in range(ulps):
            p = step(p)
        return jax.device_put(p, x.sharding)

    return jax.tree_util.tree_map(nudge, params)


def _train(family: str, workdir: str, overrides: dict, steps: int):
    """``(family, run, state, carry, losses)`` after ``steps`` train steps; the override
    ``"ulps": n`` starts from the parameters `nudged` by ``n`` units in the last place."""
    overrides = dict(overrides)
    ulps = overrides.pop("ulps", 0)
    config = make_config(family, overrides)
    fam = family_for(config, emit=lambda line: None)
    run = fam.setup(config, workdir)
    phase = fam.phase(config, run, run.model, warmup=False)
    batches = fam.train_batches(config, run)
    state, carry, losses = run.state, run.carry, []
    if ulps:
        state = state.replace(params=nudged(state.params, ulps))
    for number in range(run.start_step + 1, run.start_step + steps + 1):
        state, carry, metrics = phase.step(state, carry, next(batches), number)
        losses.append(float(metrics["loss"]))
    return fam, run, state, carry, losses


def train_losses(family: str, workdir: str, overrides: dict, steps: int = STEPS) -> list[float]:
    """The losses of ``steps`` train steps of ``family``'s smoke config on this process's
    devices, with ``overrides``."""
    _, run, _, _, losses = _train(family, workdir, overrides, steps)
    run.checkpointer.close()
    return losses


def digest(tree: Any) -> str:
    """A hash of every array of ``tree`` (its bytes, shape and dtype), fetched whole."""
    h = hashlib.sha256()
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        x = np.asarray(jax.device_get(x))
        h.update(f"{jax.tree_util.keystr(path)}{x.shape}{x.dtype}".encode())
        h.update(x.tobytes())
    return h.hexdigest()


def checkpoint_hop(family: str, workdir: str, overrides: dict) -> dict:
    """One hop of a checkpoint's journey across meshes. With ``overrides["source"]``
    (a workdir), its checkpoints are copied into ``workdir`` and restored onto this
    run's mesh; without, 2 steps are trained. Either way the state is then saved again
    from this mesh's layout (the next hop reads that), and the hash of its parameters
    and optimiser state is returned with the step and the bytes this process's devices
    hold of the state (the most on one device, and the whole)."""
    overrides = dict(overrides)
    source = overrides.pop("source", None)
    if source:
        shutil.copytree(os.path.join(source, "checkpoints"), os.path.join(workdir, "checkpoints"))
        for name in ("vocab.json",):
            if os.path.exists(os.path.join(source, name)):
                shutil.copy(os.path.join(source, name), workdir)
    fam, run, state, carry, _ = _train(family, workdir, overrides, 0 if source else 2)
    step = int(state.step)
    run.checkpointer.maybe_save(step + 1, fam.checkpoint_item(state, carry), force=True)
    run.checkpointer.close()
    held = footprint.state_bytes((state.params, state.opt_state))
    return {
        "params": digest(state.params),
        "opt_state": digest(state.opt_state),
        "step": step,
        "max_per_device": held["max_per_device"],
        "total": held["total"],
    }


def solver_loops(family: str, workdir: str, overrides: dict) -> dict:
    """What the compiled train step of ``family`` runs inside its ``while`` loops (the
    DEQ's forward and backward solves): ``{"collectives": [[kind, shape, bytes]...],
    "carries": [[shape...] per loop], "batch": the global batch}``."""
    config = make_config(family, overrides)
    fam = family_for(config, emit=lambda line: None)
    run = fam.setup(config, workdir)
    phase = fam.phase(config, run, run.model, warmup=False)
    hlo = phase.lower(run.state, run.carry, next(fam.train_batches(config, run))).compile()
    hlo = hlo.as_text()
    run.checkpointer.close()
    return {
        "collectives": [[c.kind, c.shape, c.bytes] for c in footprint.loop_collectives(hlo)],
        "carries": [shapes for _, shapes in footprint.loop_carries(hlo)],
        "batch": config.train.batch_size,
    }


JOBS = {"losses": train_losses, "loops": solver_loops, "checkpoint": checkpoint_hop}


def main(argv: list[str]) -> None:
    """``mesh_runs.py JOBS [KIND]``: runs ``JOBS`` (a JSON list of ``[family, workdir,
    overrides]``, or ``[family, workdir, overrides, kind]``) in order through the
    function ``JOBS[kind]`` (default ``KIND``, else ``losses``) and prints one line
    ``RESULT {"devices", "results"}``."""
    default = argv[2] if len(argv) > 2 else "losses"
    results = []
    for family, workdir, overrides, *kind in json.loads(argv[1]):
        results.append(JOBS[kind[0] if kind else default](family, workdir, overrides))
    print("RESULT " + json.dumps({"devices": jax.device_count(), "results": results}))


if __name__ == "__main__":
    np.set_printoptions(precision=6)
    main(sys.argv)
