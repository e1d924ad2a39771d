"""Finished runs for the report scripts: load a run's final checkpoint, or train it; the
state a report scores, its best checkpoint on validation (`best_run`); and the report's
files (`write_report`)."""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from deq_jax.training.run.writers import write_json, write_text
from launch.flags import check_overrides

# Fields a finished run may be loaded under with other values than it was trained with:
# how long it trained (a longer run resumes), the test splits of its task (every task
# names them ``test_*``) and how it is evaluated, logged and checkpointed. Everything
# else (task, model, solver, backward, optimiser, regularisers, interventions) must
# match, or the report would analyse a model under a config that did not train it.
LOADABLE_CHANGES = ("train.steps", "train.stop_at_step", "task.test_", "eval.", "log.", "ckpt.")
# Fields added after runs were trained without them, with the value that reproduces what
# those runs did: a saved config that lacks one compares as if it held that value (a CLRS
# run from before the official CLRS-30 splits drew its graphs with numpy's Generator).
LEGACY_VALUES = {"task.sampler": "generator", "task.generator": "random_start"}


class RunConfigMismatchError(ValueError):
    """A workdir holds a run trained under another config than the one asked for."""


def quiet(line: str) -> None:
    """An ``emit`` that drops every line."""
    del line


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def config_differences(saved: dict[str, Any], config: Any) -> list[str]:
    """``"key: saved -> now"`` for each field of ``config`` that differs from ``saved``.

    Fields in `LOADABLE_CHANGES` are skipped, and so are fields ``saved`` lacks (a run
    trained before the field existed); a field only ``saved`` has is shown as
    ``<missing>``. A ``saved`` config of the layout before ``config.deq`` compares under
    the new names (``solver.tol`` as ``deq.solver.tol``, `renamed_key`); one that lacks
    a field of `LEGACY_VALUES` compares as if it held the legacy value.
    """
    from deq_jax.training.loop.train import config_json
    from deq_jax.training.run.build import renamed_key

    # Through the same JSON as the saved file, so tuples compare equal to its lists.
    old = {renamed_key(k) or k: v for k, v in _flatten(saved).items()}
    new = _flatten(json.loads(config_json(config)))
    for key, value in LEGACY_VALUES.items():
        section = key.split(".")[0] + "."
        if key in new and key not in old and any(k.startswith(section) for k in old):
            old[key] = value
    diffs = []
    for key in sorted(old):
        if any(key == f or (f[-1] in "._" and key.startswith(f)) for f in LOADABLE_CHANGES):
            continue
        a, b = old[key], new.get(key, "<missing>")
        if a != b:
            diffs.append(f"{key}: {a!r} -> {b!r}")
    return diffs


def check_run_config(config: Any, workdir: str) -> None:
    """Raises `RunConfigMismatchError` if ``workdir``'s ``config.json`` disagrees.

    A workdir without ``config.json`` (nothing trained there yet) passes.
    """
    from deq_jax.training.loop.train import CONFIG_FILE

    path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(path):
        return
    with open(path) as f:
        saved = json.load(f)
    diffs = config_differences(saved, config)
    if diffs:
        shown = "; ".join(diffs[:8]) + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "")
        raise RunConfigMismatchError(
            f"{workdir} holds a run trained under another config ({shown}). Use a fresh "
            "workdir, or the config that trained it."
        )


def apply_overrides(config: Any, items: Sequence[str]) -> Any:
    """Sets ``key=value`` fields of ``config`` in place (``model.hidden=128``) and returns it.

    Values are Python literals (``0.1``, ``True``, ``(16, 64)``); anything else is a
    string (``model.processor=triplet_mpnn``). The config's field types still apply.

    Raises:
      ValueError: for an item without ``=``.
      launch.flags.UnknownOverrideError: for a key that names no field of ``config``.
    """
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"Override {item!r} is not of the form key=value.")
        check_overrides(config, [key])
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        *sections, name = key.split(".")
        node = config
        for part in sections:
            node = node[part]
        node[name] = value
    return config


def trained_run(config: Any, workdir: str, emit: Callable[[str], None] = quiet) -> Any:
    """A finished run of ``config`` in ``workdir``: trained unless its checkpoint exists.

    Returns:
      The `deq_jax.training.Run` with the final state restored.

    Raises:
      RunConfigMismatchError: if the workdir's run was trained under another config
        (beyond `LOADABLE_CHANGES`).
    """
    from deq_jax.training import setup, train_and_evaluate

    check_run_config(config, workdir)
    run = setup(config, workdir)
    run.checkpointer.close()
    if run.start_step < config.train.steps:
        train_and_evaluate(config, workdir, emit=emit)
        run = setup(config, workdir)
        run.checkpointer.close()
    return run


def best_run(
    config: Any, workdir: str, emit: Callable[[str], None] = quiet
) -> tuple[Any, int, str]:
    """`trained_run` with the state a report scores: ``(run, step, which)``, the run's
    state replaced by its best checkpoint on validation (``which="best"``,
    `deq_jax.training.run.selection`), or its last for a run trained without one."""
    from deq_jax.training.run.selection import restore_selected

    run = trained_run(config, workdir, emit=emit)
    state, step, which = restore_selected(workdir, run.state, run.start_step)
    return run._replace(state=state), step, which


def write_report(
    path: str,
    report: dict[str, Any],
    markdown: str | None = None,
    also: Sequence[str] = (),
    emit: Callable[[str], None] = print,
) -> None:
    """Writes ``report`` to ``path`` (JSON) and ``markdown``, if given, beside it with
    the suffix ``.md``; then says ``Wrote`` and every path, ``also`` (files the report
    script wrote itself, e.g. figures) included."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_json(path, report, indent=1)
    written = [path]
    if markdown is not None:
        written.append(os.path.splitext(path)[0] + ".md")
        write_text(written[-1], markdown)
    emit(f"Wrote {', '.join([*written, *also])}")
