"""Analysis of equilibrium models: path independence (AA score, adversarial starts) of
bare cells and of whole task models (`deq_call`), and test-time scaling of accuracy and
convergence with the iteration budget."""

from deq_jax.analysis.adversarial import AttackResult, adversarial_aa, unrolled_run
from deq_jax.analysis.model_analysis import (
    DEQCall,
    deq_call,
    model_aa_score,
    model_adversarial_aa,
    outputs_at,
)
from deq_jax.analysis.path_independence import (
    aa_score,
    aa_score_deq,
    derangement,
    per_sample_cosine,
)
from deq_jax.analysis.test_time import accuracy_from_logits, test_time_scaling

__all__ = [
    "AttackResult",
    "DEQCall",
    "deq_call",
    "model_aa_score",
    "model_adversarial_aa",
    "outputs_at",
    "aa_score",
    "accuracy_from_logits",
    "aa_score_deq",
    "adversarial_aa",
    "derangement",
    "per_sample_cosine",
    "test_time_scaling",
    "unrolled_run",
]
