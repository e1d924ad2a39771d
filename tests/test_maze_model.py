"""The maze DEQ: shapes on two maze sizes, mixed initialisation, gradients, bad input,
and the smoke maze config end to end (with a neural solver fitted to it)."""

import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import mazes as maze_config
from configs import mazes_hypersolver
from deq_jax import backward, models, solvers
from deq_jax.models.mazes import MazeDEQ
from deq_jax.nn import DEQSpec
from deq_jax.tasks.mazes import MazeConfig, image_size, load
from deq_jax.training import train_and_evaluate, train_hypersolver
from deq_jax.training.run import writers

WIDTH = 8


def _images(size: int, count: int) -> tuple[jax.Array, jax.Array]:
    config = MazeConfig(train_size=4, test_maze_sizes=(size,), test_size=count)
    split = load(f"test_{size}", config=config)
    return jnp.asarray(split["inputs"]), jnp.asarray(split["targets"])


def _count(params) -> int:
    return sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))


def _model(**fields) -> MazeDEQ:
    fields = {
        "width": WIDTH,
        "num_blocks": 1,
        **fields,
    }
    spec = {k: fields.pop(k) for k in ("solver", "backward", "z_init") if k in fields}
    spec = {
        "solver": solvers.anderson(tol=1e-3, max_iter=6),
        "backward": backward.jacobian_free(),
    } | spec
    return models.get("maze_deq", deq=DEQSpec(**spec), **fields)


def test_registered_by_name():
    assert "maze_deq" in models.names()
    assert isinstance(models.get("maze_deq"), MazeDEQ)


