"""A DEQ classifier on Fashion-MNIST in Flax NNX: train, evaluate, save, restore.

The model is `deq_jax.nnx.DEQ` around an `deq_jax.nnx.MLPCell` (``z = tanh(W z + U x +
b)`` on the flattened image) and a linear readout of ``z*``; it trains with
``nnx.Optimizer`` and optax's Adam (implicit gradients, Anderson forward solves),
is scored on the 10,000 test images in evaluation mode (``model.eval()``: the evaluation
budget), saved with orbax, restored into a freshly built model and scored again::

    apt-get install -y dataset-fashion-mnist    # the four idx files, read by deq_jax.tasks
    python examples/nnx_fashion_mnist.py --workdir /tmp/nnx_fashion_mnist
    python examples/nnx_fashion_mnist.py --smoke --data_dir DIR --workdir /tmp/x  # seconds

It prints one line per epoch and a final JSON line: the test accuracy before and after
the restore (equal), the wall time and the mean solver steps; it exits non-zero if the
restored model scores differently. Measured accuracy and time: docs/nnx.md.

Needs the ``[train]`` extra (orbax).

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Xiao, Rasul, Vollgraf, "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine
  Learning Algorithms", arXiv:1708.07747, 2017.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

import deq_jax as dj
from deq_jax.tasks import idx_files

# What a run trains: the full run, and the smoke run the test suite makes.
SIZES = {
    "full": dict(features=128, epochs=5, batch_size=128, train_size=None, test_size=None),
    "smoke": dict(features=16, epochs=1, batch_size=32, train_size=128, test_size=64),
}
SPEC = dj.nn.DEQSpec(
    solver=dj.solvers.anderson(m=5, tol=1e-3, stop_mode="rel"),
    backward=dj.backward.ift(),
    train_max_iter=15,
    eval_max_iter=30,
)


class Classifier(nnx.Module):
    """``x [B, 784] -> logits [B, 10]`` through the fixed point of an `MLPCell`."""

    def __init__(self, features: int, *, rngs: nnx.Rngs):
        cell = dj.nnx.MLPCell(28 * 28, features, rngs=rngs)
        self.deq = dj.nnx.DEQ(cell, SPEC, rngs=rngs)
        self.head = nnx.Linear(features, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, dj.SolverStats]:
        z_star, stats = self.deq(x)
        return self.head(z_star), stats


def load(data_dir: str, train_size: int | None, test_size: int | None) -> dict:
    """``{"train": (x, y), "test": (x, y)}``: images flattened, standardised by the
    training set's mean and deviation (float32 ``[N, 784]``), labels int32."""
    raw = idx_files.load_idx_dir(data_dir)
    images = raw["train"][0].reshape(len(raw["train"][0]), -1).astype(np.float32) / 255.0
    mean, std = images.mean(), images.std()
    out = {}
    for split, size in (("train", train_size), ("test", test_size)):
        x, y = raw[split]
        x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - mean) / std
        out[split] = (x[:size], y[:size].astype(np.int32))
    return out


@nnx.jit
def train_step(model: Classifier, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array):
    """One Adam step on the mean cross-entropy; the loss and the mean solver steps."""

    def loss_fn(model):
        logits, stats = model(x)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, stats

    (loss, stats), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss, jnp.mean(stats.nstep)


@nnx.jit
def predict(model: Classifier, x: jax.Array) -> jax.Array:
    return jnp.argmax(model(x)[0], axis=-1)


def accuracy(model: Classifier, x: np.ndarray, y: np.ndarray, batch_size: int = 1000) -> float:
    """The fraction of ``x`` classified right, in evaluation mode."""
    model.eval()
    right = sum(
        int(jnp.sum(predict(model, x[i : i + batch_size]) == y[i : i + batch_size]))
        for i in range(0, len(x), batch_size)
    )
    model.train()
    return right / len(x)


def train(model: Classifier, data: dict, epochs: int, batch_size: int, seed: int) -> float:
    """``epochs`` passes over the shuffled training set; the mean solver steps."""
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    x, y = data["train"]
    order = np.random.default_rng(seed)
    nsteps = []
    for epoch in range(epochs):
        start, losses = time.time(), []
        perm = order.permutation(len(x))
        for i in range(0, len(x) - batch_size + 1, batch_size):
            batch = perm[i : i + batch_size]
            loss, nstep = train_step(model, optimizer, x[batch], y[batch])
            losses.append(float(loss))
            nsteps.append(float(nstep))
        print(
            f"epoch {epoch + 1}: loss {np.mean(losses):.4f}, solver steps "
            f"{np.mean(nsteps[-len(losses) :]):.1f}, {time.time() - start:.1f} s",
            flush=True,
        )
    return float(np.mean(nsteps))


def save_and_restore(model: Classifier, workdir: str, features: int) -> Classifier:
    """Saves ``model``'s state with orbax and restores it into a freshly built model."""
    path = os.path.join(os.path.abspath(workdir), "state")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, nnx.state(model), force=True)
    checkpointer.wait_until_finished()
    abstract = nnx.eval_shape(lambda: Classifier(features, rngs=nnx.Rngs(0)))
    graphdef, template = nnx.split(abstract)
    return nnx.merge(graphdef, checkpointer.restore(path, template))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=idx_files.DEFAULT_FASHION_MNIST_DIR)
    parser.add_argument("--workdir", required=True, help="where the checkpoint goes")
    parser.add_argument("--smoke", action="store_true", help="a few seconds' run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    size = SIZES["smoke" if args.smoke else "full"]
    start = time.time()
    data = load(args.data_dir, size["train_size"], size["test_size"])
    model = Classifier(size["features"], rngs=nnx.Rngs(args.seed))
    nstep = train(model, data, size["epochs"], size["batch_size"], args.seed)
    test = accuracy(model, *data["test"])
    train_seconds = time.time() - start
    restored = save_and_restore(model, args.workdir, size["features"])
    report = {
        "test_accuracy": test,
        "restored_test_accuracy": accuracy(restored, *data["test"]),
        "train_and_test_seconds": round(train_seconds, 1),
        "mean_solver_steps": nstep,
        "epochs": size["epochs"],
        "jax": jax.__version__,
    }
    print(json.dumps(report))
    return 0 if report["restored_test_accuracy"] == test else 1


if __name__ == "__main__":
    sys.exit(main())
