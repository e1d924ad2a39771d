"""The config files: sections, the smoke variant, and building components by name."""

import importlib

import pytest
from ml_collections import ConfigDict

from configs import default, prefix_sum
from deq_jax import backward, solvers
from deq_jax.training import build

SECTIONS = ("task", "model", "solver", "backward", "train", "eval", "ckpt", "log")


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


@pytest.mark.parametrize("name", solvers.names())
def test_every_solver_builds_from_config(name):
    config = default.get_config()
    config.solver.name = name
    solver = build.build_solver(config.solver)
    assert solver.name == name and solver.tol == config.solver.tol
    for key, value in config.solver[name].items():
        assert getattr(solver, key) == value


@pytest.mark.parametrize("name", backward.names())
def test_every_backward_builds_from_config(name):
    config = default.get_config()
    config.backward.name = name
    assert build.build_backward(config.backward).name == name


def test_ift_backward_solver_by_name():
    config = default.get_config()
    config.backward.ift.solver = "fixed_point_iteration"
    config.backward.ift.max_iter = 7
    mode = build.build_backward(config.backward)
    assert mode.solver.name == "fixed_point_iteration" and mode.solver.max_iter == 7
    config.backward.ift.solver = "gmres"
    assert type(build.build_backward(config.backward).solver).__name__ == "gmres"


def test_unknown_names_list_valid_ones():
    config = default.get_config()
    config.solver.name = "newton"
    with pytest.raises(ValueError, match="anderson"):
        build.build_solver(config.solver)
    config = default.get_config()
    config.backward.name = "magic"
    with pytest.raises(ValueError, match="phantom"):
        build.build_backward(config.backward)
    config = default.get_config()
    config.model.name = "transformer"
    with pytest.raises(ValueError, match="prefix_sum_deq"):
        build.build_model(config.model, build.build_solver(config.solver), backward.ift())


def test_model_builds_from_config():
    config = prefix_sum.get_config("smoke")
    model = build.build_model(
        config.model, build.build_solver(config.solver), build.build_backward(config.backward)
    )
    assert model.width == config.model.width and model.norm == "layer"
    assert model.train_max_iter == config.model.train_max_iter
    assert model.z_init == "mixed" and model.backward.name == "jacobian_free"
    plain = default.get_config()
    solver = build.build_solver(plain.solver)
    assert build.build_model(plain.model, solver, backward.ift()).norm is None  # "" -> None


def test_config_modules_import_by_name():
    assert importlib.import_module("configs.prefix_sum").get_config is prefix_sum.get_config
