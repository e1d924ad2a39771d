"""`LanguageModelFamily`: the training loop's part for a language model.

For a text task (`deq_jax.tasks` ``char_text`` / ``wikitext``) and
`deq_jax.models.language.DEQTransformerLM`: batches come in Transformer-XL order (each
row continues the same row of the previous batch), so the step carries the model's
segment memory from step to step, clears it where the data starts a new epoch, and the
checkpoints hold it with the train state (``{"state", "mems"}``: a resumed run continues
exactly). Token ids are checked against the vocabulary on the host before a batch
reaches a step. The first ``train.pretrain_steps`` train the same parameters as a
weight-tied stack (locuslab's warm-up). Evaluation streams a split with the memory and
reports bits per character (character level) or perplexity (word level), the solver's
steps per segment and tokens per second. The final report scores every eval split of
the task (test read once; the first ``eval.report_max_batches`` segments of each, 0:
all) and is written to ``lm_report.json`` with ``train_seconds`` and
``train_tokens_per_second`` (the train steps' time, the first step's compile excluded,
over every invocation since the first). The workdir's ``vocab.json`` records the
vocabulary (`deq_jax.training.families.lm_setup`).

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019.
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from deq_jax.training.families.evaluate import format_report
from deq_jax.training.families.family import Family, Phase, Step, warmup_model
from deq_jax.training.families.lm_evaluate import (
    StreamEvaluator,
    evaluate_lm_checkpoint,
    lm_device_batch,
)
from deq_jax.training.families.lm_setup import setup_language_model
from deq_jax.training.families.lm_steps import make_lm_train_step, place_memory
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.families.setup import Run
from deq_jax.training.run.sharding import shardings_of
from deq_jax.training.run.state import TrainState
from deq_jax.training.run.writers import write_json

REPORT_FILE = "lm_report.json"


class LanguageModelFamily(Family):
    """The training loop's part for a language model (module docstring)."""

    report_file = REPORT_FILE
    advice = (
        "Lower train.learning_rate, raise train.pretrain_steps or add the Jacobian regulariser."
    )
    sparse_metrics = None

    def __init__(self):
        self.regularizer = JacobianRegularizer()
        self.start = 0
        self.train_seconds, self.train_tokens = 0.0, 0.0

    def setup(self, config: Any, workdir: str) -> Run:
        self.regularizer = JacobianRegularizer.from_config(config.get("regularizer", {}))
        run = setup_language_model(config, workdir)
        self.start = run.start_step
        return run

    def describe(self, run: Run) -> str:
        model = run.model
        return f"{model.__class__.__name__} ({model.mode}, vocabulary {run.task.vocab_size})"

    def train_batches(self, config: Any, run: Run) -> Iterator[dict[str, Any]]:
        return run.task.train_iterator(
            config.train.batch_size,
            config.train.seq_len,
            start_step=run.start_step,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )

    def phase(self, config: Any, run: Run, model: Any, warmup: bool) -> Phase:
        tc, ec = config.train, config.eval
        net = warmup_model(model, tc.pretrain_steps) if warmup else model
        template = jax.tree_util.tree_map(np.asarray, model.init_mems(tc.batch_size))
        train_step = make_lm_train_step(
            net,
            run.schedule,
            run.mesh,
            template,
            regularizer=self.regularizer,
            state_sharding=shardings_of(run.state),
        )
        evaluator = StreamEvaluator(
            net, run.task, run.mesh, ec.batch_size, ec.seq_len or tc.seq_len, ec.max_batches
        )
        lower = lambda state, mems, batch: train_step.lower(
            state, mems, lm_device_batch(batch, run.mesh, model.vocab_size)
        )
        step = self._step(train_step, template, run.mesh, model.vocab_size)
        return Phase(step, evaluator, lower)

    def _step(self, train_step, template: Any, mesh, vocab_size: int) -> Step:
        """The loop's `Step`: the memory cleared where the data starts a new epoch, the
        steps' time and tokens counted (the first step, which compiles, excluded)."""
        batch_size = int(np.shape(jax.tree_util.tree_leaves(template)[0])[0])

        def step(state: TrainState, mems: Any, batch: dict[str, Any], number: int):
            if batch["reset"]:
                mems = place_memory(template, mesh, batch_size)
            tokens = lm_device_batch(batch, mesh, vocab_size)
            began = time.perf_counter()
            state, mems, metrics = train_step(state, mems, tokens)
            metrics = jax.device_get(metrics)
            if number > self.start + 1:
                self.train_seconds += time.perf_counter() - began
                self.train_tokens += float(metrics["tokens"])
            return state, mems, metrics

        return step

    def final_report(self, loop: Any, scored: TrainState, step: int):
        """Every eval split of the task streamed at the eval budget (the first
        ``eval.report_max_batches`` segments of each; 0: all), then ``lm_report.json``."""
        config, task, emit = loop.config, loop.run.task, loop.emit
        limit = config.eval.report_max_batches
        segments = f"the first {limit} segments" if limit else "every segment"
        splits = tuple(task.eval_splits)
        best = loop.best.describe()
        emit(f"Final evaluation at step {step} of {best}, on {segments} of {splits}:")
        eval_metrics = loop.evaluate(step, scored=scored, splits=splits, max_batches=limit)
        budget = config.deq.eval_max_iter or config.deq.train_max_iter
        keys = [task.headline, "nstep_mean", "converged"]
        emit(
            f"{task.headline} per split at the eval budget ({budget} iterations):\n"
            + format_report({"eval": eval_metrics}, keys)
        )
        if loop.lead:
            self._write_report(loop, scored, eval_metrics)
        return eval_metrics, eval_metrics

    def _write_report(self, loop: Any, scored: TrainState, eval_metrics: dict) -> None:
        seconds, tokens = self.train_seconds, self.train_tokens
        if loop.previous is not None:  # a finished run continued: its time and tokens too
            before = loop.previous.get("train_seconds") or 0.0
            tokens += (loop.previous.get("train_tokens_per_second") or 0.0) * before
            seconds += before
        report = {
            "step": loop.report_extra["step"],
            "parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(scored.params))),
            "devices": int(loop.run.mesh.devices.size),
            "train_tokens_per_second": tokens / seconds if seconds else None,
            "train_seconds": seconds,
            "eval": eval_metrics,
            "best": loop.report_extra["best"],
        }
        path = os.path.join(loop.workdir, REPORT_FILE)
        write_json(path, report, indent=2)
        loop.emit(f"Wrote {path}")

    def evaluate_checkpoint(self, config: Any, workdir: str, *args: Any, **options: Any) -> dict:
        return evaluate_lm_checkpoint(config, workdir, *args, **options)

    def saved_report(self, previous: Mapping[str, Any]) -> dict:
        return previous["eval"]
