"""The config files: sections, the smoke variant, and building components by name."""

import ast
import collections
import dataclasses
import importlib
import inspect
import itertools
import linecache
import os
import re
import sys

import pytest
from ml_collections import ConfigDict

from configs import default, prefix_sum
from deq_jax import backward, solvers
from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.run import build
from deq_jax.training.solver_fit.spec import BUDGET_FIELDS, NeuralSolverSpec

CONFIG_DIR = os.path.dirname(os.path.abspath(default.__file__))

SECTIONS = ("task", "model", "deq", "train", "eval", "ckpt", "log")


@pytest.mark.parametrize("module", [default, prefix_sum])
def test_sections_and_run_command(module):
    config = module.get_config()
    assert isinstance(config, ConfigDict)
    for section in SECTIONS:
        assert isinstance(config[section], ConfigDict), section
    name = module.__name__.split(".")[-1]
    assert f"python -m launch.main --config configs/{name}.py --workdir" in module.__doc__


def test_smoke_variant_is_small_and_documented():
    smoke = prefix_sum.get_config("smoke")
    full = prefix_sum.get_config()
    assert smoke.train.steps < full.train.steps and smoke.model.width < full.model.width
    assert smoke.ckpt.every_steps <= smoke.train.steps
    assert "--config configs/prefix_sum.py:smoke" in prefix_sum.__doc__


def test_unknown_config_argument():
    with pytest.raises(ValueError, match="smoke"):
        prefix_sum.get_config("huge")


def test_default_prefix_sum_goal_settings():
    config = prefix_sum.get_config()
    assert config.task.train_length == 32
    assert {32, 64} <= set(config.task.test_lengths)
    assert {2, 4} <= set(config.eval.budget_multipliers)


@pytest.mark.parametrize("name", [n for n in solvers.names() if n not in solvers.COMBINATORS])
def test_every_solver_builds_from_config(name):
    config = default.get_config()
    config.deq.solver.name = name
    solver = build.build_solver(config.deq.solver)
    assert solver.name == name and solver.tol == config.deq.solver.tol
    for key, value in config.deq.solver[name].items():
        assert getattr(solver, key) == value


@pytest.mark.parametrize("name", solvers.COMBINATORS)
def test_a_bare_combinator_name_asks_for_its_parts(name):
    config = default.get_config()
    config.deq.solver.name = name
    with pytest.raises(ValueError, match=rf"{name} takes .* part\(s\), got 0.*e\.g\. {name}\("):
        build.build_solver(config.deq.solver)


@pytest.mark.parametrize("name", backward.names())
def test_every_backward_builds_from_config(name):
    config = default.get_config()
    config.deq.backward.name = name
    assert build.build_backward(config.deq.backward).name == name


def test_ift_backward_solver_by_name():
    config = default.get_config()
    config.deq.backward.ift.solver = "fixed_point_iteration"
    config.deq.backward.ift.max_iter = 7
    mode = build.build_backward(config.deq.backward)
    assert mode.solver.name == "fixed_point_iteration" and mode.solver.max_iter == 7
    config.deq.backward.ift.solver = "gmres"
    assert type(build.build_backward(config.deq.backward).solver).__name__ == "gmres"


def test_unknown_names_list_valid_ones():
    config = default.get_config()
    config.deq.solver.name = "newton"
    with pytest.raises(ValueError, match="anderson"):
        build.build_solver(config.deq.solver)
    config = default.get_config()
    config.deq.backward.name = "magic"
    with pytest.raises(ValueError, match="phantom"):
        build.build_backward(config.deq.backward)
    config = default.get_config()
    config.model.name = "transformer"
    with pytest.raises(ValueError, match="prefix_sum_deq"):
        build.build_model(config.model, build.build_deq_spec(config.deq))


def test_model_builds_from_config():
    config = prefix_sum.get_config("smoke")
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    assert model.width == config.model.width and model.norm == "layer"
    assert model.deq.train_max_iter == config.deq.train_max_iter
    assert model.deq.z_init == "mixed" and model.deq.backward.name == "jacobian_free"
    plain = default.get_config()
    spec = build.build_deq_spec(plain.deq)
    assert build.build_model(plain.model, spec).norm is None  # "" -> None


