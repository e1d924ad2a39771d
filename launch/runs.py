"""Finished runs for the report scripts: load a run's final checkpoint, or train it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def quiet(line: str) -> None:
    """An ``emit`` that drops every line."""
    del line


def trained_run(config: Any, workdir: str, emit: Callable[[str], None] = quiet) -> Any:
    """A finished run of ``config`` in ``workdir``: trained unless its checkpoint exists.

    Returns:
      The `deq_jax.training.Run` with the final state restored.
    """
    from deq_jax.training import setup, train_and_evaluate

    run = setup(config, workdir)
    run.checkpointer.close()
    if run.start_step < config.train.steps:
        train_and_evaluate(config, workdir, emit=emit)
        run = setup(config, workdir)
        run.checkpointer.close()
    return run
