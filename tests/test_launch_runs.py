"""launch.runs: a report loads a finished run only under the config that trained it."""

import json
import os

import pytest

from configs import clrs, prefix_sum, synthetic_1d
from deq_jax.training.loop import train
from deq_jax.training.run.writers import write_text
from launch import runs


def _write_config(config, workdir: str) -> None:
    """The ``config.json`` a training run leaves in its workdir."""
    write_text(os.path.join(workdir, train.CONFIG_FILE), train.config_json(config))


@pytest.mark.parametrize(
    "get_config",
    [prefix_sum.get_config, synthetic_1d.get_config, lambda: clrs.get_config("bellman_ford")],
    ids=["prefix_sum", "synthetic_1d", "clrs_bellman_ford"],
)
def test_saved_config_round_trips_without_differences(tmp_path, get_config):
    config = get_config()
    _write_config(config, str(tmp_path))  # what a training run leaves behind
    runs.check_run_config(config, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        assert runs.config_differences(json.load(f), config) == []


def test_model_changes_are_named_and_length_changes_allowed(tmp_path):
    config = prefix_sum.get_config()
    _write_config(config, str(tmp_path))
    longer = prefix_sum.get_config()
    longer.train.steps *= 2
    longer.eval.every_steps = 7
    longer.ckpt.keep = 9
    longer.task.test_lengths = (32, 64, 128)
    runs.check_run_config(longer, str(tmp_path))

    other = prefix_sum.get_config()
    other.model.norm = ""
    other.deq.solver.name = "fixed_point_iteration"
    with open(tmp_path / "config.json") as f:
        diffs = runs.config_differences(json.load(f), other)
    assert diffs == [
        "deq.solver.name: 'anderson' -> 'fixed_point_iteration'",
        "model.norm: 'layer' -> ''",
    ]
    with pytest.raises(runs.RunConfigMismatchError, match="model.norm: 'layer' -> ''"):
        runs.trained_run(other, str(tmp_path))


def test_fresh_workdir_passes(tmp_path):
    runs.check_run_config(prefix_sum.get_config(), str(tmp_path / "new"))
    assert not os.path.exists(tmp_path / "new")


def test_fields_newer_than_the_run_are_not_compared(tmp_path):
    config = prefix_sum.get_config()
    _write_config(config, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        saved = json.load(f)
    del saved["regularizer"]  # a run from before the regulariser existed
    saved["model"]["retired_field"] = 1
    assert runs.config_differences(saved, config) == ["model.retired_field: 1 -> '<missing>'"]


def _old_layout(saved):
    """A saved config as a run from before ``config.deq`` wrote it."""
    saved = json.loads(json.dumps(saved))
    deq = saved.pop("deq")
    saved["solver"], saved["backward"] = deq.pop("solver"), deq.pop("backward")
    for key in ("z_init", "train_max_iter", "eval_max_iter"):
        saved["model"][key] = deq.pop(key)
    saved["eval"].update(settle_patience=deq.pop("settle_patience"))
    saved["neural_solver"].update(deq.pop("neural_solver"))
    return saved


def test_a_run_of_the_old_layout_compares_under_the_new_names(tmp_path):
    config = prefix_sum.get_config()
    _write_config(config, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        saved = _old_layout(json.load(f))
    assert "deq" not in saved and saved["solver"]["name"] == "anderson"
    assert runs.config_differences(saved, config) == []
    saved["solver"]["tol"] = 0.5
    saved["neural_solver"]["max_iter"] = 7
    assert runs.config_differences(saved, config) == [
        "deq.neural_solver.max_iter: 7 -> 30",
        f"deq.solver.tol: 0.5 -> {config.deq.solver.tol!r}",
    ]


def test_a_clrs_run_from_before_the_official_splits_is_refused(tmp_path):
    config = clrs.get_config("bellman_ford")
    _write_config(config, str(tmp_path))
    with open(tmp_path / "config.json") as f:
        saved = json.load(f)
    del saved["task"]["sampler"]  # trained on numpy-Generator graphs
    assert runs.config_differences(saved, config) == ["task.sampler: 'generator' -> 'clrs30'"]
    config.task.sampler = "generator"
    assert runs.config_differences(saved, config) == []


def test_apply_overrides_sets_typed_fields_and_rejects_unknown_keys():
    from launch.flags import UnknownOverrideError

    config = runs.apply_overrides(
        clrs.get_config("bellman_ford"),
        [
            "regularizer.jacobian_weight=0.1",
            "model.processor=triplet_mpnn",
            "model.gumbel_hints=True",
            "task.test_nodes=(32, 128)",
            "model.hidden=128",
        ],
    )
    assert config.regularizer.jacobian_weight == 0.1
    assert config.model.processor == "triplet_mpnn"
    assert config.model.gumbel_hints is True
    assert tuple(config.task.test_nodes) == (32, 128)
    assert config.model.hidden == 128
    with pytest.raises(UnknownOverrideError, match="hiden"):
        runs.apply_overrides(config, ["model.hiden=3"])
    with pytest.raises(ValueError, match="key=value"):
        runs.apply_overrides(config, ["model.hidden"])
    with pytest.raises(TypeError):  # the config's field types still apply
        runs.apply_overrides(config, ["model.hidden=wide"])
