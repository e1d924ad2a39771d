"""`benchmarks.throughput`: the peak table, the arithmetic of each precision, XLA's FLOP
count and the achieved fraction of a chip's peak."""

import jax.numpy as jnp
import pytest

from benchmarks import throughput


@pytest.mark.parametrize(
    "device_kind, chip",
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H200", "NVIDIA H200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100"),
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("NVIDIA H100 PCIe", None),  # lower clocks than the SXM board: not in the table
        ("NVIDIA H200 NVL", None),
        ("cpu", None),
    ],
)
def test_chip_names_the_table_entry_of_a_device_kind(device_kind, chip):
    assert throughput.chip(device_kind) == chip


@pytest.mark.parametrize(
    "device_kind, platform, precision, expected",
    [
        ("NVIDIA H200", "gpu", "default", ("tf32", 495.0)),  # XLA's float32 on a GPU: TF32
        ("NVIDIA H200", "gpu", "float32", ("fp32", 67.0)),
        ("NVIDIA H200", "gpu", "bfloat16", ("bf16", 989.0)),
        ("NVIDIA H100 80GB HBM3", "gpu", "default", ("tf32", 495.0)),
        ("NVIDIA A100-SXM4-40GB", "gpu", "default", ("tf32", 156.0)),
        ("NVIDIA A100-SXM4-40GB", "gpu", "float32", ("fp32", 19.5)),
        ("NVIDIA A100-SXM4-40GB", "gpu", "bfloat16", ("bf16", 312.0)),
        ("TPU v4", "tpu", "default", ("bf16", 275.0)),  # one bfloat16 pass on a TPU
        ("TPU v5 lite", "tpu", "bfloat16", ("bf16", 197.0)),
        ("TPU v5", "tpu", "default", ("bf16", 459.0)),
        ("TPU v6 lite", "tpu", "default", ("bf16", 918.0)),
        ("TPU v4", "tpu", "float32", None),  # a TPU publishes no float32 peak
        ("cpu", "cpu", "default", None),
        ("NVIDIA GeForce RTX 4090", "gpu", "default", None),
    ],
)
def test_the_peak_follows_the_arithmetic_of_the_precision(
    device_kind, platform, precision, expected
):
    assert throughput.peak_tflops(device_kind, platform, precision) == expected


def test_an_unknown_precision_lists_the_valid_ones():
    with pytest.raises(ValueError, match="Valid precisions: default, float32, bfloat16"):
        throughput.peak_tflops("NVIDIA H200", "gpu", "tf32")


@pytest.mark.parametrize(
    "cost, flops",
    [
        ({"flops": 8192.0, "transcendentals": 256.0}, 8192.0),  # a dict (jax >= 0.4.32)
        ([{"flops": 100.0}, {"flops": 28.0}], 128.0),  # one dict per program, summed
        ([{"flops": 5.0}, {}], 5.0),
        (None, None),  # a backend that counts nothing
        ([], None),
        ({"bytes accessed": 64.0}, None),
        ({"flops": 0.0}, None),
        ({"flops": -1.0}, None),  # some backends say "unknown" with -1
    ],
)
def test_cost_flops_reads_every_shape_of_cost_analysis(cost, flops):
    assert throughput.cost_flops(cost) == flops


def test_compiled_flops_counts_a_matmul_and_its_elementwise_operations():
    a, b = jnp.ones((8, 16)), jnp.ones((16, 32))
    assert throughput.compiled_flops(lambda a, b: a @ b, a, b) == 2 * 8 * 16 * 32
    # + 2 per output element (a multiply and an add); tanh is a transcendental, not counted.
    elementwise = lambda a, b: jnp.tanh((a @ b) * 2.0 + 1.0)
    assert throughput.compiled_flops(elementwise, a, b) == 2 * 8 * 16 * 32 + 2 * 8 * 32


def test_achieved_rate_and_fraction_of_the_peak():
    gpu = throughput.achieved(495e9, 0.01, "NVIDIA H200", "gpu", "default")
    assert gpu["tflops_per_s"] == pytest.approx(49.5)
    assert gpu["fraction_of_peak"] == pytest.approx(0.1)
    assert (gpu["arithmetic"], gpu["peak_tflops"], gpu["precision"]) == ("tf32", 495.0, "default")
    bf16 = throughput.achieved(989e9, 0.01, "NVIDIA H200", "gpu", "bfloat16")
    assert bf16["fraction_of_peak"] == pytest.approx(0.1)
    cpu = throughput.achieved(2e9, 0.5, "cpu", "cpu", "default")
    assert cpu["tflops_per_s"] == pytest.approx(0.004)
    assert cpu["arithmetic"] is cpu["peak_tflops"] is cpu["fraction_of_peak"] is None
    uncounted = throughput.achieved(None, 0.5, "NVIDIA H200", "gpu", "default")
    assert uncounted["tflops_per_s"] is uncounted["fraction_of_peak"] is None
    assert uncounted["peak_tflops"] == 495.0
    with pytest.raises(ValueError, match="positive time"):
        throughput.achieved(1e9, 0.0, "cpu", "cpu", "default")
