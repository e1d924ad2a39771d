"""Prefix sums (cumulative parity of a bit string) with a 1-D convolutional DEQ.

Trains on 32-bit strings and reports bit and whole-string accuracy on 16- to 64-bit
strings at 1x, 2x and 4x the train solver budget. Run it with (the "Prefix sums"
table of BUILD_NOTES.md)::

    python -m launch.main --config configs/prefix_sum.py --workdir /tmp/ps

The smoke variant (a tiny model, a few steps, still writing checkpoints, metrics and
TensorBoard events; 26-30 s of wall time on an idle 2-core CPU, 2026-12-01, of which
about 12 s compile, most of it the evaluation of each split and budget: 14 s with the
compilation cached)::

    python -m launch.main --config configs/prefix_sum.py:smoke --workdir /tmp/ps_smoke

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The prefix-sum config; ``arg="smoke"`` gives the seconds-long test variant."""
    arg = default.variant(arg)
    config = default.get_config()
    # Per-position layer norm keeps the map length-agnostic and convergent, mixed
    # initialisation makes the fixed point path independent, and Jacobian-free
    # gradients make a step cheaper than IFT.
    config.model.norm = "layer"
    config.deq.update(dict(z_init="mixed", eval_max_iter=100, backward=dict(name="jacobian_free")))
    config.train.update(dict(steps=2_000, batch_size=32, learning_rate=3e-3))
    config.eval.max_batches = 2
    if arg == "smoke":
        default.smoke(
            config,
            steps=6,
            batch_size=16,
            warmup_steps=2,
            eval_every=4,
            eval_batch_size=32,
            budgets=(6, 6),
            task=dict(
                train_size=256, train_length=16, test_lengths=(16, 32), test_size=64, val_size=64
            ),
            model=dict(width=8, num_blocks=1),
        )
    return config
