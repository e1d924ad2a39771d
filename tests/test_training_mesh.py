"""Every family on a named mesh of 8 simulated CPU devices (issue 80).

Each run is a subprocess (`tests/mesh_runs.py`), because the device count is fixed when
JAX starts. In CI one small combined test per family: its smoke config trained 20 steps
on one mesh of 8 devices against 1 device, and the solver's loops of the compiled train
step. The whole matrix (every family on every mesh and backward mode) is marked slow.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, run_on_devices
from jax.sharding import NamedSharding, PartitionSpec

from deq_jax.nn import DEQ, DEQSpec, with_spec
from deq_jax.nn.cells import MLPCell
from deq_jax.training import footprint, sharding

_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import mesh_runs
mesh_runs.main(sys.argv)
""".format(tests=f"{ROOT}/tests")

FSDP8 = {"data": 1, "fsdp": 8, "tensor": 1}
DATA8 = {"data": 8, "fsdp": 1, "tensor": 1}
DATA2_FSDP4 = {"data": 2, "fsdp": 4, "tensor": 1}
FSDP4_TENSOR2 = {"data": 1, "fsdp": 4, "tensor": 2}


def _run(jobs, devices, kind="losses"):
    out = run_on_devices(_SCRIPT, json.dumps(jobs), kind, devices=devices)
    assert out["devices"] == devices
    return out["results"]


def _check_same_losses(one, eight):
    """The issue's tolerance: 1e-5 relative on the first step, 1e-4 on all 20."""
    one, eight = np.asarray(one), np.asarray(eight)
    assert one.shape == eight.shape == (20,) and np.all(np.isfinite(one))
    np.testing.assert_allclose(eight[0], one[0], rtol=1e-5, atol=0)
    np.testing.assert_allclose(eight, one, rtol=1e-4, atol=0)


def _loop_check(loops_short, loops_long, rows, m_short, m_long):
    """The solver's loops (Anderson with histories of ``m_short`` and ``m_long``): the
    history is carried as a device's ``rows`` only, and the collectives inside every
    loop are the same for both history lengths (none grows with the history)."""
    for loops, m in ((loops_short, m_short), (loops_long, m_long)):
        shapes = [s for carry in loops["carries"] for s in carry]
        history = [s for s in shapes if s.startswith(f"f32[{rows},{m},")]
        assert history, shapes  # [rows, m, n]: the history of this device's rows
        assert not [s for s in shapes if s.startswith(f"f32[{loops['batch']},{m},")]
    assert sorted(map(tuple, loops_short["collectives"])) == sorted(
        map(tuple, loops_long["collectives"])
    )
    # what is gathered inside a loop is a device's rows of an activation (over tensor),
    # never a parameter (gathered once, before the loop)
    gathered = [c[1] for c in loops_short["collectives"] if c[0] == "all-gather"]
    assert all(shape.startswith(f"f32[{rows},") for shape in gathered), gathered


def test_footprint_reads_loops_and_collectives():
    hlo = """HloModule m

%body (p: (s32[], f32[2,3,4])) -> (s32[], f32[2,3,4]) {
  %p = (s32[], f32[2,3,4]) parameter(0)
  %g = f32[16,4]{1,0} all-gather(f32[2,4]{1,0} %x), dimensions={0}
  ROOT %t = (s32[], f32[2,3,4]) tuple(%i, %h)
}

%cond (p: (s32[], f32[2,3,4])) -> pred[] {
  %r = pred[] all-reduce(pred[] %c), to_apply=%or
  ROOT %c = pred[] constant(true)
}

%or (a: pred[], b: pred[]) -> pred[] {
  ROOT %o = pred[] or(pred[] %a, pred[] %b)
}

ENTRY %main (x: f32[2,4]) -> f32[2,4] {
  %g0 = f32[16,4]{1,0} all-gather(f32[2,4]{1,0} %x), dimensions={0}
  %w = (s32[], f32[2,3,4]) while((s32[], f32[2,3,4]) %init), condition=%cond, body=%body, \
metadata={op_name="jit(f)/while"}
  ROOT %x = f32[2,4] parameter(0)
}
"""
    found = footprint.loop_collectives(hlo)
    assert [(c.kind, c.shape, c.bytes) for c in found] == [
        ("all-gather", "f32[16,4]{1,0}", 256),
        ("all-reduce", "pred[]", 1),
    ]
    assert footprint.loop_carries(hlo) == [("jit(f)/while", ["s32[]", "f32[2,3,4]"])]
    assert footprint.shape_bytes("(f32[2,3], bf16[4])") == 32


@pytest.fixture(scope="module")
def lm_loops(tmp_path_factory):
    d = tmp_path_factory.mktemp("loops")
    jobs = [
        ["lm", str(d / f"m{m}"), {"train.mesh": FSDP4_TENSOR2, "deq.solver.anderson.m": m}]
        for m in (3, 6)
    ]
    return _run(jobs, 8, "loops")


def test_lm_solver_state_is_sharded_like_activations(lm_loops):
    """fsdp 4 x tensor 2 on 8 rows: a device's 2 rows in the forward and backward
    solves' loops; the parameters are gathered before them, not inside. (Over tensor
    the loops gather the rows' qkv activations: the fused projection's output orders
    q, k, v outermost, so its split does not fall on heads; docs/mesh.md.)"""
    short, long = lm_loops
    _loop_check(short, long, rows=2, m_short=3, m_long=6)


def test_state_sharding_constrains_the_start_and_every_cell_output():
    """`DEQSpec.state_sharding` puts a sharding constraint on z0 and the cell's output
    (so on what the solver carries); the fixed point is the same as without one."""
    mesh = sharding.make_mesh()
    x = jnp.linspace(-1.0, 1.0, 12).reshape(2, 6)
    model = DEQ(MLPCell(features=6), spec=DEQSpec(train_max_iter=20))
    variables = model.init(jax.random.PRNGKey(0), x, train=False)
    placed = sharding.place_solve(model, mesh)
    assert placed.spec.state_sharding == NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    assert with_spec(model, state_sharding=None).spec == model.spec

    def solve(net):
        return jax.jit(lambda v: net.apply(v, x, train=False)[0])

    text = str(jax.make_jaxpr(lambda v: placed.apply(v, x, train=False)[0])(variables))
    assert text.count("sharding_constraint") >= 2  # z0, and the cell inside the loop
    assert "sharding_constraint" not in str(
        jax.make_jaxpr(lambda v: model.apply(v, x, train=False)[0])(variables)
    )
    np.testing.assert_allclose(solve(placed)(variables), solve(model)(variables), atol=0)
