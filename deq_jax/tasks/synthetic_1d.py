"""The 1-D regression set of the Jacobian-regularisation paper.

``y = 1.5 x^3 + x^2 - 5 x + 2 sin(x) - 3 + noise`` with Gaussian noise of standard
deviation 0.05; 5,096 pairs, the first 4,096 for training and the last 1,000 for
validation. The paper does not state the range of ``x``; we draw it uniformly from
``[-2, 2]`` (``x_range``), an interval that holds both turning points of the cubic
(near ``x = -1.23`` and ``x = 0.68``), so the curve is non-monotone and a cell must
bend twice. The set is a pure function of `Synthetic1DConfig` (numpy only; no tfds:
5,096 rows are generated in well under a millisecond, so nothing is stored).

Batches are ``{"inputs": float32 [b, 1], "targets": float32 [b, 1], "mask": bool [b],
"index": int32 [b]}``; `Synthetic1DTask.metrics` is the mean squared error.

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (the synthetic experiment: a DEQ fit to this curve grows unstable, with an
  exploding spectral radius of ``J_f``, unless the Jacobian is regularised).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from deq_jax.tasks.base import Task

TRAIN, VALIDATION = "train", "validation"
SPLITS = (TRAIN, VALIDATION)


def target_function(x: np.ndarray) -> np.ndarray:
    """The noise-free curve ``1.5 x^3 + x^2 - 5 x + 2 sin(x) - 3``."""
    return 1.5 * x**3 + x**2 - 5.0 * x + 2.0 * np.sin(x) - 3.0


@dataclasses.dataclass(frozen=True)
class Synthetic1DConfig:
    """What to generate (frozen, hashable).

    Attributes:
      seed: seeds the inputs and the noise.
      train_size: training pairs (4,096 in the paper).
      validation_size: validation pairs (1,000 in the paper).
      noise_std: standard deviation of the additive Gaussian noise (0.05).
      x_range: ``(low, high)`` of the uniform inputs.
    """

    seed: int = 0
    train_size: int = 4096
    validation_size: int = 1000
    noise_std: float = 0.05
    x_range: tuple[float, float] = (-2.0, 2.0)

    def __post_init__(self):
        if self.train_size < 1 or self.validation_size < 1:
            raise ValueError(
                f"train_size and validation_size must be >= 1, got {self.train_size} and "
                f"{self.validation_size}."
            )
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {self.noise_std}.")
        low, high = self.x_range
        if not low < high:
            raise ValueError(f"x_range must be (low, high) with low < high, got {self.x_range}.")

    def size(self, split: str) -> int:
        """Pairs in ``split``."""
        check_split(split)
        return self.train_size if split == TRAIN else self.validation_size


def check_split(split: str) -> None:
    """Raises a ValueError listing the valid splits for an unknown one."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}. Valid splits: {', '.join(SPLITS)}.")


def generate(config: Synthetic1DConfig = Synthetic1DConfig()) -> dict[str, dict[str, np.ndarray]]:
    """Both splits, drawn in one go from ``config.seed``.

    Returns:
      ``{split: {"inputs": float32 [N, 1], "targets": float32 [N, 1]}}``; the training
      pairs come first in the draw, so changing ``validation_size`` keeps them.
    """
    rng = np.random.default_rng(np.random.SeedSequence([config.seed]))
    n = config.train_size + config.validation_size
    x = rng.uniform(*config.x_range, size=(n, 1))  # [N, 1]
    y = target_function(x) + config.noise_std * rng.standard_normal((n, 1))  # [N, 1]
    cut = config.train_size
    return {
        TRAIN: {"inputs": x[:cut].astype(np.float32), "targets": y[:cut].astype(np.float32)},
        VALIDATION: {"inputs": x[cut:].astype(np.float32), "targets": y[cut:].astype(np.float32)},
    }


def mean_squared_error(predictions, targets, mask=None) -> dict:
    """Mean squared error over the real examples; works on numpy or jax arrays, jittable.

    Args:
      predictions: ``[B, ...]``.
      targets: ``[B, ...]``, the same shape.
      mask: optional ``[B]`` bool, which examples count (padding is False).

    Returns:
      ``{"mse": mean over counted examples of the per-example mean squared error,
      "count": number of counted examples}``; combine batches with
      `deq_jax.tasks.data.weighted_mean`.
    """
    if predictions.shape != targets.shape or predictions.ndim < 1:
        raise ValueError(
            f"predictions and targets need equal shapes [B, ...], got {predictions.shape} "
            f"and {targets.shape}."
        )
    err = jnp.square(jnp.asarray(predictions, jnp.float32) - jnp.asarray(targets, jnp.float32))
    per_example = jnp.mean(err.reshape(err.shape[0], -1), axis=1)  # [B]
    weight = jnp.ones(err.shape[0]) if mask is None else jnp.asarray(mask, jnp.float32)
    count = jnp.sum(weight)
    return {"mse": jnp.sum(weight * per_example) / jnp.maximum(count, 1.0), "count": count}


class Synthetic1DTask(Task):
    """The 1-D regression task behind the uniform task interface (see `deq_jax.tasks`).

    Args:
      config: what to generate.
    """

    name = "synthetic_1d"
    num_classes = None  # a regression task: one real output per example
    num_outputs = 1
    input_shape = (1,)
    train_split = TRAIN
    eval_splits = (VALIDATION,)
    validation_split = VALIDATION
    splits = SPLITS

    def __init__(self, config: Synthetic1DConfig = Synthetic1DConfig()):
        self.config = config
        self._arrays: dict[str, dict[str, np.ndarray]] | None = None

    def num_examples(self, split: str) -> int:
        """Pairs in ``split``."""
        return self.config.size(split)

    def source(self, split: str) -> dict[str, np.ndarray]:
        """The arrays of ``split`` (see `arrays`)."""
        return self.arrays(split)

    def arrays(self, split: str) -> dict[str, np.ndarray]:
        """``{"inputs": float32 [N, 1], "targets": float32 [N, 1]}`` of ``split``, cached."""
        check_split(split)
        if self._arrays is None:
            self._arrays = generate(self.config)
        return self._arrays[split]

    @staticmethod
    def metrics(predictions, targets, mask=None) -> dict:
        """``{"mse", "count"}``; see `mean_squared_error`."""
        return mean_squared_error(predictions, targets, mask)


def synthetic_1d(
    *,
    seed: int = 0,
    train_size: int = 4096,
    validation_size: int = 1000,
    noise_std: float = 0.05,
    x_range: tuple[float, float] = (-2.0, 2.0),
    data_dir: str | None = None,
) -> Synthetic1DTask:
    """Builds the 1-D regression task; the registry's constructor.

    ``data_dir`` is accepted for a uniform call signature across tasks and unused:
    nothing is stored.
    """
    del data_dir  # Generated in memory.
    config = Synthetic1DConfig(
        seed=seed,
        train_size=train_size,
        validation_size=validation_size,
        noise_std=noise_std,
        x_range=tuple(x_range),
    )
    return Synthetic1DTask(config)
