"""The neural solver's fit as the paper trains it (issue 79): the recipe's defaults and
the ``previous`` variant, fresh batches against a pool, the targets' residual check and
its one-line error, the fit's batches without augmentation, the fit's cost reported."""

import itertools
import json
import types

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_module

from configs import default, digits_hypersolver, lm_shakespeare_hypersolver, prefix_sum_hypersolver
from deq_jax.neural_solver import PAPER_WEIGHTS
from deq_jax.tasks import data
from deq_jax.tasks.base import Task
from deq_jax.training.solver_fit.spec import NeuralSolverSpec
from deq_jax.training.solver_fit.targets import TargetResidualError, TargetStream


def test_spec_defaults_are_the_papers_recipe():
    spec = NeuralSolverSpec()
    assert (spec.l1, spec.l2, spec.l3, spec.l3_final) == (0.1, 0.05, 1e-4, 5e-8)
    assert spec.l3_decay == 0.4  # its 2k of 5k steps
    assert spec.detach_init and spec.fresh_batches and spec.error == "absolute"
    assert spec.detached_steps == 0  # BPTT through every unrolled step
    assert spec.train_steps >= 1_000 and spec.max_target_residual == 1e-3
    with pytest.raises(ValueError, match="error must be one of absolute, relative"):
        NeuralSolverSpec(error="squared")
    with pytest.raises(ValueError, match="l3_decay must lie in"):
        NeuralSolverSpec(l3_decay=0.0)


@pytest.mark.parametrize(
    "module, old_steps",
    [(prefix_sum_hypersolver, (1_500, 1_200)), (lm_shakespeare_hypersolver, (200, 150))],
)
def test_configs_fit_the_papers_way_and_keep_the_previous_recipe(module, old_steps):
    model = "jacobian" if module is lm_shakespeare_hypersolver else ""
    ns = module.get_config(model).neural_solver
    assert ns.train_steps >= 1_000 and ns.detached_steps == 0 and ns.fresh_batches
    assert (ns.l1, ns.l2, ns.l3) == (PAPER_WEIGHTS["l1"], PAPER_WEIGHTS["l2"], PAPER_WEIGHTS["l3"])
    assert ns.max_target_residual == 1e-3  # no looser threshold for any config
    old = module.get_config(",".join(filter(None, [model, "previous"]))).neural_solver
    assert (old.l1, old.l2, old.l3, old.l3_final, old.l3_decay) == (1.0, 1.0, 0.1, 0.0, 1.0)
    assert not old.fresh_batches and not old.detach_init
    assert (old.train_steps, old.detached_steps) == old_steps
    assert default.split_hypersolver_arg("smoke,jacobian,previous") == (
        "smoke,jacobian",
        ("previous",),
    )


class _Frozen:
    """A stand-in `FrozenDEQ`: a batch's targets carry its number and the residual the
    batch asks for."""

    target_solver = types.SimpleNamespace(max_iter=60)

    def __init__(self):
        self.solved = []

    def targets(self, batch):
        self.solved.append(batch["n"])
        rel = np.full(4, batch["rel"])
        return types.SimpleNamespace(args=None, x=None, z_star=batch["n"], rel_residual=rel)


def _batches(residuals):
    return ({"n": n, "rel": r} for n, r in enumerate(residuals))


def test_fresh_batches_solve_a_new_batch_every_step():
    frozen, lines = _Frozen(), []
    stream = TargetStream(frozen, _batches([1e-5] * 10), 1e-3, emit=lines.append)
    assert frozen.solved == [0] and stream.first.z_star == 0  # the first, solved at once
    assert [t.z_star for t in itertools.islice(stream, 5)] == [0, 1, 2, 3, 4]
    assert frozen.solved == [0, 1, 2, 3, 4]
    summary = stream.summary()
    assert summary["fresh"] and summary["examples"] == 20 and summary["seconds"] >= 0
    assert summary["rel_residual_mean"] == pytest.approx(1e-5)
    assert len(lines) == 1 and "the first fresh batch" in lines[0]


