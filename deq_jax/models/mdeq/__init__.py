"""The multiscale deep equilibrium model (MDEQ) for image classification.

One equilibrium over several resolutions at once: the state is a tuple of feature maps
``[B, H / 2^i, W / 2^i, C_i]``, highest resolution first, and the cell runs a residual
block per resolution and fuses every resolution into every other.

* `blocks`: `ResidualBlock`, the fusion paths `Downsample` / `Upsample`, and
  `MultiscaleFusion`;
* `cell`: `MultiscaleCell`, the equilibrium cell (with ``state_spec``);
* `head`: `Bottleneck` and `ClassificationHead`, the readout of all resolutions;
* `model`: the input `Stem`, `MDEQ` (modes ``"deq"`` and ``"weight_tied"``) and the sizes `TINY`,
  `SMALL` and `LARGE` of locuslab's configs.

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
  (github.com/locuslab/mdeq).
"""

from deq_jax.models.mdeq.blocks import Downsample, MultiscaleFusion, ResidualBlock, Upsample
from deq_jax.models.mdeq.cell import MultiscaleCell
from deq_jax.models.mdeq.head import Bottleneck, ClassificationHead
from deq_jax.models.mdeq.model import LARGE, MDEQ, MODES, SMALL, TINY, Stem

__all__ = [
    "LARGE",
    "MDEQ",
    "MODES",
    "SMALL",
    "TINY",
    "Bottleneck",
    "ClassificationHead",
    "Downsample",
    "MultiscaleCell",
    "MultiscaleFusion",
    "ResidualBlock",
    "Stem",
    "Upsample",
]
