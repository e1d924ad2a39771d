"""Training: the optax loop, orbax checkpoints, data-parallel sharding and metrics.

The entry point is `train_and_evaluate(config, workdir)`, the one training loop of
every task family, the language model included (`deq_jax.training.family`: a family
brings its set-up, its step and the carry between steps, its evaluator and its report;
`TaskFamily` and `LanguageModelFamily`); ``launch/main.py`` turns command-line flags
into the config. `evaluate_checkpoint` evaluates a saved run on any
split and solver budget. The pieces are usable on their own: `TrainState`,
`make_train_step` / `make_eval_step`, `make_optimizer`, `Checkpointer`, the sharding
helpers and the metric writers.

A run survives what long jobs meet: SIGTERM or SIGINT stops it after the step it is in
with a checkpoint there (`StopRequests`, ``preemption``; all processes agree on the
step), a workdir holds one live run (`WorkdirLock`, ``workdir``), a failed save raises
`CheckpointSaveError` and leaves the earlier checkpoints intact, and checkpoints restore
on another device or process count.

Fitting a neural solver (`deq_jax.neural_solver`) to a trained DEQ lives here too:
`train_hypersolver(config, workdir)` fits one to the DEQ of
``neural_solver.deq_workdir`` (``launch/main.py`` runs it when that is set) and
`load_hypersolver` restores it; `FrozenDEQ` makes its training data, `TargetStream`
the fit's batches of known fixed points (fresh, or a pool cycled; `TargetResidualError`
when they are not fixed points), `NeuralSolverSpec` the config section,
`train_neural_solver` the optax loop, and `AlternatingSolver` alternates DEQ and solver
training.

Language models (`deq_jax.models.language`) train through the same loop with
`LanguageModelFamily` (``lm_family``), which carries the segment memory from batch to
batch: its steps (``lm_steps``), set-up and vocabulary check (``lm_setup``), streamed
evaluation (``lm_evaluate``), sampling (``lm_generate``) and neural-solver fit
(``lm_hypersolver``) sit beside it.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the Jacobian regulariser, `JacobianRegularizer`).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (the solver fit).
"""

from deq_jax.training import build, sharding
from deq_jax.training.alternating import AlternatingSolver
from deq_jax.training.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointSaveError,
    CheckpointUnreadableError,
)
from deq_jax.training.evaluate import Evaluator, length_report
from deq_jax.training.family import Family, Phase
from deq_jax.training.frozen_deq import FrozenDEQ, Targets
from deq_jax.training.hypersolver import HyperSolverRun, load_hypersolver, train_hypersolver
from deq_jax.training.interventions import PathIndependence
from deq_jax.training.lm_family import LanguageModelFamily
from deq_jax.training.metrics import classification_loss, regression_loss
from deq_jax.training.optim import make_optimizer, make_schedule
from deq_jax.training.preemption import PREEMPTED_EXIT_STATUS, StopRequests
from deq_jax.training.regularizer import JacobianRegularizer
from deq_jax.training.settle import SettleRule
from deq_jax.training.setup import Run, restore_trained, setup
from deq_jax.training.solver_fit import NeuralSolverSpec, SolverFit
from deq_jax.training.solver_targets import TargetResidualError, TargetStream
from deq_jax.training.solver_train import TrainedNeuralSolver, train_neural_solver
from deq_jax.training.state import TrainState, create_train_state
from deq_jax.training.steps import make_eval_step, make_spectral_step, make_train_step
from deq_jax.training.task_family import TaskFamily
from deq_jax.training.train import (
    NonFiniteLossError,
    RunResult,
    evaluate_checkpoint,
    family_for,
    train_and_evaluate,
)
from deq_jax.training.workdir import WorkdirError, WorkdirLock, WorkdirLockedError
from deq_jax.training.writers import MetricWriter, ProgressLogger, read_metrics

__all__ = [
    "AlternatingSolver",
    "CheckpointMismatchError",
    "CheckpointSaveError",
    "CheckpointUnreadableError",
    "Checkpointer",
    "Evaluator",
    "FrozenDEQ",
    "HyperSolverRun",
    "JacobianRegularizer",
    "Family",
    "LanguageModelFamily",
    "PathIndependence",
    "Phase",
    "MetricWriter",
    "NeuralSolverSpec",
    "NonFiniteLossError",
    "PREEMPTED_EXIT_STATUS",
    "ProgressLogger",
    "Run",
    "RunResult",
    "SettleRule",
    "SolverFit",
    "StopRequests",
    "TaskFamily",
    "TargetResidualError",
    "TargetStream",
    "Targets",
    "TrainedNeuralSolver",
    "TrainState",
    "WorkdirError",
    "WorkdirLock",
    "WorkdirLockedError",
    "build",
    "classification_loss",
    "create_train_state",
    "evaluate_checkpoint",
    "family_for",
    "length_report",
    "load_hypersolver",
    "make_eval_step",
    "make_optimizer",
    "make_schedule",
    "make_spectral_step",
    "make_train_step",
    "read_metrics",
    "regression_loss",
    "restore_trained",
    "setup",
    "sharding",
    "train_and_evaluate",
    "train_hypersolver",
    "train_neural_solver",
]
