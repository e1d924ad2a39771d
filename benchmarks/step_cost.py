"""Memory and speed of a task model's train and eval steps as the forward budget grows.

For each forward budget (``--budgets``) and backward mode (``--backwards``: the implicit
``ift`` and plain backprop through the solver iterations, ``unrolled``, or any other
mode's name), compiles the train step of the config's model (with its ``regularizer``
and ``path_independence`` sections, as `launch.main` trains it) on one batch of
``train.batch_size`` examples, reads
XLA's memory analysis of the compiled program (``temp_size_in_bytes``: the step's
working memory besides its arguments and outputs), then times the step and an eval
forward pass (median of ``--repeats`` calls after the compile). Every solve runs its
whole budget (``full_budget``), so the budgets really differ. The DEQ claim is that the
implicit backward's memory does not grow with the forward budget, while backprop's
grows linearly::

    python -m benchmarks.step_cost --config configs/mdeq_fashion_mnist.py --workdir /tmp/cost

``--synthetic`` draws standard-normal images of ``--input_shape`` (default: the task's)
and random labels instead of reading the task's data, for an accelerator without the
data set (``--input_shape=32,32,3`` for CIFAR-10). Writes ``{workdir}/step_cost.json``
and prints a table with images per second. The parameters are the fresh
initialisation (cost does not depend on the weights).

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019 (Table 1: memory).
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from absl import flags

from deq_jax.training.run.writers import write_json
from launch import flags as launch_flags

_BUDGETS = flags.DEFINE_list("budgets", ["18", "36", "72"], "Forward budgets.")
_BACKWARDS = flags.DEFINE_list("backwards", ["ift", "unrolled"], "Backward modes.")
_REPEATS = flags.DEFINE_integer(
    "repeats", 3, "Timed steps per setting (median kept); 0: compile only (memory, no times)."
)
_SYNTHETIC = flags.DEFINE_bool("synthetic", False, "Random images instead of the task's.")
_INPUT_SHAPE = flags.DEFINE_list("input_shape", [], "H,W,C of synthetic images.")
_SPECTRAL_ITERS = flags.DEFINE_integer(
    "spectral_iters",
    0,
    "Also time the spectral-radius diagnostic (`regularizer.spectral_every`'s step) with "
    "this many power iterations; 0: not timed.",
)


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    import jax
    import numpy as np

    times = []
    for _ in range(repeats + 1):  # the first call is a warm-up
        began = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - began)
    return float(np.median(times[1:]))


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """The median of ``repeats`` calls of ``fn`` after a warm-up, in milliseconds."""
    return 1e3 * _median_seconds(fn, repeats)


def _batch(config, workdir: str, synthetic: bool, input_shape: Sequence[int]):
    """One host batch ``{"inputs", "targets", "mask", "index"}`` and the metrics fn."""
    import numpy as np

    from deq_jax.tasks.images import classification_accuracy
    from deq_jax.training.run import build

    b = config.train.batch_size
    if synthetic:
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 3:
            raise ValueError(f"--synthetic needs --input_shape=H,W,C, got {input_shape}.")
        rng = np.random.default_rng(0)
        batch = {
            "inputs": rng.standard_normal((b, *shape)).astype(np.float32),
            "targets": rng.integers(0, config.model.num_classes, b).astype(np.int32),
            "mask": np.ones(b, bool),
            "index": np.arange(b, dtype=np.int32),
        }
        return batch, classification_accuracy
    task = build.build_task(config.task, workdir)
    task.prepare()
    batch = next(task.train_iterator(b, seed=0))
    return batch, task.metrics


def _times(model, step, state, batch, repeats: int, spectral_step=None) -> dict:
    """Median seconds and images per second of the train step and an eval forward, and
    the seconds of ``spectral_step`` when one is given."""
    import jax

    from deq_jax.training.families.steps import RNG_STREAMS

    holder = {"state": state}

    def train_once():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics

    train_seconds = _median_seconds(train_once, repeats)
    forward = jax.jit(
        lambda variables, x, rngs: model.apply(variables, x, train=False, rngs=rngs)[0]
    )
    variables = holder["state"].variables()
    rngs = holder["state"].step_rngs(*RNG_STREAMS)  # as the eval step: z_init="mixed" draws
    eval_seconds = _median_seconds(lambda: forward(variables, batch["inputs"], rngs), repeats)
    b = batch["inputs"].shape[0]
    times = {
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "train_images_per_second": b / train_seconds,
        "eval_images_per_second": b / eval_seconds,
    }
    if spectral_step is not None:
        state = holder["state"]
        times["spectral_seconds"] = _median_seconds(lambda: spectral_step(state, batch), repeats)
    return times


def measure(
    config,
    workdir: str,
    budgets: Sequence[int],
    backwards: Sequence[str],
    repeats: int,
    synthetic: bool = False,
    input_shape: Sequence[int] = (),
    spectral_iters: int = 0,
) -> list[dict]:
    """``[{backward, budget, temp_bytes, train_seconds, eval_seconds, ...}]`` per setting
    (without the times for ``repeats=0``; with ``spectral_seconds``, the spectral-radius
    diagnostic of ``spectral_iters`` power iterations, when that is positive)."""
    import jax
    import jax.numpy as jnp

    from deq_jax.training.families.interventions import PathIndependence
    from deq_jax.training.families.regularizer import JacobianRegularizer
    from deq_jax.training.families.steps import make_spectral_step, make_train_step
    from deq_jax.training.run import build, sharding
    from deq_jax.training.run.optim import make_optimizer
    from deq_jax.training.run.state import create_train_state

    host_batch, metrics_fn = _batch(config, workdir, synthetic, input_shape)
    mesh = sharding.make_mesh()
    batch = sharding.shard_batch(host_batch, mesh)
    b = int(host_batch["inputs"].shape[0])
    rows = []
    for backward in backwards:
        for budget in budgets:
            cfg = config.copy_and_resolve_references()
            with cfg.unlocked():
                cfg.deq.backward.name = backward
                cfg.deq.solver.full_budget = True
                cfg.deq.train_max_iter = cfg.deq.eval_max_iter = budget
                cfg.deq.backward.ift.max_iter = budget
            model = build.build_model(cfg.model, build.build_deq_spec(cfg.deq))
            tx, schedule = make_optimizer(cfg.train)
            sample = jnp.zeros((1, *host_batch["inputs"].shape[1:]), jnp.float32)
            state = create_train_state(model, tx, sample, jax.random.PRNGKey(0))
            state = sharding.replicate(state, mesh)
            step = make_train_step(
                model,
                metrics_fn,
                schedule,
                mesh,
                regularizer=JacobianRegularizer.from_config(cfg.get("regularizer", {})),
                interventions=PathIndependence.from_config(cfg.get("path_independence", {})),
            )
            compiled = step.lower(state, batch).compile()
            memory = compiled.memory_analysis()
            row = {
                "backward": backward,
                "budget": budget,
                "batch_size": b,
                "temp_bytes": int(memory.temp_size_in_bytes),
                "argument_bytes": int(memory.argument_size_in_bytes),
                "device": jax.devices()[0].device_kind,
                "device_count": jax.device_count(),
            }
            if repeats:
                spectral = None
                if spectral_iters:
                    spectral = make_spectral_step(model, mesh, spectral_iters)
                row.update(_times(model, step, state, batch, repeats, spectral))
            rows.append(row)
    return rows


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    config, workdir = launch_flags.CONFIG.value, launch_flags.WORKDIR.value
    os.makedirs(workdir, exist_ok=True)
    rows = measure(
        config,
        workdir,
        [int(b) for b in _BUDGETS.value],
        list(_BACKWARDS.value),
        _REPEATS.value,
        _SYNTHETIC.value,
        _INPUT_SHAPE.value,
        _SPECTRAL_ITERS.value,
    )
    print(
        f"{'backward':10s} {'budget':>6s} {'working MiB':>12s} {'train s':>8s} "
        f"{'train img/s':>12s} {'eval img/s':>11s} {'spectral s':>10s}"
    )
    for r in rows:
        times = (
            f"{r['train_seconds']:8.3f} {r['train_images_per_second']:12.1f} "
            f"{r['eval_images_per_second']:11.1f}"
            if "train_seconds" in r
            else f"{'-':>8s} {'-':>12s} {'-':>11s}"
        )
        times += f" {r['spectral_seconds']:10.3f}" if "spectral_seconds" in r else f" {'-':>10s}"
        print(f"{r['backward']:10s} {r['budget']:6d} {r['temp_bytes'] / 2**20:12.1f} {times}")
    path = os.path.join(workdir, "step_cost.json")
    write_json(path, {"rows": rows}, indent=2)
    print(f"Wrote {path}", flush=True)


if __name__ == "__main__":
    launch_flags.run(main)
