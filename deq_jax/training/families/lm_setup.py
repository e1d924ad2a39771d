"""Setting up a language-model run: the model sized to the data's vocabulary, its train
state and segment memory, restored from the workdir's checkpoint.

The workdir's ``vocab.json`` records the vocabulary a run was trained on: a run on other
data is refused (`VocabularyMismatchError`), and `restore_language_model` rebuilds a
trained model from it without the corpus (for sampling).

References:
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deq_jax.tasks.text import Vocabulary
from deq_jax.training.families.lm_steps import place_memory
from deq_jax.training.families.setup import Run, make_checkpointer, place, prepare_run
from deq_jax.training.run import build
from deq_jax.training.run.checkpoint import Checkpointer
from deq_jax.training.run.optim import make_optimizer
from deq_jax.training.run.state import TrainState
from deq_jax.training.run.writers import write_text

VOCAB_FILE = "vocab.json"


class VocabularyMismatchError(ValueError):
    """The workdir's checkpoints were trained on another vocabulary than the data's."""


def saved_vocabulary_path(workdir: str) -> str:
    """The path of a trained language model's ``vocab.json`` in ``workdir``.

    Raises:
      FileNotFoundError: if there is none (not a language model's run).
    """
    path = os.path.join(workdir, VOCAB_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"No {VOCAB_FILE} in {workdir}: is it a language-model run? Pass the config "
            "the run was trained with."
        )
    return path


def check_vocabulary(workdir: str, vocab: Vocabulary, *, write: bool = True) -> None:
    """Checks ``vocab`` against the workdir's ``vocab.json`` (written on a fresh run).

    Raises:
      VocabularyMismatchError: if the workdir was trained on another vocabulary.
    """
    path = os.path.join(workdir, VOCAB_FILE)
    if os.path.exists(path):
        with open(path) as f:
            saved = Vocabulary.from_json(f.read())
        if saved.fingerprint != vocab.fingerprint:
            raise VocabularyMismatchError(
                f"The checkpoints in {workdir} were trained on another vocabulary "
                f"({saved.size} tokens, fingerprint {saved.fingerprint}) than this data's "
                f"({vocab.size} tokens, fingerprint {vocab.fingerprint}). Use the data the "
                "run was trained on, or a fresh --workdir."
            )
    elif write:
        write_text(path, vocab.to_json())


def model_fields(config: Any, vocab_size: int) -> Any:
    """``config.model`` with ``vocab_size`` from the data (``0`` in the config).

    Raises:
      ValueError: for a non-zero ``model.vocab_size`` that differs from the data's.
    """
    fields = config.model.to_dict() if hasattr(config.model, "to_dict") else dict(config.model)
    given = fields.get("vocab_size", 0)
    if given and given != vocab_size:
        raise ValueError(
            f"config.model.vocab_size={given} but the data's vocabulary has {vocab_size} "
            "tokens; set it to 0 (taken from the data)."
        )
    fields["vocab_size"] = vocab_size
    return fields


def init_state(model: Any, tx: optax.GradientTransformation, seq_len: int, seed: int):
    """The train state of a fresh language model (initialised on one segment)."""
    k_params, k_z0, k_dropout, k_run = jax.random.split(jax.random.PRNGKey(seed), 4)
    tokens = jnp.zeros((1, seq_len), jnp.int32)

    def init(rngs):
        return model.init(rngs, tokens, mems=model.init_mems(1), train=False)

    variables = dict(jax.jit(init)({"params": k_params, "z0": k_z0, "dropout": k_dropout}))
    params = variables.pop("params")
    state = TrainState.create(
        apply_fn=model.apply, params=params, tx=tx, model_state=variables, rng=k_run
    )
    return state.replace(step=jnp.zeros((), jnp.int32))


def setup_language_model(config: Any, workdir: str) -> Run:
    """Builds the run ``config`` describes and restores the workdir's latest checkpoint;
    the `Run`'s ``carry`` is the training memory of the global batch, restored with the
    state.

    Raises:
      ValueError: for an invalid config or a batch size that does not split evenly
        over the devices.
      VocabularyMismatchError: if the workdir was trained on another vocabulary.
      CheckpointMismatchError: if the workdir's checkpoint does not fit the model.
    """
    tc = config.train
    mesh, task = prepare_run(config, workdir)
    check_vocabulary(workdir, task.vocab, write=jax.process_index() == 0)
    model = build.build_model(
        model_fields(config, task.vocab_size), build.build_deq_spec(config.deq)
    )
    tx, schedule = make_optimizer(tc)
    # The template in this run's layout, the state placed by the partition rules and the
    # memory split along the batch: the checkpoint is read straight into it, whatever
    # the mesh, device and process counts that saved it (orbax refuses a template
    # without shardings once the devices differ, and a restored array cannot be copied
    # across hosts).
    state = place(init_state(model, tx, tc.seq_len, tc.seed), config, mesh)
    fresh = jax.tree_util.tree_map(np.asarray, model.init_mems(tc.batch_size))
    template = {"state": state, "mems": place_memory(fresh, mesh, tc.batch_size)}
    ckpt = make_checkpointer(config, workdir)
    restored, start = ckpt.restore_or_init(template)
    return Run(
        mesh=mesh,
        task=task,
        model=model,
        schedule=schedule,
        state=restored["state"],
        start_step=start,
        checkpointer=ckpt,
        carry=restored["mems"],
    )


def restore_language_model(config: Any, workdir: str) -> tuple[Any, Any, Vocabulary, int]:
    """The trained model of ``workdir``, without its data: ``(model, variables, vocab,
    step)``, the vocabulary read from the workdir's ``vocab.json``.

    Raises:
      FileNotFoundError: if the workdir has no ``vocab.json`` or no checkpoint.
      CheckpointMismatchError: if the checkpoint does not fit the config's model.
    """
    with open(saved_vocabulary_path(workdir)) as f:
        vocab = Vocabulary.from_json(f.read())
    build.check_layout(config)
    tc = config.train
    model = build.build_model(model_fields(config, vocab.size), build.build_deq_spec(config.deq))
    tx, _ = make_optimizer(tc)
    state = init_state(model, tx, tc.seq_len, tc.seed)
    mems = model.init_mems(tc.batch_size)  # on the default device, as the state
    ckpt = Checkpointer(workdir, every_steps=1, keep=max(config.ckpt.keep, 1))
    try:
        if ckpt.latest_step() is None:
            raise FileNotFoundError(f"No checkpoint in {ckpt.directory}.")
        restored, step = ckpt.restore_or_init({"state": state, "mems": mems})
    finally:
        ckpt.close()
    return model, restored["state"].variables(), vocab, step
