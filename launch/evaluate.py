"""Evaluates a checkpoint of a workdir on any splits and solver budgets.

Usage::

    python -m launch.evaluate --config configs/prefix_sum.py --workdir /tmp/ps \\
        --splits=test_32,test_64 --max_iters=30,60,120 [--checkpoint=best|last]

``--max_batches=N`` scores the first ``N`` batches of each split (``eval.batch_size``
examples each; the same at every budget) instead of whole splits.

``--checkpoint=best`` scores the state with the best validation score that training
kept (``checkpoints_best/``, `deq_jax.training.run.selection`), ``last`` the latest
checkpoint; by default the best if the run has one, else the last. The first line
printed names the step scored and why.

Pass the config (and overrides) the checkpoint was trained with. Without ``--splits``
every eval split of the task is used; without ``--max_iters`` the budgets are
``eval.budget_multipliers`` times ``deq.train_max_iter``. A line per split and budget
is printed as it is done, then the table, also written as JSON to ``--output``
(default ``{workdir}/evaluation.json``). A workdir without a checkpoint is refused at
once (nothing generated or created).

A language model's run (``configs/lm_*.py``) is streamed over whole splits with its
segment memory (`deq_jax.training.families.lm_evaluate.evaluate_lm_checkpoint`); its budgets
default to ``deq.eval_max_iter``, and its JSON also holds each split's per-segment
loss, steps and convergence::

    python -m launch.evaluate --config configs/lm_shakespeare.py --workdir /tmp/lm \\
        --splits=valid,test --max_iters=30,60,120

``--exclude=REGEX`` (character level) also scores each split outside and inside the
pattern's matches, e.g. ``--exclude=' {10,}'`` for the long runs of spaces that indent
half-lines in some plays.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence

from absl import flags

from deq_jax.training.run.writers import write_json
from launch import flags as launch_flags

_SPLITS = flags.DEFINE_list("splits", [], "Splits to evaluate (default: every eval split).")
_MAX_ITERS = flags.DEFINE_list("max_iters", [], "Solver budgets (default: the multipliers).")
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "", ["", "best", "last"], "best, last, or empty: the best if there is one."
)
_EXCLUDE = flags.DEFINE_string(
    "exclude",
    "",
    "Language models, character level: a regular expression; also score the characters "
    "outside its matches and inside them (e.g. ' {10,}').",
)
_OUTPUT = flags.DEFINE_string("output", "", "JSON output path (default {workdir}/evaluation.json).")
_MAX_BATCHES = flags.DEFINE_integer(
    "max_batches",
    0,
    "The first this many eval batches of each split (the same ones at every budget); "
    "0: whole splits (a language model's first segments, streamed with the memory).",
    lower_bound=0,
)


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    from deq_jax.training import evaluate_checkpoint
    from deq_jax.training.run.checkpoint import saved_steps

    launch_flags.quiet_library_logs()
    config = launch_flags.checked_config()
    workdir = launch_flags.WORKDIR.value
    if not saved_steps(workdir):
        print(
            f"FATAL No checkpoint in {os.path.join(workdir, 'checkpoints')}: train one first "
            f"(python -m launch.main --config ... --workdir {workdir}).",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)
    options = dict(max_batches=_MAX_BATCHES.value)
    if _EXCLUDE.value:  # the family refuses it where it does not apply (tasks)
        options["exclude"] = _EXCLUDE.value
    try:
        with launch_flags.user_errors():
            report = evaluate_checkpoint(
                config,
                workdir,
                splits=_SPLITS.value,
                max_iters=[int(k) for k in _MAX_ITERS.value],
                emit=functools.partial(print, flush=True),
                checkpoint=_CHECKPOINT.value,
                **options,
            )
    except ValueError as e:
        print(f"FATAL {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    path = _OUTPUT.value or os.path.join(workdir, "evaluation.json")
    write_json(path, report, indent=2, sort_keys=True)
    print(f"Wrote {path}", flush=True)


if __name__ == "__main__":
    launch_flags.run(main)
