"""A neural solver for a trained DEQ-Transformer language model.

`deq_jax.training.hypersolver` for a language model: the config is the LM's own plus a
``neural_solver`` section whose ``deq_workdir`` names the trained LM. The run

1. restores the LM (`setup_language_model`) and freezes its DEQ (`FrozenDEQ`; the
   initialiser reads the injection of the DEQ's input, the memory rides along in the
   cell's arguments);
2. streams training segments with the segment memory, as in training, and solves
   ``target_batches`` of them to their fixed points with Anderson run long;
3. fits HyperAnderson and the paper's LM initialiser (a causal convolution of width
   ``init_kernel_size`` over the injection, ReLU, a linear map to the state;
   `deq_jax.neural_solver.SequenceInitializer`) with the LM frozen; each residual is
   compressed per sequence by ``pool`` (``"last"`` token or ``"mean"``);
4. streams ``eval.max_batches`` validation segments with Anderson and with the neural
   solver at ``deq.neural_solver.max_iter`` (and the neural solver at twice its trained
   ``unroll_steps``) and writes ``neural_solver.json``: bits per character, solver
   steps, wall time per segment batch, the solver's size and fitting time against the
   LM's.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 5.1, the
  language model).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import jax

from deq_jax.solvers.anderson import anderson
from deq_jax.training.evaluate import read_train_seconds
from deq_jax.training.frozen_deq import FrozenDEQ
from deq_jax.training.hypersolver import (
    REPORT_FILE,
    HyperSolverRun,
    count_params,
    fit_and_report,
    read_solver_report,
    restore_frozen,
    restore_solvers,
)
from deq_jax.training.lm_evaluate import StreamEvaluator
from deq_jax.training.lm_setup import setup_language_model
from deq_jax.training.lm_train import REPORT_FILE as LM_REPORT_FILE
from deq_jax.training.solver_fit import NeuralSolverSpec, SolverFit

# The batch key under which the segment memory reaches the model (a model keyword).
MEMS = "mems"


def restore_lm(config: Any, emit: Callable[[str], None] = print) -> tuple[Any, FrozenDEQ]:
    """The trained LM of ``config.neural_solver.deq_workdir`` and its `FrozenDEQ`
    (`restore_frozen` with `setup_language_model`; the memory is a cell argument).

    Raises:
      ValueError: if ``deq_workdir`` is empty or holds no checkpoint.
    """
    return restore_frozen(
        config,
        setup_language_model,
        what="language model",
        train_hint="python -m launch.main --config configs/lm_shakespeare.py --workdir DIR",
        extras=lambda run: (MEMS,),
        emit=emit,
    )


def segments_with_memory(
    run: Any, variables: Any, batch_size: int, seq_len: int, *, warm: int = 1
) -> Iterator[dict[str, Any]]:
    """Training segments ``{"inputs", "mems"}`` in stream order, each with the memory the
    model built over the previous segments (the first ``warm`` segments only fill it)."""
    model = run.model
    advance = jax.jit(lambda v, t, m: model.apply(v, t, mems=m, train=False).mems)
    fresh = model.init_mems(batch_size)
    mems = fresh
    batches = run.task.train_iterator(batch_size, seq_len)
    for i, batch in enumerate(batches):
        if batch["reset"]:
            mems = fresh
        if i >= warm:
            yield {"inputs": batch["inputs"], MEMS: mems}
        mems = advance(variables, batch["inputs"], mems)


def evaluate_solvers(
    config: Any, run: Any, frozen: FrozenDEQ, fitted: SolverFit, spec: NeuralSolverSpec
) -> dict[str, dict[str, float]]:
    """Validation metrics streamed over ``eval.max_batches`` segments: Anderson and the
    neural solver at ``spec.max_iter``, the neural solver at ``2 * unroll_steps``; each
    with ``seconds_per_batch`` (the first, compiling, segment excluded)."""
    ec = config.eval
    split = run.task.eval_splits[0]
    lineup = {
        "anderson": (frozen.with_solver(anderson(tol=spec.tol, max_iter=spec.max_iter)), None),
        "neural": (frozen.with_solver(fitted.solver, fitted.init or "keep"), None),
        "neural_2K": (
            frozen.with_solver(fitted.solver, fitted.init or "keep"),
            2 * spec.unroll_steps,
        ),
    }
    out = {}
    for name, (model, budget) in lineup.items():
        evaluator = StreamEvaluator(
            model,
            run.task,
            run.mesh,
            ec.batch_size,
            ec.seq_len or config.train.seq_len,
            ec.max_batches,
        )
        metrics = evaluator.evaluate(run.state, split, max_iter=budget or spec.max_iter)
        batches = max((ec.max_batches or 0) - 1, 1)
        metrics["seconds_per_batch"] = metrics["seconds"] / batches
        out[name] = {k: float(v) for k, v in metrics.items()}
    return out


def train_lm_hypersolver(
    config: Any, workdir: str, *, emit: Callable[[str], None] = print
) -> HyperSolverRun:
    """Fits a neural solver (and, with ``ablations``, its ablations) to a trained LM.

    Args:
      config: the LM's config with a ``neural_solver`` section
        (``configs/lm_shakespeare_hypersolver.py``).
      workdir: where the solver's checkpoints and ``neural_solver.json`` go.
      emit: receives every human-readable line.

    Returns:
      A `HyperSolverRun` (``deq`` is the LM's `LMRun`).

    Raises:
      ValueError: if the LM's workdir has no checkpoint or its fixed points cannot be
        found to ``max_target_residual``.
    """
    spec = NeuralSolverSpec.from_run_config(config)
    os.makedirs(workdir, exist_ok=True)
    run, frozen = restore_lm(config, emit)
    fits, report = fit_and_report(
        spec,
        frozen,
        segments_with_memory(run, frozen.variables, spec.batch_size, config.train.seq_len),
        workdir,
        deq_params=count_params(run.state.params),
        deq_seconds=read_train_seconds(spec.deq_workdir, LM_REPORT_FILE),
        evaluate=lambda main: evaluate_solvers(config, run, frozen, main, spec),
        what="LM",
        emit=emit,
    )
    path = os.path.join(workdir, REPORT_FILE)
    headline = run.task.headline
    for name, m in report["eval"].items():
        emit(
            f"eval {name}: {headline} {m[headline]:.4f}  nstep_mean {m['nstep_mean']:.1f}  "
            f"converged {m['converged']:.3f}  {m['seconds_per_batch'] * 1e3:.1f} ms per batch"
        )
    emit(f"Wrote {path}")
    solvers = {name: (f.solver, f.init) for name, f in fits.items()}
    return HyperSolverRun(run, frozen, solvers, report)


def load_lm_hypersolver(
    config: Any, workdir: str, emit: Callable[[str], None] = print
) -> HyperSolverRun:
    """Restores the solvers `train_lm_hypersolver` wrote to ``workdir`` (and the LM).

    Raises:
      FileNotFoundError: if ``workdir`` holds no ``neural_solver.json``.
    """
    report = read_solver_report(workdir)
    run, frozen = restore_lm(config, emit)
    return HyperSolverRun(run, frozen, restore_solvers(report, workdir), report)
