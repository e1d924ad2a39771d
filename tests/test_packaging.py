"""The distribution installs `deq_jax` alone, light, and ``import deq_jax`` stays light.

* ``import deq_jax`` (in a fresh interpreter) imports no training, data-pipeline or
  plotting package: none that ``import jax, flax.linen, optax, numpy`` does not import
  itself (absl comes with optax and flax), and never tfds, orbax, matplotlib, ...;
* `deq_jax.training` is imported on first use, as ``dj.training``, the image tasks on
  their first `deq_jax.tasks.get`, and tfds when a task first reads or writes its
  records (``prepare()``, ``source()``); without the ``[train]`` extra both say which
  extra to install, while the generated tasks (prefix sums, mazes, ...), the text tasks
  and the image tasks' shapes still work;
* ``setup.cfg`` selects the ``deq_jax`` packages only and asks for jax, flax, optax and
  numpy, the training, data and plotting packages coming with the ``[train]`` extra;
* a wheel built from the repository holds ``deq_jax`` as its only top-level package;
* ``examples/light_install.py`` runs with the core packages alone.
"""

from __future__ import annotations

import configparser
import json
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest
import setuptools

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Training, data-pipeline and plotting packages: the ``[train]`` extra's.
HEAVY = (
    "absl",
    "array_record",
    "jaxopt",
    "matplotlib",
    "ml_collections",
    "orbax",
    "sklearn",
    "tensorboardX",
    "tensorflow",
    "tensorflow_datasets",
)
CORE_REQUIREMENTS = {"jax", "flax", "optax", "numpy"}
TRAIN_REQUIREMENTS = {
    "orbax-checkpoint",
    "tensorflow-datasets",
    "array-record",
    "absl-py",
    "ml_collections",
    "tensorboardX",
    "matplotlib",
}
# What the distribution leaves out: it runs from a clone.
CLONE_ONLY = ("launch", "configs", "experiments", "benchmarks", "tests")


def _top_level_modules(statement: str) -> set[str]:
    """The top-level names in ``sys.modules`` after ``statement``, in a fresh interpreter."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


def _setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def _requirement_names(block: str) -> set[str]:
    """``"jax>=0.4\\nflax"`` -> ``{"jax", "flax"}``."""
    names = set()
    for line in block.split("\n"):
        line = line.strip()
        for sep in "<>=!~[;":
            line = line.split(sep)[0]
        if line.strip():
            names.add(line.strip())
    return names


def test_import_deq_jax_is_light():
    baseline = _top_level_modules("import jax, flax.linen, optax, numpy")
    loaded = _top_level_modules("import deq_jax")
    assert "deq_jax" in loaded
    added = sorted((loaded - baseline) & set(HEAVY))
    assert not added, f"import deq_jax imports {added}"
    never = sorted(loaded & {"tensorflow", "tensorflow_datasets", "orbax", "matplotlib"})
    assert not never, f"import deq_jax imports {never}"


def test_training_is_imported_on_first_use():
    code = (
        "import sys, deq_jax as dj\n"
        "assert 'deq_jax.training' not in sys.modules\n"
        "assert callable(dj.training.train_and_evaluate)\n"
        "assert 'deq_jax.training' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_missing_train_package_names_the_extra():
    # ``None`` in ``sys.modules`` makes importing that package fail as if not installed.
    code = (
        "import sys\n"
        "sys.modules['orbax'] = sys.modules['tensorflow_datasets'] = None\n"
        "import deq_jax as dj\n"
        "assert dj.tasks.get('mazes', train_size=8).name == 'mazes'\n"
        "assert dj.tasks.get('prefix_sum', train_size=8).name == 'prefix_sum'\n"
        "assert dj.tasks.get('cifar10').input_shape == (32, 32, 3)\n"
        "for use in (lambda: dj.training, lambda: dj.tasks.get('cifar10').prepare()):\n"
        "    try:\n"
        "        use()\n"
        "    except ModuleNotFoundError as error:\n"
        "        assert \"pip install 'deq_jax[train]'\" in str(error), error\n"
        "    else:\n"
        "        raise AssertionError('no ModuleNotFoundError')\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_unknown_attribute_still_raises():
    import deq_jax as dj

    with pytest.raises(AttributeError, match="no attribute 'trainig'"):
        dj.trainig  # noqa: B018


def test_setup_cfg_selects_deq_jax_only():
    find = _setup_cfg()["options.packages.find"]
    include = [p.strip() for p in find["include"].split("\n") if p.strip()]
    packages = setuptools.find_packages(str(ROOT), include=include)
    assert "deq_jax" in packages and "deq_jax.tasks" in packages
    assert "deq_jax.models.clrs.algorithms" in packages
    strays = [p for p in packages if p.split(".")[0] != "deq_jax"]
    assert not strays, f"setup.cfg packages {strays}"
    everything = setuptools.find_packages(str(ROOT))
    assert {p.split(".")[0] for p in everything} & set(CLONE_ONLY), "nothing to leave out"


def test_setup_cfg_requirements_are_light():
    cfg = _setup_cfg()
    core = _requirement_names(cfg["options"]["install_requires"])
    assert core == CORE_REQUIREMENTS
    train = _requirement_names(cfg["options.extras_require"]["train"])
    assert TRAIN_REQUIREMENTS <= train
    assert "pytest" in _requirement_names(cfg["options.extras_require"]["test"])


def _copy_sources(dest: pathlib.Path) -> pathlib.Path:
    """The files a build reads, and the clone-only folders it must leave out."""
    src = dest / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "workdirs")
    for name in ("deq_jax", *CLONE_ONLY):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    return src


def test_wheel_holds_deq_jax_only(tmp_path):
    # Built as ``pip install .`` builds it: pyproject.toml's build requirements in an
    # isolated environment (about 10 s).
    src, wheels = _copy_sources(tmp_path), tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("deq_jax-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["deq_jax"]
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"deq_jax"}
    assert "deq_jax/models/clrs/algorithms/__init__.py" in names


def test_light_install_example_runs():
    """``examples/light_install.py`` (what the core install is enough for) solves,
    differentiates and trains a DEQ layer, importing no package of the ``[train]`` extra."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "light_install.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy_imported"] == [] and report["fixed_point"]["grad_finite"]
    assert report["deq_layer"]["loss_last"] < report["deq_layer"]["loss_first"]
