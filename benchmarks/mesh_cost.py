"""What a language model's train step costs a device on a named mesh: memory and time.

Run on 8 devices (8 simulated CPU devices here; a GPU host or a TPU slice as it is)::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python -m benchmarks.mesh_cost --parts memory,sizes,speed --out /tmp/mesh_cost.json

* ``memory``: the language model of ``configs/lm_shakespeare.py`` (today's size) and of
  ``configs/lm_wikitext103.py`` at its paper size (d_model 700, d_inner 48,000,
  WikiText-103's 267,735 words in an adaptive softmax; 96.7M parameters) and as
  ``:large`` (d_model 768; 106.7M), each with data 8 (every device a replica) and
  fsdp 8. The bytes per device of the parameters plus the optimiser
  state, from the placed arrays' addressable shards (`footprint.state_bytes`; the
  small model only: the large one is never materialised) and from their shardings'
  shard shapes; and the compiled train step's memory analysis per device
  (`footprint.compiled_memory`: its arguments, outputs, temporaries). The large model
  is compiled, never run (`jax.ShapeDtypeStruct`s with shardings).
* ``sizes``: ``:large`` at growing widths (``--widths``, d_model in heads of 64; d_inner
  scaled with it), compiled both ways: the peak bytes per device, and the largest width
  that fits each per-device memory of ``--budgets_gib``.
* ``speed``: the small model's train step with fsdp 8 against data 8, timed
  interleaved (``--repeats`` rounds, each one step of each, the first round dropped).

Writes the rows as JSON (``--out``) and prints them.

References:
  Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", SC 2020.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from configs import lm_shakespeare, lm_wikitext103
from deq_jax.training.families.lm_setup import init_state, model_fields
from deq_jax.training.families.lm_steps import make_lm_train_step, memory_shardings
from deq_jax.training.run import build, footprint, partition, sharding
from deq_jax.training.run.mesh import make_mesh
from deq_jax.training.run.optim import make_optimizer
from deq_jax.training.run.writers import write_json

_PARTS = flags.DEFINE_list("parts", ["memory", "sizes", "speed"], "What to measure.")
_OUT = flags.DEFINE_string("out", "", "Where to write the rows (JSON).")
_WIDTHS = flags.DEFINE_list("widths", ["384", "768", "1152", "1536"], "d_model of `sizes`.")
_BUDGETS = flags.DEFINE_list("budgets_gib", ["2", "4", "8", "16"], "Per-device memories.")
_REPEATS = flags.DEFINE_integer("repeats", 6, "Interleaved rounds of `speed`.")

MESHES = {"data 8": {"data": 8, "fsdp": 1, "tensor": 1}, "fsdp 8": {"data": 1, "fsdp": 8}}
WIKITEXT103_VOCAB = 267_735  # Merity et al. 2016: the words of WikiText-103's training set
SHAKESPEARE_VOCAB = 65


def wikitext103(width: int | None = None):
    """``configs/lm_wikitext103.py``: its paper size (``None``), or ``:large`` at
    d_model ``width`` in heads of 64, d_inner scaled from 48,000 at 768."""
    if width is None:
        return lm_wikitext103.get_config()
    config = lm_wikitext103.get_config("large")
    config.model.update(dict(d_model=width, n_head=width // 64, d_inner=48_000 * width // 768))
    return config


def abstract_run(config, vocab_size: int, mesh_section: dict):
    """``(step, state, mems, batch, model, tx)``: the jitted train step and its
    arguments as `jax.ShapeDtypeStruct`s with this mesh's shardings (nothing
    allocated), the model and the optimiser."""
    config = config.copy_and_resolve_references()
    config.train.mesh = mesh_section
    mesh = make_mesh(mesh_section)
    model = build.build_model(model_fields(config, vocab_size), build.build_deq_spec(config.deq))
    tx, schedule = make_optimizer(config.train)
    tc = config.train
    shapes = jax.eval_shape(lambda: init_state(model, tx, tc.seq_len, tc.seed))
    rules = partition.rules_for(config.model.name)
    shardings = partition.state_shardings(shapes, mesh, rules, tc.fsdp_min_size)
    state = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
    )
    mems = jax.eval_shape(lambda: model.init_mems(tc.batch_size))
    template = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), mems)
    mem_shardings = memory_shardings(template, mesh, tc.batch_size)
    mems = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), mems, mem_shardings
    )
    data = sharding.batch_sharding(mesh)
    tokens = jax.ShapeDtypeStruct((tc.batch_size, tc.seq_len), jnp.int32, sharding=data)
    mask = jax.ShapeDtypeStruct((tc.batch_size, tc.seq_len), jnp.bool_, sharding=data)
    batch = {"inputs": tokens, "targets": tokens, "mask": mask}
    step = make_lm_train_step(model, schedule, mesh, template, state_sharding=shardings)
    return step, state, mems, batch, model, tx


def sharded_bytes(state) -> int:
    """The bytes a device holds of ``state`` (`jax.ShapeDtypeStruct`s with shardings):
    the largest shard of every array (its shape from the sharding)."""
    return sum(
        int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
        for x in jax.tree_util.tree_leaves(state)
    )


def memory_row(name: str, config, vocab_size: int, mesh_name: str, materialise: bool) -> dict:
    step, state, mems, batch, _, _ = abstract_run(config, vocab_size, MESHES[mesh_name])
    began = time.perf_counter()
    compiled = step.lower(state, mems, batch).compile()
    row = {
        "model": name,
        "mesh": mesh_name,
        "params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state.params))),
        "state_bytes_per_device": sharded_bytes(state),
        "compile_s": round(time.perf_counter() - began, 1),
        **{f"compiled_{k}": v for k, v in footprint.compiled_memory(compiled).items()},
    }
    if materialise:  # the real arrays, placed: what each device's shards hold
        real = jax.tree_util.tree_map(
            lambda x: jax.device_put(jnp.zeros(x.shape, x.dtype), x.sharding), state
        )
        row["addressable_bytes_per_device"] = footprint.state_bytes(real)["max_per_device"]
    return row


def memory() -> list[dict]:
    rows = []
    for name, config, vocab, real in (
        ("lm_shakespeare", lm_shakespeare.get_config(), SHAKESPEARE_VOCAB, True),
        ("lm_wikitext103 (paper size)", wikitext103(), WIKITEXT103_VOCAB, False),
        ("lm_wikitext103:large", wikitext103(768), WIKITEXT103_VOCAB, False),
    ):
        for mesh_name in MESHES:
            rows.append(memory_row(name, config, vocab, mesh_name, real))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def sizes(widths: Sequence[int], budgets_gib: Sequence[float]) -> list[dict]:
    rows = []
    for width in widths:
        for mesh_name in MESHES:
            row = memory_row(
                f"d_model {width}", wikitext103(width), WIKITEXT103_VOCAB, mesh_name, False
            )
            rows.append(dict(row, width=width))
            print(json.dumps(rows[-1]), flush=True)
    fits = []
    for gib in budgets_gib:
        fit = {"budget_gib": gib}
        for mesh_name in MESHES:
            ok = [r for r in rows if r["mesh"] == mesh_name and r["compiled_peak"] <= gib * 2**30]
            best = max(ok, key=lambda r: r["params"], default=None)
            fit[mesh_name] = (
                None if best is None else {"width": best["width"], "params": best["params"]}
            )
        fits.append(fit)
        print(json.dumps(fit), flush=True)
    return rows + fits


def speed(repeats: int) -> list[dict]:
    """The small model's step, fsdp 8 against data 8, interleaved (module docstring)."""
    config = lm_shakespeare.get_config()
    runs = {}
    for mesh_name, section in MESHES.items():
        step, state, mems, batch, model, tx = abstract_run(config, SHAKESPEARE_VOCAB, section)
        key = jax.random.PRNGKey(0)
        real = init_state(model, tx, config.train.seq_len, 0)
        real = jax.device_put(real, jax.tree_util.tree_map(lambda x: x.sharding, state))
        zeros = lambda x: jax.device_put(jnp.zeros(x.shape, x.dtype), x.sharding)
        tokens = jax.random.randint(key, batch["inputs"].shape, 0, SHAKESPEARE_VOCAB)
        device_batch = {
            "inputs": jax.device_put(tokens, batch["inputs"].sharding),
            "targets": jax.device_put(jnp.roll(tokens, -1, 1), batch["inputs"].sharding),
            "mask": jax.device_put(jnp.ones(tokens.shape, bool), batch["mask"].sharding),
        }
        runs[mesh_name] = [step, real, jax.tree_util.tree_map(zeros, mems), device_batch]
    times = {name: [] for name in runs}
    for _ in range(repeats + 1):
        for name, run in runs.items():
            step, state, mems, device_batch = run
            began = time.perf_counter()
            state, mems, metrics = step(state, mems, device_batch)
            jax.block_until_ready(metrics)
            times[name].append(time.perf_counter() - began)
            run[1], run[2] = state, mems
    row = {name: float(np.median(t[1:])) for name, t in times.items()}
    row["fsdp 8 / data 8"] = row["fsdp 8"] / row["data 8"]
    row["rounds"] = repeats
    row["devices"] = jax.device_count()
    print(json.dumps(row), flush=True)
    return [row]


def main(argv: Sequence[str]) -> None:
    del argv
    out = {"devices": jax.device_count(), "backend": jax.default_backend()}
    if "memory" in _PARTS.value:
        out["memory"] = memory()
    if "sizes" in _PARTS.value:
        out["sizes"] = sizes([int(w) for w in _WIDTHS.value], [float(b) for b in _BUDGETS.value])
    if "speed" in _PARTS.value:
        out["speed"] = speed(_REPEATS.value)
    if _OUT.value:
        write_json(_OUT.value, out)


if __name__ == "__main__":
    app.run(main)
