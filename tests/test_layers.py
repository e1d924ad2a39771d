"""The layers of DESIGN.md, enforced: imports point down, nothing hides in a function.

An AST walk (no import is executed) over ``deq_jax/``, ``launch/``, ``configs/``,
``experiments/`` and ``benchmarks/`` checks four rules, each failure naming the file,
the line and the rule:

* ``cycle``: no import cycle between modules, counting module-level imports only. An
  import is an edge to the module it names (``from pkg import sub`` to ``pkg.sub`` when
  that is a module, else to ``pkg``), never to the packages above it: a package's
  ``__init__`` that re-exports its own submodules is not a cycle with them, while a
  submodule importing a name from its package's ``__init__`` is. A study (a subfolder of
  ``experiments/``) and ``benchmarks/`` are each one unit, and no circle runs between
  units either, even one that no single pair of modules closes.
* ``layer``: an import only points down the order
  ``solvers < backward < fixed_point < regularizers < {nn, nnx} < models <
  {analysis, neural_solver} < training < launch/configs < experiments/benchmarks``, with
  ``_flat``, ``_forward_mode``, ``_registry`` and ``_sections`` the ground floor; ``analysis`` and
  ``neural_solver`` do not import each other; ``deq_jax.tasks`` imports only the ground
  floor, solvers, backward and fixed_point, and only models and what is above them import
  it. ``nnx`` (the Flax NNX layer) shares ``nn``'s floor but may import ``nn``, whose
  spec, states and pure functions it reuses (`SIDEWAYS`); ``nn`` never imports ``nnx``.
  Inside ``deq_jax/training/`` the same holds for its four places, lowest first
  ``run < families < solver_fit < loop`` (`TRAINING_PLACES`; its ``__init__`` may
  import any). ``deq_jax/__init__.py`` is the package face: it may import any of ``deq_jax``, and
  only the command line and the studies import it. ``experiments`` and ``benchmarks`` may import
  ``deq_jax``, ``launch`` and ``configs``, which never import them. A ``deq_jax`` module
  outside these layers is a failure too.
* ``lazy``: no import of a ``deq_jax`` module inside a function in ``deq_jax/``
  (an import dodging a cycle means a piece sits on the wrong floor: move the piece).
* ``length``: no module in ``deq_jax/``, ``launch/``, ``experiments/`` or
  ``benchmarks/`` over 400 lines.

Run it with ``python -m pytest -q tests/test_layers.py``; ``check(root)`` returns the
failures of any tree laid out like this repository.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator
from typing import NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("deq_jax", "launch", "configs", "experiments", "benchmarks")  # the trees checked
STUDIES = ("experiments", "benchmarks")  # the top floor: studies, reports, timing tools
LENGTH_CHECKED = ("deq_jax", "launch", *STUDIES)
LAZY_CHECKED = ("deq_jax",)
MAX_LINES = 400

# Each floor of DESIGN.md, lowest first; floors sharing a rank do not import each other.
GROUND = (
    "deq_jax._flat",
    "deq_jax._forward_mode",
    "deq_jax._registry",
    "deq_jax._sections",
    "deq_jax.precision",
)
RANKS = {
    "ground": 0,
    "solvers": 1,
    "backward": 2,
    "fixed_point": 3,
    "regularizers": 4,
    "nn": 5,
    "nnx": 5,
    "models": 6,
    "analysis": 7,
    "neural_solver": 7,
    "training": 8,
    "package face": 9,
    "command line": 10,
    "studies": 11,
}
# Floors sharing a rank where one may import the other: (importer, imported).
SIDEWAYS = {("nnx", "nn")}
TASKS_MAY_IMPORT = ("ground", "solvers", "backward", "fixed_point")
# The four places of deq_jax/training/ (DESIGN.md), lowest first: a place imports only
# itself and the places below it; the package's ``__init__`` (its face) may import any.
TRAINING_PLACES = ("run", "families", "solver_fit", "loop")
TASKS_IMPORTED_FROM = RANKS["models"]  # models and above may import tasks
RULES = ("cycle", "layer", "lazy", "length")


class Import(NamedTuple):
    """One import statement's edge: ``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: str
    line: int
    in_function: bool


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    """``deq_jax/nn/deq.py`` -> ``deq_jax.nn.deq``; a package's ``__init__`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files(root: pathlib.Path, packages=PACKAGES) -> Iterator[pathlib.Path]:
    for package in packages:
        if (root / package).is_dir():
            yield from sorted(
                p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts
            )


def _statements(tree: ast.AST) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement with whether it sits inside a function (or lambda)."""

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            yield from walk(child, inner)

    yield from walk(tree, False)


