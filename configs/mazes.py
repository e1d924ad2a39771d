"""Mazes: train a path-independent 2-D convolutional DEQ on 9x9, test on larger mazes.

`deq_jax.models.mazes.MazeDEQ` with its grid stem: the framed, 2x upscaled image is
folded back onto the maze grid (2x2 blocks into channels), a 3x3 projection is
injected into a `Conv2DCell` (two residual blocks, per-position layer norm) at every
iteration, and a three-convolution readout marks the path per grid point, unfolded
back onto the pixels. Trained with mixed initialisation (half the batch starts from
zeros, half from noise), Anderson forward and Jacobian-free gradients, 4,000 steps of
32 mazes; the final report gives pixel and whole-maze accuracy on 9x9 to 13x13 mazes at
1x, 2x and 4x the train budget of 30 iterations (measured figures in BUILD_NOTES.md,
"Path independence"). It took 51 minutes on a shared 2-core CPU at commit 8f25a40,
before its train step became 1.7x cheaper (BUILD_NOTES.md, "Solvers and gradients").
Run it with::

    python -m launch.main --config configs/mazes.py --workdir /tmp/mazes

and evaluate the trained model on larger mazes with more iterations::

    python -m launch.evaluate --config configs/mazes.py --workdir /tmp/mazes \\
        --config.task.test_maze_sizes="(13,15,19,25,33)" --max_iters=30,60,120,240

The smoke variant (a tiny model on 5x5 mazes, a few steps, still writing checkpoints,
metrics and TensorBoard events; 31 s of wall time on an idle 2-core CPU, compilation
included, most of it compiling the evaluation of each split and budget; 2026-12-01)::

    python -m launch.main --config configs/mazes.py:smoke --workdir /tmp/mazes_smoke

The mazes come from ``generator="random_start"`` (the search starts at a random cell),
pinned here because the figures in BUILD_NOTES.md were measured on that data. The
``benchmark`` variant trains and tests on benchmark-style mazes instead:
``generator="from_start"``, easy-to-hard-data's generator, whose start-goal paths are
longer (41.0 against 26.9 path pixels on 13x13 mazes), tested on 9x9 to 21x21::

    python -m launch.main --config configs/mazes.py:benchmark --workdir /tmp/mazes_bench
    python -m launch.main --config configs/mazes.py:benchmark,smoke --workdir /tmp/mzb_smoke

The periodic evaluation reads ``valid`` only; the test mazes are read once, by the final
report. The best checkpoint is chosen on ``valid``, new mazes of the training size, which a
trained model solves from early on; ``--config.task.val_maze_size=11`` draws them at
11x11 instead (between the training and test sizes), so the kept checkpoint is the one
that extrapolates best.

The ``gpu`` variant is sized for an accelerator: deep-thinking's width (128) and
training set (50,000 mazes), batches of 128, 1,000 test mazes per size, selection on
500 new 13x13 mazes (at this width 11x11 validation scores 1.000 from the first
evaluation on, so the first checkpoint wins the tie), and weight averaging
(``train.ema_decay=0.999``: evaluation and selection use the moving average of the
weights, and each periodic evaluation also logs the raw weights as ``valid_raw``;
on the CPU at width 32 the average beat the raw weights at 22 of 24 evaluations,
BUILD_NOTES.md "Mazes"). ``experiments/gpu/mazes_benchmark.sh`` trains three seeds of
``benchmark,gpu`` (with the Jacobian penalty) side by side in a wall-clock budget and
prints their seed report.

To train or test on easy-to-hard-data's own files (``maze_data_{train,test}_{S}/``
folders of ``inputs.npy`` and ``solutions.npy``, as its ``MazeDataset`` downloads them),
point ``task.files_dir`` at the folder that holds them::

    python -m launch.evaluate --config configs/mazes.py:benchmark --workdir /tmp/mazes_bench \
        --config.task.files_dir=/data/easy_to_hard --config.task.test_maze_sizes="(13,)"

References:
  Schwarzschild et al., "Can You Learn an Algorithm? Generalizing from Easy to Hard
  Problems with Recurrent Networks", NeurIPS 2021.
  Anil et al., "Path Independent Equilibrium Models Can Better Exploit Test-Time
  Computation", NeurIPS 2022.
"""

from ml_collections import ConfigDict

from configs import default


def get_config(arg: str | None = None) -> ConfigDict:
    """The maze config; ``arg``: ``"smoke"`` (the seconds-long test variant),
    ``"benchmark"`` (easy-to-hard-data's generator), ``"gpu"`` (deep-thinking's width and
    data size, for an accelerator), or a comma-separated combination such as
    ``"benchmark,smoke"`` or ``"benchmark,gpu"``."""
    names = default.variants(arg, ("smoke", "benchmark", "gpu"))
    config = default.get_config()
    config.task = ConfigDict(
        dict(
            name="mazes",
            data_dir="",
            seed=0,
            train_size=10_000,
            train_maze_size=9,
            test_maze_sizes=(9, 11, 13),
            test_size=200,
            val_size=200,  # "valid": new 9x9 mazes, for model selection
            val_maze_size=0,  # their size; 0: the training size
            generator="random_start",
            files_dir="",
        )
    )
    if "benchmark" in names:
        config.task.update(dict(generator="from_start", test_maze_sizes=(9, 13, 15, 21)))
    # Mixed initialisation makes the fixed point path independent, per-position layer
    # norm keeps the map size-agnostic and convergent, Jacobian-free gradients make a
    # step cheaper than IFT, and the grid stem moves information twice as far per
    # convolution at a quarter of the cost.
    config.model.update(dict(name="maze_deq", norm="layer", stem="grid"))
    config.deq.update(dict(z_init="mixed", eval_max_iter=60, backward=dict(name="jacobian_free")))
    config.train.update(dict(steps=4_000, batch_size=32, learning_rate=2e-3))
    config.eval.update(
        dict(
            batch_size=100,
            # valid only: it selects the checkpoint, and the test mazes are read once,
            # by the final report (--config.eval.splits="('valid','test_13')" to watch
            # a test size during training)
            splits=("valid",),
            max_batches=1,
        )
    )
    if "gpu" in names:
        # deep-thinking's maze model width (128) and training set (50,000 mazes), four
        # times the batch (an accelerator runs it at little extra cost), 1,000 test
        # mazes per size (0.1 points each) and selection on 13x13 mazes distinct from the
        # test ones: 11x11 saturates at this width (BUILD_NOTES "Mazes").
        config.task.update(dict(train_size=50_000, test_size=1_000, val_size=500, val_maze_size=13))
        config.model.width = 128
        config.train.update(dict(steps=6_000, batch_size=128, warmup_steps=200, ema_decay=0.999))
        config.eval.update(dict(batch_size=500, score_raw_weights=True))
    if "smoke" in names:
        default.smoke(
            config,
            steps=4,
            batch_size=8,
            warmup_steps=1,
            eval_every=2,
            eval_batch_size=16,
            budgets=(4, 8),
            task=dict(
                train_size=64,
                train_maze_size=5,
                test_maze_sizes=(5, 7),
                test_size=16,
                val_size=16,
            ),
            model=dict(width=8, num_blocks=1),
        )
    return config
