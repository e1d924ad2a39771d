"""MDEQ on CIFAR-10 at the sizes of the paper (for an accelerator).

``TINY`` (2 resolutions of 24 channels, locuslab's ``cls_mdeq_TINY``) by default,
``:small`` for 4 resolutions of 32-256 channels; the budgets are locuslab's
(``F_THRES``/``B_THRES``: 22/24 for TINY, 26/27 for SMALL), the forward solver
Anderson (``:broyden`` for locuslab's Broyden), the backward implicit (IFT), a
weight-tied warm-up first. The data are the ``cifar-10-batches-py`` directory users
download (``--config.task.dir=/path/to/cifar-10-batches-py``), or tfds's ``cifar10``
when it is prepared under ``task.data_dir`` (``dir=""``); 5,000 training images are
held out for validation. Run it with::

    python -m launch.main --config configs/mdeq_cifar10.py --workdir /tmp/mdeq_cifar \\
        --config.task.dir=$HOME/data/cifar-10-batches-py

Other variants as in ``configs/mdeq_fashion_mnist.py`` (``explicit``, ``jacobian``,
``torchdeq``, ``broyden``, ``smoke``). Images per second and the memory of a step,
without the data set::

    python -m launch.step_cost --config configs/mdeq_cifar10.py:small --workdir /tmp/cost \\
        --synthetic --input_shape=32,32,3

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (CIFAR-10: 17 -> 6 forward NFEs at about the same accuracy).
"""

from ml_collections import ConfigDict

from configs import default, mdeq_fashion_mnist

VARIANTS = ("smoke", "small", "explicit", "jacobian", "torchdeq", "broyden")


def get_config(arg: str | None = None) -> ConfigDict:
    """The CIFAR-10 config with the variants of ``arg`` (module docstring)."""
    from deq_jax.models.mdeq import SMALL

    names = default.variants(arg, VARIANTS)
    config = mdeq_fashion_mnist.mdeq_config(names)
    config.task = ConfigDict(
        dict(
            name="cifar10",
            data_dir="",
            dir="",
            valid_size=5_000,
            split_seed=0,
            crop_padding=4,
            flip=True,
            image_size=32,
        )
    )
    config.deq.update(dict(train_max_iter=22, eval_max_iter=22))
    config.deq.backward.ift.max_iter = 24
    config.train.update(dict(steps=39_000, batch_size=128, warmup_steps=500))  # 112 epochs
    if config.model.mode == "deq":
        config.train.pretrain_steps = 3_000
    config.eval.update(dict(every_steps=3_900, batch_size=500))
    config.ckpt.every_steps = 1_950
    config.log.every_steps = 100
    if "small" in names:
        config.model.update(dict(SMALL))
        config.model.channels = tuple(config.model.channels)
        config.model.head_channels = tuple(config.model.head_channels)
        config.model.dropout_rate = 0.25  # SMALL's 0.0 is locuslab's ImageNet setting
        config.deq.update(dict(train_max_iter=26, eval_max_iter=26))
        config.deq.backward.ift.max_iter = 27
    if "smoke" in names:
        mdeq_fashion_mnist.mdeq_smoke(config, valid_size=100)
    return config
