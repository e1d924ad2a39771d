"""Achieved FLOP/s of a jitted function and its fraction of the chip's peak.

XLA counts the floating-point operations of a compiled function
(``jax.jit(f).lower(...).compile().cost_analysis()``, its ``"flops"``: 2 per
multiply-add of every matmul and convolution, 1 per elementwise operation;
transcendentals such as ``tanh`` and ``exp`` are counted apart and left out);
`cost_flops` reads that count whichever shape a backend returns it in (a dict, a list
of one dict per program, or nothing).
`achieved` divides it by a measured time, and by the chip's peak for the run's
arithmetic when the chip is in `PEAK_TFLOPS`.

Which peak applies depends on the arithmetic of the run (`deq_jax.precision`'s names):

* ``"default"``: TF32 on an NVIDIA GPU (XLA's float32 matmuls and convolutions take
  TensorFloat-32 there), one bfloat16 pass on a TPU;
* ``"float32"``: true float32 (the GPU's FP32 peak; a TPU publishes none);
* ``"bfloat16"``: bfloat16 operands, float32 accumulation (the bfloat16 peak).

An unknown chip (the CPU, a GPU or TPU not in the table) has no peak: its record says
FLOP/s alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

# Dense peaks (no 2:4 sparsity), TFLOP/s per chip, by arithmetic, from the makers' public
# spec sheets: NVIDIA's H100 and H200 product pages (nvidia.com/en-us/data-center/h100/,
# .../h200/: SXM boards; the sheets quote TF32 and BF16 with sparsity, twice the dense
# figure) and the A100 datasheet (nvidia-a100-datasheet, SXM and PCIe alike); Google
# Cloud's TPU pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e: bf16 per chip).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "NVIDIA H100 SXM": {"bf16": 989.0, "tf32": 495.0, "fp32": 67.0},
    "NVIDIA H200": {"bf16": 989.0, "tf32": 495.0, "fp32": 67.0},
    "NVIDIA A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "TPU v4": {"bf16": 275.0},
    "TPU v5e": {"bf16": 197.0},
    "TPU v5p": {"bf16": 459.0},
    "TPU v6e": {"bf16": 918.0},
}

# ``jax.devices()[0].device_kind`` -> the table's chip, exact names first. PCIe and NVL
# boards of the H100 and H200 run lower clocks and are not in the table (no peak).
_KINDS = {
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
    "NVIDIA H200": "NVIDIA H200",
    "TPU v4": "TPU v4",
    "TPU v5 lite": "TPU v5e",
    "TPU v5e": "TPU v5e",
    "TPU v5": "TPU v5p",
    "TPU v5p": "TPU v5p",
    "TPU v6 lite": "TPU v6e",
    "TPU v6e": "TPU v6e",
}
_A100 = ("NVIDIA A100-SXM4", "NVIDIA A100-PCIE", "NVIDIA A100 80GB PCIe")

# The arithmetic of each precision name, per platform (``None``: no published peak).
_ARITHMETIC = {
    "gpu": {"default": "tf32", "float32": "fp32", "bfloat16": "bf16"},
    "tpu": {"default": "bf16", "float32": None, "bfloat16": "bf16"},
}


def chip(device_kind: str) -> str | None:
    """The `PEAK_TFLOPS` chip of a ``device_kind`` (``None``: not in the table)."""
    if device_kind in _KINDS:
        return _KINDS[device_kind]
    return "NVIDIA A100" if device_kind.startswith(_A100) else None


def arithmetic(platform: str, precision: str) -> str | None:
    """The arithmetic (``"tf32"``, ``"fp32"``, ``"bf16"``) a ``precision`` (module
    docstring) computes in on ``platform`` (``"gpu"``, ``"tpu"``, ``"cpu"``, ...);
    ``None`` where no chip publishes a peak for it.

    Raises:
      ValueError: for an unknown precision, naming the valid ones.
    """
    names = _ARITHMETIC["gpu"]
    if precision not in names:
        raise ValueError(f"Unknown precision {precision!r}. Valid precisions: {', '.join(names)}.")
    return _ARITHMETIC.get(platform, {}).get(precision)


def peak_tflops(device_kind: str, platform: str, precision: str) -> tuple[str, float] | None:
    """``(arithmetic, dense peak TFLOP/s)`` of one chip for ``precision``; ``None`` for
    a chip not in `PEAK_TFLOPS` or an arithmetic it publishes no peak for."""
    name, kind = chip(device_kind), arithmetic(platform, precision)
    if name is None or kind is None or kind not in PEAK_TFLOPS[name]:
        return None
    return kind, PEAK_TFLOPS[name][kind]


def cost_flops(cost: Mapping[str, Any] | list | None) -> float | None:
    """The ``"flops"`` of a ``cost_analysis()`` result: a dict, a list of one dict per
    program (summed), or ``None``; ``None`` when the backend counted none."""
    if cost is None:
        return None
    programs = [cost] if isinstance(cost, Mapping) else list(cost)
    counts = [float(p["flops"]) for p in programs if p and p.get("flops") is not None]
    total = sum(counts)
    return total if counts and total > 0 else None


def compiled_flops(f: Callable, *args: Any) -> float | None:
    """XLA's count of the floating-point operations of one ``jax.jit(f)(*args)``
    (`cost_flops`; ``None`` when the backend counts none)."""
    return cost_flops(jax.jit(f).lower(*args).compile().cost_analysis())


def achieved(
    flops: float | None, seconds: float, device_kind: str, platform: str, precision: str
) -> dict[str, Any]:
    """What ``flops`` operations in ``seconds`` achieve on the chip.

    Returns:
      ``{"flops", "tflops_per_s", "precision", "arithmetic", "peak_tflops",
      "fraction_of_peak"}``; the last three ``None`` without a known peak, the rate and
      the fraction ``None`` without a count.

    Raises:
      ValueError: for ``seconds <= 0`` or an unknown precision.
    """
    if not seconds > 0:
        raise ValueError(f"A rate needs a positive time, got {seconds} s.")
    peak = peak_tflops(device_kind, platform, precision)
    kind, top = peak if peak else (None, None)
    rate = flops / seconds / 1e12 if flops else None
    return {
        "flops": flops,
        "tflops_per_s": rate,
        "precision": precision,
        "arithmetic": kind,
        "peak_tflops": top,
        "fraction_of_peak": rate / top if rate is not None and top else None,
    }
