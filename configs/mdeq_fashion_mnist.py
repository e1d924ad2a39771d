"""MDEQ-TINY on Fashion-MNIST: the multiscale DEQ of Bai et al. (2020) on real images.

Two resolutions (28x28 and 14x14, 24 channels each: locuslab's ``cls_mdeq_TINY``),
a weight-tied warm-up (``train.pretrain_steps``), then Anderson forward with the
implicit (IFT) backward (`deq_jax.models.mdeq.MDEQ`). The data are the four idx files
of Debian's ``dataset-fashion-mnist`` (``apt-get install dataset-fashion-mnist``; or
``--config.task.dir=`` any directory holding them), converted once to tfds
array_record under ``{workdir}/data``; 5,000 training images are held out as the
validation split that settings are chosen on, the test split is read once at the end.
Run it with::

    python -m launch.main --config configs/mdeq_fashion_mnist.py --workdir /tmp/mdeq_fm

Variants (``:a,b``): ``smoke`` (a few steps on a narrow model, a 2-batch report; 65-69
s of wall time on an idle 2-core CPU with the conversion of 70,000 images, 2026-12-01,
of which about 27 s compile: 41 s with the compilation cached),
``explicit`` (the same network weight-tied and unrolled ``n_layer`` steps, backprop:
the explicit baseline), ``jacobian`` (the Jacobian regulariser of Bai et al. 2021),
``torchdeq`` (torchdeq's recipe: a few damped phantom-gradient steps instead of the
IFT), ``broyden`` (Broyden forward, as locuslab), ``reversible`` (the reversible DEQ of
McCallum et al. 2025: b 0.8, 5 evaluations, exact gradient in constant memory,
docs/results/reversible.md), ``gpu`` (20 epochs instead of 6.6),
``cpu`` (half an epoch of 32-image batches, 48 minutes on 2 CPU cores with the final
report, which scores the training budget only: 79.3% test accuracy, BUILD_NOTES). The
default's 6.6 epochs take about 8 hours on 2 CPU cores (16 training images/s at batch
32, BUILD_NOTES): an accelerator's job.
The throughput and the memory of a training step::

    python -m benchmarks.step_cost --config configs/mdeq_fashion_mnist.py --workdir /tmp/cost

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Table 3).
  Geng et al., "TorchDEQ: A Library for Deep Equilibrium Models", 2023.
  McCallum, Arora & Foster, "Reversible Deep Equilibrium Models", 2025.
"""

from ml_collections import ConfigDict

from configs import default
from deq_jax.models.mdeq import TINY

VARIANTS = ("smoke", "explicit", "jacobian", "torchdeq", "broyden", "reversible", "gpu", "cpu")


def variants(arg: str | None) -> tuple[str, ...]:
    """The variants of a config argument such as ``"smoke,jacobian"``.

    Raises:
      ValueError: for an unknown or repeated variant.
    """
    return default.variants(arg, VARIANTS)


def mdeq_config(names: tuple[str, ...], size: dict = TINY) -> ConfigDict:
    """The MDEQ sections shared by the Fashion-MNIST and CIFAR-10 configs: the model of
    ``size`` (`deq_jax.models.mdeq`'s ``TINY``, ``SMALL`` or ``LARGE``), Anderson + IFT,
    and the variants of ``names`` (but ``smoke``, which each data set shrinks its own
    way)."""
    config = default.get_config()
    config.model = ConfigDict(dict(name="mdeq", num_classes=10, mode="deq", **size))
    config.deq.update(dict(train_max_iter=12, eval_max_iter=18))
    config.deq.backward.ift.max_iter = 12
    config.train.update(dict(optimizer="adam", weight_decay=0.0))
    config.eval.update(dict(splits=("valid",), budget_multipliers=(1, 2)))
    if "explicit" in names:
        config.model.mode = "weight_tied"
    if "jacobian" in names:
        # gamma 2 on every step, on the per-dimension estimate ||J||_F^2 / d
        config.regularizer.jacobian_weight = 2.0
    if "torchdeq" in names:
        config.deq.backward.name = "phantom"
        config.deq.backward.phantom.tau = 0.8
    if "broyden" in names:
        config.deq.solver.name = "broyden"
    return config


def reversible_solve(config: ConfigDict) -> ConfigDict:
    """The ``reversible`` variant: McCallum et al.'s image settings, b = 0.8, two coupled
    steps (5 evaluations of the cell, every sample the whole budget), the exact
    reversible backward, no regulariser. (The IFT default spends 12 + 12 evaluations in
    training and 18 in evaluation.) Applied after a data set's own budgets."""
    config.deq.solver.name = "reversible"
    config.deq.solver.reversible.beta = 0.8
    config.deq.solver.full_budget = True
    config.deq.backward.name = "reversible"
    config.deq.update(dict(train_max_iter=5, eval_max_iter=5))
    return config


def mdeq_smoke(config: ConfigDict, valid_size: int) -> ConfigDict:
    """Shrinks an MDEQ config to its test variant: 4 steps of 8 (the first 2 weight-tied for a
    DEQ), two resolutions of 8 channels, budgets of 4, a 2-batch final report."""
    default.smoke(
        config,
        steps=4,
        batch_size=8,
        warmup_steps=1,
        eval_every=2,
        eval_batch_size=50,
        budgets=(4, 4),
    )
    config.model.update(dict(channels=(8, 8), head_channels=(4, 4), final_channels=16))
    config.model.num_groups = 4
    config.deq.backward.ift.max_iter = 4
    if config.model.mode == "deq":
        config.train.pretrain_steps = 2  # two warm-up steps, then two DEQ steps
    config.task.valid_size = valid_size
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    """The Fashion-MNIST config with the variants of ``arg`` (module docstring)."""
    names = variants(arg)
    config = mdeq_config(names)
    config.task = ConfigDict(
        dict(
            name="fashion_mnist",
            data_dir="",
            dir="/usr/share/datasets/fashion-mnist",
            valid_size=5_000,
            split_seed=0,
            crop_padding=2,
            flip=True,
            image_size=28,
        )
    )
    # 6.6 epochs: the length the accelerator runs of BUILD_NOTES could afford.
    config.train.update(dict(steps=2_850, batch_size=128, warmup_steps=142))
    if config.model.mode == "deq":
        config.train.pretrain_steps = 356
    config.eval.update(dict(every_steps=950, batch_size=500))
    config.ckpt.every_steps = 950
    config.log.every_steps = 285
    if "gpu" in names:  # 20 epochs
        config.train.update(dict(steps=8_600, warmup_steps=300))
        if config.model.mode == "deq":
            config.train.pretrain_steps = 1_000
        config.eval.update(dict(every_steps=2_150))
        config.ckpt.every_steps = 2_150
        config.log.every_steps = 200
    if "cpu" in names:  # half an epoch of 32-image batches: 48 minutes on 2 CPU cores
        config.train.update(dict(steps=900, batch_size=32, warmup_steps=45))
        if config.model.mode == "deq":
            config.train.pretrain_steps = 110
        config.eval.update(dict(every_steps=450, max_batches=2, budget_multipliers=(1,)))
        config.ckpt.every_steps = 450
        config.log.every_steps = 50
    if "reversible" in names:
        reversible_solve(config)
    if "smoke" in names:
        mdeq_smoke(config, valid_size=1_000)
    return config
