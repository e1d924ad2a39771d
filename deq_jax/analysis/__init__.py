"""Analysis of equilibrium models: path independence (AA score, adversarial starts) of
bare cells and of whole task models, test-time scaling of accuracy and convergence with
the iteration budget, and a solve's replayed trajectory (when the answer settled, when
every node converged). The model interception these build on (`deq_call`, `outputs_at`,
`settled_apply`) lives with the DEQ layer, `deq_jax.nn.intercept`, and is re-exported
here."""

from deq_jax.analysis.adversarial import AttackResult, adversarial_aa, unrolled_run
from deq_jax.analysis.model_analysis import model_aa_score, model_adversarial_aa
from deq_jax.analysis.path_independence import (
    aa_score,
    aa_score_deq,
    derangement,
    per_sample_cosine,
)
from deq_jax.analysis.test_time import accuracy_from_logits, test_time_scaling
from deq_jax.analysis.trajectory import first_below, node_residual, settle_step, solver_trajectory
from deq_jax.nn.intercept import DEQCall, argmax_answer, deq_call, outputs_at, settled_apply

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
