"""What a checkpoint save costs the training loop: synchronous against asynchronous.

Builds a run from a config (`deq_jax.training.family_for`), then times training steps
in turns, the two modes interleaved: two plain steps, then a save of the checkpoint item
and the next step (with ``async_save`` the write overlaps that next step). The
figures are medians over ``--rounds`` after a warm-up: the plain step, the save call
itself, the step after it, and their sum against two plain steps.

Usage (BUILD_NOTES, "Preemption and failures")::

    python -m benchmarks.save_cost --config configs/lm_shakespeare.py [--rounds 7]
"""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
from absl import app, flags

from deq_jax.training.families import family_for
from deq_jax.training.run.checkpoint import Checkpointer
from launch import flags as launch_flags

_ROUNDS = flags.DEFINE_integer("rounds", 7, "Timed saves per mode (after one warm-up).")


def _timed(fn):
    began = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return out, time.perf_counter() - began


def measure(config, rounds: int) -> dict[str, dict[str, float]]:
    """``{mode: {"step", "save_call", "step_after", "overhead"}}`` in seconds (overhead:
    save call + step after, minus two plain steps)."""
    workdir = tempfile.mkdtemp(prefix="save_cost_")
    family = family_for(config, emit=lambda line: None)
    run = family.setup(config, workdir)
    run.checkpointer.close()
    batches = family.train_batches(config, run)
    step_fn = family.phase(config, run, run.model, warmup=False).step
    state, carry, number = run.state, run.carry, 0

    def step():
        nonlocal state, carry, number
        number += 1
        state, carry, metrics = step_fn(state, carry, next(batches), number)
        return metrics

    modes = ("sync", "async")
    ckpts = {
        mode: Checkpointer(
            tempfile.mkdtemp(prefix=f"save_cost_{mode}_"),
            every_steps=1,
            keep=2,
            async_save=mode == "async",
        )
        for mode in modes
    }
    times = {mode: ([], [], []) for mode in modes}  # plain, save call, step after
    for turn in range(rounds + 1):  # the modes interleaved, in alternating order
        for mode in modes if turn % 2 else modes[::-1]:
            plain, call, after = times[mode]
            for _ in range(2):
                plain.append(_timed(step)[1])
            began = time.perf_counter()
            ckpts[mode].maybe_save(number, family.checkpoint_item(state, carry))
            call.append(time.perf_counter() - began)
            after.append(_timed(step)[1])
            ckpts[mode].wait()  # the next turn starts with nothing pending
            if turn == 0:  # the warm-up
                times[mode] = ([], [], [])
    out = {}
    for mode, (plain, call, after) in times.items():
        ckpts[mode].close()
        median = statistics.median
        out[mode] = dict(
            step=median(plain),
            save_call=median(call),
            step_after=median(after),
            overhead=median(c + a for c, a in zip(call, after, strict=True)) - median(plain),
        )
    return out


def main(argv):
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    config = launch_flags.CONFIG.value
    figures = measure(config, _ROUNDS.value)
    print("| mode | plain step ms | save call ms | step after the save ms | save's cost in steps |")
    print("| --- | --- | --- | --- | --- |")
    for mode, f in figures.items():
        print(
            f"| {mode} | {1e3 * f['step']:.1f} | {1e3 * f['save_call']:.1f} | "
            f"{1e3 * f['step_after']:.1f} | {f['overhead'] / f['step']:.2f} |"
        )


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
