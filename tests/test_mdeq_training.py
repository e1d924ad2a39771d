"""MDEQ end to end: the Fashion-MNIST config on small idx files, the weight-tied warm-up,
the neural solver on its multiscale state and the configs (the step-cost tool on MDEQ:
`test_mdeq_step_cost.py`)."""

import json
import os

import numpy as np
import pytest
from test_tasks_idx import write_dir

from configs import (
    mdeq_cifar10,
    mdeq_cifar10_hypersolver,
    mdeq_fashion_mnist,
    mdeq_fashion_mnist_hypersolver,
)
from deq_jax.training import train_and_evaluate, train_hypersolver
from deq_jax.training.run import writers

SIZE = 8  # 8x8 images keep the run to seconds; the config's 28 is checked below


def _config(arg, idx_dir, data_dir):
    config = mdeq_fashion_mnist.get_config(arg)
    config.task.update(dict(dir=idx_dir, data_dir=data_dir, image_size=SIZE, crop_padding=1))
    config.task.valid_size = 8
    config.eval.batch_size = 8
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("mdeq")
    idx_dir, data_dir = str(root / "idx"), str(root / "data")
    write_dir(idx_dir, size=SIZE, n_train=40, n_test=12)
    config = _config("smoke", idx_dir, data_dir)
    workdir = str(root / "run")
    lines: list[str] = []
    result = train_and_evaluate(config, workdir, emit=lines.append)
    return config, workdir, result, lines


def test_smoke_run_warms_up_weight_tied_then_solves(trained):
    config, workdir, result, lines = trained
    assert result.step == config.train.steps == 4 and config.train.pretrain_steps == 2
    assert any("weight-tied warm-up done" in line for line in lines)
    train = [r for r in writers.read_metrics(workdir) if r["split"] == "train"]
    # The warm-up logs the explicit depth, the DEQ steps the solver's (budget 4).
    assert train[0]["nstep_mean"] == config.model.n_layer
    assert train[-1]["nstep_mean"] <= config.deq.train_max_iter
    with open(os.path.join(workdir, "length_generalization.json")) as f:
        written = json.load(f)
    report = written["report"]
    assert set(report) == {"1x", "2x"} and set(report["1x"]) == {"valid", "test"}
    assert 0 <= report["1x"]["test"]["accuracy"] <= 1
    # A warm-up state is scored as the weight-tied network it trains, never selected.
    assert written["best"]["step"] > config.train.pretrain_steps
    # The report is per split, not per length: its title says so.
    assert any(line.startswith("Accuracy per split") for line in lines)
    assert not any("Per-length" in line for line in lines)


def test_neural_solver_fits_the_multiscale_state(trained, tmp_path):
    config, workdir, _, _ = trained
    hyper = mdeq_fashion_mnist_hypersolver.get_config("smoke")
    hyper.task.update(dict(config.task))
    hyper.eval.batch_size = config.eval.batch_size
    hyper.neural_solver.update(dict(deq_workdir=workdir, ablations=False, batch_size=8))
    run = train_hypersolver(hyper, str(tmp_path / "solver"), emit=lambda _: None)
    channels = config.model.channels
    assert run.report["state_shape"] == [
        [SIZE, SIZE, channels[0]],
        [SIZE // 2, SIZE // 2, channels[1]],
    ]
    assert set(run.solvers) == {"hyper_anderson"} and run.report["param_fraction"] > 0


def test_warm_up_needs_a_weight_tied_mode(tmp_path):
    from configs import digits

    config = digits.get_config("smoke")
    config.train.pretrain_steps = 2
    with pytest.raises(ValueError, match="weight-tied warm-up"):
        train_and_evaluate(config, str(tmp_path), emit=lambda _: None)


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["smoke,explicit", "smoke,jacobian", "smoke,torchdeq"])
def test_variants_train(tmp_path, arg):
    idx_dir = str(tmp_path / "idx")
    write_dir(idx_dir, size=SIZE, n_train=40, n_test=12)
    config = _config(arg, idx_dir, str(tmp_path / "data"))
    result = train_and_evaluate(config, str(tmp_path / "run"), emit=lambda _: None)
    assert result.step == config.train.steps
    assert np.isfinite(result.report["1x"]["test"]["loss"])


