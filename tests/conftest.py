"""Shared fixtures and helpers: float64 on demand, running a launch module as a command.

Compilation settings for the suite, applied before JAX starts its backend:

* XLA's CPU backend compiles at LLVM optimisation level 0
  (``--xla_backend_optimization_level=0``) unless ``XLA_FLAGS`` already names a level.
  Most tests are dominated by compiling small programs once; at level 0 the suite takes
  about half the CPU time (measured in BUILD_NOTES.md). The numbers are the same
  program's, so every tolerance still holds; speed is measured by the benchmarks, never
  here.
* ``DEQ_JAX_TEST_CACHE=<dir>`` turns on JAX's persistent compilation cache in ``<dir>``,
  so a second run of the suite skips most compilation (about 4x less CPU time).

"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LEVEL_FLAG = "--xla_backend_optimization_level"
if _LEVEL_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_LEVEL_FLAG}=0".strip()

import jax  # noqa: E402 - after XLA_FLAGS, which the backend reads when it starts
import pytest  # noqa: E402

if os.environ.get("DEQ_JAX_TEST_CACHE"):
    jax.config.update("jax_compilation_cache_dir", os.environ["DEQ_JAX_TEST_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture
def x64():
    """Runs a test with 64-bit floats enabled, restoring the setting afterwards."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    """Runs a test once in float32 and once in float64 (x64 enabled for the latter)."""
    if request.param == "float64":
        with jax.enable_x64(True):
            yield request.param
    else:
        yield request.param


def run_module(module, *args, timeout=600):
    """Runs ``python -m module *args`` from the repository root, as a user would.

    The repository is put first on ``PYTHONPATH`` so that the subprocess imports this
    checkout's ``deq_jax``, ``configs`` and ``launch``. Tests import it with
    ``from conftest import run_module``.

    Args:
      module: the module to run, e.g. ``"launch.main"``.
      *args: its command-line arguments.
      timeout: seconds before the run is killed (``subprocess.TimeoutExpired``).

    Returns:
      The ``subprocess.CompletedProcess``, with ``stdout`` and ``stderr`` as text.
    """
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