def imports(root: pathlib.Path, packages=PACKAGES) -> list[Import]:
    """The edges of every import of a checked module by a checked module."""
    files = {module_name(p, root): p for p in python_files(root, packages)}
    modules = set(files)
    edges = []
    for source, path in files.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        rel = str(path.relative_to(root))
        for node, in_function in _statements(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    names.append(sub if sub in modules else base)
            for name in names:
                if name.split(".")[0] in packages:
                    edges.append(Import(source, name, rel, node.lineno, in_function))
    return edges


def layer_of(module: str) -> str | None:
    """The floor of DESIGN.md a module sits on (``None``: none of them)."""
    top, _, rest = module.partition(".")
    if top in ("launch", "configs"):
        return "command line"
    if top in STUDIES:
        return "studies"
    if top != "deq_jax":
        return None
    if not rest:
        return "package face"
    if module in GROUND:
        return "ground"
    floor = rest.split(".")[0]
    if floor == "tasks":
        return "tasks"
    return floor if floor in RANKS and floor not in ("ground", "package face") else None


def training_place(module: str) -> str | None:
    """The place of ``deq_jax.training`` a module sits in: one of `TRAINING_PLACES`,
    ``"face"`` for the package itself, ``None`` outside them."""
    parts = module.split(".")
    if len(parts) == 2:
        return "face"
    return parts[2] if parts[2] in TRAINING_PLACES else None


def _training_problem(source: str, target: str) -> str | None:
    """Why ``source`` may not import ``target``, both in ``deq_jax.training``."""
    high, low = training_place(source), training_place(target)
    if high == "face":
        return None
    for module, place in ((source, high), (target, low)):
        if place is None:
            return f"{module} is in none of deq_jax.training's places {TRAINING_PLACES}"
    if low == "face":
        return "a place imports the modules of another, not the package deq_jax.training"
    if TRAINING_PLACES.index(low) > TRAINING_PLACES.index(high):
        return f"deq_jax.training.{high} is below deq_jax.training.{low}: imports point down"
    return None


def _layer_problem(source: str, target: str) -> str | None:
    """Why ``source`` may not import ``target`` (``None``: it may)."""
    low, high = layer_of(target), layer_of(source)
    for module, floor in ((source, high), (target, low)):
        if floor is None:
            return f"{module} is on no floor of DESIGN.md's layers"
    if low == high == "training":
        return _training_problem(source, target)
    if low == high or (high == "package face" and target.split(".")[0] == "deq_jax"):
        return None
    if high == "tasks":
        if low in TASKS_MAY_IMPORT:
            return None
        return "deq_jax.tasks imports only the ground floor, solvers, backward and fixed_point"
    if low == "tasks":
        if RANKS[high] >= TASKS_IMPORTED_FROM:
            return None
        return "only models and the floors above them import deq_jax.tasks"
    if RANKS[low] < RANKS[high] or (high, low) in SIDEWAYS:
        return None
    if RANKS[low] == RANKS[high]:
        return f"{high} and {low} share a floor and do not import each other"
    return f"{high} is below {low}: imports point down"


def _cycles(edges: list[Import]) -> list[list[Import]]:
    """One cycle through each strongly connected group of modules (module-level edges)."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in edges:
        if not edge.in_function:
            graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(node):  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, {}):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for group in groups:
        start = min(group)
        path, seen = [start], {start}
        while True:  # walk inside the group until it closes on a module already visited
            succ = min(s for s in graph[path[-1]] if s in group)
            if succ in seen:
                path = path[path.index(succ) :] + [succ]
                break
            path.append(succ)
            seen.add(succ)
        cycles.append([graph[a][b] for a, b in zip(path, path[1:], strict=False)])
    return cycles


def study_unit(module: str) -> str | None:
    """The unit of the top floor a module belongs to: ``experiments.clrs.report`` ->
    ``experiments.clrs`` (one study), ``benchmarks.step_cost`` -> ``benchmarks``;
    ``None`` below the top floor."""
    parts = module.split(".")
    if parts[0] not in STUDIES:
        return None
    return ".".join(parts[:2]) if parts[0] == "experiments" else parts[0]


def _unit_edges(edges: list[Import]) -> list[Import]:
    """The import edges between different units of the top floor, as unit-to-unit edges."""
    units = []
    for edge in edges:
        source, target = study_unit(edge.source), study_unit(edge.target)
        if source and target and source != target:
            units.append(edge._replace(source=source, target=target))
    return units


def check(root: pathlib.Path, packages=PACKAGES) -> list[str]:
    """Every failure of the four rules in the tree at ``root``, as ``path:line: rule: ...``."""
    edges = imports(root, packages)
    failures = []
    for cycle in _cycles(edges) + _cycles(_unit_edges(edges)):
        hops = " -> ".join([cycle[0].source] + [f"{e.target} ({e.path}:{e.line})" for e in cycle])
        failures.append(f"{cycle[0].path}:{cycle[0].line}: cycle: {hops}")
    for edge in edges:
        problem = _layer_problem(edge.source, edge.target)
        if problem:
            failures.append(
                f"{edge.path}:{edge.line}: layer: {edge.source} imports {edge.target} ({problem})"
            )
        if edge.in_function and edge.path.split("/")[0] in LAZY_CHECKED:
            failures.append(
                f"{edge.path}:{edge.line}: lazy: {edge.source} imports {edge.target} inside a "
                "function (move the piece to the right floor instead)"
            )
    for path in python_files(root, [p for p in packages if p in LENGTH_CHECKED]):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            failures.append(
                f"{path.relative_to(root)}:{MAX_LINES + 1}: length: {lines} lines, over "
                f"{MAX_LINES} (split the module)"
            )
    return failures


def _rule(failure: str) -> str:
    return failure.split(": ")[1]


@pytest.fixture(scope="module")
def repository_failures():
    return check(ROOT)


@pytest.mark.parametrize("rule", RULES)
def test_repository_keeps_its_layers(repository_failures, rule):
    """The repository itself: each rule's failures listed, one per line."""
    failures = [f for f in repository_failures if _rule(f) == rule]
    assert not failures, f"{len(failures)} {rule} failure(s):\n" + "\n".join(failures)


# The checker itself, on fake trees: each rule must be able to fail.


def _tree(tmp_path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _failures(tmp_path, files, rule):
    return [f for f in check(_tree(tmp_path, files)) if _rule(f) == rule]


CLEAN = {
    "deq_jax/__init__.py": "from deq_jax import nn, solvers\nfrom deq_jax.nn import DEQ\n",
    "deq_jax/_flat.py": "import jax\n",
    "deq_jax/solvers/__init__.py": "from deq_jax.solvers.base import Solver\n",
    "deq_jax/solvers/base.py": "from deq_jax import _flat\nclass Solver: ...\n",
    "deq_jax/nn/__init__.py": "from deq_jax.nn.deq import DEQ\n",
    "deq_jax/nn/deq.py": "from deq_jax.solvers import Solver\nDEQ = Solver\n",
    "deq_jax/nnx/__init__.py": "from deq_jax.nn.deq import DEQ\n",
    "deq_jax/models/__init__.py": "from deq_jax.models import language\n",
    "deq_jax/models/language.py": "from deq_jax.nn import DEQ\nfrom deq_jax.tasks import base\n",
    "deq_jax/tasks/__init__.py": "from . import base\n",
    "deq_jax/tasks/base.py": "from deq_jax._flat import jax\nfrom .. import fixed_point\n",
    "deq_jax/fixed_point.py": "from deq_jax.solvers.base import Solver\n",
    "launch/main.py": "import deq_jax as dj\n\ndef main():\n    from deq_jax import training\n",
    "configs/default.py": '"""Example::\n\n    from deq_jax.training import x\n"""\n',
    "experiments/__init__.py": "",
    "experiments/study/__init__.py": "",
    "experiments/study/report.py": (
        "import deq_jax as dj\nfrom configs import default\nfrom launch import main\n"
        "from benchmarks import cost\nfrom experiments.study import plots\n"
    ),
    "experiments/study/plots.py": "import numpy\n",
    "experiments/other/__init__.py": "",
    "experiments/other/report.py": "from experiments.study import report\n",
    "benchmarks/__init__.py": "",
    "benchmarks/cost.py": "from deq_jax.nn import DEQ\nfrom launch import main\n",
}


def test_checker_passes_a_clean_tree(tmp_path):
    """Re-exports, relative imports, imports in docstrings and in launch functions pass."""
    assert check(_tree(tmp_path, CLEAN)) == []


def test_checker_finds_a_cycle(tmp_path):
    files = dict(CLEAN)
    files["deq_jax/solvers/base.py"] = "from deq_jax.solvers import other\n"
    files["deq_jax/solvers/other.py"] = "\nfrom deq_jax.solvers.base import Solver\n"
    (failure,) = _failures(tmp_path, files, "cycle")
    assert failure.startswith("deq_jax/solvers/base.py:1: cycle: deq_jax.solvers.base -> ")
    assert "deq_jax.solvers.other (deq_jax/solvers/base.py:1)" in failure
    assert "deq_jax.solvers.base (deq_jax/solvers/other.py:2)" in failure


def test_checker_finds_a_cycle_through_a_package_init(tmp_path):
    """A submodule importing a name from its own package's ``__init__`` closes a cycle."""
    files = dict(CLEAN, **{"deq_jax/nn/deq.py": "from deq_jax.nn import DEQ\n"})
    (failure,) = _failures(tmp_path, files, "cycle")
    assert "deq_jax.nn -> deq_jax.nn.deq (deq_jax/nn/__init__.py:1)" in failure


@pytest.mark.parametrize(
    "path, text, expected",
    [
        ("deq_jax/solvers/base.py", "import deq_jax.nn.deq\n", "imports point down"),
        ("deq_jax/nn/deq.py", "from deq_jax.models import language\n", "imports point down"),
        ("deq_jax/analysis/a.py", "from deq_jax.neural_solver import s\n", "share a floor"),
        ("deq_jax/nn/deq.py", "from deq_jax.nnx import DEQ\n", "share a floor"),
        ("deq_jax/tasks/base.py", "from deq_jax.nn import DEQ\n", "deq_jax.tasks imports only"),
        ("deq_jax/nn/deq.py", "from deq_jax.tasks import base\n", "only models and the"),
        ("deq_jax/training/a.py", "import deq_jax\n", "imports point down"),
        ("deq_jax/extra.py", "import jax\nfrom deq_jax import _flat\n", "on no floor"),
        ("deq_jax/training/run/a.py", "from deq_jax.training.loop import b\n", "run is below"),
        ("deq_jax/training/families/a.py", "from deq_jax.training.solver_fit import b\n", "below"),
        ("deq_jax/training/a.py", "from deq_jax.training import run\n", "none of deq_jax.training"),
        ("deq_jax/training/loop/a.py", "from deq_jax.training import b\n", "not the package"),
    ],
)
def test_checker_finds_an_upward_import(tmp_path, path, text, expected):
    files = dict(CLEAN, **{path: text})
    failures = _failures(tmp_path, files, "layer")
    assert failures and all(f.startswith(f"{path}:") for f in failures), failures
    assert expected in failures[0]


@pytest.mark.parametrize(
    "path, text",
    [
        ("launch/main.py", "from experiments.study import report\n"),
        ("configs/default.py", "import benchmarks.cost\n"),
        ("deq_jax/nn/deq.py", "from experiments import study\n"),
        ("deq_jax/__init__.py", "from benchmarks import cost\n"),
    ],
)
def test_checker_finds_an_import_of_a_study(tmp_path, path, text):
    """deq_jax, launch and configs never import experiments or benchmarks."""
    failures = _failures(tmp_path, dict(CLEAN, **{path: text}), "layer")
    assert failures and all(f.startswith(f"{path}:1: layer: ") for f in failures), failures
    assert "imports point down" in failures[0]


def test_checker_finds_a_circle_between_studies(tmp_path):
    """Two studies (or a study and the benchmarks) importing each other through different
    modules: no module-level cycle, but a circle between the units."""
    files = dict(CLEAN, **{"benchmarks/extra.py": "from experiments.other import report\n"})
    (failure,) = _failures(tmp_path, files, "cycle")
    assert failure.startswith("benchmarks/extra.py:1: cycle: benchmarks -> experiments.other ")
    assert "experiments.study (experiments/other/report.py:1)" in failure
    assert "benchmarks (experiments/study/report.py:4)" in failure


def test_checker_finds_a_lazy_import(tmp_path):
    files = dict(CLEAN)
    files["deq_jax/nn/deq.py"] = (
        '"""Docstring::\n\n    from deq_jax import nn\n"""\nimport jax\n\n\n'
        "def f():\n    import numpy\n    return lambda: __import__('x')\n\n\n"
        "class A:\n    def g(self):\n        from deq_jax.solvers import Solver\n"
    )
    (failure,) = _failures(tmp_path, files, "lazy")
    assert failure.startswith("deq_jax/nn/deq.py:15: lazy: deq_jax.nn.deq imports deq_jax.solvers")


def test_checker_finds_a_long_module(tmp_path):
    files = dict(CLEAN)
    files["launch/long.py"] = "x = 1\n" * (MAX_LINES + 1)
    files["experiments/study/long.py"] = "x = 1\n" * (MAX_LINES + 1)
    files["deq_jax/nn/just_right.py"] = "x = 1\n" * MAX_LINES
    failures = sorted(_failures(tmp_path, files, "length"))
    assert failures == [
        "experiments/study/long.py:401: length: 401 lines, over 400 (split the module)",
        "launch/long.py:401: length: 401 lines, over 400 (split the module)",
    ]
