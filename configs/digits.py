"""8x8 digits (scikit-learn) with a small convolutional DEQ, for Jacobian regularisation.

A 3x3 input projection, a `Conv2DCell` with input injection, group norm and
weight-normalised convolutions, and a pooled linear readout to 10 classes
(`deq_jax.models.vision.DigitsDEQ`); Anderson forward, implicit (IFT) backward. The
Jacobian regulariser is off unless ``--config.regularizer.jacobian_weight`` is set.
Run it with::

    python -m launch.main --config configs/digits.py --workdir /tmp/digits \\
        --config.regularizer.jacobian_weight=1

The smoke variant (a few steps, still writing checkpoints and metrics)::

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
    # "valid": 180 of the 1,437 training digits, cut out for model selection.
    config.task = ConfigDict(dict(name="digits", data_dir="", seed=0, valid_size=180))
    config.model.update(
        dict(
            name="digits_deq",
            width=16,
            num_blocks=0,
            num_classes=10,
            norm="group",
            weight_norm=True,
        )
    )
    config.deq.train_max_iter = 12
    config.train.update(dict(batch_size=32, optimizer="adam", learning_rate=2e-3, warmup_steps=50))
    config.eval.update(dict(batch_size=120, budget_multipliers=(1, 2)))
    config.regularizer.spectral_every = 50
    if arg == "smoke":
        default.smoke(
            config,
            steps=4,
            batch_size=16,
            warmup_steps=1,
            eval_every=2,
            eval_batch_size=120,
            budgets=(4, 4),
            model=dict(width=8),
            regularizer=dict(jacobian_weight=1.0, spectral_every=2, spectral_iters=3),
        )
    return config
