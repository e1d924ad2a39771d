"""The learned initialiser ``h_phi``: the input injection mapped to a first state ``z0``.

One small linen module per kind of state, each mapping the injection ``x [B, ..., C_in]``
to ``[B, ..., features]`` (the same leading axes, the state's channels):

* `SequenceInitializer` for ``[B, L, C]``: a causal 1-D convolution, ReLU, a linear layer.
* `ImageInitializer` for ``[B, H, W, C]``: one 3x3 convolution.
* `VectorInitializer` for ``[B, D]``: one linear layer.
* `MultiscaleInitializer` for a multiscale state (a tuple of ``[B, H/2^i, W/2^i, C_i]``,
  `deq_jax.models.mdeq.MDEQ`) from an injection ``[B, H, W, C_in]`` at the highest
  resolution: per resolution, the injection average-pooled to that resolution and one
  3x3 convolution.

The last layer starts at zero weight and bias, so an untrained initialiser returns the
zero state of a classic DEQ and training moves it towards the fixed points. Use it as
``z0 = initializer.apply(init_params, x)`` for `deq_jax.fixed_point` or as the ``z0`` of
a `deq_jax.nn.DEQ` call. `LearnedInit` freezes a trained initialiser into a hashable
callable ``x -> z0``, which a `deq_jax.nn.DEQ` (or a task model) takes as its ``z_init``.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Sec. 4.1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax

from deq_jax.neural_solver.params import FrozenParams
from deq_jax.nn.conv import Conv

INITIALIZER_KINDS = ("sequence", "image", "vector", "multiscale")

_zeros = nn.initializers.zeros


# The key of a DEQ's injected input that an initialiser reads when that input is a
# mapping (the language model's injection next to its segment memory).
INJECTION_KEY = "injection"


def initializer_input(x: Any) -> jax.Array:
    """The array an initialiser reads from a DEQ's injected input ``x``: ``x`` itself,
    or ``x["injection"]`` when ``x`` is a mapping (e.g. the injection and the memory of
    `deq_jax.models.language.DEQTransformerLM`).

    Raises:
      ValueError: for a mapping without an ``"injection"`` entry.
    """
    if isinstance(x, Mapping):
        if INJECTION_KEY not in x:
            raise ValueError(
                f"A DEQ whose injected input is a mapping ({sorted(x)}) must name the "
                f"initialiser's input {INJECTION_KEY!r}."
            )
        return x[INJECTION_KEY]
    return x


def _check_rank(x: jax.Array, rank: int, kind: str, layout: str) -> None:
    if x.ndim != rank:
        raise ValueError(f"{kind} takes inputs {layout}, got shape {x.shape}.")


class SequenceInitializer(nn.Module):
    """``[B, L, C_in] -> [B, L, features]``: causal conv, ReLU, linear.

    Attributes:
      features: the state's channels.
      hidden: channels of the causal convolution (``features`` if ``None``).
      kernel_size: width of the causal convolution (position ``t`` sees ``t - k + 1..t``).
    """

    features: int
    hidden: int | None = None
    kernel_size: int = 3

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        _check_rank(x, 3, "SequenceInitializer", "[B, L, C]")
        hidden = self.features if self.hidden is None else self.hidden
        h = Conv(hidden, (self.kernel_size,), padding=((self.kernel_size - 1, 0),))(x)
        return nn.Dense(self.features, kernel_init=_zeros, bias_init=_zeros)(nn.relu(h))


class ImageInitializer(nn.Module):
    """``[B, H, W, C_in] -> [B, H, W, features]``: one 3x3 convolution.

    Attributes:
      features: the state's channels.
      kernel_size: the square kernel's side.
    """

    features: int
    kernel_size: int = 3

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        _check_rank(x, 4, "ImageInitializer", "[B, H, W, C]")
        k = (self.kernel_size, self.kernel_size)
        return Conv(self.features, k, padding="SAME", kernel_init=_zeros, bias_init=_zeros)(x)


class VectorInitializer(nn.Module):
    """``[B, D_in] -> [B, features]``: one linear layer.

    Attributes:
      features: the state size.
    """

    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        _check_rank(x, 2, "VectorInitializer", "[B, D]")
        return nn.Dense(self.features, kernel_init=_zeros, bias_init=_zeros)(x)


class MultiscaleInitializer(nn.Module):
    """``[B, H, W, C_in] -> ([B, H, W, C_0], [B, H/2, W/2, C_1], ...)``: per resolution
    ``i`` the injection average-pooled over ``2^i x 2^i`` windows, then one
    convolution.

    Attributes:
      features: the channels of each resolution, highest first.
      kernel_size: the square kernel's side.
    """

    features: tuple[int, ...]
    kernel_size: int = 3

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, ...]:
        _check_rank(x, 4, "MultiscaleInitializer", "[B, H, W, C]")
        k = (self.kernel_size, self.kernel_size)
        out = []
        for i, channels in enumerate(self.features):
            factor = 2**i
            if x.shape[1] % factor or x.shape[2] % factor:
                raise ValueError(
                    f"MultiscaleInitializer: {len(self.features)} resolutions need H and W "
                    f"divisible by {factor}, got {x.shape}."
                )
            xi = nn.avg_pool(x, (factor, factor), strides=(factor, factor)) if i else x
            conv = Conv(channels, k, padding="SAME", kernel_init=_zeros, bias_init=_zeros)
            out.append(conv(xi))  # [B, H / 2^i, W / 2^i, C_i]
        return tuple(out)


def make_initializer(kind: str, features: int | tuple[int, ...], **options) -> nn.Module:
    """The initialiser module of ``kind`` (``"sequence"``, ``"image"``, ``"vector"``
    or ``"multiscale"``).

    Args:
      kind: the kind of state.
      features: the state's channels (its size for vectors; a tuple of channels, one
        per resolution, for ``"multiscale"``).
      **options: the module's other fields (``hidden``, ``kernel_size``).

    Raises:
      ValueError: for an unknown kind (the valid ones are listed).
    """
    modules = {
        "sequence": SequenceInitializer,
        "image": ImageInitializer,
        "vector": VectorInitializer,
        "multiscale": MultiscaleInitializer,
    }
    if kind not in modules:
        raise ValueError(f"kind must be one of {', '.join(INITIALIZER_KINDS)}, got {kind!r}.")
    if (kind == "multiscale") != isinstance(features, tuple):
        raise ValueError(
            "features must be a tuple of channels (one per resolution) for kind "
            f"'multiscale' and an int otherwise; got {features!r} for {kind!r}."
        )
    return modules[kind](features=features, **options)


@dataclasses.dataclass(frozen=True)
class LearnedInit:
    """A trained ``h_phi`` frozen into a hashable callable ``x -> z0``.

    Give it to a `deq_jax.nn.DEQ` (or a task model) as ``z_init``: the DEQ then starts
    every solve at ``h_phi(x)`` of its injected input ``x``, e.g.
    ``model.clone(deq=model.deq.replace(solver=trained.solver, z_init=LearnedInit(...)))``.

    Attributes:
      kind: the initialiser kind (see `make_initializer`).
      features: the state's channels (a tuple, one per resolution, for ``"multiscale"``).
      params: the trained variables (a pytree is wrapped in a `FrozenParams`).
      options: the module's other fields, as ``((name, value), ...)``.
    """

    kind: str
    features: int | tuple[int, ...]
    params: Any
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "params", FrozenParams(self.params))
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))
        make_initializer(self.kind, self.features, **dict(self.options))  # validates

    @property
    def module(self) -> nn.Module:
        """The initialiser module."""
        return make_initializer(self.kind, self.features, **dict(self.options))

    def __call__(self, x: Any) -> Any:
        """``h_phi(x)``, the first state for the injected input ``x`` (`initializer_input`)."""
        x = initializer_input(x)
        z0 = self.module.apply(self.params.tree, x)
        return jax.tree_util.tree_map(lambda z: z.astype(x.dtype), z0)
