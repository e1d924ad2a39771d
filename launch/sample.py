"""Samples text from a trained language model's latest checkpoint.

Usage::

    python -m launch.sample --config configs/lm_shakespeare.py --workdir /tmp/lm \\
        --prompt "ROMEO:" --length 500 [--temperature 0.8 --top_k 0 --seed 0]

Pass the config (and overrides) the checkpoint was trained with; the vocabulary comes
from the workdir's ``vocab.json``, so the corpus is not needed. Tokens are generated one
at a time with the segment memory, each solve started from the previous position's
fixed point (`deq_jax.training.families.lm_generate`). The prompt and the text are printed,
followed by the mean solver steps per generated token. A prompt with a character (or
word) outside the vocabulary fails before anything runs, naming it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import jax
import numpy as np
from absl import flags

from launch import flags as launch_flags

_PROMPT = flags.DEFINE_string("prompt", "\n", "Text the sample continues.")
_LENGTH = flags.DEFINE_integer("length", 500, "Tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "0: greedy; 1: the model's distribution.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k likeliest tokens only (0: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_MAX_ITER = flags.DEFINE_integer("max_iter", 0, "Solver budget per token (0: the eval budget).")


def main(argv: Sequence[str]) -> None:
    launch_flags.reject_arguments(argv)
    launch_flags.quiet_library_logs()
    from deq_jax.training.families.lm_generate import generate
    from deq_jax.training.families.lm_setup import restore_language_model

    config = launch_flags.CONFIG.value
    with launch_flags.user_errors():
        model, variables, vocab, step = restore_language_model(config, launch_flags.WORKDIR.value)
    try:
        prompt = vocab.encode(_PROMPT.value)
    except ValueError as e:
        print(f"FATAL Bad --prompt: {e}", file=sys.stderr)
        sys.exit(2)
    result = generate(
        model,
        variables,
        prompt,
        _LENGTH.value,
        key=jax.random.PRNGKey(_SEED.value),
        seq_len=config.train.seq_len,
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value,
        max_iter=_MAX_ITER.value or None,
    )
    print(f"[checkpoint step {step}]")
    print(_PROMPT.value + vocab.decode(result.tokens), flush=True)
    if result.nstep.size:
        print(f"[{float(np.mean(result.nstep)):.1f} solver steps per token]", flush=True)


if __name__ == "__main__":
    launch_flags.run(main)
