"""MDEQ's classification head: the equilibria of all resolutions read out to classes.

Each resolution's fixed point goes through a `Bottleneck` block that widens it to
``4 * head_channels[i]`` channels (locuslab's ``incre_modules``); the result is merged
downwards, resolution ``i`` reaching ``i + 1`` through a strided 3x3 convolution,
batch norm and ReLU and added there (``downsamp_modules``); the lowest resolution goes
through a 1x1 convolution to ``final_channels``, batch norm and ReLU (``final_layer``),
global average pooling and one dense layer.

Batch norms (outside the equilibrium, as in locuslab) use the batch statistics in
training and the running averages at evaluation: train with ``mutable=["batch_stats"]``
(the train step of `deq_jax.training` does).

References:
  Bai, Koltun & Kolter, "Multiscale Deep Equilibrium Models", NeurIPS 2020
  (Section 3.3; github.com/locuslab/mdeq, ``lib/models/mdeq.py``).
  He, Zhang, Ren & Sun, "Deep Residual Learning for Image Recognition", CVPR 2016
  (the bottleneck block).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from deq_jax.models.mdeq.blocks import conv

BN_MOMENTUM = 0.9  # PyTorch's momentum 0.1
BN_EPS = 1e-5  # PyTorch's


def batch_norm(train: bool, affine: bool = True, name: str | None = None) -> nn.BatchNorm:
    """A batch norm with PyTorch's defaults; ``affine=False`` drops scale and bias."""
    return nn.BatchNorm(
        use_running_average=not train,
        momentum=BN_MOMENTUM,
        epsilon=BN_EPS,
        use_scale=affine,
        use_bias=affine,
        name=name,
    )


class Bottleneck(nn.Module):
    """The bottleneck residual block of the head (locuslab's ``Bottleneck``, stride 1).

    ``relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x))`` with 1x1,
    3x3 and 1x1 convolutions (no bias) to ``planes``, ``planes`` and
    ``4 * planes`` channels and batch norms without scale or bias; the shortcut is the
    identity when ``x`` already has ``4 * planes`` channels, else a 1x1 convolution and
    a batch norm.

    Attributes:
      planes: the bottleneck width; the output has ``4 * planes`` channels.
    """

    expansion: ClassVar[int] = 4

    planes: int

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        """``x [B, h, w, C] -> [B, h, w, 4 * planes]``."""
        out_channels = self.planes * self.expansion
        out = nn.relu(batch_norm(train, False, "bn1")(conv(self.planes, 1, name="conv1")(x)))
        out = nn.relu(batch_norm(train, False, "bn2")(conv(self.planes, 3, name="conv2")(out)))
        out = batch_norm(train, False, "bn3")(conv(out_channels, 1, name="conv3")(out))
        shortcut = x
        if x.shape[-1] != out_channels:
            shortcut = batch_norm(train, name="bn_shortcut")(
                conv(out_channels, 1, name="conv_shortcut")(x)
            )
        return nn.relu(out + shortcut)


class ClassificationHead(nn.Module):
    """Reads the multiscale equilibrium ``z`` out to class scores (module docstring).

    Attributes:
      head_channels: the bottleneck width of every resolution (outputs
        ``4 * head_channels[i]`` channels).
      final_channels: the channels of the last 1x1 convolution.
      num_classes: classes.
    """

    head_channels: tuple[int, ...]
    final_channels: int
    num_classes: int

    @nn.compact
    def __call__(self, zs: tuple[jax.Array, ...], *, train: bool) -> jax.Array:
        """``zs[i] [B, H / 2^i, W / 2^i, C_i]`` -> logits ``[B, num_classes]``."""
        expand = Bottleneck.expansion
        y = Bottleneck(self.head_channels[0], name="incre_0")(zs[0], train=train)
        for i in range(1, len(zs)):
            down = conv(
                expand * self.head_channels[i],
                3,
                strides=2,
                use_bias=True,
                name=f"down_conv_{i - 1}",
            )(y)  # [B, H / 2^i, W / 2^i, 4 c_i]
            down = nn.relu(batch_norm(train, name=f"down_bn_{i - 1}")(down))
            y = Bottleneck(self.head_channels[i], name=f"incre_{i}")(zs[i], train=train) + down
        y = conv(self.final_channels, 1, use_bias=True, name="final_conv")(y)
        y = nn.relu(batch_norm(train, name="final_bn")(y))  # [B, h, w, final]
        pooled = jnp.mean(y, axis=(1, 2))  # [B, final]
        return nn.Dense(self.num_classes, name="classifier")(pooled)
