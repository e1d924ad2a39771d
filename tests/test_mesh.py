"""The named mesh, the partition rules and the config's ranges, on one device (issue 80).

Layouts of 8-device meshes are computed on an `AbstractMesh` (no devices needed); the
runs on 8 simulated devices are in ``test_training_mesh.py``.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from configs import lm_shakespeare, mdeq_fashion_mnist, prefix_sum
from deq_jax.training.families.lm_setup import init_state, model_fields
from deq_jax.training.run import build, config_checks, mesh, partition, sharding
from deq_jax.training.run.optim import make_optimizer

P = PartitionSpec


def _abstract(data=1, fsdp=1, tensor=1):
    return AbstractMesh((data, fsdp, tensor), mesh.AXES)


def test_mesh_sizes_default_and_bad_sections():
    assert mesh.mesh_sizes(None) == {"data": -1, "fsdp": 1, "tensor": 1}
    assert mesh.mesh_sizes({"fsdp": 8}) == {"data": -1, "fsdp": 8, "tensor": 1}
    with pytest.raises(mesh.ConfigError, match="unknown axis 'model': the mesh axes are data"):
        mesh.mesh_sizes({"model": 2})
    with pytest.raises(mesh.ConfigError, match="fsdp=0 must be a positive size or -1"):
        mesh.mesh_sizes({"fsdp": 0})
    with pytest.raises(mesh.ConfigError, match="only one axis may be -1"):
        mesh.mesh_sizes({"data": -1, "fsdp": -1})


def test_resolve_fills_the_free_axis_and_refuses_a_mismatch():
    assert mesh.resolve({"fsdp": 4}, 8) == {"data": 2, "fsdp": 4, "tensor": 1}
    assert mesh.resolve({"data": 1, "fsdp": -1, "tensor": 2}, 8)["fsdp"] == 4
    with pytest.raises(mesh.ConfigError, match="needs a multiple of 3 devices, but this run has 8"):
        mesh.resolve({"fsdp": 3}, 8)
    with pytest.raises(mesh.ConfigError, match="needs 4 devices, but this run has 8"):
        mesh.resolve({"data": 1, "fsdp": 4, "tensor": 1}, 8)
    with pytest.raises(mesh.ConfigError, match="tensor=2 must divide the devices of one host"):
        mesh.check_mesh({"data": 1, "fsdp": 1, "tensor": 2}, 1, 2)


def test_batch_split_and_padding():
    m = _abstract(data=2, fsdp=4, tensor=2)
    assert mesh.batch_shards(m) == 8 and mesh.batch_spec(m) == P(("data", "fsdp"))
    assert mesh.padded_batch_size(250, m) == 256 and mesh.padded_batch_size(8, m) == 8
    with pytest.raises(mesh.ConfigError, match="batch_size=8 or --config.train.batch_size=12"):
        mesh.check_batch_size(10, _abstract(data=1, fsdp=4))
    one = sharding.make_mesh()
    assert one.axis_names == mesh.AXES and mesh.batch_shards(one) == jax.device_count()


def test_pad_rows_masks_the_padding():
    batch = {"inputs": np.arange(6).reshape(3, 2), "mask": np.ones(3, bool), "reset": np.True_}
    padded = sharding.pad_rows(batch, 5)
    np.testing.assert_array_equal(padded["mask"], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(padded["inputs"][3:], [[0, 1], [0, 1]])  # row 0 repeated
    assert padded["reset"] is batch["reset"] and sharding.pad_rows(batch, 3) is batch


def _lm_state():
    config = lm_shakespeare.get_config()
    model = build.build_model(model_fields(config, 65), build.build_deq_spec(config.deq))
    tx, _ = make_optimizer(config.train)
    return jax.eval_shape(lambda: init_state(model, tx, 8, 0))


def _flat_specs(specs):
    leaves = jax.tree_util.tree_flatten_with_path(
        specs, is_leaf=lambda s: isinstance(s, PartitionSpec)
    )[0]
    return {partition.path_string(p): s for p, s in leaves}


def test_language_model_rules_with_fsdp_and_tensor():
    state = _lm_state()
    specs = _flat_specs(
        partition.state_specs(state, _abstract(fsdp=4, tensor=2), partition.LANGUAGE_MODEL)
    )
    assert specs["params/cell/attn/qkv/kernel"] == P("fsdp", "tensor")  # [128, 384]
    assert specs["params/cell/attn/o_net/kernel"] == P("tensor", "fsdp")  # [128, 128]
    assert specs["params/cell/ff/ff1/kernel"] == P("fsdp", "tensor")  # [128, 512]
    assert specs["params/cell/ff/ff2/kernel"] == P("tensor", "fsdp")  # [512, 128]
    assert specs["params/cell/attn/r_w_bias"] == P("tensor")  # [4, 32]: 128 entries
    assert specs["params/cell/ff/ff1/bias"] == P("tensor")  # small: not over fsdp
    # 65 characters do not split over 2: the vocabulary stays whole over tensor
    assert specs["params/io/emb_0"] == P(None, "fsdp")
    assert specs["params/io/out_bias"] == P()
    # the optimiser's moments take their parameter's layout; the counters are replicated
    assert specs["opt_state/1/0/mu/cell/attn/qkv/kernel"] == P("fsdp", "tensor")
    assert specs["opt_state/1/0/nu/cell/ff/ff2/kernel"] == P("tensor", "fsdp")
    assert specs["step"] == P() and specs["opt_state/1/0/count"] == P()


def test_fsdp_default_takes_the_largest_axis_it_divides():
    m = _abstract(fsdp=8)
    assert partition.array_spec((3, 64, 32), [None] * 3, 8, 0) == P(None, "fsdp")
    assert partition.array_spec((24, 200), [None, None], 8, 0) == P(None, "fsdp")
    assert partition.array_spec((7, 9), [None, None], 8, 0) == P()  # no axis divides
    assert partition.array_spec((64, 64), [None, None], 8, 10_000) == P()  # small
    params = {"w": jnp.zeros((3, 32, 16)), "b": jnp.zeros(16)}
    specs = partition.state_specs(params, m, min_size=0)
    assert specs == {"w": P(None, "fsdp"), "b": P("fsdp")}


def test_mdeq_rules_split_the_block_channels():
    config = mdeq_fashion_mnist.get_config()
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    tx, _ = make_optimizer(config.train)
    from deq_jax.training.run.state import create_train_state

    state = jax.eval_shape(
        lambda: create_train_state(model, tx, np.zeros((1, 28, 28, 1)), jax.random.PRNGKey(0))
    )
    specs = _flat_specs(partition.state_specs(state, _abstract(fsdp=4, tensor=2), partition.MDEQ))
    assert specs["params/cell/block_0/conv1/kernel"] == P(None, None, "fsdp", "tensor")
    assert specs["params/cell/block_0/conv2/kernel"] == P(None, None, "tensor", "fsdp")
    assert specs["params/cell/block_1/gn1/scale"] == P("tensor")
    assert specs["params/cell/fuse/post_conv_0/kernel"] == P(None, None, None, "tensor")


def test_a_rule_matching_nothing_is_warned_once(caplog):
    rules = (*partition.MDEQ, (r"nowhere/kernel$", (None, "tensor")))
    params = {"block_0": {"conv1": {"kernel": jnp.zeros((3, 3, 4, 8))}}}
    with caplog.at_level(logging.WARNING):
        partition.state_specs(params, _abstract(tensor=2), rules)
    lines = [r.getMessage() for r in caplog.records if "match no parameter" in r.getMessage()]
    assert len(lines) == 1
    assert "nowhere/kernel$" in lines[0] and r"fuse/.+/kernel$" in lines[0]
    assert "conv1/kernel" not in lines[0]


def test_tensor_size_must_divide_heads_and_channels():
    lm = lm_shakespeare.get_config().model.to_dict()
    partition.check_tensor_sizes(lm, 4)
    with pytest.raises(mesh.ConfigError, match="tensor=3 must divide model.n_head=4"):
        partition.check_tensor_sizes(lm, 3)
    mdeq = mdeq_fashion_mnist.get_config().model.to_dict()
    with pytest.raises(mesh.ConfigError, match=r"tensor=16 must divide model.channels\[0\]=24"):
        partition.check_tensor_sizes(mdeq, 16)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"steps": 1}, "config.train.warmup_steps=2 must lie in [0, config.train.steps=1]"),
        ({"learning_rate": -1.0}, "config.train.learning_rate=-1.0 must be above 0.0"),
        ({"b2": 1.0}, "config.train.b2=1.0 must lie in [0.0, 1.0)"),
        ({"max_nonfinite_steps": 0}, "config.train.max_nonfinite_steps=0 must be at least 1"),
        ({"optimizer": "adamm"}, "config.train.optimizer='adamm' is not one of adam, adamw, sgd"),
        ({"pretrain_steps": 99}, "config.train.pretrain_steps=99 must lie in [0, "),
        ({"mesh": {"data": 1, "fsdp": 3, "tensor": 1}}, "batch_size=16 must be a multiple of"),
    ],
)
def test_train_fields_out_of_range(fields, message):
    config = prefix_sum.get_config("smoke")
    config.train.update(fields)
    with pytest.raises(mesh.ConfigError) as info:
        config_checks.check_ranges(config)
        config_checks.check_mesh_section(config)
    assert message in str(info.value) and "\n" not in str(info.value)
