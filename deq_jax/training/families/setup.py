"""Everything a run needs before its first step, built from the config and the workdir.

`setup` is shared by training and by checkpoint evaluation: it checks the config
(`check_config`, before anything is created or generated), initialises the distributed
runtime (if asked), builds the mesh, task, model and optimiser, creates the train state
and restores the workdir's newest readable checkpoint into it (replicated over the
mesh).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh

from deq_jax.training.families.interventions import PathIndependence
from deq_jax.training.families.regularizer import JacobianRegularizer
from deq_jax.training.run import build, sharding
from deq_jax.training.run.checkpoint import Checkpointer, saved_steps
from deq_jax.training.run.config_checks import check_mesh_section, check_ranges, model_section
from deq_jax.training.run.mesh import TENSOR, axis_size
from deq_jax.training.run.optim import make_optimizer
from deq_jax.training.run.partition import MIN_SIZE, check_tensor_sizes, rules_for
from deq_jax.training.run.state import TrainState, create_train_state
from deq_jax.training.run.workdir import WorkdirLock, ensure_workdir, lock_workdir


class Run(NamedTuple):
    """The components of a run.

    Attributes:
      mesh: the run's mesh over all devices (`deq_jax.training.run.mesh`).
      task: the `deq_jax.tasks` task.
      model: the linen model.
      schedule: the learning-rate schedule.
      state: the train state, restored if the workdir had a checkpoint, placed on the
        mesh by the model's partition rules (`place_state`).
      start_step: the restored step (0 for a fresh run).
      checkpointer: the workdir's `Checkpointer`.
      carry: what the training loop threads from step to step (``None`` for the
        tasks; a language model's segment memory, restored with the state).
    """

    mesh: Mesh
    task: Any
    model: Any
    schedule: optax.Schedule
    state: TrainState
    start_step: int
    checkpointer: Checkpointer
    carry: Any = None


def check_config(config: Any, workdir: str) -> None:
    """Checks what can be checked before anything is created or generated: the workdir
    is named, the config has the current layout, the DEQ's solver and backward mode
    exist with valid keywords, every numeric field of ``train``, ``eval``, ``ckpt`` and
    ``log`` lies in its range (`deq_jax.training.run.config_checks`), the regulariser's and
    the interventions' fields too, and ``train.mesh`` names valid axes and sizes.

    Raises:
      ValueError: naming the config key (or ``--workdir``) and the fix.
    """
    if not workdir:
        raise ValueError(
            "--workdir is empty: name the directory for the run's checkpoints, metrics and "
            "report, e.g. --workdir=/tmp/run."
        )
    build.check_layout(config)
    build.build_deq_spec(config.deq)
    check_ranges(config)
    check_mesh_section(config)
    JacobianRegularizer.from_config(config.get("regularizer", {}))
    PathIndependence.from_config(config.get("path_independence", {}))


def _initialize_distributed(config: Any) -> None:
    tc = config.train
    sharding.initialize_distributed(
        tc.distributed,
        tc.coordinator_address,
        tc.num_processes,
        tc.process_id,
        tc.heartbeat_timeout_s,
    )


def begin_run(config: Any, workdir: str, emit: Callable[[str], None] = print) -> WorkdirLock | None:
    """What a training run does before anything else: checks the config
    (`check_config`), joins the other processes (``train.distributed``), checks the
    mesh against the devices (`run_mesh`), creates the workdir and takes its lock
    (`deq_jax.training.run.workdir.lock_workdir`).

    Returns:
      The lock (process 0; ``None`` on the others), to be released when the run ends.
    """
    check_config(config, workdir)
    _initialize_distributed(config)
    run_mesh(config)  # the mesh's errors before the workdir is created
    return lock_workdir(workdir, emit)


def run_mesh(config: Any) -> Mesh:
    """The mesh of ``config.train.mesh`` over every device, checked against the model
    and the batch size.

    Raises:
      ConfigError: for sizes that do not multiply to the device count, a tensor size
        that does not divide the model's heads or channels, or a batch size that
        data x fsdp do not divide (`deq_jax.training.run.mesh`).
    """
    tc = config.train
    section = tc.get("mesh", None)
    mesh = sharding.make_mesh(section.to_dict() if hasattr(section, "to_dict") else section)
    check_tensor_sizes(model_section(config), axis_size(mesh, TENSOR))
    sharding.check_batch_size(tc.batch_size, mesh)
    return mesh


def place(state: Any, config: Any, mesh: Mesh) -> Any:
    """``state`` on ``mesh`` by the partition rules of ``config.model.name`` and
    ``config.train.fsdp_min_size`` (`deq_jax.training.run.partition`)."""
    min_size = config.train.get("fsdp_min_size", MIN_SIZE)
    return sharding.place_state(state, mesh, rules_for(config.model.get("name")), min_size)


def prepare_run(config: Any, workdir: str) -> tuple[Mesh, Any]:
    """What every training run does first: checks the config (`check_config`), joins
    the other processes (``train.distributed``), makes the device mesh and checks the
    model and the batch size against it (`run_mesh`), then creates ``workdir``, builds
    the task and prepares its data.

    Returns:
      ``(mesh, task)``.
    """
    check_config(config, workdir)
    _initialize_distributed(config)
    mesh = run_mesh(config)
    tensor = axis_size(mesh, TENSOR)
    if tensor > 1 and not rules_for(config.model.get("name")):
        logging.warning(
            "config.train.mesh.tensor=%d, but model %s has no tensor partition rules "
            "(deq_jax.training.run.partition.RULES): each tensor group computes the same rows.",
            tensor,
            config.model.get("name"),
        )
    ensure_workdir(workdir)
    task = build.build_task(config.task, workdir)
    sharding.lead_first(task.prepare, "deq_jax:prepare_data")  # one writer of {workdir}/data
    return mesh, task


def make_checkpointer(config: Any, workdir: str) -> Checkpointer:
    """The run's `Checkpointer` in ``workdir``, as ``config.ckpt`` says."""
    return Checkpointer(
        workdir,
        every_steps=config.ckpt.every_steps,
        keep=config.ckpt.keep,
        async_save=config.ckpt.async_save,
    )


def setup(config: Any, workdir: str) -> Run:
    """Builds the run ``config`` describes and restores ``workdir``'s latest checkpoint.

    Args:
      config: the configuration (see ``configs/default.py``).
      workdir: the run's directory (created if missing).

    Returns:
      A `Run`.

    Raises:
      ValueError: for an invalid config or a mesh or batch size that does not fit the
        devices.
      CheckpointMismatchError: if the workdir's checkpoint does not fit the model.
    """
    tc = config.train
    mesh, task = prepare_run(config, workdir)
    model = build.build_model(config.model, build.build_deq_spec(config.deq))
    tx, schedule = make_optimizer(tc)
    sample = np.zeros((1, *task.input_shape), np.float32)
    state = create_train_state(model, tx, sample, jax.random.PRNGKey(tc.seed))
    # Restore straight into the run's layout: on several processes a checkpoint restored
    # onto one device could not be placed afterwards (no cross-host copy), and a
    # checkpoint saved on another mesh is read into this one.
    state = place(state, config, mesh)
    ckpt = make_checkpointer(config, workdir)
    state, start = ckpt.restore_or_init(state)
    return Run(
        mesh=mesh,
        task=task,
        model=model,
        schedule=schedule,
        state=state,
        start_step=start,
        checkpointer=ckpt,
    )


def restore_trained(
    config: Any, workdir: str, purpose: str, setup_fn: Callable[[Any, str], Any] | None = None
) -> Any:
    """`setup` for a tool that reads a trained run: the checkpointer is closed (nothing
    is saved) and a workdir without a checkpoint is an error.

    Args:
      config: the configuration the run was trained with.
      workdir: the run's directory.
      purpose: what the run is restored for, in the error ("to evaluate").
      setup_fn: ``(config, workdir) -> run`` that builds the model and restores the
        latest checkpoint (``None``: `setup`; a language model's run passes a
        `setup_language_model`).

    Raises:
      FileNotFoundError: if the workdir holds no checkpoint (said before any data is
        generated or any directory created).
      CheckpointMismatchError: if the workdir's checkpoint does not fit the model.
    """
    if not saved_steps(workdir):
        raise FileNotFoundError(
            f"No checkpoint in {os.path.join(workdir, 'checkpoints')} {purpose}: train one "
            f"first (python -m launch.main --config ... --workdir {workdir}), or pass the "
            "--workdir of a trained run."
        )
    run = (setup_fn or setup)(config, workdir)
    run.checkpointer.close()
    if run.start_step == 0:
        raise FileNotFoundError(f"No checkpoint in {run.checkpointer.directory} {purpose}.")
    return run
