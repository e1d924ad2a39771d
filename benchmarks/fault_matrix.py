"""Fault injection: a training run stopped by SIGTERM, SIGINT or SIGKILL mid-step,
mid-save or mid-evaluation, then resumed, against the same run uninterrupted.

Each case trains the prefix-sum smoke model (`config`: 8 steps, a checkpoint every 4,
an evaluation every 3) and delivers its signal to its own process at one point:

- ``step``: while step `STEP_AT` runs (after its dispatch, before its result is read);
  step 6 is an evaluation step, so a stop there also skips that evaluation, which the
  resumed run then catches up;
- ``save``: while the checkpoint of step `SAVE_AT` is written (orbax's commit of the
  temporary directory; for SIGTERM and SIGINT, as the save begins);
- ``eval``: while the periodic evaluation of step `EVAL_AT` runs.

SIGTERM and SIGINT are sent in-process (the run saves, returns ``stopped_by`` and the
same process resumes); SIGKILL in a subprocess (``python -m benchmarks.fault_matrix
--victim``), resumed by the caller, with checkpoints written in the background (the
default) and synchronously. A SIGKILL loses the steps since the last checkpoint on
disk: at most ``ckpt.every_steps`` with synchronous saves; with asynchronous ones the
checkpoint being written when the kill came is lost too, so at most twice that (the
write of one checkpoint is waited for when the next is due).

A case's figures: the last step the interrupted run finished (its last train metric),
the step the rerun resumed from, the steps lost (their difference), and whether the
resumed run's final parameters equal the uninterrupted run's bit for bit.

Usage (the table of BUILD_NOTES, "Preemption"; about 3 minutes on 2 cores)::

    python -m benchmarks.fault_matrix [--out DIR]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, CKPT_EVERY, EVAL_EVERY = 8, 4, 3
STEP_AT, SAVE_AT, EVAL_AT = 6, 4, 3
POINTS = {"step": STEP_AT, "save": SAVE_AT, "eval": EVAL_AT}
SIGNALS = ("SIGTERM", "SIGINT", "SIGKILL")


def config(data_dir: str, async_save: bool = True):
    """The prefix-sum smoke config of every case (checkpoints written in the background
    with ``async_save``, the default, else synchronously)."""
    from configs import prefix_sum

    c = prefix_sum.get_config("smoke")
    c.ckpt.async_save = async_save
    c.task.data_dir = data_dir
    c.train.steps = STEPS
    c.ckpt.every_steps = CKPT_EVERY
    c.eval.every_steps = EVAL_EVERY
    c.log.every_steps = 1
    c.task.test_lengths = (16,)  # the cheapest report that still evaluates
    c.eval.budget_multipliers = (1,)
    c.eval.report_max_batches = 1
    return c


def _send(name: str) -> None:
    os.kill(os.getpid(), getattr(signal, name))


@contextlib.contextmanager
def inject(name: str, point: str) -> Iterator[None]:
    """While entered, the training loop sends signal ``name`` to this process at
    ``point`` (``"step"``, ``"save"`` or ``"eval"``; ``"commit"``: inside orbax's
    commit of the checkpoint of `SAVE_AT`, as ``"save"`` is for SIGKILL), once."""
    from orbax.checkpoint._src.path import atomicity

    from deq_jax.training.loop import loop as loop_module
    from deq_jax.training.run.checkpoint import Checkpointer

    at = POINTS.get(point, SAVE_AT)
    fired = []

    def fire() -> None:
        if not fired:
            fired.append(True)
            _send(name)

    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, new: Any) -> None:
        patches.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    if point == "step":
        build = loop_module.Loop.build

        def build_firing(self, model):
            build(self, model)
            for warm, phase in self.phases.items():
                run_step = phase.step

                def step(state, carry, batch, number, run_step=run_step):
                    out = run_step(state, carry, batch, number)
                    if number == at:
                        fire()
                    return out

                self.phases[warm] = phase._replace(step=step)

        patch(loop_module.Loop, "build", build_firing)
    elif point == "eval":
        evaluate = loop_module.Loop.evaluate

        def evaluate_firing(self, step, **kwargs):
            if step == at:
                fire()
            return evaluate(self, step, **kwargs)

        patch(loop_module.Loop, "evaluate", evaluate_firing)
    elif point == "commit" or name == "SIGKILL":  # in orbax's commit: arrays written
        finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def finalize_firing(self, *args, **kwargs):
            if self.get_final().name == str(at):
                fire()
            return await finalize(self, *args, **kwargs)

        patch(atomicity.AtomicRenameTemporaryPath, "finalize", finalize_firing)
    else:
        maybe_save = Checkpointer.maybe_save

        def save_firing(self, step, state, *, force=False):
            if step == at:
                fire()
            return maybe_save(self, step, state, force=force)

        patch(Checkpointer, "maybe_save", save_firing)
    try:
        yield
    finally:
        for owner, attr, old in reversed(patches):
            setattr(owner, attr, old)


def _last_trained(workdir: str) -> int:
    from deq_jax.training.run import writers

    steps = [r["step"] for r in writers.read_metrics(workdir) if r["split"] == "train"]
    return max(steps, default=0)


def params(result) -> list[np.ndarray]:
    import jax

    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(result.state.params))]


def identical(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    """Whether two runs' parameters (`params`) are equal bit for bit."""
    if len(got) != len(want):
        return False
    return all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def run_case(
    name: str, point: str, workdir: str, data_dir: str, async_save: bool = True
) -> dict[str, Any]:
    """Interrupts a run with signal ``name`` at ``point`` (several faults: ``name`` is
    a `kill` list and ``point`` is ignored), resumes it to the end; returns the figures
    and the resumed `RunResult` under ``"result"``."""
    from deq_jax.training import train_and_evaluate

    quiet = lambda line: None  # noqa: E731
    if name == "SIGKILL" or "," in name:
        faults = f"{name}:{point}" if "," not in name else name
        status = kill(faults, workdir, data_dir, async_save)
        stopped_by = None
    else:
        with inject(name, point):
            first = train_and_evaluate(config(data_dir, async_save), workdir, emit=quiet)
        status, stopped_by = None, first.stopped_by
    trained = _last_trained(workdir)
    lines: list[str] = []
    resumed = train_and_evaluate(config(data_dir, async_save), workdir, emit=lines.append)
    start_line = next(line for line in lines if "parameters," in line)
    start = (
        int(start_line.split("resuming from step ")[1].split(";")[0])
        if "resuming" in (start_line)
        else 0
    )
    return dict(
        signal=name,
        point=point,
        at=POINTS.get(point),
        exit_status=status,
        stopped_by=stopped_by,
        last_trained=trained,
        resumed_from=start,
        steps_lost=trained - start,
        result=resumed,
    )


