"""MDEQ on CIFAR-10 at the sizes of the paper (for an accelerator).

``TINY`` (2 resolutions of 24 channels) by default, locuslab's ``cls_mdeq_TINY``: 50
epochs of 128 images, no augmentation, budgets ``F_THRES``/``B_THRES`` 22/24, 3,000
weight-tied warm-up steps. ``:small`` is 4 resolutions of 32-256 channels (locuslab's
ImageNet SMALL; 111 epochs with random crops and flips, budgets 26/27). ``:large`` is
locuslab's ``cls_mdeq_LARGE`` (4 resolutions, head 14-112, dropout 0.3, 220 epochs with
crops and flips, budgets 18/20, 20,000 warm-up steps), and ``:large,jacobian`` its
``cls_mdeq_LARGE_reg``, the Jacobian-regularised model of Bai et al. (2021): batches of
96, dropout 0.22, training and evaluation budget 8, IFT budget 7, gamma 0.4 with two
probes on 2% of the steps (``regularizer.jacobian_freq``), none after epoch 90
(``regularizer.jacobian_stop_step``), 16,000 warm-up steps. (Its random +-2 jitter of
the budget on regularised steps, ``RAND_F_THRES_DELTA``, is not reproduced.) The
forward solver is Anderson (``:broyden`` for locuslab's Broyden), the backward the
implicit one (IFT). The data are the ``cifar-10-batches-py`` directory users download
(``--config.task.dir=/path/to/cifar-10-batches-py``), or tfds's ``cifar10`` when it is
prepared under ``task.data_dir`` (``dir=""``); 5,000 training images are held out for
validation, so an epoch is 45,000 images. Run it with::

    python -m launch.main --config configs/mdeq_cifar10.py --workdir /tmp/mdeq_cifar \\
        --config.task.dir=$HOME/data/cifar-10-batches-py

Other variants as in ``configs/mdeq_fashion_mnist.py`` (``explicit``, ``jacobian``: gamma
2 on every step, ``torchdeq``, ``broyden``, ``smoke``). Images per second and the memory
of a step, without the data set::

    python -m benchmarks.step_cost --config configs/mdeq_cifar10.py:small --workdir /tmp/cost \\
        --synthetic --input_shape=32,32,3

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
  (github.com/locuslab/mdeq, ``experiments/cifar``).
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (CIFAR-10: 17 -> 6 forward NFEs at about the same accuracy;
  github.com/locuslab/deq, ``MDEQ-Vision/experiments/cifar/cls_mdeq_LARGE_reg.yaml``).
"""

from ml_collections import ConfigDict

from configs import default, mdeq_fashion_mnist
from deq_jax.models.mdeq import LARGE, SMALL, TINY

VARIANTS = ("smoke", "small", "large", "explicit", "jacobian", "torchdeq", "broyden", "reversible")
# Training images per epoch: the 50,000 less the 5,000 held out for validation.
TRAIN_IMAGES = 45_000


def _epochs(epochs: int, batch_size: int) -> int:
    """Steps of ``epochs`` passes over the training images in batches of ``batch_size``."""
    return round(epochs * TRAIN_IMAGES / batch_size)


def get_config(arg: str | None = None) -> ConfigDict:
    """The CIFAR-10 config with the variants of ``arg`` (module docstring)."""
    names = default.variants(arg, VARIANTS, {"size": ("small", "large")})
    size = SMALL if "small" in names else LARGE if "large" in names else TINY
    config = mdeq_fashion_mnist.mdeq_config(names, size)
    config.task = ConfigDict(
        dict(
            name="cifar10",
            data_dir="",
            dir="",
            valid_size=5_000,
            split_seed=0,
            crop_padding=0,  # TINY: locuslab's cls_mdeq_TINY, no augmentation
            flip=False,
            image_size=32,
        )
    )
    deq = config.model.mode == "deq"
    config.deq.update(dict(train_max_iter=22, eval_max_iter=22))
    config.deq.backward.ift.max_iter = 24
    config.train.update(dict(steps=_epochs(50, 128), batch_size=128, warmup_steps=500))
    if deq:
        config.train.pretrain_steps = 3_000
    config.eval.update(dict(every_steps=1_760, batch_size=500))
    config.ckpt.every_steps = 1_760
    config.log.every_steps = 100
    if "small" in names:
        config.model.dropout_rate = 0.25  # SMALL's 0.0 is locuslab's ImageNet setting
        config.task.update(dict(crop_padding=4, flip=True))
        config.deq.update(dict(train_max_iter=26, eval_max_iter=26))
        config.deq.backward.ift.max_iter = 27
        config.train.steps = 39_000  # 111 epochs
        config.eval.every_steps = 3_900
        config.ckpt.every_steps = 1_950
    if "large" in names:
        _large(config, regularised="jacobian" in names, deq=deq)
    if "reversible" in names:
        mdeq_fashion_mnist.reversible_solve(config)
    if "smoke" in names:
        mdeq_fashion_mnist.mdeq_smoke(config, valid_size=100)
    return config


def _large(config: ConfigDict, *, regularised: bool, deq: bool) -> None:
    """locuslab's ``cls_mdeq_LARGE`` (or, ``regularised``, ``cls_mdeq_LARGE_reg``)."""
    config.task.update(dict(crop_padding=4, flip=True))
    if not regularised:
        config.deq.update(dict(train_max_iter=18, eval_max_iter=18))
        config.deq.backward.ift.max_iter = 20
        config.train.update(dict(steps=_epochs(220, 128), warmup_steps=1_000))
        if deq:
            config.train.pretrain_steps = 20_000
    else:
        config.model.dropout_rate = 0.22
        config.deq.update(dict(train_max_iter=8, eval_max_iter=8))
        config.deq.backward.ift.max_iter = 7
        config.train.update(dict(steps=_epochs(220, 96), batch_size=96, warmup_steps=1_000))
        if deq:
            config.train.pretrain_steps = 16_000
        config.regularizer.update(
            dict(
                jacobian_weight=0.4,
                jacobian_freq=0.02,
                jacobian_samples=2,
                jacobian_stop_step=_epochs(90, 96),
            )
        )
    config.eval.every_steps = _epochs(10, config.train.batch_size)
    config.ckpt.every_steps = _epochs(5, config.train.batch_size)
