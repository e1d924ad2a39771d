"""Matrix inversion (10x10 symmetric positive definite) with an MLP-cell DEQ.

Trains on matrices of condition number 1 to 5 and reports the mean squared error of
the predicted inverse on matrices of condition number 2 to 50 at 1x, 2x and 4x the
train solver budget (`deq_jax.models.reasoning.MatrixInversionDEQ`: the flattened
matrix is projected and injected into an `MLPCell`, read out as a matrix). Results:
BUILD_NOTES.md, "Path independence". Run it with::

    python -m launch.main --config configs/matrix_inversion.py --workdir /tmp/matinv

The smoke variant (a tiny model, a few steps, still writing checkpoints and
metrics)::

    python -m launch.main --config configs/matrix_inversion.py:smoke --workdir /tmp/matinv_smoke

References:
  Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
  Minimization", ICML 2022 (matrix inversion, harder test matrices).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The matrix-inversion config; ``arg="smoke"`` gives the seconds-long test variant."""
    arg = default.variant(arg)
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="matrix_inversion",
            data_dir="",
            seed=0,
            train_size=10_000,
            dim=10,
            train_cond=(1.0, 5.0),
            test_conds=(2.0, 5.0, 10.0, 20.0, 50.0),
            test_size=1_000,
            val_size=1_000,  # "valid": drawn as the training matrices, for model selection
            noise_std=0.01,
        )
    )
    # Mixed initialisation makes the fixed point path independent; Jacobian-free
    # gradients keep a step cheap.
    config.model = ConfigDict(
        dict(
            name="matrix_inversion_deq",
            width=128,
            hidden=256,
            weight_norm=False,
            dropout_rate=0.0,
        )
    )
    config.deq.update(
        dict(
            z_init="mixed", train_max_iter=20, eval_max_iter=40, backward=dict(name="jacobian_free")
        )
    )
    config.train.update(dict(steps=3_000, optimizer="adam"))
    config.eval.update(dict(every_steps=1_000, batch_size=500, max_batches=1))
    config.ckpt.every_steps = 1_000
    config.log.every_steps = 100
    if arg == "smoke":
        default.smoke(
            config,
            steps=6,
            batch_size=16,
            warmup_steps=2,
            eval_every=4,
            eval_batch_size=32,
            budgets=(6, 6),
            task=dict(train_size=256, test_conds=(2.0, 20.0), test_size=64, val_size=64),
            model=dict(width=16, hidden=32),
        )
    return config
