"""Analysis of equilibrium models: path independence (AA score, adversarial starts) of
bare cells and of whole task models (`deq_call`), test-time scaling of accuracy and
convergence with the iteration budget, and a solve's replayed trajectory (when the
answer settled, when every node converged)."""

from deq_jax.analysis.adversarial import AttackResult, adversarial_aa, unrolled_run
from deq_jax.analysis.model_analysis import (
    DEQCall,
    argmax_answer,
    deq_call,
    model_aa_score,
    model_adversarial_aa,
    outputs_at,
    settled_apply,
)
from deq_jax.analysis.path_independence import (
    aa_score,
    aa_score_deq,
    derangement,
    per_sample_cosine,
)
from deq_jax.analysis.test_time import accuracy_from_logits, test_time_scaling
from deq_jax.analysis.trajectory import first_below, node_residual, settle_step, solver_trajectory

__all__ = [
    "AttackResult",
    "DEQCall",
    "argmax_answer",
    "deq_call",
    "model_aa_score",
    "model_adversarial_aa",
    "outputs_at",
    "aa_score",
    "accuracy_from_logits",
    "aa_score_deq",
    "adversarial_aa",
    "derangement",
    "first_below",
    "node_residual",
    "per_sample_cosine",
    "settle_step",
    "settled_apply",
    "solver_trajectory",
    "test_time_scaling",
    "unrolled_run",
]