def test_shapes_and_parameter_count_on_two_maze_sizes():
    model = _model()
    x5, _ = _images(5, 3)
    variables = jax.jit(lambda k, x: model.init(k, x, train=False))(jax.random.key(0), x5)
    n_params = _count(variables["params"])
    w = WIDTH  # project + cell (input conv, one residual block) + head (w, w // 2, 2)
    cell = 9 * 2 * w * w + 2 * 9 * w * w
    head = 9 * w * w + 9 * w * (w // 2) + 9 * (w // 2) * 2
    assert n_params == 9 * 3 * w + cell + head
    apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
    for size in (5, 9):  # the same parameters on 16x16 and 24x24 images
        x, _ = _images(size, 3)
        side = image_size(size)
        logits, stats = apply(variables, x)
        chex.assert_shape(logits, (3, side, side, 2))
        chex.assert_shape(stats.nstep, (3,))
        chex.assert_tree_all_finite(logits)


def test_grid_stem_runs_the_deq_on_the_maze_grid():
    model = _model(stem="grid")
    x5, _ = _images(5, 2)
    variables = jax.jit(lambda k, x: model.init(k, x, train=False))(jax.random.key(0), x5)
    plain = jax.eval_shape(lambda k: _model().init(k, x5, train=False), jax.random.key(0))
    # only the projection differs: it reads 2x2 blocks of 3 colours, 12 channels
    assert _count(variables["params"]) - _count(plain["params"]) == 9 * (12 - 3) * WIDTH
    apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
    for size in (5, 9):
        x, _ = _images(size, 3)
        grid = size + 2  # 2n + 1 grid points a side, n = (size + 1) / 2 cells
        chex.assert_shape(model.to_cell_grid(x), (3, grid, grid, 12))
        logits, _ = apply(variables, x)
        chex.assert_shape(logits, (3, image_size(size), image_size(size), 2))
        chex.assert_tree_all_finite(logits)


def test_grid_stem_folds_blocks_and_unfolds_onto_them_exactly():
    model = _model(stem="grid")
    x, y = _images(7, 4)  # [4, 20, 20, 3], targets [4, 20, 20]
    grid = model.to_cell_grid(x)  # [4, 9, 9, 12]: the four pixels of each block
    for block in range(4):
        r, c = divmod(block, 2)
        pixels = x[:, 1 + r : -1 : 2, 1 + c : -1 : 2]  # pixel (r, c) of every block
        np.testing.assert_array_equal(grid[..., 3 * block : 3 * block + 3], pixels)
    on_grid = jnp.asarray(y)[:, 1:-1:2, 1:-1:2, None]  # [4, 9, 9, 1]
    np.testing.assert_array_equal(model.from_cell_grid(on_grid)[..., 0], y)  # frame included


def test_grid_stem_rejects_images_that_are_not_a_framed_upscale_and_unknown_stems():
    model = _model(stem="grid")
    with pytest.raises(ValueError, match="2 g \\+ 2"):
        model.to_cell_grid(jnp.zeros((1, 23, 23, 3)))
    with pytest.raises(ValueError, match="stem must be one of"):
        _model(stem="patches")


def test_layer_norm_adds_scale_and_bias_per_convolution():
    x, _ = _images(5, 2)
    shapes = lambda model: jax.eval_shape(
        lambda k: model.init(k, x, train=False)["params"], jax.random.key(0)
    )
    plain, normed = shapes(_model()), shapes(_model(norm="layer"))
    assert _count(normed) - _count(plain) == 3 * 2 * WIDTH  # three convs in the cell


def test_mixed_init_starts_half_the_batch_from_zeros():
    x, _ = _images(5, 4)
    one_step = solvers.fixed_point_iteration(tol=1e-12, max_iter=1)
    zeros, mixed = _model(solver=one_step), _model(solver=one_step, z_init="mixed")
    variables = jax.jit(lambda k: zeros.init(k, x, train=False))(jax.random.key(0))
    from_zeros, _ = jax.jit(lambda v: zeros.apply(v, x, train=False))(variables)
    with pytest.raises(ValueError, match="z0"):
        mixed.apply(variables, x, train=False)
    apply = jax.jit(lambda v, x, k: mixed.apply(v, x, train=False, rngs={"z0": k}))
    for seed in range(3):
        logits, _ = apply(variables, x, jax.random.key(seed))
        same = jnp.all(jnp.isclose(logits, from_zeros, atol=1e-6), axis=(1, 2, 3))  # [B]
        assert int(same.sum()) == 2, seed  # exactly half start at zero after one step


def test_explicit_zero_start_matches_zeros_init():
    x, _ = _images(5, 2)
    model = _model(z_init="mixed")
    variables = jax.jit(lambda r: model.init(r, x, train=False))(
        {"params": jax.random.key(0), "z0": jax.random.key(1)}
    )
    z0 = jnp.zeros(x.shape[:-1] + (WIDTH,))
    given, _ = jax.jit(lambda v: model.apply(v, x, train=False, z0=z0))(variables)
    expected, _ = jax.jit(lambda v: _model().apply(v, x, train=False))(variables)
    chex.assert_trees_all_close(given, expected, atol=1e-6)


def test_gradient_is_finite_and_reaches_every_part():
    x, y = _images(5, 2)
    model = _model(z_init="mixed", norm="layer")  # the config's Jacobian-free backward
    rngs = {"params": jax.random.key(0), "z0": jax.random.key(1)}
    params = jax.jit(lambda r: model.init(r, x, train=True))(rngs)["params"]

    def loss(p):
        logits, _ = model.apply({"params": p}, x, train=True, rngs={"z0": jax.random.key(2)})
        labels = jax.nn.one_hot(y, 2)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(float(value))
    chex.assert_tree_all_finite(grads)
    for part in ("project", "cell", "head_0", "head_out"):
        norm = sum(float(jnp.sum(g**2)) for g in jax.tree_util.tree_leaves(grads[part]))
        assert norm > 0, part


def test_bad_input_rank_raises():
    model = _model()
    x, _ = _images(5, 2)
    variables = jax.eval_shape(lambda k: model.init(k, x, train=False), jax.random.key(0))
    with pytest.raises(ValueError, match=r"\[B, H, W, C\]"):  # [B, H, W]: no channels
        jax.eval_shape(lambda v: model.apply(v, x[..., 0], train=False), variables)
    with pytest.raises(ValueError, match=r"\[B, H, W, C\]"):  # [H, W, C]: no batch
        jax.eval_shape(lambda k: model.init(k, x[0], train=False), jax.random.key(0))


def test_config_sections_and_commands():
    full, smoke = maze_config.get_config(), maze_config.get_config("smoke")
    assert full.task.name == "mazes" and full.model.name == "maze_deq"
    assert full.task.train_maze_size == 9 and 13 in full.task.test_maze_sizes
    assert full.deq.z_init == "mixed" and full.deq.backward.name == "jacobian_free"
    assert full.model.stem == "grid" and smoke.model.stem == "grid"
    assert smoke.train.steps < full.train.steps and smoke.model.width < full.model.width
    assert smoke.ckpt.every_steps <= smoke.train.steps
    assert "python -m launch.main --config configs/mazes.py --workdir" in maze_config.__doc__
    assert "--config configs/mazes.py:smoke" in maze_config.__doc__
    with pytest.raises(ValueError, match="smoke"):
        maze_config.get_config("huge")


def test_smoke_config_runs_end_to_end(tmp_path):
    config = maze_config.get_config("smoke")
    config.task.data_dir = str(tmp_path / "data")
    workdir = str(tmp_path / "run")
    lines = []
    result = train_and_evaluate(config, workdir, emit=lines.append)
    assert result.step == config.train.steps
    saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert saved and saved[-1] == config.train.steps
    records = writers.read_metrics(workdir)
    train = [r for r in records if r["split"] == "train"]
    assert train and all(np.isfinite(train[-1][k]) for k in ("loss", "grad_norm", "nstep_mean"))
    # The periodic evaluation (step 2) reads valid only; the test mazes are read once.
    periodic = {r["split"] for r in records if r["split"] != "train" and r["step"] < result.step}
    assert periodic == {"valid"} and set(result.eval_metrics) == {"valid"}
    with open(os.path.join(workdir, "length_generalization.json")) as f:
        report = json.load(f)
    base = config.deq.train_max_iter
    assert report["budgets"] == {f"{m}x": m * base for m in config.eval.budget_multipliers}
    splits = {f"test_{s}" for s in config.task.test_maze_sizes}
    for by_split in report["report"].values():
        assert set(by_split) == splits
        for metrics in by_split.values():
            assert 0 <= metrics["maze_accuracy"] <= metrics["pixel_accuracy"] <= 1
            assert metrics["count"] == config.task.test_size
    assert any("Per-length accuracy" in line for line in lines)
    # The neural solver fits the trained maze model: an image state on the cell grid.
    hyper = mazes_hypersolver.get_config("smoke")
    hyper.task.data_dir = config.task.data_dir
    hyper.neural_solver.update(dict(deq_workdir=workdir, ablations=False))
    run = train_hypersolver(hyper, str(tmp_path / "solver"), emit=lines.append)
    grid = config.task.train_maze_size + 2  # the (2n + 1)-point grid of an n-cell maze
    assert run.report["state_shape"] == [grid, grid, config.model.width]
    assert run.report["param_fraction"] > 0 and set(run.solvers) == {"hyper_anderson"}
    steps = hyper.neural_solver.train_steps  # the fit reports its progress, ending at the last step
    assert any(line.strip().startswith(f"fit step {steps}/{steps}") for line in lines)
    assert (
        mazes_hypersolver.get_config().deq.neural_solver.max_iter
        == maze_config.get_config().deq.eval_max_iter
    )


def test_step_cost_times_a_mixed_init_maze_model_on_its_task_data(tmp_path):
    # benchmarks.step_cost's eval forward draws z_init="mixed"'s start from the step's rng
    # streams, as the eval step does (experiments/gpu/mazes_benchmark.sh fits its steps to it).
    from benchmarks import step_cost

    config = maze_config.get_config("benchmark,smoke")
    config.task.data_dir = str(tmp_path / "data")
    assert config.deq.z_init == "mixed"
    (row,) = step_cost.measure(config, str(tmp_path), [3], ["jacobian_free"], 1)
    assert row["backward"] == "jacobian_free" and row["budget"] == 3
    assert row["batch_size"] == config.train.batch_size
    assert row["train_seconds"] > 0 and row["eval_images_per_second"] > 0
