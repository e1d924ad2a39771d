"""A neural solver (HyperAnderson + a multiscale initialiser) for a trained Fashion-MNIST MDEQ.

Train the MDEQ, then its solver with the MDEQ frozen, then sweep the solvers::

    python -m launch.main --config configs/mdeq_fashion_mnist.py --workdir /tmp/mdeq_fm
    python -m launch.main --config configs/mdeq_fashion_mnist_hypersolver.py \\
        --workdir /tmp/mdeq_fm_solver --config.neural_solver.deq_workdir=/tmp/mdeq_fm
    python -m experiments.neural_solver.pareto --config configs/mdeq_fashion_mnist_hypersolver.py \\
        --workdir /tmp/mdeq_fm_solver --config.neural_solver.deq_workdir=/tmp/mdeq_fm

The task, model and DEQ sections are those of ``configs/mdeq_fashion_mnist.py`` (the
checkpoint must fit them; pass the same variants, e.g. ``:jacobian``); ``neural_solver``
sets the solver (see ``configs/default.py``): HyperAnderson with each resolution's
residual compressed by global average pooling (the ``C_0 + C_1`` channel means) and the
paper's image initialiser, per resolution one convolution of the injection pooled to
that resolution (`deq_jax.neural_solver.MultiscaleInitializer`; 1x1 here rather than
the paper's 3x3, which alone would be 6.6% of TINY's 158k parameters against the 3%
goal), fitted the paper's way (its loss weights, BPTT through all ``K = 10`` steps, 1,000
steps on fresh, unaugmented training images; targets from 100 Anderson steps).
``:previous`` is the recipe before issue 79 (300 steps, the first 200 without the
backward pass through the cell, weights 1 : 1 : 0.1, a pool of 8 batches), e.g.
``:jacobian,previous``. ``:smoke`` pairs with ``configs/mdeq_fashion_mnist.py:smoke``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 5.2).
"""

from ml_collections import ConfigDict

from configs import default, mdeq_fashion_mnist


def get_config(arg: str | None = None) -> ConfigDict:
    """The MDEQ solver config; ``arg``: the variants of `configs.mdeq_fashion_mnist` and
    ``previous`` (the earlier recipe)."""
    model_arg, variants = default.split_hypersolver_arg(arg)
    config = mdeq_fashion_mnist.get_config(model_arg)
    smoke = "smoke" in mdeq_fashion_mnist.variants(model_arg)
    return default.hypersolver(
        config,
        "smoke" if smoke else "",
        variants=variants,
        previous=dict(train_steps=300, detached_steps=200),
        hidden=8,
        init_kernel_size=1,
        unroll_steps=10,
        budgets=dict(target_max_iter=100),
        l2=0.02,  # the paper's image weights: 0.1 : 0.02 : 1e-5
        l3=1e-5,
    )
