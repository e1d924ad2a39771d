"""A neural solver (HyperAnderson + a multiscale initialiser) for a trained CIFAR-10 MDEQ.

As ``configs/mdeq_fashion_mnist_hypersolver.py``, for ``configs/mdeq_cifar10.py`` (pass
the same variants, e.g. ``:small``)::

    python -m launch.main --config configs/mdeq_cifar10.py --workdir /tmp/mdeq_c10 \\
        --config.task.dir=$HOME/data/cifar-10-batches-py
    python -m launch.main --config configs/mdeq_cifar10_hypersolver.py \\
        --workdir /tmp/mdeq_c10_solver --config.neural_solver.deq_workdir=/tmp/mdeq_c10 \\
        --config.task.dir=$HOME/data/cifar-10-batches-py
    python -m experiments.neural_solver.pareto --config configs/mdeq_cifar10_hypersolver.py \\
        --workdir /tmp/mdeq_c10_solver --config.neural_solver.deq_workdir=/tmp/mdeq_c10 \\
        --config.task.dir=$HOME/data/cifar-10-batches-py

The paper's 3x3 initialiser is affordable at these sizes (SMALL: 14.8M parameters).
Fitted the paper's way (its image loss weights 0.1 : 0.02 : 1e-5, BPTT through all
``K = 10`` steps, 1,000 steps on fresh, unaugmented images); ``:previous`` is the recipe
before issue 79 (500 steps, the first 300 without the backward pass through the cell).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 5.2).
"""

from ml_collections import ConfigDict

from configs import default, mdeq_cifar10


def get_config(arg: str | None = None) -> ConfigDict:
    """The CIFAR-10 MDEQ solver config; ``arg``: the variants of `configs.mdeq_cifar10`
    and ``previous`` (the earlier recipe)."""
    model_arg, variants = default.split_hypersolver_arg(arg)
    config = mdeq_cifar10.get_config(model_arg)
    smoke = "smoke" in default.variants(model_arg, mdeq_cifar10.VARIANTS)
    return default.hypersolver(
        config,
        "smoke" if smoke else "",
        variants=variants,
        previous=dict(train_steps=500, detached_steps=300),
        hidden=16,
        unroll_steps=10,
        budgets=dict(max_iter=40, target_max_iter=100),
        l2=0.02,
        l3=1e-5,
    )
