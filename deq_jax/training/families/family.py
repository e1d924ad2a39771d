"""What a task family brings to the one training loop (`deq_jax.training.loop.train`).

The loop (`deq_jax.training.loop.loop`: finished-run check, periodic evaluation,
best-checkpoint selection, non-finite skipping, checkpoints, the final report) is the
same for every family; a `Family` says what differs, the way the flax examples'
``train.py`` takes a model and a dataset:

* `Family.setup`: the run (`deq_jax.training.families.setup.Run`), with the ``carry`` threaded
  from step to step (``None`` for the tasks; the language model's segment memory);
* `Family.phase`: the train step and the evaluator of a model, for the weight-tied
  warm-up (``train.pretrain_steps``) or the main phase;
* `Family.checkpoint_item`: what a checkpoint holds (the state, or state and carry);
* `Family.final_report`: the report of the selected state, written to
  `Family.report_file`;
* `Family.evaluate_checkpoint`: a saved checkpoint scored at any budgets.

Two families exist: `deq_jax.training.families.task_family.TaskFamily` (every `deq_jax.tasks`
task but text) and `deq_jax.training.families.lm_family.LanguageModelFamily`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from deq_jax.training.run.state import TrainState

# ``step(state, carry, batch, step_number) -> (state, carry, metrics)``: one train step
# on a host batch, the metrics on the host.
Step = Callable[[TrainState, Any, dict[str, Any], int], tuple[TrainState, Any, dict[str, Any]]]


class Phase(NamedTuple):
    """How one phase of training (the weight-tied warm-up or the main phase) trains and
    scores its model.

    Attributes:
      step: the train `Step`.
      evaluator: has ``evaluate(state, split) -> metrics`` and a settable
        ``max_batches`` (0: the whole split).
      lower: ``lower(state, carry, batch) -> jax.stages.Lowered``: the jitted train
        step lowered for a host batch without running it (``state`` may hold
        `jax.ShapeDtypeStruct`s with shardings); ``.compile()`` gives its HLO and
        memory analysis (`deq_jax.training.run.footprint`).
    """

    step: Step
    evaluator: Any
    lower: Callable[[TrainState, Any, dict[str, Any]], Any] | None = None


class Family(abc.ABC):
    """A task family's part of the training loop (module docstring).

    Attributes:
      report_file: the final report's file name in the workdir.
      advice: what to try when too many steps in a row are non-finite.
      sparse_metrics: train metrics averaged over their finite values only (``None``:
        every metric; see `deq_jax.training.loop.train.interval_mean`).
      alternates: its runs can alternate DEQ and neural-solver training
        (``neural_solver.alternating``, `deq_jax.training.solver_fit.alternating`).
    """

    report_file: str
    advice: str
    sparse_metrics: Sequence[str] | None
    alternates: bool = False

    @abc.abstractmethod
    def setup(self, config: Any, workdir: str) -> Any:
        """The `deq_jax.training.families.setup.Run` of ``config``, restored from ``workdir``."""

    @abc.abstractmethod
    def describe(self, run: Any) -> str:
        """The model's name (and what else the start line says about it)."""

    @abc.abstractmethod
    def train_batches(self, config: Any, run: Any) -> Iterator[dict[str, Any]]:
        """The host batches of training, from the step after ``run.start_step``."""

    @abc.abstractmethod
    def phase(self, config: Any, run: Any, model: Any, warmup: bool) -> Phase:
        """The `Phase` of ``model`` (its weight-tied warm-up when ``warmup``)."""

    def checkpoint_item(self, state: TrainState, carry: Any) -> Any:
        """What a checkpoint holds: the state, or ``{"state", "mems"}`` with a carry."""
        return state if carry is None else {"state": state, "mems": carry}

    @abc.abstractmethod
    def final_report(self, loop: Any, scored: TrainState, step: int) -> tuple[dict, dict]:
        """Scores the selected state ``scored`` at the end of training and writes the
        report; returns ``({split: metrics} at the eval budget, report)``.

        ``loop`` is the training loop's `deq_jax.training.loop.loop.Loop`: its ``config``,
        ``workdir``, ``run``, ``writer``, ``best``, ``emit``, ``lead`` (the process
        that writes), ``phases``, ``periodic_splits``, ``previous`` (the report of the
        run this one continues), ``report_extra`` (``step``, ``best``,
        ``train_seconds``) and ``evaluate`` are what a report needs.
        """

    @abc.abstractmethod
    def evaluate_checkpoint(self, config: Any, workdir: str, *args: Any, **options: Any) -> dict:
        """Scores a saved checkpoint (`deq_jax.training.loop.train.evaluate_checkpoint`)."""

    @abc.abstractmethod
    def saved_report(self, previous: Mapping[str, Any]) -> dict:
        """The report part of a finished run's report file (`RunResult.report`)."""


def warmup_model(model: Any, pretrain_steps: int) -> Any:
    """``model`` run as its explicit weight-tied network (``mode="weight_tied"``), the
    warm-up of the first ``train.pretrain_steps`` steps.

    Raises:
      ValueError: for a model without a ``"weight_tied"`` mode.
    """
    if not hasattr(model, "mode"):
        raise ValueError(
            f"train.pretrain_steps={pretrain_steps} runs a weight-tied warm-up, which "
            f"{type(model).__name__} does not have (models with a mode='weight_tied': "
            "mdeq, deq_transformer_lm); set train.pretrain_steps=0."
        )
    return model.clone(mode="weight_tied")
