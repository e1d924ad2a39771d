"""Shared fixtures and helpers: float64 on demand, running a launch module as a command.

Compilation settings for the suite, applied before JAX starts its backend:

* XLA's CPU backend compiles at LLVM optimisation level 0
  (``--xla_backend_optimization_level=0``) unless ``XLA_FLAGS`` already names a level.
  Most tests are dominated by compiling small programs once; at level 0 the suite takes
  about half the CPU time (measured in BUILD_NOTES.md). The numbers are the same
  program's, so every tolerance still holds; speed is measured by the benchmarks, never
  here.
* It also uses its older fusion emitters (``--xla_cpu_use_fusion_emitters=false``),
  likewise unless ``XLA_FLAGS`` names the flag: they compile MDEQ's smoke run in about
  60% of the default emitters' time, and the CI command ran in 13 min instead of 21
  (BUILD_NOTES.md). They round some programs differently from the default ones, so two
  programs that do the same arithmetic in a different arrangement no longer always agree
  bit for bit. The tests that compare such programs that closely compile them with
  XLA's defaults (`problems.jit_as_users_compile`) or compare them in float64.
* JAX's persistent compilation cache is on: a test that compiles a program another
  test (or the other xdist worker, or a launch subprocess) already compiled in this run
  loads it instead (a resumed run's train step, the same smoke config in several
  modules). The cache lives in a fresh temporary directory per run, removed at the end
  (the CI command: 17 min 55 s -> 15 min 09 s, BUILD_NOTES.md).
  ``DEQ_JAX_TEST_CACHE=<dir>`` names a lasting one instead, so a second run of the
  suite skips most compilation (about 4x less CPU time).

Order of the modules under ``-n 2 --dist loadscope`` (the CI command): xdist hands out
whole modules, and by default sorts them by their number of tests, most first. That put
the few-test end-to-end modules, the longest of the suite, last, where one worker ran
them alone while the other had finished. Here the modules of `LONGEST_MODULES` go
first, longest first, and the rest follow by number of tests as before (longest
processing time first), so that the last minutes hold short modules for both workers.
A plain run (no ``-n``) keeps the file order.
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite's XLA flags (module docstring), each unless XLA_FLAGS already names it.
_SUITE_XLA_FLAGS = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
}
for _flag, _value in _SUITE_XLA_FLAGS.items():
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()

import jax  # noqa: E402 - after XLA_FLAGS, which the backend reads when it starts
import pytest  # noqa: E402

# The run's compilation cache: made by the process that starts the run (xdist's
# controller, or a plain run) before its workers start, so that they and the launch
# subprocesses of the tests inherit it through the environment.
_RUN_CACHE = None
if not os.environ.get("DEQ_JAX_TEST_CACHE") and not os.environ.get("PYTEST_XDIST_WORKER"):
    _RUN_CACHE = tempfile.mkdtemp(prefix="deq_jax_test_xla_cache_")
    os.environ["DEQ_JAX_TEST_CACHE"] = _RUN_CACHE
if os.environ.get("DEQ_JAX_TEST_CACHE"):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["DEQ_JAX_TEST_CACHE"]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
    jax.config.update("jax_compilation_cache_dir", os.environ["DEQ_JAX_TEST_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# The default suite's longest modules, longest first, by CPU seconds of the module alone
# (`/usr/bin/time` user of ``python -m pytest -q -n 0 -p no:cacheprovider tests/<m>``
# on the 2-core machine shared with a training job; "measured": after the shared
# programs and shrinks of branch wt-t2). Modules not measured there keep the estimate of
# their place before: the sum of their tests' seconds in the 120 longest phases of the
# CI command's ``--durations=120`` (commit d6305d9), divided by the 2.9 by which wall
# exceeded CPU in that run (a lower bound for a module of many short tests). A module
# missing here only loses its early start.
LONGEST_MODULES = (
    "test_lm_training.py",  # 142 s measured, with the 1-vs-8-device subprocesses
    "test_training_mesh.py",  # ~80 s: three families on 8 and 1 devices, the hops
    "test_language_model.py",  # 132 s measured
    "test_clrs_model.py",  # 104 s measured
    "test_backward.py",  # 102 s measured
    "test_mdeq.py",  # 96 s measured
    "test_neural_solver.py",  # ~96 s estimated
    "test_mdeq_training.py",  # ~90 s estimated
    "test_combinators.py",  # 84 s measured
    "test_neural_solver_launch.py",  # ~72 s: the digits DEQ, its hypersolver, the sweep
    "test_training_run.py",  # ~54 s estimated
    "test_resume_device_count.py",  # ~52 s CPU measured: 1, 8, 1 devices in subprocesses
    "test_training_jacobian.py",  # ~53 s estimated
    "test_training_multidevice.py",  # 51 s measured
    "test_clrs_launch.py",  # 49 s measured
    "test_analysis_path_independence.py",  # ~48 s estimated
    "test_reasoning_models.py",  # ~47 s estimated
    "test_path_independence_training.py",  # ~44 s estimated
    "test_mdeq_step_cost.py",  # ~37 s estimated
    "test_nonfinite_values.py",  # 36 s measured
    "test_training_multihost.py",  # ~35 s estimated
    "test_preemption.py",  # ~30 s measured: three faults, the command line under SIGTERM
    "test_startup_errors.py",  # ~27 s measured: five launch subprocesses
    "test_maze_model.py",  # ~31 s estimated
    "test_benchmark_solvers.py",  # ~24 s estimated
    "test_checkpoint_save_failure.py",  # ~18 s measured: two smoke trainings
    "test_settle.py",  # ~19 s estimated
    "test_properties.py",  # ~19 s estimated
    "test_readme.py",  # ~19 s estimated
    "test_nn_deq.py",  # ~19 s estimated
    "test_nn_cells.py",  # ~18 s estimated
)


def pytest_configure(config):
    """Turns off xdist's by-count module order, which `pytest_collection_modifyitems`
    replaces (the option exists only where pytest-xdist is installed)."""
    if getattr(config.option, "dist", "no") == "loadscope":
        config.option.loadscopereorder = False


def pytest_unconfigure(config):
    """Removes the run's compilation cache (in the process that made it)."""
    if _RUN_CACHE is not None:
        shutil.rmtree(_RUN_CACHE, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after ``-m "not slow"`` has deselected its tests
def pytest_collection_modifyitems(config, items):
    """On an xdist worker, orders the modules: `LONGEST_MODULES` first in their order,
    then the others by number of tests, most first; a module's tests keep their order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    modules = [item.nodeid.split("::")[0] for item in items]
    counts = collections.Counter(modules)
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    keys = {
        module: (rank.get(os.path.basename(module), len(rank)), -counts[module], module)
        for module in counts
    }
    order = sorted(range(len(items)), key=lambda i: keys[modules[i]])
    items[:] = [items[i] for i in order]


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


def run_on_devices(script: str, *args, devices: int, timeout: int = 600) -> dict:
    """Runs ``python -c script *args`` on ``devices`` simulated CPU devices.

    The subprocess keeps the suite's ``XLA_FLAGS`` (`launch.multiprocess.process_env`)
    and must print one line ``RESULT <json>``; the last such line is returned, parsed.
    """
    from launch import multiprocess  # here: its absl flags only for the tests that use it

    env = multiprocess.process_env(devices)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


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
