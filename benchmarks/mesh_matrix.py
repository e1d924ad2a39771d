"""Every family's smoke training on 8 simulated CPU devices against 1 device, per mesh
and backward mode: how far the 20 losses drift apart (issue 80's matrix).

    python -m benchmarks.mesh_matrix --out /tmp/mesh_matrix.json

Runs `tests/mesh_runs.py` in two processes (1 device; 8 devices, with
``--xla_force_host_platform_device_count=8``) on the jobs of
`tests/test_training_mesh.py`'s slow matrix (with the suite's XLA flags), and prints
per job the relative deviation of the first loss, the largest over the 20 steps and the
first step past 1e-4. Each family and backward mode also gets a row ``mesh="1 ulp"``:
the 1-device run started from parameters one unit in the last place away
(`mesh_runs.nudged`), the drift that one rounding grows into under that training, for
telling rounding from a sharding error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

from deq_jax.training.run.writers import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import mesh_runs  # noqa: E402 - the jobs' runner and the matrix, shared with the tests

MESHES = mesh_runs.MESHES

_OUT = flags.DEFINE_string("out", "", "Where to write the rows (JSON).")
_FAMILIES = flags.DEFINE_list("families", list(mesh_runs.MATRIX_FAMILIES), "Families.")

# The test suite's compilation flags (tests/conftest.py): the same programs as the tests.
SUITE_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _run(jobs, devices: int) -> list[list[float]]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    )
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])
    script = os.path.join(ROOT, "tests", "mesh_runs.py")
    proc = subprocess.run(
        [sys.executable, script, json.dumps(jobs), "losses"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-4000:])
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])["results"]


def main(argv) -> None:
    del argv
    cells = list(mesh_runs.matrix(_FAMILIES.value))
    with tempfile.TemporaryDirectory() as tmp:
        refs = sorted({(f, b) for f, _, b in cells})
        ones = [[f, f"{tmp}/{f}-{b}-1", dict(mesh_runs.BACKWARDS[b])] for f, b in refs]
        nudged = [[f, f"{tmp}/{f}-{b}-ulp", {**mesh_runs.BACKWARDS[b], "ulps": 1}] for f, b in refs]
        eights = [
            [f, f"{tmp}/{f}-{b}-{i}-8", {**mesh_runs.BACKWARDS[b], "train.mesh": MESHES[m]}]
            for i, (f, m, b) in enumerate(cells)
        ]
        first = _run(ones + nudged, 1)
        one = dict(zip(refs, first[: len(refs)], strict=True))
        eight = _run(eights, 8)
    envelopes = [(f, "1 ulp", b) for f, b in refs]
    rows = []
    for (family, mesh, backward), losses in zip(
        cells + envelopes, eight + first[len(refs) :], strict=True
    ):
        ref = np.asarray(one[(family, backward)])
        rel = np.abs(np.asarray(losses) / ref - 1)
        past = np.flatnonzero(rel > 1e-4)
        rows.append(
            {
                "family": family,
                "mesh": mesh,
                "backward": backward,
                "first": float(rel[0]),
                "max": float(rel.max()),
                "first_step_past_1e-4": int(past[0]) + 1 if past.size else None,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    if _OUT.value:
        write_json(_OUT.value, rows)


if __name__ == "__main__":
    app.run(main)