def test_configs_fit_the_data_and_the_paper():
    config = mdeq_fashion_mnist.get_config()
    assert config.task.image_size == 28 and config.model.channels == (24, 24)
    assert config.train.pretrain_steps > 0
    assert mdeq_fashion_mnist.get_config("explicit").model.mode == "weight_tied"
    assert mdeq_fashion_mnist.get_config("explicit").train.pretrain_steps == 0
    assert mdeq_fashion_mnist.get_config("jacobian").regularizer.jacobian_weight > 0
    assert mdeq_fashion_mnist.get_config("torchdeq").deq.backward.name == "phantom"
    small = mdeq_cifar10.get_config("small")
    assert small.model.channels == (32, 64, 128, 256) and small.task.image_size == 32
    assert mdeq_cifar10_hypersolver.get_config("small").neural_solver.pool == "mean"
    with pytest.raises(ValueError, match="Unknown config argument"):
        mdeq_fashion_mnist.get_config("tiny")
    with pytest.raises(ValueError, match="repeats"):
        mdeq_cifar10.get_config("small,small")
    for module in (mdeq_fashion_mnist, mdeq_cifar10, mdeq_fashion_mnist_hypersolver):
        assert "python -m launch.main --config configs/" in module.__doc__


def test_cifar10_sizes_follow_locuslab():
    # experiments/cifar/cls_mdeq_TINY.yaml: 50 epochs of 128, no augmentation, 22/24.
    tiny = mdeq_cifar10.get_config()
    assert tiny.train.steps == round(50 * mdeq_cifar10.TRAIN_IMAGES / 128) == 17_578
    assert (tiny.task.crop_padding, tiny.task.flip) == (0, False)
    assert (tiny.deq.train_max_iter, tiny.deq.backward.ift.max_iter) == (22, 24)
    # cls_mdeq_LARGE.yaml and cls_mdeq_LARGE_reg.yaml (locuslab/deq's MDEQ-Vision).
    large = mdeq_cifar10.get_config("large")
    assert large.model.head_channels == (14, 28, 56, 112) and large.model.dropout_rate == 0.3
    assert (large.deq.train_max_iter, large.deq.backward.ift.max_iter) == (18, 20)
    assert large.train.pretrain_steps == 20_000 and large.regularizer.jacobian_weight == 0
    reg = mdeq_cifar10.get_config("large,jacobian")
    assert (reg.deq.train_max_iter, reg.deq.eval_max_iter, reg.deq.backward.ift.max_iter) == (
        8,
        8,
        7,
    )
    assert (
        dict(reg.regularizer).items()
        >= {
            "jacobian_weight": 0.4,
            "jacobian_freq": 0.02,
            "jacobian_samples": 2,
        }.items()
    )
    epoch = mdeq_cifar10.TRAIN_IMAGES / reg.train.batch_size
    assert reg.regularizer.jacobian_stop_step == round(90 * epoch)
    assert reg.train.steps == round(220 * epoch) and reg.model.dropout_rate == 0.22
    assert mdeq_cifar10.get_config("large,explicit").train.pretrain_steps == 0
    with pytest.raises(ValueError, match="one size"):
        mdeq_cifar10.get_config("small,large")


@pytest.mark.slow
@pytest.mark.parametrize("arg", ["smoke", "smoke,large,jacobian"])
def test_cifar10_smoke_on_python_batches(tmp_path, arg):
    from test_tasks_cifar_files import write_cifar_dir

    cifar_dir = str(tmp_path / "cifar-10-batches-py")
    write_cifar_dir(cifar_dir)
    config = mdeq_cifar10.get_config(arg)
    config.task.update(dict(dir=cifar_dir, data_dir=str(tmp_path / "data"), valid_size=8))
    config.eval.batch_size = 8
    result = train_and_evaluate(config, str(tmp_path / "run"), emit=lambda _: None)
    assert result.step == config.train.steps
    assert set(result.report["1x"]) == {"valid", "test"}
