"""Training: the one optax loop, its families, the neural-solver fit and the run's machinery.

Four places, each a folder, imports pointing down (``run < families < solver_fit <
loop``, `tests/test_layers.py`):

* ``loop/``: `train_and_evaluate(config, workdir)`, the one training loop of every
  task family, the language model included; `evaluate_checkpoint` evaluates a saved
  run on any split and solver budget. ``launch/main.py`` turns flags into the config.
* ``families/``: what differs per kind of model (`Family`: its set-up, its step and the
  carry between steps, its evaluator and its report): `TaskFamily` for the
  `deq_jax.tasks` tasks and `LanguageModelFamily`, which carries the segment memory
  from batch to batch; `family_for` picks one. Their pieces are usable on their own:
  `setup`, `make_train_step` / `make_eval_step`, `Evaluator`, `JacobianRegularizer`,
  `PathIndependence`, `SettleRule`.
* ``solver_fit/``: fitting a neural solver (`deq_jax.neural_solver`) to a trained DEQ.
  `train_hypersolver(config, workdir)` fits one to the DEQ of
  ``neural_solver.deq_workdir`` (``launch/main.py`` runs it when that is set) and
  `load_hypersolver` restores it; `FrozenDEQ` makes its training data, `TargetStream`
  the fit's batches of known fixed points (`TargetResidualError` when they are not
  fixed points), `NeuralSolverSpec` the config section, `train_neural_solver` the optax
  loop, and `AlternatingSolver` alternates DEQ and solver training.
* ``run/``: the machinery every run shares: `TrainState`, `make_optimizer`,
  `Checkpointer`, the mesh and its sharding helpers (``sharding``), the metric writers.
  A run survives what long jobs meet: SIGTERM or SIGINT stops it after the step it is
  in with a checkpoint there (`StopRequests`; all processes agree on the step), a
  workdir holds one live run (`WorkdirLock`), a failed save raises
  `CheckpointSaveError` and leaves the earlier checkpoints intact, and checkpoints
  restore on another mesh, device or process count.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the Jacobian regulariser, `JacobianRegularizer`).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (the solver fit).
"""

from deq_jax.training.families import family_for
from deq_jax.training.families.evaluate import Evaluator, length_report
from deq_jax.training.families.family import Family, Phase
from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.lm_family import LanguageModelFamily
from deq_jax.training.families.metrics import classification_loss, regression_loss
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.families.settle import SettleRule
from deq_jax.training.families.setup import Run, restore_trained, setup
from deq_jax.training.families.steps import make_eval_step, make_spectral_step, make_train_step
from deq_jax.training.families.task_family import TaskFamily
from deq_jax.training.loop.train import (
    NonFiniteLossError,
    RunResult,
    evaluate_checkpoint,
    train_and_evaluate,
)
from deq_jax.training.run import build, sharding
from deq_jax.training.run.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointSaveError,
    CheckpointUnreadableError,
)
from deq_jax.training.run.optim import make_optimizer, make_schedule
from deq_jax.training.run.preemption import PREEMPTED_EXIT_STATUS, StopRequests
from deq_jax.training.run.state import TrainState, create_train_state
from deq_jax.training.run.workdir import WorkdirError, WorkdirLock, WorkdirLockedError
from deq_jax.training.run.writers import MetricWriter, ProgressLogger, read_metrics
from deq_jax.training.solver_fit.alternating import AlternatingSolver
from deq_jax.training.solver_fit.frozen_deq import FrozenDEQ, Targets
from deq_jax.training.solver_fit.hypersolver import (
    HyperSolverRun,
    load_hypersolver,
    train_hypersolver,
)
from deq_jax.training.solver_fit.spec import NeuralSolverSpec, SolverFit
from deq_jax.training.solver_fit.targets import TargetResidualError, TargetStream
from deq_jax.training.solver_fit.trainer import TrainedNeuralSolver, train_neural_solver

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
