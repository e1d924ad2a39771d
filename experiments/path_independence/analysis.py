"""The analysis of one trained run for the path-independence report and study.

* `TASKS`: per task, its config module, the harder split of the paper's Table 1, the
  whole-answer metric; `task_config` builds a task's config with overrides.
* `analyse_run`: the test-time curve at 0.5x-8x the training budget, AA per split,
  attacked AA and the Table 1 row of one run; `aa_cost`: the cost of the AA score
  against one forward solve; `spearman`: the rank correlation of the report and study.

`experiments.path_independence.report` (Table 1, the figures) and
`experiments.path_independence.runner` (the study grid) both build on it.

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deq_jax import analysis
from deq_jax.training.families.evaluate import Evaluator

# Each run's analysis, kept in its workdir so a rerun of the report reuses it.
ANALYSIS_FILE = "path_independence_analysis.json"

# Per task: its config module, the harder split of Table 1, the whole-answer metric and
# the test-time budgets (multiples of the train budget) of Figure 2b.
TASKS = {
    "prefix_sum": dict(
        config="prefix_sum",
        overrides={"task.test_lengths": (32, 64, 128)},
        target="test_128",
        metric="string_accuracy",
    ),
    "mazes": dict(config="mazes", overrides={}, target="test_13", metric="maze_accuracy"),
    "blurry_digits": dict(config="blurry_digits", overrides={}, target=None, metric="accuracy"),
    # Regression: "accuracy" is the mean squared error (lower is better), "correct" the
    # better half of each batch.
    "edge_copy": dict(config="edge_copy", overrides={}, target=None, metric="mse"),
    "matrix_inversion": dict(config="matrix_inversion", overrides={}, target=None, metric="mse"),
}
BUDGET_MULTIPLIERS = (0.5, 1, 2, 4, 8)


def task_config(task: str, overrides: dict[str, Any], smoke: bool = False) -> Any:
    """The task's config (``configs/<name>.py``) with ``"section.field"`` overrides."""
    spec = TASKS[task]
    module = importlib.import_module(f"configs.{spec['config']}")
    config = module.get_config("smoke" if smoke else None)
    for key, value in {**spec["overrides"], **overrides}.items():
        *sections, field = key.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[field] = value
    return config


def _budgets(config: Any, multipliers: Sequence[float] = BUDGET_MULTIPLIERS) -> list[int]:
    base = config.deq.train_max_iter
    return sorted({max(1, int(round(m * base))) for m in multipliers})


def _batch(run: Any, split: str, size: int) -> dict[str, np.ndarray]:
    """The first ``size`` real examples of ``split``, as one host batch."""
    batch = next(iter(run.task.eval_iterator(split, size)))
    keep = np.asarray(batch["mask"], bool)
    return {k: np.asarray(v)[keep] for k, v in batch.items()}


def _whole_correct(outputs: Any, targets: Any, regression: bool = False) -> np.ndarray:
    """``[B]`` bool: every label of the example right (classification); for a
    regression task, a squared error below the batch median (the better half)."""
    if regression:
        err = np.square(np.asarray(outputs) - np.asarray(targets))
        err = err.reshape(err.shape[0], -1).mean(axis=1)
        return err <= np.median(err)
    right = np.asarray(jnp.argmax(outputs, axis=-1)) == np.asarray(targets)
    return right.reshape(right.shape[0], -1).all(axis=1)


def _attacked_metric(outputs: Any, targets: Any, regression: bool) -> float:
    """Whole-answer accuracy of the attacked outputs, or their mean squared error."""
    if regression:
        return float(np.mean(np.square(np.asarray(outputs) - np.asarray(targets))))
    return float(np.mean(_whole_correct(outputs, targets)))


def analyse_run(
    run: Any,
    config: Any,
    target: str,
    metric: str,
    key: jax.Array,
    aa_batch: int = 100,
    attack_batch: int = 32,
    multipliers: Sequence[float] = BUDGET_MULTIPLIERS,
) -> dict:
    """Test-time curve (at ``multipliers`` times the train budget), AA per split (at the
    largest), Table 1 row and per-instance AA of one run."""
    model, variables = run.model, run.state.variables()
    regression = getattr(run.task, "num_classes", None) is None
    budgets = _budgets(config, multipliers)
    evaluator = Evaluator(
        model, run.task, run.mesh, config.eval.batch_size, max_batches=config.eval.max_batches
    )
    curve = []
    for split in run.task.eval_splits:
        for budget in budgets:
            m = evaluator.evaluate(run.state, split, budget)
            curve.append(dict(split=split, max_iter=budget, **m))
    top = budgets[-1]
    extra_keys = tuple(getattr(run.task, "batch_extras", ()))
    aa = {}
    for i, split in enumerate(run.task.eval_splits):
        b = _batch(run, split, aa_batch)
        kwargs = {k: jnp.asarray(b[k]) for k in extra_keys}
        rngs = {"z0": jax.random.fold_in(key, 2 * i)}
        inputs = jnp.asarray(b["inputs"])
        call = analysis.deq_call(model, variables, inputs, max_iter=top, rngs=rngs, **kwargs)
        mean, per = analysis.model_aa_score(
            model,
            variables,
            inputs,
            key=jax.random.fold_in(key, 2 * i + 1),
            max_iter=top,
            first=call,
            **kwargs,
        )
        aa[split] = dict(
            aa=float(mean),
            per_instance=np.asarray(per).tolist(),
            correct=_whole_correct(call.outputs, b["targets"], regression).tolist(),
        )
    b = _batch(run, target, attack_batch)
    kwargs = {k: jnp.asarray(b[k]) for k in extra_keys}
    attack, attacked_out = analysis.model_adversarial_aa(
        model,
        variables,
        jnp.asarray(b["inputs"]),
        key=jax.random.fold_in(key, 99),
        max_iter=top,
        rngs={"z0": jax.random.fold_in(key, 98)},
        model_kwargs=kwargs,
        steps=config.deq.train_max_iter,
        restarts=2,
        lbfgs_iters=10,
    )
    at_target = next(r for r in curve if r["split"] == target and r["max_iter"] == top)
    table = dict(
        aa=aa[target]["aa"],
        accuracy=at_target[metric],
        attacked_aa=float(attack.aa),
        attacked_diverged=float(np.mean(np.asarray(attack.diverged))),
        attacked_accuracy=_attacked_metric(attacked_out, b["targets"], regression),
        split=target,
        max_iter=top,
    )
    return dict(table=table, test_time=curve, aa=aa)


def aa_cost(run: Any, split: str, aa_batch: int = 100, repeats: int = 5) -> dict[str, float]:
    """Median seconds of `model_aa_score` and of one forward solve, and their ratio."""
    model, variables = run.model, run.state.variables()
    b = _batch(run, split, aa_batch)
    x = jnp.asarray(b["inputs"])
    kw = {k: jnp.asarray(b[k]) for k in getattr(run.task, "batch_extras", ())}
    rngs, key = {"z0": jax.random.key(0)}, jax.random.key(1)
    forward = jax.jit(lambda v, x: model.apply(v, x, train=False, rngs=rngs, **kw)[0])
    score = jax.jit(lambda v, x: analysis.model_aa_score(model, v, x, key=key, rngs=rngs, **kw)[0])

    def median_time(fn):
        jax.block_until_ready(fn(variables, x))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(variables, x))
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    t_fwd, t_aa = median_time(forward), median_time(score)
    return dict(forward_s=t_fwd, aa_s=t_aa, ratio=t_aa / t_fwd, split=split)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])
