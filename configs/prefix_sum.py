"""Prefix sums (cumulative parity of a bit string) with a 1-D convolutional DEQ.

Trains on 32-bit strings and reports bit and whole-string accuracy on 16- to 64-bit
strings at 1x, 2x and 4x the train solver budget (about 7 minutes on 2 CPU cores;
100% whole-string accuracy up to 64 bits at 2x). Run it with::

    python -m launch.main --config configs/prefix_sum.py --workdir /tmp/ps

The smoke variant (a tiny model, a few steps, still writing checkpoints, metrics and
TensorBoard events; under a minute on a laptop CPU)::

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
    # Tuned on a 2-core CPU: per-position layer norm keeps the map length-agnostic
    # and convergent, mixed initialisation makes the fixed point path independent,
    # and Jacobian-free gradients make a step about three times cheaper than IFT.
    config.model.norm = "layer"
    config.model.z_init = "mixed"
    config.model.train_max_iter = 30
    config.model.eval_max_iter = 100
    config.backward.name = "jacobian_free"
    config.train.steps = 2_000
    config.train.batch_size = 32
    config.train.learning_rate = 3e-3
    config.eval.every_steps = 500
    config.eval.max_batches = 2
    if arg == "smoke":
        config.task.train_size = 256
        config.task.train_length = 16
        config.task.test_lengths = (16, 32)
        config.task.test_size = 64
        config.model.width = 8
        config.model.num_blocks = 1
        config.model.train_max_iter = 6
        config.model.eval_max_iter = 6
        config.backward.ift.max_iter = 6
        config.train.steps = 6
        config.train.batch_size = 16
        config.train.warmup_steps = 2
        config.eval.every_steps = 4
        config.eval.batch_size = 32
        config.eval.max_batches = 1
        config.eval.budget_multipliers = (1, 2)
        config.ckpt.every_steps = 2
        config.ckpt.keep = 2
        config.log.every_steps = 2
    return config
