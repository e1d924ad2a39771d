"""Training and timing need jax, flax, optax, orbax, absl, ml_collections, numpy and chex:
nothing else.

Each package of `OPTIONAL` is imported only where its feature is used (tfds and
array_record by the image tasks, tensorboardX by TensorBoard events, jaxopt by the
solver benchmark against it, matplotlib by plots, scikit-learn by the digits task). A
subprocess makes them look uninstalled (`BLOCK`: a ``sys.meta_path`` finder that raises
``ModuleNotFoundError`` for them, as a missing package does) and then:

* imports what ``launch.main`` and ``benchmarks.step_time`` import, builds the
  prefix-sum and character-level tasks (a tiny corpus) and writes a metric asking for
  TensorBoard events, which says in one line that they are not written;
* runs ``launch.main`` on ``configs/prefix_sum.py:smoke`` (16 s on 2 cores shared
  with other jobs, the suite's XLA flags);
* (slow: 39 s and 26 s there, over a minute each outside the suite) runs ``launch.main`` on
  ``configs/lm_shakespeare.py:smoke`` with a tiny corpus, and ``benchmarks.step_time``
  on the tiny language model with no corpus at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_lm_training import write_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONAL = (
    "tensorflow_datasets",
    "array_record",
    "tensorboardX",
    "jaxopt",
    "matplotlib",
    "sklearn",
)
BLOCK = f"""
import runpy, sys

class Uninstalled:
    '''Importing a package of BLOCKED fails as if it were not installed.'''

    BLOCKED = {OPTIONAL!r}

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
"""
# ``python -c RUN_MODULE module args``: ``python -m module args`` with the block on.
RUN_MODULE = BLOCK + (
    "sys.argv = sys.argv[1:]\nrunpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def _run(code: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -c code *args`` from the repository root, this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_block_makes_a_package_look_uninstalled():
    """The finder itself: an import of a blocked package fails, others work."""
    code = BLOCK + (
        "try:\n    import tensorboardX\nexcept ModuleNotFoundError as e:\n    print(e.name)\n"
        "import numpy\n"
    )
    out = _run(code)
    assert out.returncode == 0 and out.stdout.strip() == "tensorboardX", out.stderr[-2000:]


LIGHT_USE = """
import json
import deq_jax.tasks as tasks
import benchmarks.step_time
import launch.main
from deq_jax.training import train_and_evaluate, train_hypersolver
from deq_jax.training.writers import MetricWriter

corpus, data_dir, workdir = sys.argv[1:]
bits = tasks.get("prefix_sum", train_size=8, train_length=4, test_lengths=(4,), test_size=4,
                 val_size=2)
bits.prepare()
text = tasks.get("char_text", path=corpus, data_dir=data_dir)
text.prepare()
said = []
MetricWriter(workdir, emit=said.append).write(1, "train", {"loss": 1.0})
MetricWriter(workdir, tensorboard=False, emit=said.append).write(2, "train", {"loss": 1.0})
loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(Uninstalled.BLOCKED))
print(json.dumps({"said": said, "loaded": loaded, "vocab": text.vocab_size}))
"""


def test_training_and_timing_import_no_optional_package(tmp_path):
    corpus = write_corpus(tmp_path / "plays.txt", repeats=2)
    out = _run(BLOCK + LIGHT_USE, corpus, str(tmp_path / "data"), str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["loaded"] == [] and report["vocab"] > 1
    (line,) = report["said"]  # once: not again with tensorboard=False
    assert "tensorboardX is not installed" in line and "log.tensorboard=False" in line
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [1, 2]
    assert not (tmp_path / "run" / "tensorboard").exists()


@pytest.mark.parametrize(
    "model", ["prefix_sum", pytest.param("language_model", marks=pytest.mark.slow)]
)
def test_a_training_run_needs_no_optional_package(tmp_path, model):
    workdir = str(tmp_path / "run")
    if model == "prefix_sum":
        args = ["--config", "configs/prefix_sum.py:smoke", "--workdir", workdir]
        report = "length_generalization.json"
    else:
        corpus = write_corpus(tmp_path / "plays.txt")
        args = ["--config", "configs/lm_shakespeare.py:smoke", "--workdir", workdir]
        args += [f"--config.task.path={corpus}"]
        report = "lm_report.json"
    out = _run(RUN_MODULE, "launch.main", *args)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "No TensorBoard events: tensorboardX is not installed" in out.stdout
    assert os.path.exists(os.path.join(workdir, report))


@pytest.mark.slow
def test_step_time_needs_no_optional_package_and_no_corpus(tmp_path):
    (tmp_path / "corpus").mkdir()
    args = ["--config", "configs/lm_shakespeare.py:smoke", "--vocab", "12", "--batch", "2"]
    args += ["--warmup", "1", "--steps", "1", "--eval_steps", "1", "--f_evals", "2"]
    args += [f"--config.task.path={tmp_path / 'corpus'}", "--out", str(tmp_path / "r.jsonl")]
    out = _run(RUN_MODULE, "benchmarks.step_time", *args)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    record = json.loads((tmp_path / "r.jsonl").read_text())
    assert record["data"] == "synthetic" and record["f_eval_flops"] > 0
    assert "f(z*) FLOPs (XLA count)" in out.stdout
