"""Memory and time of a language-model training step as the forward budget grows.

For each forward budget (``--budgets``, default 30, 60, 120) and each backward mode
(``--backwards``: implicit ``ift`` and plain backprop through the solver iterations,
``unrolled``), compiles the train step of the config's model on one real batch and
reads XLA's memory analysis of the compiled program (``temp_size_in_bytes``: the
step's working memory besides its arguments and outputs), then times the step (median
of ``--repeats`` calls after the compile). Every solve runs its whole budget
(``full_budget``), so the budgets really differ. The DEQ claim is that the implicit
backward's memory does not grow with the forward budget, while backprop's grows
linearly::

    python -m benchmarks.lm_memory --config configs/lm_shakespeare.py --workdir /tmp/lm_mem

Writes ``{workdir}/lm_memory.json`` and prints a table. The parameters are the fresh
initialisation (memory does not depend on the weights).

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019 (Table 1: memory).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from absl import flags

from deq_jax.training.run.writers import write_json
from launch import flags as launch_flags

_BUDGETS = flags.DEFINE_list("budgets", ["30", "60", "120"], "Forward budgets.")
_BACKWARDS = flags.DEFINE_list("backwards", ["ift", "unrolled"], "Backward modes.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps per setting (median kept).")


def measure(config, workdir: str, budgets: Sequence[int], backwards: Sequence[str], repeats: int):
    """``[{backward, budget, temp_bytes, argument_bytes, seconds}]`` for every setting."""
    import jax
    import numpy as np

    from deq_jax.training.families.lm_evaluate import lm_device_batch
    from deq_jax.training.families.lm_setup import setup_language_model
    from deq_jax.training.families.lm_steps import make_lm_train_step, place_memory

    rows = []
    for backward in backwards:
        for budget in budgets:
            cfg = config.copy_and_resolve_references()
            with cfg.unlocked():
                cfg.deq.backward.name = backward
                cfg.deq.solver.full_budget = True
                cfg.deq.train_max_iter = budget
                cfg.deq.backward.ift.max_iter = budget
            run = setup_language_model(cfg, workdir)
            run.checkpointer.close()
            template = jax.tree_util.tree_map(np.asarray, run.model.init_mems(cfg.train.batch_size))
            step = make_lm_train_step(run.model, run.schedule, run.mesh, template)
            batch = lm_device_batch(
                next(run.task.train_iterator(cfg.train.batch_size, cfg.train.seq_len)), run.mesh
            )
            mems = place_memory(template, run.mesh, cfg.train.batch_size)
            compiled = step.lower(run.state, mems, batch).compile()
            memory = compiled.memory_analysis()
            state, times = run.state, []
            for _ in range(repeats + 1):
                began = time.perf_counter()
                state, mems, metrics = step(state, mems, batch)
                jax.block_until_ready(metrics)
                times.append(time.perf_counter() - began)
            rows.append(
                {
                    "backward": backward,
                    "budget": budget,
                    "temp_bytes": int(memory.temp_size_in_bytes),
                    "argument_bytes": int(memory.argument_size_in_bytes),
                    "seconds": float(np.median(times[1:])),
                    "nstep_mean": float(metrics["nstep_mean"]),
                    "mode": cfg.model.mode,
                }
            )
    return rows


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    config, workdir = launch_flags.CONFIG.value, launch_flags.WORKDIR.value
    rows = measure(
        config,
        workdir,
        [int(b) for b in _BUDGETS.value],
        list(_BACKWARDS.value),
        _REPEATS.value,
    )
    print(f"{'backward':10s} {'budget':>6s} {'working MiB':>12s} {'step s':>8s}")
    for r in rows:
        print(
            f"{r['backward']:10s} {r['budget']:6d} {r['temp_bytes'] / 2**20:12.1f} "
            f"{r['seconds']:8.3f}"
        )
    path = os.path.join(workdir, "lm_memory.json")
    write_json(path, {"rows": rows}, indent=2)
    print(f"Wrote {path}", flush=True)


if __name__ == "__main__":
    launch_flags.run(main)
