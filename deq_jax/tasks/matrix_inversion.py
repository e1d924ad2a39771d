"""Matrix inversion: map a symmetric positive definite matrix to its inverse.

Generator. ``A = Q diag(s) Q^T`` with ``Q`` a Haar-random orthogonal matrix (QR of a
Gaussian matrix, signs fixed by the diagonal of ``R``) and eigenvalues
``s_i = kappa^(u_i - 1/2)``, where ``u_1 = 0``, ``u_2 = 1`` and the other ``u_i`` are
uniform on ``[0, 1]``. So ``A`` is symmetric positive definite with condition number
exactly ``kappa`` and eigenvalues in ``[kappa^-1/2, kappa^1/2]``, and its inverse
``Q diag(1 / s) Q^T`` (the target, computed from the decomposition, not by a solver)
has the same distribution as ``A``: inputs and targets are on one scale. Training
matrices draw ``kappa`` uniformly from ``train_cond`` (``[1, 5]`` by default); test
split ``"test_cond{c}"`` holds matrices of condition number exactly ``c``, so the
splits beyond 5 are harder than anything seen in training. The validation split
``"valid"`` (``val_size`` matrices, for model selection; none with ``val_size=0``) is
drawn like the training set from a stream of its own.

Training noise. Du et al. 2022 draw a fresh random matrix for every training example;
here the training set is fixed (so ``start_step`` resumes exactly) and fresh noise is
added to its inputs each time a batch is drawn: the training batch at global step
``s`` gets ``A + noise_std * (G + G^T) / 2``, ``G`` standard normal ``[d, d]`` drawn
from ``(seed, s)`` (see `deq_jax.tasks.edge_copy.StepNoiseTask`), so the input
stays symmetric. Targets stay the clean ``A^-1``; evaluation inputs are clean.

Batches are ``{"inputs": float32 [b, d, d], "targets": float32 [b, d, d], "mask":
bool [b], "index": int32 [b]}``; the metric is the mean squared error of the entries.

References:
  Du, Li, Tenenbaum, Mordatch, "Learning Iterative Reasoning through Energy
  Minimization", ICML 2022 (10x10 matrix inversion, harder test matrices).
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from deq_jax.tasks import data
from deq_jax.tasks.edge_copy import StepNoiseTask
from deq_jax.tasks.splits import TRAIN, VALID, HeldOutSplits, SplitSizes
from deq_jax.tasks.synthetic_1d import mean_squared_error

_PREFIX = "test_cond"


def random_spd(
    conds: np.ndarray, dim: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Random symmetric positive definite matrices of given condition numbers.

    Args:
      conds: ``[N]`` condition numbers, each >= 1.
      dim: matrix side ``d`` (>= 2).
      rng: the source of randomness.

    Returns:
      ``(A, A^-1)``, float64 ``[N, d, d]`` each, exactly symmetric (see the module
      docstring for the distribution).
    """
    count = len(conds)
    q, r = np.linalg.qr(rng.standard_normal((count, dim, dim)))  # [N, d, d] each
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]  # Haar-distributed
    u = rng.random((count, dim))  # [N, d]
    u[:, 0], u[:, 1] = 0.0, 1.0  # pin the extreme eigenvalues: condition number = conds
    s = np.exp(np.log(np.asarray(conds, np.float64))[:, None] * (u - 0.5))  # [N, d]
    qt = np.swapaxes(q, 1, 2)
    sym = lambda m: (m + np.swapaxes(m, 1, 2)) / 2
    return sym((q * s[:, None, :]) @ qt), sym((q / s[:, None, :]) @ qt)


@dataclasses.dataclass(frozen=True)
class MatrixInversionConfig(SplitSizes):
    """What to generate (frozen, hashable).

    Attributes:
      seed: seeds every split (independent streams per split).
      train_size: training matrices.
      dim: matrix side ``d`` (10 in Du et al. 2022).
      train_cond: ``(low, high)``; training condition numbers are uniform on it.
      test_conds: one test split ``"test_cond{c}"`` per condition number ``c``.
      test_size: matrices per test split.
      val_size: matrices of the validation split ``"valid"`` (drawn as the training
        ones; 0: none).
      noise_std: scale of the training-input noise (0 disables it).
    """

    seed: int = 0
    train_size: int = 10_000
    dim: int = 10
    train_cond: tuple[float, float] = (1.0, 5.0)
    test_conds: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 50.0)
    test_size: int = 1_000
    val_size: int = 1_000
    noise_std: float = 0.01

    def __post_init__(self):
        object.__setattr__(self, "train_cond", tuple(float(c) for c in self.train_cond))
        object.__setattr__(self, "test_conds", tuple(float(c) for c in self.test_conds))
        for field in ("seed", "train_size", "dim", "test_size", "val_size"):
            value = getattr(self, field)
            least = {"seed": 0, "dim": 2, "val_size": 0}.get(field, 1)
            if not isinstance(value, int | np.integer) or value < least:
                raise ValueError(
                    f"MatrixInversionConfig.{field} must be >= {least}, got {value!r}."
                )
        cond = self.train_cond
        if len(cond) != 2 or not 1.0 <= cond[0] <= cond[1]:
            raise ValueError(
                f"train_cond must be (low, high) with 1 <= low <= high, got {self.train_cond}."
            )
        if not self.test_conds or min(self.test_conds) < 1.0:
            raise ValueError(f"test_conds must be condition numbers >= 1, got {self.test_conds}.")
        if len(set(self.splits)) != len(self.splits):
            raise ValueError(f"test_conds must be distinct, got {self.test_conds}.")
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {self.noise_std}.")

    @property
    def test_splits(self) -> tuple[str, ...]:
        """``("test_cond2", "test_cond5", ...)`` in the order of `test_conds`."""
        return tuple(f"{_PREFIX}{c:g}" for c in self.test_conds)


