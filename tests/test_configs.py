"""The config files: sections, the smoke variant, and building components by name."""

import importlib

import pytest
from ml_collections import ConfigDict

from configs import default, prefix_sum
from deq_jax import backward, solvers
from deq_jax.training import build

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
