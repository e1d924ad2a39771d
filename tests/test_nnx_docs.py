"""docs/nnx.md's Python examples run as written, each on its own."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "nnx.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_page_has_its_examples():
    assert len(BLOCKS) == 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_docs_nnx_example_runs_on_its_own(index):
    block = BLOCKS[index]
    if "import equinox" in block:
        pytest.importorskip("equinox")
    namespace = {}  # no block may lean on names an earlier block defined
    exec(compile(block, f"{DOC}:block{index}", "exec"), namespace)
    checks = {
        0: lambda ns: ns["z_star"].shape == (8, 32) and ns["stats"].nstep.shape == (8,),
        1: lambda ns: ns["loss"].shape == () and ns["nstep"].shape == (8,),
        2: lambda ns: float(abs(ns["grads"]["cell"]["recurrent"]["kernel"][...]).sum()) > 0,
        3: lambda ns: set(ns["variables"]) == {"params"},
        4: lambda ns: ns["ift"].recurrent.weight.shape == ns["reversible"].recurrent.weight.shape,
    }
    assert checks[index](namespace)
