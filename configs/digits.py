"""8x8 digits (scikit-learn) with a small convolutional DEQ, for Jacobian regularisation.

A 3x3 input projection, a `Conv2DCell` with input injection, group norm and
weight-normalised convolutions, and a pooled linear readout to 10 classes
(`deq_jax.nn.models.DigitsDEQ`); Anderson forward, implicit (IFT) backward. The
Jacobian regulariser is off unless ``--config.regularizer.jacobian_weight`` is set.
Run it with::

    python -m launch.main --config configs/digits.py --workdir /tmp/digits \\
        --config.regularizer.jacobian_weight=1

The smoke variant (a few steps, still writing checkpoints and metrics; seconds)::

    python -m launch.main --config configs/digits.py:smoke --workdir /tmp/digits_smoke

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Table 3: accuracy against the inference budget).
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The digits config; ``arg="smoke"`` gives the seconds-long test variant."""
    arg = default.variant(arg)
    config = default.get_config()
    config.task = ConfigDict(dict(name="digits", data_dir="", seed=0))
    config.model = ConfigDict(
        dict(
            name="digits_deq",
            width=16,
            num_blocks=0,
            kernel_size=3,
            num_classes=10,
            norm="group",
            norm_groups=4,
            weight_norm=True,
            dropout_rate=0.0,
            z_init="zeros",
            train_max_iter=12,
            eval_max_iter=30,
        )
    )
    config.backward.ift.max_iter = 12
    config.train.steps = 1_000
    config.train.batch_size = 32
    config.train.optimizer = "adam"
    config.train.learning_rate = 2e-3
    config.train.warmup_steps = 50
    config.eval.every_steps = 500
    config.eval.batch_size = 120
    config.eval.budget_multipliers = (1, 2)
    config.regularizer.jacobian_samples = 1
    config.regularizer.spectral_every = 50
    config.regularizer.spectral_iters = 20
    config.ckpt.every_steps = 500
    config.log.every_steps = 50
    if arg == "smoke":
        config.model.width = 8
        config.model.train_max_iter = 4
        config.model.eval_max_iter = 4
        config.backward.ift.max_iter = 4
        config.train.steps = 4
        config.train.batch_size = 16
        config.train.warmup_steps = 1
        config.eval.every_steps = 2
        config.eval.batch_size = 120
        config.eval.max_batches = 1
        config.regularizer.jacobian_weight = 1.0
        config.regularizer.spectral_every = 2
        config.regularizer.spectral_iters = 3
        config.ckpt.every_steps = 2
        config.log.every_steps = 2
    return config
