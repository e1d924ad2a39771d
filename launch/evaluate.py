"""Evaluates the latest checkpoint of a workdir on any splits and solver budgets.

Usage::

    python -m launch.evaluate --config configs/prefix_sum.py --workdir /tmp/ps \\
        --splits=test_32,test_64 --max_iters=30,60,120

Pass the config (and overrides) the checkpoint was trained with. Without ``--splits``
every eval split of the task is used; without ``--max_iters`` the budgets are
``eval.budget_multipliers`` times ``deq.train_max_iter``. The table is printed and
written as JSON to ``--output`` (default ``{workdir}/evaluation.json``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

from absl import flags

from launch import main as launch_main

_SPLITS = flags.DEFINE_list("splits", [], "Splits to evaluate (default: every eval split).")
_MAX_ITERS = flags.DEFINE_list("max_iters", [], "Solver budgets (default: the multipliers).")
_OUTPUT = flags.DEFINE_string("output", "", "JSON output path (default {workdir}/evaluation.json).")


def main(argv: Sequence[str]) -> None:
    launch_main.reject_arguments(argv)
    from deq_jax.training import evaluate_checkpoint

    launch_main.quiet_library_logs()
    workdir = launch_main._WORKDIR.value
    report = evaluate_checkpoint(
        launch_main._CONFIG.value,
        workdir,
        splits=_SPLITS.value,
        max_iters=[int(k) for k in _MAX_ITERS.value],
        emit=functools.partial(print, flush=True),
    )
    path = _OUTPUT.value or os.path.join(workdir, "evaluation.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    print(f"Wrote {path}", flush=True)


if __name__ == "__main__":
    launch_main.run(main)
