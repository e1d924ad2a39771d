"""Edge copy on random graphs with an edge-state graph DEQ.

Trains on noisy 10-node Erdős–Rényi graphs to reproduce the clean edge features and
reports the mean squared error over the edges of 10-, 20- and 40-node graphs at 1x, 2x
and 4x the train solver budget (`deq_jax.models.reasoning.EdgeCopyDEQ`: one state
per edge, updated from the edges that share an endpoint; the same parameters on every
graph size). Results: BUILD_NOTES.md, "Path independence". Run it with::

    python -m launch.main --config configs/edge_copy.py --workdir /tmp/edge_copy

The smoke variant (a tiny model, a few steps, still writing checkpoints and
metrics)::

    python -m launch.main --config configs/edge_copy.py:smoke --workdir /tmp/edge_copy_smoke

References:
  Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
  Minimization", ICML 2022 (the edge-copy graph task).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The edge-copy config; ``arg="smoke"`` gives the seconds-long test variant."""
    arg = default.variant(arg)
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="edge_copy",
            data_dir="",
            seed=0,
            train_size=10_000,
            train_nodes=10,
            test_nodes=(10, 20, 40),
            test_size=500,
            val_size=500,  # "valid": new graphs of train_nodes nodes, for model selection
            edge_prob=0.3,
            num_features=1,
            noise_std=0.1,
        )
    )
    # Layer norm over each edge's features keeps the map bounded and convergent on
    # every graph size, mixed initialisation makes the fixed point path independent,
    # and Jacobian-free gradients keep a step cheap.
    config.model = ConfigDict(
        dict(
            name="edge_copy_deq",
            width=32,
            hidden=64,
            dropout_rate=0.0,
        )
    )
    config.deq.update(dict(z_init="mixed", train_max_iter=15, backward=dict(name="jacobian_free")))
    config.train.update(dict(steps=1_500, batch_size=32, optimizer="adam"))
    config.eval.update(dict(batch_size=100, max_batches=1))
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
            task=dict(train_size=256, train_nodes=6, test_nodes=(9,), test_size=32, val_size=32),
            model=dict(width=8, hidden=16),
        )
    return config