def test_ift_backward_inherits_the_forward_solver():
    config = default.get_config()
    mode = build.build_backward(config.deq.backward)  # solver "", tol 0, max_iter 0
    assert mode.solver is None and mode.tol is None and mode.max_iter is None
    forward = build.build_solver(config.deq.solver)
    assert mode.inherit(forward) == forward
    config.deq.backward.ift.tol = 1e-6
    config.deq.backward.ift.max_iter = 40
    mode = build.build_backward(config.deq.backward)
    assert mode.inherit(forward) == forward.replace(tol=1e-6, max_iter=40)


def test_deq_spec_from_config_and_full_budget():
    config = default.get_config()
    config.deq.solver.full_budget = True
    config.deq.eval_max_iter = 0  # 0: the solver's own budget
    spec = build.build_deq_spec(config.deq)
    assert spec.solver.full_budget and spec.budget(train=False) == spec.solver.max_iter
    assert spec.budget(train=True) == config.deq.train_max_iter == 30
    assert spec.budget(train=True, max_iter=7) == 7
    config.deq.unknown = 1
    with pytest.raises(ValueError, match="Unknown field.*unknown.*Valid: solver, backward"):
        build.build_deq_spec(config.deq)


@pytest.mark.parametrize(
    "old, new",
    [
        ("solver", "deq.solver"),
        ("backward", "deq.backward"),
        ("model.z_init", "deq.z_init"),
        ("model.train_max_iter", "deq.train_max_iter"),
        ("eval.settle_patience", "deq.settle_patience"),
        ("neural_solver.tol", "deq.neural_solver.tol"),
        ("neural_solver.target_max_iter", "deq.neural_solver.target_max_iter"),
    ],
)
def test_old_layout_names_the_new_key(old, new):
    config = default.get_config().to_dict()
    section, _, field = old.partition(".")
    config[section] = dict(config[section], **{field: 1}) if field else {"name": "anderson"}
    with pytest.raises(ValueError, match=f"config.{old} has moved to config.{new}"):
        build.check_layout(config)
    assert build.renamed_key(old + ".x") == new + ".x"
    assert build.renamed_key("train.steps") is None


def test_config_modules_import_by_name():
    assert importlib.import_module("configs.prefix_sum").get_config is prefix_sum.get_config


@pytest.mark.parametrize(
    "cls, section, field, value",
    [
        (JacobianRegularizer, "regularizer", "jacobian_freq", 0.25),
        (PathIndependence, "path_independence", "budget_choices", 7),
        (NeuralSolverSpec, "neural_solver", "unroll_steps", 11),
        (NeuralSolverSpec, "deq.neural_solver", "target_max_iter", 123),
    ],
)
def test_dataclass_defaults_are_the_config_defaults(monkeypatch, cls, section, field, value):
    """The dataclass is the one home of these defaults: the config section is built from
    it (a changed dataclass default shows up in the config), and reads back to it."""

    def node(config):
        for part in section.split("."):
            config = config[part]
        return config

    config = default.get_config()
    if section == "deq.neural_solver":
        assert set(node(config)) == set(BUDGET_FIELDS)
        assert NeuralSolverSpec.from_run_config(config) == NeuralSolverSpec()
    else:
        assert cls.from_config(node(config)) == cls()
    changed = dataclasses.make_dataclass(
        cls.__name__,
        [(field, type(value), dataclasses.field(default=value))],
        bases=(cls,),
        frozen=True,
    )
    monkeypatch.setattr(default, cls.__name__, changed)
    assert node(default.get_config())[field] == value


def test_every_config_has_max_nonfinite_steps():
    for module, arg in _every_config():
        config = module.get_config(arg)
        assert config.train.max_nonfinite_steps == 5, (module.__name__, arg)


def _config_modules():
    """Every config module but `default` (helpers without `get_config` left out)."""
    names = sorted(n[:-3] for n in os.listdir(CONFIG_DIR) if n.endswith(".py"))
    modules = [importlib.import_module(f"configs.{n}") for n in names if n != "__init__"]
    return [m for m in modules if hasattr(m, "get_config") and m is not default]