def kill(faults: str, workdir: str, data_dir: str, async_save: bool = True) -> int:
    """Runs the training in a subprocess with ``faults`` injected (``"SIGKILL:save"``,
    or several: ``"SIGINT:save,SIGTERM:commit"``); returns its exit status, which must
    be death by the last fault's signal."""
    victim = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.fault_matrix", "--victim", faults),
            *(workdir, data_dir, "async" if async_save else "sync"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    last = faults.split(",")[-1].split(":")[0]
    if victim.returncode != -getattr(signal, last):
        raise RuntimeError(f"The victim exited {victim.returncode}:\n{victim.stderr[-3000:]}")
    return victim.returncode


def _victim(faults: str, workdir: str, data_dir: str, mode: str) -> None:
    from deq_jax.training import train_and_evaluate

    with contextlib.ExitStack() as stack:
        for fault in faults.split(","):
            stack.enter_context(inject(*fault.split(":")))
        train_and_evaluate(config(data_dir, mode == "async"), workdir, emit=lambda line: None)
    sys.exit(3)  # not killed: the injection missed


def matrix(root: str) -> list[dict[str, Any]]:
    """Every signal at every point, each against one uninterrupted run; the figures
    with ``identical`` (bit for bit) in place of the result."""
    from deq_jax.training import train_and_evaluate

    data_dir = os.path.join(root, "data")
    reference = params(
        train_and_evaluate(config(data_dir), os.path.join(root, "ref"), emit=lambda line: None)
    )
    rows = []
    cases = [(name, point, True) for name in SIGNALS for point in POINTS]
    cases += [("SIGKILL", point, False) for point in POINTS]
    for name, point, async_save in cases:
        workdir = os.path.join(root, f"{name}_{point}_{'async' if async_save else 'sync'}")
        case = run_case(name, point, workdir, data_dir, async_save)
        case["saves"] = "async" if async_save else "sync"
        case["identical"] = identical(params(case.pop("result")), reference)
        rows.append(case)
        print(json.dumps(case), flush=True)
    return rows


def main(argv: list[str]) -> None:
    if argv[:1] == ["--victim"]:
        _victim(*argv[1:5])
        return
    out = argv[argv.index("--out") + 1] if "--out" in argv else tempfile.mkdtemp()
    rows = matrix(out)
    print(
        "| signal | point (step) | saves | exit | last step done | resumed from | lost | "
        "identical |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        exit_ = r["exit_status"] if r["exit_status"] is not None else f"stopped ({r['stopped_by']})"
        print(
            f"| {r['signal']} | {r['point']} ({r['at']}) | {r['saves']} | {exit_} | "
            f"{r['last_trained']} | "
            f"{r['resumed_from']} | {r['steps_lost']} | {r['identical']} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
