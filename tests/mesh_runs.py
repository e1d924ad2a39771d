"""Train steps of the smoke configs on any mesh, for `test_training_mesh.py` and the mesh
benchmarks: one process runs a list of jobs on the devices it was started with.

A job is ``(family, workdir, overrides)``: ``family`` one of `CONFIGS`, ``overrides``
``{"section.field": value}`` (``train.mesh`` as ``{"data": .., "fsdp": .., "tensor": ..}``).
`train_losses` runs ``steps`` train steps through the family's own step (the loop's
`deq_jax.training.family.Phase.step`: the mesh, the partition rules, the sharded batch)
and returns each step's loss.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from configs import clrs, lm_shakespeare, mdeq_fashion_mnist, prefix_sum
from deq_jax.models.mdeq.model import TINY
from deq_jax.training import family_for, footprint

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
MDEQ_TINY = {f"model.{k}": tuple(v) if isinstance(v, tuple) else v for k, v in TINY.items()}


def make_config(family: str, overrides: dict):
    config = CONFIGS[family]()
    for key, value in {**COMMON, **overrides}.items():
        section, _, field = key.rpartition(".")
        node = config
        for part in section.split("."):
            node = node[part]
        node[field] = tuple(value) if isinstance(value, list) else value
    return config


def train_losses(family: str, workdir: str, overrides: dict, steps: int = STEPS) -> list[float]:
    """The losses of ``steps`` train steps of ``family``'s smoke config on this process's
    devices, with ``overrides``."""
    config = make_config(family, overrides)
    fam = family_for(config, emit=lambda line: None)
    run = fam.setup(config, workdir)
    phase = fam.phase(config, run, run.model, warmup=False)
    batches = fam.train_batches(config, run)
    state, carry, losses = run.state, run.carry, []
    for number in range(1, steps + 1):
        state, carry, metrics = phase.step(state, carry, next(batches), number)
        losses.append(float(metrics["loss"]))
    run.checkpointer.close()
    return losses


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


JOBS = {"losses": train_losses, "loops": solver_loops}


def main(argv: list[str]) -> None:
    """``mesh_runs.py JOBS [KIND]``: runs ``JOBS`` (a JSON list of ``[family, workdir,
    overrides]``) through the function ``JOBS[KIND]`` (default ``losses``) and prints one line
    ``RESULT {"devices", "results"}``."""
    run = JOBS[argv[2] if len(argv) > 2 else "losses"]
    jobs = json.loads(argv[1])
    results = [run(family, workdir, overrides) for family, workdir, overrides in jobs]
    print("RESULT " + json.dumps({"devices": jax.device_count(), "results": results}))


if __name__ == "__main__":
    np.set_printoptions(precision=6)
    main(sys.argv)
