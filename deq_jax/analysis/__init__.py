"""Analysis of equilibrium models: path independence (the AA score) and convergence."""

from deq_jax.analysis.adversarial import AttackResult, adversarial_aa, unrolled_run
from deq_jax.analysis.path_independence import (
    aa_score,
    aa_score_deq,
    derangement,
    per_sample_cosine,
)

__all__ = [
    "AttackResult",
    "aa_score",
    "aa_score_deq",
    "adversarial_aa",
    "derangement",
    "per_sample_cosine",
    "unrolled_run",
]
