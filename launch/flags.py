"""The flags every command of `launch` shares, and the code that checks them.

``--config`` (an `ml_collections` config file, locked: an override can change a field
but not add one) and ``--workdir`` are defined here once; `launch.main` trains with
them and every other entry point (`launch.evaluate`, `launch.sample`,
`launch.seed_report`, the studies in ``experiments/`` and the tools in
``benchmarks/``) imports this module instead of another entry point. An override
naming an unknown field fails before anything runs (`validate_argv`, called by `run`),
naming the valid fields of its section; a config the library refuses fails in one
``FATAL`` line (`checked_config`), and so does any other start-up error a user can
cause (`user_errors`: a mesh or batch size that does not fit the devices, missing or
malformed data, a workdir holding another model's
checkpoints or only damaged ones, a workdir that is a file, not writable or held by
another live run; and a checkpoint that could not be written).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence

from absl import app, flags, logging
from ml_collections import ConfigDict, config_flags

from deq_jax.tasks.errors import DataError
from deq_jax.training.families.lm_setup import VocabularyMismatchError
from deq_jax.training.families.setup import check_config
from deq_jax.training.run.build import renamed_key
from deq_jax.training.run.checkpoint import (
    CheckpointMismatchError,
    CheckpointSaveError,
    CheckpointUnreadableError,
)
from deq_jax.training.run.mesh import ConfigError
from deq_jax.training.run.workdir import WorkdirError, WorkdirLockedError
from deq_jax.training.run.writers import write_json
from deq_jax.training.solver_fit.targets import TargetResidualError

CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Path to a config file, optionally ':arg' for get_config(arg).",
    lock_config=True,
)
WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")

_PREFIXES = ("--config.", "-config.", "--noconfig.", "-noconfig.")

# The errors a user causes at start-up, each with the words its FATAL line starts with
# (`user_errors`); the first class that matches wins. Each message already says what
# is wrong and how to fix it. A new library error of that kind is added here, with its
# words.
USER_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (ConfigError, "config error"),
    (DataError, "data error"),
    (CheckpointMismatchError, "checkpoint error"),
    (CheckpointUnreadableError, "checkpoint error"),
    (VocabularyMismatchError, "vocabulary error"),
    (WorkdirError, "workdir error"),
    (WorkdirLockedError, "workdir error"),
    (TargetResidualError, "neural solver error"),
    (CheckpointSaveError, "checkpoint save failed"),
)
# The exit status of a `USER_ERRORS` line: 2 (a usage error), but 74 (sysexits'
# EX_IOERR) for a checkpoint that could not be written during training.
IO_ERRORS: tuple[type[BaseException], ...] = (CheckpointSaveError,)
IO_ERROR_EXIT_STATUS = 74


class UnknownOverrideError(ValueError):
    """A ``--config.*`` override names a field the config does not have."""


def _flag_value(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name=v`` or ``--name v`` in ``argv`` (the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        for dashes in ("--", "-"):
            if arg.startswith(f"{dashes}{name}="):
                value = arg.split("=", 1)[1]
            elif arg == f"{dashes}{name}" and i + 1 < len(argv):
                value = argv[i + 1]
    return value


def load_config_file(spec: str) -> ConfigDict:
    """Loads ``path[:arg]`` the way ``--config`` does: ``get_config(arg)`` or ``get_config()``."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Config file {path!r} not found.")
    module_spec = importlib.util.spec_from_file_location("_launch_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def override_keys(argv: Sequence[str]) -> list[str]:
    """The dotted field names of every ``--config.a.b=...`` style override in ``argv``."""
    keys = []
    for arg in argv:
        for prefix in _PREFIXES:
            if arg.startswith(prefix):
                keys.append(arg[len(prefix) :].split("=", 1)[0])
    return keys


def check_overrides(config: ConfigDict, keys: Sequence[str]) -> None:
    """Fails on the first override key that names no field of ``config``.

    Raises:
      UnknownOverrideError: naming the key, its section and the section's valid fields.
    """
    for key in keys:
        node, seen = config, "config"
        for part in key.split("."):
            moved = renamed_key(key)
            if moved and (not isinstance(node, ConfigDict) or part not in node):
                raise UnknownOverrideError(
                    f"--config.{key} has moved to --config.{moved}: everything a DEQ solves "
                    "with (solver, backward mode, z_init, budgets, settle rule) lives in "
                    "config.deq."
                )
            if not isinstance(node, ConfigDict) or part not in node:
                valid = ", ".join(sorted(node.keys())) if isinstance(node, ConfigDict) else ""
                what = f"Valid fields of {seen}: {valid}." if valid else f"{seen} is not a section."
                raise UnknownOverrideError(
                    f"Unknown config override --config.{key}: {seen} has no field {part!r}. {what}"
                )
            node, seen = node[part], f"{seen}.{part}"


def validate_argv(argv: Sequence[str]) -> None:
    """Checks the ``--config.*`` overrides of ``argv`` against the config file they target."""
    spec = _flag_value(argv, "config")
    keys = override_keys(argv)
    if spec and keys:
        check_overrides(load_config_file(spec), keys)


def checked_config() -> ConfigDict:
    """The ``--config`` after `check_config` with ``--workdir``; a refused config ends
    the process with one ``FATAL`` line on stderr (exit status 2), no traceback."""
    config = CONFIG.value
    try:
        check_config(config, WORKDIR.value)
    except ValueError as e:
        print(f"FATAL config error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    return config


def fold(message: str) -> str:
    """``message`` on one line: its non-blank lines, stripped, joined with ``"; "`` (with
    a space after a line that ends in a colon)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    out = lines[0] if lines else ""
    for line in lines[1:]:
        out += (" " if out.endswith(":") else "; ") + line
    return out


def user_error_line(error: BaseException) -> str | None:
    """``"FATAL <what>: <message on one line>"`` for an error a user can cause or fix
    (`USER_ERRORS`), else ``None``."""
    for kind, what in USER_ERRORS:
        if isinstance(error, kind):
            text = getattr(error, "strerror", None) or str(error)  # without "[Errno N] "
            return f"FATAL {what}: {fold(str(text))}"
    return None


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Ends the process on an error the user can fix (`user_error_line`) with one
    ``FATAL`` line on stderr and exit status 2 (`IO_ERROR_EXIT_STATUS` for the
    `IO_ERRORS`), no traceback; any other exception passes through unchanged."""
    try:
        yield
    except Exception as e:
        line = user_error_line(e)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        sys.exit(IO_ERROR_EXIT_STATUS if isinstance(e, IO_ERRORS) else 2)


def reject_arguments(argv: Sequence[str]) -> None:
    """Raises `absl.app.UsageError` on positional arguments (every option is a flag)."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")


def quiet_library_logs() -> None:
    """Shows warnings and errors only (orbax logs every save at INFO), unless the
    command line sets ``--verbosity``."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


SPLITS_FLAG = "splits"


def define_splits_flag() -> None:
    """Defines ``--splits`` once: the per-split tools on a trained run
    (`experiments.clrs.diagnose`, `experiments.clrs.steps`) share it, and both may be imported
    into one process."""
    if SPLITS_FLAG not in flags.FLAGS:
        flags.DEFINE_list(SPLITS_FLAG, [], "Splits to analyse (default: every eval split).")


def run_split_tool(
    argv: Sequence[str],
    analyse: Callable[..., dict],
    write_figure: Callable[[dict, str], str],
    output: str,
) -> None:
    """The ``main`` of a per-split tool on a trained run: ``analyse(config, workdir,
    splits, emit=...)`` printing as it goes, then ``{workdir}/{output}.json`` and the
    figure ``{output}.png`` (``write_figure(report, path)``)."""
    reject_arguments(argv)
    quiet_library_logs()
    workdir = WORKDIR.value
    emit = functools.partial(print, flush=True)
    report = analyse(CONFIG.value, workdir, flags.FLAGS[SPLITS_FLAG].value, emit=emit)
    path = os.path.join(workdir, f"{output}.json")
    write_json(path, report, indent=2, sort_keys=True)
    figure = write_figure(report, os.path.join(workdir, f"{output}.png"))
    emit(f"Wrote {path}, {figure}")


def run(entry) -> None:
    """Validates the overrides, then runs ``entry`` under `absl.app` (``--config`` and
    ``--workdir`` required)."""
    try:
        validate_argv(sys.argv[1:])
    except (UnknownOverrideError, FileNotFoundError) as e:
        print(f"FATAL Flags parsing error: {e}", file=sys.stderr)
        sys.exit(2)
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(entry)