@functools.lru_cache(maxsize=16)
def generate_split(config: MatrixInversionConfig, split: str) -> dict[str, np.ndarray]:
    """Generates one split, deterministically from ``(config, split)``; cached.

    Returns:
      ``{"inputs": float32 [N, d, d], "targets": float32 [N, d, d], "conds": float32
      [N]}`` (read-only): ``A``, ``A^-1`` and the condition number of ``A``.
    """
    count = config.size(split)
    if split in (TRAIN, VALID):
        rng = np.random.default_rng(
            np.random.SeedSequence([config.seed, 0 if split == TRAIN else 2])
        )
        conds = rng.uniform(*config.train_cond, size=count)
    else:
        cond = config.test_conds[config.test_splits.index(split)]
        rng = np.random.default_rng(np.random.SeedSequence([config.seed, 1, round(cond * 1e6)]))
        conds = np.full(count, cond)
    a, a_inv = random_spd(conds, config.dim, rng)
    out = {
        "inputs": a.astype(np.float32),
        "targets": a_inv.astype(np.float32),
        "conds": conds.astype(np.float32),
    }
    for array in out.values():
        array.flags.writeable = False
    return out


class MatrixInversionTask(HeldOutSplits, StepNoiseTask):
    """The matrix-inversion task behind the uniform task interface (see `deq_jax.tasks`).

    Args:
      config: what to generate.
    """

    name = "matrix_inversion"
    num_classes = None  # a regression task: d * d real outputs
    train_split = TRAIN

    def __init__(self, config: MatrixInversionConfig = MatrixInversionConfig()):
        self.config = config

    @property
    def num_outputs(self) -> int:
        """Outputs per example, ``d * d``."""
        return self.config.dim**2

    @property
    def input_shape(self) -> tuple[int, int]:
        """One input matrix's shape ``(d, d)``, for ``model.init``."""
        return (self.config.dim, self.config.dim)

    def source(self, split: str) -> dict[str, np.ndarray]:
        """The arrays of ``split`` (see `arrays`)."""
        return self.arrays(split)

    def arrays(self, split: str) -> dict[str, np.ndarray]:
        """``{"inputs", "targets"}`` of ``split`` (clean; see `generate_split`)."""
        raw = generate_split(self.config, split)
        return {"inputs": raw["inputs"], "targets": raw["targets"]}

    def num_examples(self, split: str) -> int:
        """Matrices in ``split``."""
        return self.config.size(split)

    def perturb_inputs(self, batch: data.Batch, noise: np.ndarray) -> np.ndarray:
        """``inputs + noise_std * (G + G^T) / 2`` for noise ``G [b, d, d]`` (symmetric)."""
        return batch["inputs"] + self.config.noise_std * (noise + np.swapaxes(noise, 1, 2)) / 2

    @staticmethod
    def metrics(predictions, targets, mask=None) -> dict:
        """``{"mse", "count"}``: mean squared error of the entries of ``A^-1``."""
        return mean_squared_error(predictions, targets, mask)


def matrix_inversion(
    *,
    data_dir: str | None = None,
    seed: int = 0,
    train_size: int = 10_000,
    dim: int = 10,
    train_cond: tuple[float, float] = (1.0, 5.0),
    test_conds: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 50.0),
    test_size: int = 1_000,
    val_size: int = 1_000,
    noise_std: float = 0.01,
) -> MatrixInversionTask:
    """Builds the matrix-inversion task; the registry's constructor.

    See `MatrixInversionConfig`. ``data_dir`` is accepted for a uniform call signature
    and unused (generated in memory).
    """
    del data_dir  # Generated in memory.
    config = MatrixInversionConfig(
        seed=seed,
        train_size=train_size,
        dim=dim,
        train_cond=tuple(train_cond),
        test_conds=tuple(test_conds),
        test_size=test_size,
        val_size=val_size,
        noise_std=noise_std,
    )
    return MatrixInversionTask(config)
