"""`train_language_model`: the language model's training, kept for the callers that
name it; it is `deq_jax.training.train_and_evaluate`, whose `family_for` picks the
`deq_jax.training.lm_family.LanguageModelFamily` for a language model's config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deq_jax.training.lm_family import REPORT_FILE  # noqa: F401 (re-exported)
from deq_jax.training.train import RunResult, train_and_evaluate


def train_language_model(
    config: Any, workdir: str, *, emit: Callable[[str], None] = print
) -> RunResult:
    """`train_and_evaluate` of a language model's config (``carry``: the memory)."""
    return train_and_evaluate(config, workdir, emit=emit)
