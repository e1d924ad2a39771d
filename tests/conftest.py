"""Shared fixtures: float64 on demand, small reference problems."""

import jax
import pytest


@pytest.fixture
def x64():
    """Runs a test with 64-bit floats enabled, restoring the setting afterwards."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    """Runs a test once in float32 and once in float64 (x64 enabled for the latter)."""
    if request.param == "float64":
        with jax.enable_x64(True):
            yield request.param
    else:
        yield request.param
