"""Trains and evaluates a model described by a config file.

Usage::

    python -m launch.main --config configs/prefix_sum.py --workdir /tmp/ps \\
        [--config.train.steps=2000 --config.deq.solver.name=broyden ...]

Only ``--config`` (an `ml_collections` config file, locked: an override can change a
field but not add one) and ``--workdir`` are flags; everything else is a config field.
An override naming an unknown field fails before anything runs, naming the valid
fields of its section; so does a config the library refuses (an unknown solver name, an
empty ``--workdir``, a batch size of 0: `deq_jax.training.setup.check_config`), in one
line and before any data is generated or any directory created. The library receives
the config object through `deq_jax.training.train_and_evaluate(config, workdir)`; it
never reads flags. The flags and their checks live in `launch.flags`, which every other
entry point shares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ml_collections import ConfigDict

from deq_jax.training.sharding import explain_peer_failure
from launch import flags as launch_flags


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    config, emit = launch_flags.checked_config(), functools.partial(print, flush=True)
    with explain_peer_failure():
        _train(config, emit)


def _train(config: ConfigDict, emit: Callable[[str], None]) -> None:
    """Runs the training ``config`` describes: a neural-solver fit when it names the
    frozen DEQ's run (``neural_solver.deq_workdir``), else the model's training; the
    library picks the family (task, image or language model) from the config."""
    from deq_jax.training import train_and_evaluate, train_hypersolver

    if config.get("neural_solver", {}).get("deq_workdir", ""):
        train_hypersolver(config, launch_flags.WORKDIR.value, emit=emit)
    else:
        train_and_evaluate(config, launch_flags.WORKDIR.value, emit=emit)


if __name__ == "__main__":
    launch_flags.run(main)
