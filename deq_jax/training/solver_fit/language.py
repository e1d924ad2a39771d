"""The language model's part of a neural-solver fit: `LANGUAGE`, a `SolverFamily`.

`deq_jax.training.solver_fit.hypersolver.train_hypersolver` fits a solver to a trained
DEQ-Transformer language model with this family (``configs/lm_shakespeare_hypersolver.py``):

1. the LM is restored as its training restores it (`LanguageModelFamily`); its frozen
   DEQ's initialiser reads the injection of the DEQ's input, and the segment memory
   rides along in the cell's arguments (the batch key `MEMS`);
2. the fixed points come from training segments streamed with their memory, as in
   training (`segments_with_memory`);
3. the solver is HyperAnderson with each residual compressed per sequence by ``pool``
   (``"last"`` token or ``"mean"``), the initialiser the paper's LM one (a causal
   convolution of width ``init_kernel_size`` over the injection, ReLU, a linear map to
   the state; `deq_jax.neural_solver.SequenceInitializer`);
4. the comparison streams ``eval.max_batches`` validation segments with Anderson and
   with the neural solver at ``deq.neural_solver.max_iter`` (and the neural solver at
   twice its trained ``unroll_steps``): bits per character, solver steps and wall time
   per segment batch (`score_stream`).

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 5.1, the
  language model).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
from flax import linen as nn

from deq_jax.training.families.lm_evaluate import StreamEvaluator
from deq_jax.training.families.lm_family import LanguageModelFamily
from deq_jax.training.solver_fit.runs import SolverFamily
from deq_jax.training.solver_fit.spec import NeuralSolverSpec

# The batch key under which the segment memory reaches the model (a model keyword).
MEMS = "mems"


def segments_with_memory(
    run: Any,
    variables: Any,
    batch_size: int,
    seq_len: int,
    *,
    warm: int = 1,
    split: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Training segments (or those of the eval ``split``) ``{"inputs", "mems"}`` in stream
    order, each with the memory the model built over the previous segments (the first
    ``warm`` segments only fill it)."""
    model = run.model
    advance = jax.jit(lambda v, t, m: model.apply(v, t, mems=m, train=False).mems)
    fresh = model.init_mems(batch_size)
    mems = fresh
    if split is None:
        batches = run.task.train_iterator(batch_size, seq_len)
    else:
        batches = run.task.eval_iterator(split, batch_size, seq_len)
    for i, batch in enumerate(batches):
        if batch["reset"]:
            mems = fresh
        if i >= warm:
            yield {"inputs": batch["inputs"], MEMS: mems}
        mems = advance(variables, batch["inputs"], mems)


def _segments(
    config: Any, run: Any, variables: Any, spec: NeuralSolverSpec
) -> Iterator[dict[str, Any]]:
    """`segments_with_memory` of ``spec.batch_size`` segments of ``train.seq_len``."""
    return segments_with_memory(run, variables, spec.batch_size, config.train.seq_len)


def _held_out(
    config: Any, run: Any, variables: Any, spec: NeuralSolverSpec, split: str
) -> Iterator[dict[str, Any]]:
    """`segments_with_memory` of ``split`` (the first eval split when empty)."""
    split = split or run.task.eval_splits[0]
    return segments_with_memory(run, variables, spec.batch_size, config.train.seq_len, split=split)


def score_stream(config: Any, run: Any, model: nn.Module, max_iter: int) -> dict[str, Any]:
    """``model``'s metrics on ``eval.max_batches`` validation segments streamed at
    ``max_iter``, with ``seconds_per_batch`` (the first, compiling, segment excluded)."""
    ec = config.eval
    seq_len = ec.seq_len or config.train.seq_len
    evaluator = StreamEvaluator(model, run.task, run.mesh, ec.batch_size, seq_len, ec.max_batches)
    metrics = evaluator.evaluate(run.state, run.task.eval_splits[0], max_iter=max_iter)
    metrics["seconds_per_batch"] = metrics["seconds"] / max((ec.max_batches or 0) - 1, 1)
    return metrics


def _lines(comparison: dict[str, Any], run: Any) -> list[str]:
    """A line per solver: the headline metric, the steps, convergence and time."""
    headline = run.task.headline
    return [
        f"eval {name}: {headline} {m[headline]:.4f}  nstep_mean {m['nstep_mean']:.1f}  "
        f"converged {m['converged']:.3f}  {m['seconds_per_batch'] * 1e3:.1f} ms per batch"
        for name, m in comparison.items()
    ]


LANGUAGE = SolverFamily(
    what="language model",
    short="LM",
    train_hint="python -m launch.main --config configs/lm_shakespeare.py --workdir DIR",
    training=LanguageModelFamily,
    extras=lambda run: (MEMS,),
    batches=_segments,
    held_out=_held_out,
    score=score_stream,
    eval_lines=_lines,
    twice_unroll=True,
)
