"""Analysis of equilibrium models: path independence (AA score, adversarial starts) and
test-time scaling of accuracy and convergence with the iteration budget."""

from deq_jax.analysis.adversarial import AttackResult, adversarial_aa, unrolled_run
from deq_jax.analysis.path_independence import (
    aa_score,
    aa_score_deq,
    derangement,
    per_sample_cosine,
)
from deq_jax.analysis.test_time import accuracy_from_logits, test_time_scaling

__all__ = [
    "AttackResult",
    "aa_score",
    "accuracy_from_logits",
    "aa_score_deq",
    "adversarial_aa",
    "derangement",
    "per_sample_cosine",
    "test_time_scaling",
    "unrolled_run",
]
