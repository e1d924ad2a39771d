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
* builds every image task (from a few idx files and CIFAR-10 python batches, and tfds'
  cifar10 and mnist without their records) and reads its input shape, classes, metric
  and augmentation with tfds and array_record blocked; its ``prepare()`` is where they
  would load, and says which extra to install;
* runs ``launch.main`` on ``configs/prefix_sum.py:smoke`` (16 s on 2 cores shared
  with other jobs, the suite's XLA flags), and ``benchmarks.step_time`` on the tiny
  MDEQ of `test_step_time` (one 8-channel resolution of
  ``configs/mdeq_fashion_mnist.py:smoke``, 8x8 inputs) with empty data directories
  (14 s);
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
from test_tasks_cifar_files import write_cifar_dir
from test_tasks_idx import write_dir

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
from deq_jax.training.run.writers import MetricWriter

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


IMAGE_TASKS = """
import json
import numpy as np
import deq_jax.tasks as tasks

idx_dir, cifar_dir, data_dir = sys.argv[1:]
built = {
    "fashion_mnist": tasks.get("fashion_mnist", dir=idx_dir, data_dir=data_dir),
    "mnist": tasks.get("mnist", dir=idx_dir, data_dir=data_dir),
    "cifar10 files": tasks.get("cifar10", dir=cifar_dir, data_dir=data_dir),
    "cifar10 tfds": tasks.get("cifar10", data_dir=data_dir),
    "blurry mnist": tasks.get("blurry_digits", source="mnist", data_dir=data_dir),
}
logits, targets = np.eye(10, dtype=np.float32)[:4], np.arange(4, dtype=np.int32)
report = {
    name: {
        "shape": list(task.input_shape),
        "classes": task.num_classes,
        "accuracy": float(task.metrics(logits, targets)["accuracy"]),
        "augments": task.augments_training,
    }
    for name, task in built.items()
}
loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(Uninstalled.BLOCKED))
for name, task in built.items():
    try:
        task.prepare()
    except ModuleNotFoundError as error:
        report[name]["prepare"] = str(error)
print(json.dumps({"tasks": report, "loaded": loaded}))
"""


def test_image_tasks_are_built_without_tfds(tmp_path):
    """Building an image task and reading what a model needs of it loads no tfds."""
    idx_dir, cifar_dir, data_dir = (str(tmp_path / name) for name in ("idx", "cifar", "data"))
    write_dir(idx_dir, size=28)
    write_cifar_dir(cifar_dir)
    out = _run(BLOCK + IMAGE_TASKS, idx_dir, cifar_dir, data_dir)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["loaded"] == []
    shapes = {name: tuple(task["shape"]) for name, task in report["tasks"].items()}
    assert shapes == {
        "fashion_mnist": (28, 28, 1),
        "mnist": (28, 28, 1),
        "cifar10 files": (32, 32, 3),
        "cifar10 tfds": (32, 32, 3),
        "blurry mnist": (28, 28, 1),
    }
    for name, task in report["tasks"].items():
        assert task["classes"] == 10 and task["accuracy"] == 1.0, name
        assert task["augments"] == (name != "blurry mnist"), name
        assert "tensorflow_datasets" in task["prepare"], name
        assert "pip install 'deq_jax[train]'" in task["prepare"], name
    assert not os.path.exists(data_dir)  # nothing written


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


def test_step_time_times_an_image_model_without_tfds(tmp_path):
    """The tiny MDEQ of `test_step_time`, its data directories empty, tfds blocked."""
    empty = [tmp_path / "idx", tmp_path / "data"]
    for folder in empty:
        folder.mkdir()
    args = ["--config", "configs/mdeq_fashion_mnist.py:smoke", "--input_shape", "8,8,1"]
    args += ["--config.model.channels=(8,)", "--config.model.head_channels=(4,)"]
    args += [f"--config.task.dir={empty[0]}", f"--config.task.data_dir={empty[1]}"]
    args += ["--batch", "4", "--warmup", "1", "--steps", "1", "--eval_steps", "1"]
    args += ["--f_evals", "2", "--out", str(tmp_path / "r.jsonl")]
    out = _run(RUN_MODULE, "benchmarks.step_time", *args)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    record = json.loads((tmp_path / "r.jsonl").read_text())
    assert record["data"] == "synthetic" and record["input_shape"] == [8, 8, 1]
    assert record["model"] == "mdeq" and record["f_eval_flops"] > 0
    assert not [path for folder in empty for path in folder.iterdir()]  # nothing written