def _valid_arguments(module):
    """The variant names ``module.get_config`` accepts, read from its error message."""
    with pytest.raises(ValueError) as info:
        module.get_config("no_such_variant")
    return re.search(r"Valid arguments: (.*)\.", str(info.value)).group(1).split(", ")


def _every_config():
    """Every (module, argument) that builds: no variant, and up to three joined by commas."""
    for module in _config_modules():
        names = _valid_arguments(module)
        combos = itertools.chain.from_iterable(itertools.combinations(names, k) for k in range(4))
        for combo in combos:
            try:
                module.get_config(",".join(combo))
            except ValueError:
                continue  # e.g. two sizes
            yield module, ",".join(combo)


def _passes_on_a_callers_dict(frame):
    """Whether ``frame`` runs ``x.update(arg)`` on a dict its caller passed (``smoke``'s
    ``sections``, ``hypersolver``'s ``fields``): then the write is the caller's."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    try:
        call = ast.parse(line).body[0].value
    except (SyntaxError, AttributeError, IndexError):
        return False
    if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "update"):
        return False
    arg = call.args[0] if len(call.args) == 1 else None
    arg = arg.values[0] if isinstance(arg, ast.BoolOp) else arg  # ``update(x or {})``
    code = frame.f_code  # the parameters come first in co_varnames
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return isinstance(arg, ast.Name) and arg.id in code.co_varnames[:count]


def _write_site(frame, root):
    """``file:line`` of the innermost frame under ``root`` that made a write."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(root) and not _passes_on_a_callers_dict(frame):
            return f"{os.path.relpath(filename, os.path.dirname(root))}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _no_op_writes(monkeypatch, builds, root):
    """The (site, key) of every write made under ``root`` by ``builds`` that never changes
    a value: it sets a field to the value it already has (in every build that runs it),
    or replaces a section with one that keeps all its fields and repeats some."""
    outcomes = collections.defaultdict(list)
    setitem = ConfigDict.__setitem__

    def record(self, key, value):
        site = _write_site(sys._getframe(1), root)
        old = self._fields.get(key)
        if site is not None and key in self:
            if isinstance(old, ConfigDict):
                if isinstance(value, dict | ConfigDict) and set(old) <= set(value):
                    for field in old:
                        outcomes[site, f"{key}.{field}"].append(old[field] == value[field])
            else:
                outcomes[site, key].append(bool(old == value))
        setitem(self, key, value)

    monkeypatch.setattr(ConfigDict, "__setitem__", record)
    for build_config in builds:
        build_config()
    return sorted(f"{site} {key}" for (site, key), same in outcomes.items() if all(same))


def test_no_config_writes_a_default(monkeypatch):
    """Task configs set only what differs: no write sets a field to its current value."""
    builds = [lambda m=m, a=a: m.get_config(a) for m, a in _every_config()]
    assert len(builds) > 100
    no_ops = _no_op_writes(monkeypatch, builds, CONFIG_DIR)
    assert not no_ops, "These config writes set a field to the value it has:\n" + "\n".join(no_ops)


def _writes_a_default():
    config = default.get_config()
    config.train.steps = 2_000  # a change
    config.train.update(dict(batch_size=64, seed=1))  # batch_size: 64 already
    default.smoke(
        config,
        steps=4,
        batch_size=8,
        warmup_steps=1,
        eval_every=2,
        eval_batch_size=8,
        budgets=(4, 4),
        model=dict(width=32),
    )
    config.task = ConfigDict(dict(config.task, name="prefix_sum"))  # no change
    return config


def test_the_write_detector_finds_no_op_writes(monkeypatch):
    tests = os.path.dirname(os.path.abspath(__file__))
    found = _no_op_writes(monkeypatch, [_writes_a_default], tests)
    lines = {key: int(site.rsplit(":", 1)[1]) for site, key in (f.split() for f in found)}
    assert set(lines) == {"batch_size", "width"} | {f"task.{k}" for k in default.get_config().task}
    assert len(set(lines.values())) == 3  # the update, the smoke call, the replacement
