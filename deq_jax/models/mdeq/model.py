"""`MDEQ`: the multiscale deep equilibrium classifier of images, and its sizes.

An input stem maps the image ``[B, H, W, C]`` to ``C_0`` channels at full resolution;
that map is injected into the highest resolution of a `MultiscaleCell`, whose state
holds one feature map per resolution; the `ClassificationHead` reads all resolutions
of the result out to class scores. Two modes share one parameter tree:

* ``"deq"``: the multiscale fixed point ``z* = cell(z*, x)``, solved by
  `deq_jax.nn.DEQ` as the model's `DEQSpec` says (solver, backward mode, initial
  state, budgets, penalty terms);
* ``"weight_tied"``: the explicit network of the same parameters, the cell applied
  ``n_layer`` times from ``z = 0`` with backpropagation through the unroll
  (`deq_jax.nn.run_tied`). It is the explicit baseline of the same depth and
  locuslab's warm-up (``TRAIN.PRETRAIN_STEPS``): ``model.clone(mode="weight_tied")`` for
  the first training steps of a ``"deq"`` model.

Sizes (`TINY`, `SMALL`, `LARGE`: dicts of fields to unpack, ``MDEQ(**TINY)``) come from
locuslab's configs; the DEQ budgets of those configs belong to ``config.deq``:
``F_THRES``/``B_THRES`` are 22/24 for TINY, 26/27 for SMALL and 18/20 for LARGE.

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
  (github.com/locuslab/mdeq).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from deq_jax.models.mdeq.blocks import conv
from deq_jax.models.mdeq.cell import MultiscaleCell, check_channels, check_image
from deq_jax.models.mdeq.head import ClassificationHead, batch_norm
from deq_jax.nn.deq import DEQ, sow_terms
from deq_jax.nn.spec import DEQSpec
from deq_jax.nn.state import initial_state
from deq_jax.nn.unroll import run_tied
from deq_jax.solvers.base import SolverStats

MODES = ("deq", "weight_tied")

# experiments/cifar/cls_mdeq_TINY.yaml: 2 resolutions of 24 channels each.
TINY = dict(
    channels=(24, 24),
    head_channels=(8, 16),
    final_channels=200,
    num_groups=8,
    expansion=5,
    dropout_rate=0.25,
    n_layer=10,
)
# experiments/imagenet/cls_mdeq_SMALL.yaml, the only SMALL classifier of locuslab/mdeq
# (its ImageNet stem downsamples twice; this model's stem keeps the full resolution).
SMALL = dict(
    channels=(32, 64, 128, 256),
    head_channels=(24, 48, 96, 192),
    final_channels=2048,
    num_groups=8,
    expansion=5,
    dropout_rate=0.0,
    n_layer=5,
)
# experiments/cifar/cls_mdeq_LARGE.yaml.
LARGE = dict(
    channels=(32, 64, 128, 256),
    head_channels=(14, 28, 56, 112),
    final_channels=1680,
    num_groups=8,
    expansion=5,
    dropout_rate=0.3,
    n_layer=10,
)

_UNROLL_OPTIONS = ("z0", "stats_probe")  # the DEQ call's options the unroll accepts


class Stem(nn.Module):
    """locuslab's downsample-free (CIFAR) input stem, ``[B, H, W, C] -> [B, H, W, features]``:
    two 3x3 convolutions (the first to ``hidden``, the second to ``features``), each
    followed by a batch norm and a ReLU. Its output is MDEQ's injection.

    Attributes:
      features: the output channels (the cell's ``C_0``).
      hidden: the first convolution's channels (``None``: ``features``).
    """

    features: int
    hidden: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        """``x [B, H, W, C] -> [B, H, W, features]``."""
        for k, width in enumerate((self.hidden or self.features, self.features)):
            x = conv(width, 3, name=f"conv{k}")(x)
            x = nn.relu(batch_norm(train, name=f"bn{k}")(x))  # [B, H, W, width]
        return x


class MDEQ(nn.Module):
    """The multiscale DEQ classifier (module docstring); defaults are `TINY`.

    The `Stem` is locuslab's downsample-free (CIFAR) stem: two 3x3 convolutions (the
    first to ``stem_channels``, the second to ``C_0``), each followed by a batch norm
    and a ReLU. Batch norms live in the stem and the head only (outside the
    equilibrium): train with ``mutable=["batch_stats"]``.

    Attributes:
      num_classes: classes.
      channels: ``C_i`` of every resolution of the state, highest resolution first.
      head_channels: the head's bottleneck width per resolution (same length).
      final_channels: the head's last width before pooling.
      stem_channels: the width of the stem's first convolution (``None``: ``C_0``).
      expansion: the residual blocks' width factor.
      num_groups: groups of the cell's group norms (must divide every ``C_i``).
      weight_norm: weight-normalise the cell's convolutions (the blocks' and the
        post-fusion ones, those locuslab normalises).
      dropout_rate: the cell's variational dropout (one mask per forward pass).
      mode: ``"deq"`` or ``"weight_tied"`` (the same parameters: ``model.clone(mode=...)``
        runs one as the other).
      n_layer: the depth of the weight-tied mode.
      deq: what the DEQ solves with (`deq_jax.nn.DEQSpec`).

    References:
      Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020.
    """

    num_classes: int = 10
    channels: tuple[int, ...] = TINY["channels"]
    head_channels: tuple[int, ...] = TINY["head_channels"]
    final_channels: int = TINY["final_channels"]
    stem_channels: int | None = None
    expansion: int = TINY["expansion"]
    num_groups: int = TINY["num_groups"]
    weight_norm: bool = True
    dropout_rate: float = TINY["dropout_rate"]
    mode: str = "deq"
    n_layer: int = TINY["n_layer"]
    deq: DEQSpec = DEQSpec()

    def __post_init__(self):
        channels = check_channels(self.channels, self.num_groups, self.expansion)
        object.__setattr__(self, "channels", channels)
        object.__setattr__(self, "head_channels", tuple(self.head_channels))
        if len(self.head_channels) != len(self.channels):
            raise ValueError(
                f"head_channels needs one width per resolution: channels {self.channels} has "
                f"{len(self.channels)}, head_channels {self.head_channels} has "
                f"{len(self.head_channels)}."
            )
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        sizes = {
            "num_classes": self.num_classes,
            "final_channels": self.final_channels,
            "n_layer": self.n_layer,
            **{f"head_channels[{i}]": c for i, c in enumerate(self.head_channels)},
        }
        if self.stem_channels is not None:
            sizes["stem_channels"] = self.stem_channels
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        super().__post_init__()

    def _cell(self) -> MultiscaleCell:
        return MultiscaleCell(
            self.channels,
            self.expansion,
            self.num_groups,
            self.weight_norm,
            self.dropout_rate,
            name="cell",
        )

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        *,
        train: bool,
        max_iter: int | None = None,
        **deq_options: Any,
    ) -> tuple[jax.Array, SolverStats]:
        """``x [B, H, W, C] -> (logits [B, num_classes], stats)``.

        Args:
          x: images, ``H`` and ``W`` divisible by ``2^(len(channels) - 1)``.
          train: training mode (batch statistics, dropout with the ``"dropout"`` rng,
            the spec's ``train_max_iter``).
          max_iter: the DEQ's budget for this call (the weight-tied mode ignores it).
          **deq_options: go to the `DEQ` call (``z0``, ``stats_probe``); the
            weight-tied mode starts from ``z0`` if given (else zeros) and leaves the
            probe without gradient.

        Returns:
          The logits and per-sample `deq_jax.SolverStats` (weight-tied: ``nstep`` the
          depth, the residual that of the last step).

        Raises:
          ValueError: for ``x`` not ``[B, H, W, C]`` with ``H`` and
            ``W`` divisible by ``2^(len(channels) - 1)``.
          TypeError: for a keyword the weight-tied mode does not know.
        """
        check_image(x, len(self.channels))
        u = Stem(self.channels[0], self.stem_channels, name="stem")(x, train=train)  # [B,H,W,C_0]
        cell = self._cell()
        if self.mode == "deq":
            deq = DEQ(cell, spec=self.deq, name="deq")
            z, stats = deq(u, train=train, max_iter=max_iter, **deq_options)
        else:
            z, stats = self._weight_tied(cell, u, train, **deq_options)
        head = ClassificationHead(
            self.head_channels, self.final_channels, self.num_classes, name="head"
        )
        return head(z, train=train), stats

    def _weight_tied(
        self, cell: MultiscaleCell, u: jax.Array, train: bool, **options: Any
    ) -> tuple[tuple[jax.Array, ...], SolverStats]:
        """The cell applied ``n_layer`` times from ``z0`` (zeros), with the penalty terms
        of ``deq.terms`` sown at the final state (the alignment penalty is refused)."""
        unknown = sorted(set(options) - set(_UNROLL_OPTIONS))
        if unknown:
            raise TypeError(
                f"MDEQ got unexpected keyword(s) {', '.join(unknown)}; the DEQ call takes "
                f"{', '.join(_UNROLL_OPTIONS)}."
            )
        z0 = options.get("z0")
        if z0 is None:
            z0 = initial_state(cell.state_spec(u), "zeros", None)
        key = self.make_rng("dropout") if train and self.has_rng("dropout") else None
        z, stats, _ = run_tied(self, cell, self.n_layer, u, z0, key)
        if self.deq.terms:
            module, variables = cell.unbind()

            def f(z, args):
                cell_vars, x_in, k = args
                return module.apply(cell_vars, z, x_in, rngs=None if k is None else {"dropout": k})

            def resolve(start):
                raise ValueError("The alignment penalty needs mode='deq'.")

            sow_terms(self, self.deq.terms, f, z, (variables, u, key), resolve)
        return z, stats
