"""The synthetic 1-D regression of Bai et al. (2021) with the 200-parameter DEQ.

``f(z; x) = W2^T ReLU(W1 z + U x + b)`` (50 hidden units, the prediction is ``z*``)
fit to ``y = 1.5 x^3 + x^2 - 5 x + 2 sin(x) - 3 + noise`` with Adam (1e-3, cosine
schedule, 80,000 steps of 128 pairs: two to three minutes on 2 CPU cores) and an
Anderson forward solver; the Jacobian regulariser is off unless
``--config.regularizer.jacobian_weight`` is set, and then uses M = 4 Hutchinson probes.
The length and the probes were chosen on seeds 10-14 (BUILD_NOTES.md, "Jacobian
regularisation", which holds the results). Run it with::

    python -m launch.main --config configs/synthetic_1d.py --workdir /tmp/syn1d \\
        --config.regularizer.jacobian_weight=4

The smoke variant (a few steps, still writing checkpoints and metrics)::

    python -m launch.main --config configs/synthetic_1d.py:smoke --workdir /tmp/syn1d_smoke

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Section 5.1 and Figure 5).
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The synthetic 1-D config; ``arg="smoke"`` gives the seconds-long test variant."""
    arg = default.variant(arg)
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="synthetic_1d",
            data_dir="",
            seed=0,
            train_size=4096,
            validation_size=1000,
            noise_std=0.05,
        )
    )
    config.model = ConfigDict(
        dict(
            name="synthetic_1d_deq",
            hidden=50,
            recurrent_std=1.0,
            out_std=0.5,
        )
    )
    config.deq.eval_max_iter = 60
    config.train.update(
        dict(
            steps=80_000,
            batch_size=128,
            optimizer="adam",
            warmup_steps=0,
            grad_clip_norm=0.0,
        )
    )
    config.eval.update(dict(every_steps=20_000, batch_size=500, budget_multipliers=(1, 2)))
    config.regularizer.update(dict(jacobian_samples=4, spectral_every=100, spectral_iters=4))
    config.ckpt.every_steps = 20_000
    config.log.every_steps = 100
    if arg == "smoke":
        default.smoke(
            config,
            steps=6,
            batch_size=32,
            warmup_steps=0,
            eval_every=4,
            eval_batch_size=32,
            budgets=(6, 6),
            max_batches=0,
            task=dict(train_size=256, validation_size=64),
            regularizer=dict(jacobian_weight=1.0, jacobian_freq=0.5, spectral_every=2),
        )
    return config