def test_a_pool_is_solved_up_front_and_cycled():
    frozen = _Frozen()
    stream = TargetStream(frozen, _batches([1e-5] * 10), 1e-3, pool=3)
    assert [t.z_star for t in itertools.islice(stream, 7)] == [0, 1, 2, 0, 1, 2, 0]
    assert frozen.solved == [0, 1, 2] and not stream.summary()["fresh"]


def test_targets_that_are_not_fixed_points_stop_the_fit_in_one_line():
    with pytest.raises(TargetResidualError) as error:
        TargetStream(_Frozen(), _batches([2e-2]), 1e-3)
    line = str(error.value)
    assert "\n" not in line and "2.00e-02" in line and "max_target_residual=0.001" in line
    assert "target_max_iter" in line and "Jacobian-regularised" in line
    # A bad stretch later in a fresh stream stops it once the running mean is over.
    stream = TargetStream(_Frozen(), _batches([1e-4, 1e-4, 5e-3, 1e-2]), 1e-3)
    next(stream), next(stream)
    with pytest.raises(TargetResidualError, match=r"residual is 1.73e-03 over 12 examples"):
        next(stream)


def test_the_fit_reads_training_batches_without_augmentation():
    class Shifted(Task):
        """A task whose augmentation adds 100 to every input."""

        name, eval_splits = "shifted", ("test",)

        def source(self, split):
            return {"inputs": np.arange(8, dtype=np.float32)[:, None], "targets": np.zeros(8)}

        @property
        def augments_training(self):
            return True

        def augment_train_batch(self, batch, **unused):
            return dict(batch, inputs=batch["inputs"] + 100)

    task = Shifted()
    augmented = next(task.train_iterator(4, seed=1))["inputs"]
    plain = next(task.train_iterator(4, seed=1, augment=False))["inputs"]
    np.testing.assert_array_equal(augmented, plain + 100)
    assert plain.max() < 8
    assert data.num_examples(task.source("train")) == 8


@pytest.mark.slow  # two launches; the stop itself: test_targets_that_are_not_fixed_points_...
def test_a_fit_to_an_unconverged_deq_ends_in_one_fatal_line(tmp_path):
    deq = tmp_path / "deq"
    trained = run_module("launch.main", "--config", "configs/digits.py:smoke", f"--workdir={deq}")
    assert trained.returncode == 0, trained.stderr[-2000:]
    proc = run_module(
        "launch.main",
        "--config",
        "configs/digits_hypersolver.py:smoke",
        f"--workdir={tmp_path / 'solver'}",
        f"--config.neural_solver.deq_workdir={deq}",
        "--config.deq.neural_solver.target_max_iter=1",  # one step: not a fixed point
        "--config.neural_solver.max_target_residual=1e-3",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("FATAL neural solver error: the fit's targets are not fixed")
    assert "target_max_iter" in lines[0]


def test_the_fit_reports_its_cost_and_its_targets(tmp_path):
    from configs import digits
    from deq_jax.training import train_and_evaluate
    from deq_jax.training.solver_fit.hypersolver import train_hypersolver

    config = digits.get_config("smoke")
    config.regularizer.update(dict(jacobian_weight=0.0, spectral_every=0))
    config.eval.update(dict(every_steps=0, budget_multipliers=(1,)))
    train_and_evaluate(config, str(tmp_path / "deq"), emit=lambda line: None)
    solver = digits_hypersolver.get_config("smoke")
    solver.neural_solver.update(dict(deq_workdir=str(tmp_path / "deq"), ablations=False))
    lines = []
    train_hypersolver(solver, str(tmp_path / "solver"), emit=lines.append)
    report = json.loads((tmp_path / "solver" / "neural_solver.json").read_text())
    targets = report["targets"]["hyper_anderson"]
    # Fresh batches: one solved per fit step (4), the first one before the fit.
    assert targets["fresh"] and targets["examples"] == 4 * solver.neural_solver.batch_size
    assert 0 < report["target_seconds"] <= report["fit_seconds"]["hyper_anderson"]
    assert report["time_fraction"] > 0 and jnp.isfinite(targets["rel_residual_mean"])
    assert any("of it solving targets" in line for line in lines)
