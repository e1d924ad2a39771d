"""The families: what each kind of model brings to the one training loop.

A `deq_jax.training.families.family.Family` gives the loop its set-up, its train step
and the carry between steps, its evaluator and its final report. Two families train
every model:

* `TaskFamily` (``task_family``): every `deq_jax.tasks` task but text. Its pieces are
  shared with the language model: the set-up of a run from its config (``setup``), the
  jitted train and eval steps (``steps``, ``update``), evaluation on any split and
  budget (``evaluate``), losses and metrics (``metrics``), the training options (the
  Jacobian ``regularizer``, the path-independence ``interventions``, the ``settle``
  rule of evaluation).
* `LanguageModelFamily` (``lm_family``): the DEQ-Transformer language model, which
  carries its segment memory from batch to batch: ``lm_setup``, ``lm_steps``,
  ``lm_evaluate`` and ``lm_generate`` (sampling).

`family_for(config)` picks the family of a config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deq_jax.training.families.family import Family
from deq_jax.training.families.lm_family import LanguageModelFamily
from deq_jax.training.families.task_family import TaskFamily

# Models trained by `LanguageModelFamily`; every other model by `TaskFamily`.
LANGUAGE_MODELS = ("deq_transformer_lm",)


def family_for(config: Any, emit: Callable[[str], None] = print) -> Family:
    """The `Family` that trains ``config.model``: `LanguageModelFamily` for the
    `LANGUAGE_MODELS`, `TaskFamily` for every other."""
    if config.model.get("name") in LANGUAGE_MODELS:
        return LanguageModelFamily()
    return TaskFamily(emit)


__all__ = ["LANGUAGE_MODELS", "Family", "LanguageModelFamily", "TaskFamily", "family_for"]
