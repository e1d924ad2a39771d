"""Blurry digits: classify lightly blurred 8x8 digits, test on blurrier ones.

Trains the small convolutional DEQ of ``configs/digits.py``
(`deq_jax.models.vision.DigitsDEQ`) on scikit-learn digits blurred with a Gaussian of
standard deviation 0.5 pixels and reports the accuracy on the test digits blurred at
0.5, 1 and 1.5 pixels, at 1x, 2x and 4x the train solver budget (results:
BUILD_NOTES.md, "Path independence"). Run it with::

    python -m launch.main --config configs/blurry_digits.py --workdir /tmp/blurry_digits

The smoke variant (a tiny model, a few steps, still writing checkpoints and
metrics)::

    python -m launch.main --config configs/blurry_digits.py:smoke --workdir /tmp/blurry_smoke

References:
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022 (upwards generalisation: test inputs harder than any
  seen in training).
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The blurry-digits config; ``arg="smoke"`` gives the seconds-long test variant."""
    arg = default.variant(arg)
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="blurry_digits",
            source="digits",
            data_dir="",
            seed=0,
            train_sigma=0.5,
            test_sigmas=(0.5, 1.0, 1.5),
            # "valid": training digits cut out for model selection (None: 180 for
            # digits, 0 for mnist, which has none).
            valid_size=None,
        )
    )
    # Group norm keeps the cell convergent, mixed initialisation makes the fixed point
    # path independent, and Jacobian-free gradients keep a step cheap.
    config.model.update(
        dict(name="digits_deq", width=16, num_blocks=1, num_classes=10, norm="group")
    )
    config.deq.update(dict(z_init="mixed", train_max_iter=15, backward=dict(name="jacobian_free")))
    config.train.update(dict(batch_size=32, optimizer="adam", learning_rate=2e-3, warmup_steps=50))
    config.eval.batch_size = 120
    config.log.every_steps = 100
    if arg == "smoke":
        default.smoke(
            config,
            steps=4,
            batch_size=16,
            warmup_steps=1,
            eval_every=2,
            eval_batch_size=120,
            budgets=(4, 4),
            task=dict(test_sigmas=(0.5, 1.5)),
            model=dict(width=8, num_blocks=0),
        )
    return config
