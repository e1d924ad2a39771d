"""Neural deep equilibrium solvers: a learned initialiser and HyperAnderson iterations.

* `make_initializer` / `SequenceInitializer` / `ImageInitializer` / `VectorInitializer`
  / `MultiscaleInitializer`: ``h_phi(x)``, the injection mapped to a first state.
* `state_shape`: the per-sample layout a solver is built for (one array, or one per
  resolution of a multiscale state): `state_shape_of`, `pooled_channels`.
* `neural_solver`: HyperAnderson with trained weights, a `deq_jax.Solver` usable in
  `deq_jax.fixed_point` and `deq_jax.nn.DEQ`; `init_neural_solver` builds an untrained one.
* `neural_solver_loss`, `unroll`, `step_weights`, `step_errors`, `batch_error`,
  `alpha_weight` (`linear_decay`), `PAPER_WEIGHTS`: the training objective with the DEQ frozen.
* `LearnedInit`: trained initialiser variables as a DEQ's ``z_init``.
* Kernels: `normalize_alpha`, `hyper_anderson_update`, `hyper_anderson_step`,
  `pool_residual`, `history_features`.

Fitting them to a trained DEQ is training's business (`deq_jax.training`:
`train_neural_solver`, `FrozenDEQ`, `train_hypersolver`, the alternating mode).
Typical use::

    from deq_jax.training import train_neural_solver

    solver = init_neural_solver(key, state_shape=(16,), tol=1e-4, max_iter=40)
    h_phi = make_initializer("vector", features=16)
    trained = train_neural_solver(solver, h_phi, f, batches, num_steps=300, key=key)
    z0 = h_phi.apply(trained.init_params, x)
    sol = dj.fixed_point(f, z0, args, solver=trained.solver,
                         backward=dj.backward.ift(solver=dj.solvers.anderson(tol=1e-6)))

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from deq_jax.neural_solver.hyper_anderson import (
    POOLS,
    HyperAndersonNet,
    HyperAndersonState,
    HyperAndersonStep,
    history_features,
    hyper_anderson_init,
    hyper_anderson_step,
    hyper_anderson_update,
    normalize_alpha,
    pool_residual,
)
from deq_jax.neural_solver.initializer import (
    INITIALIZER_KINDS,
    ImageInitializer,
    LearnedInit,
    MultiscaleInitializer,
    SequenceInitializer,
    VectorInitializer,
    make_initializer,
)
from deq_jax.neural_solver.loss import (
    ERRORS,
    PAPER_WEIGHTS,
    Unrolled,
    alpha_weight,
    batch_error,
    linear_decay,
    neural_solver_loss,
    step_errors,
    step_weights,
    unroll,
)
from deq_jax.neural_solver.params import FrozenParams
from deq_jax.neural_solver.solver import init_neural_solver, init_params, neural_solver
from deq_jax.neural_solver.state_shape import (
    check_state_shape,
    is_multiscale,
    pooled_channels,
    state_shape_of,
)

__all__ = [
    "ERRORS",
    "INITIALIZER_KINDS",
    "PAPER_WEIGHTS",
    "POOLS",
    "FrozenParams",
    "HyperAndersonNet",
    "HyperAndersonState",
    "HyperAndersonStep",
    "ImageInitializer",
    "LearnedInit",
    "MultiscaleInitializer",
    "SequenceInitializer",
    "Unrolled",
    "VectorInitializer",
    "alpha_weight",
    "history_features",
    "hyper_anderson_init",
    "hyper_anderson_step",
    "hyper_anderson_update",
    "init_neural_solver",
    "init_params",
    "is_multiscale",
    "check_state_shape",
    "linear_decay",
    "make_initializer",
    "neural_solver",
    "neural_solver_loss",
    "normalize_alpha",
    "pool_residual",
    "pooled_channels",
    "state_shape_of",
    "batch_error",
    "step_errors",
    "step_weights",
    "unroll",
]
