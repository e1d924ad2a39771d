"""Trains and evaluates a model described by a config file.

Usage::

    python -m launch.main --config configs/prefix_sum.py --workdir /tmp/ps \\
        [--config.train.steps=2000 --config.deq.solver.name=broyden ...]

Only ``--config`` (an `ml_collections` config file, locked: an override can change a
field but not add one) and ``--workdir`` are flags; everything else is a config field.
An override naming an unknown field fails before anything runs, naming the valid
fields of its section; so does a config the library refuses (an unknown solver name, an
empty ``--workdir``, a batch size of 0: `deq_jax.training.families.setup.check_config`), in one
line and before any data is generated or any directory created. Any other start-up
error a user can cause (missing or malformed data, a workdir holding another model's
checkpoints or only damaged ones, another vocabulary's run, a workdir that is a file or
not writable) ends the run in one ``FATAL`` line too, with the fix and exit status 2
(`launch.flags.user_errors`).

SIGTERM or SIGINT during training (a preempted machine, Ctrl-C) stops the run after
the step it arrives in, with a checkpoint at that step and one line saying so; the
process then exits with status 75 (`PREEMPTED_EXIT_STATUS`, sysexits' EX_TEMPFAIL), and
the same command resumes from that step. A second signal ends the process at once.
A checkpoint that cannot be written (a full disk) ends the run with one ``FATAL`` line
and status 74; the earlier checkpoints are intact. The library receives
the config object through `deq_jax.training.train_and_evaluate(config, workdir)`; it
never reads flags. The flags and their checks live in `launch.flags`, which every other
entry point shares.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

from ml_collections import ConfigDict

from deq_jax.training.run.preemption import PREEMPTED_EXIT_STATUS
from deq_jax.training.run.sharding import explain_peer_failure
from launch import flags as launch_flags


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    config, emit = launch_flags.checked_config(), functools.partial(print, flush=True)
    with launch_flags.user_errors(), explain_peer_failure():
        stopped_by = _train(config, emit)
    if stopped_by:
        sys.exit(PREEMPTED_EXIT_STATUS)


def _train(config: ConfigDict, emit: Callable[[str], None]) -> str | None:
    """Runs the training ``config`` describes: a neural-solver fit when it names the
    frozen DEQ's run (``neural_solver.deq_workdir``), else the model's training; the
    library picks the family (task, image or language model) from the config. Returns
    the signal that stopped the training early, or ``None``."""
    from deq_jax.training import train_and_evaluate, train_hypersolver

    if config.get("neural_solver", {}).get("deq_workdir", ""):
        train_hypersolver(config, launch_flags.WORKDIR.value, emit=emit)
        return None
    return train_and_evaluate(config, launch_flags.WORKDIR.value, emit=emit).stopped_by


if __name__ == "__main__":
    launch_flags.run(main)
