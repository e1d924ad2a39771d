"""Text from a trained language model, one token at a time, with the segment memory.

`generate` reads the prompt in segments of ``seq_len`` tokens, filling the model's
memory (Transformer-XL), samples a token from the last position's distribution, then
feeds each new token alone: the memory holds the fixed points of the last ``mem_len``
positions, and each new solve starts from the previous position's fixed point (the
warm start of Bai et al. 2019, Sec. 4.3), so it needs few solver steps.

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Dai et al., "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
  Context", ACL 2019.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Generation(NamedTuple):
    """What `generate` returns.

    Attributes:
      tokens: the generated token ids ``[length]`` (the prompt not included).
      nstep: the solver steps of each generated position's solve ``[length]``.
    """

    tokens: np.ndarray
    nstep: np.ndarray


def _sample(key: jax.Array, log_probs: jax.Array, temperature: float, top_k: int) -> jax.Array:
    """One token id from ``log_probs [V]``: greedy at temperature 0, else a draw from the
    (top-``k``, if ``top_k > 0``) distribution sharpened by ``1 / temperature``."""
    if temperature <= 0:
        return jnp.argmax(log_probs)
    logits = log_probs / temperature
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits)


@functools.partial(jax.jit, static_argnames=("model", "max_iter"))
def _read(model: Any, variables: Any, mems: Any, tokens: jax.Array, z0: Any, max_iter: int | None):
    """Reads ``tokens [1, T]`` after the memory ``mems``: the new memory, the last
    position's log-probabilities, its fixed point (the next solve's start) and its solver
    steps. One program per model, budget and segment length, shared by every call of
    `generate` (the variables are an argument, not constants of the program)."""
    out = model.apply(variables, tokens, mems=mems, train=False, max_iter=max_iter, z0=z0)
    return out.mems, out.log_probs[0, -1], out.z_star[:, -1:], out.stats.nstep[0]


def generate(
    model: Any,
    variables: Any,
    prompt: np.ndarray,
    length: int,
    *,
    key: jax.Array,
    seq_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    max_iter: int | None = None,
) -> Generation:
    """Samples ``length`` tokens after ``prompt``.

    Args:
      model: the language model (`deq_jax.models.language.DEQTransformerLM`).
      variables: its trained variables.
      prompt: the prompt's token ids ``[P]``, ``P >= 1`` (e.g. ``vocab.encode(text)``).
      length: how many tokens to generate.
      key: the sampling key.
      seq_len: the segment length the prompt is read in (the training one).
      temperature: ``0`` is greedy; ``1`` samples from the model's distribution.
      top_k: sample among the ``top_k`` likeliest tokens only (0: all).
      max_iter: the solver budget of each solve (``None``: the model's eval budget).

    Returns:
      A `Generation`.

    Raises:
      ValueError: for an empty prompt, a token id outside the vocabulary, ``length < 0``
        or ``seq_len < 1``.
    """
    prompt = np.asarray(prompt)
    if prompt.ndim != 1 or prompt.size == 0:
        raise ValueError(
            f"The prompt must be a non-empty 1-D array of token ids, got {prompt.shape}."
        )
    bad = prompt[(prompt < 0) | (prompt >= model.vocab_size)]
    if bad.size:
        raise ValueError(
            f"Token id {int(bad[0])} of the prompt is outside the vocabulary "
            f"[0, {model.vocab_size})."
        )
    if length < 0 or seq_len < 1:
        raise ValueError(f"length must be >= 0 and seq_len >= 1, got {length} and {seq_len}.")

    read = functools.partial(_read, model, variables, max_iter=max_iter)
    mems = model.init_mems(1)
    for begin in range(0, prompt.size, seq_len):
        chunk = jnp.asarray(prompt[None, begin : begin + seq_len], jnp.int32)
        mems, log_probs, z_last, _ = read(mems, chunk, None)
    tokens, nsteps = [], []
    for _ in range(length):
        key, draw = jax.random.split(key)
        token = _sample(draw, log_probs, temperature, top_k)
        tokens.append(int(token))
        mems, log_probs, z_last, nstep = read(
            mems, jnp.reshape(token, (1, 1)).astype(jnp.int32), z_last
        )
        nsteps.append(int(nstep))
    return Generation(np.asarray(tokens, np.int32), np.asarray(nsteps, np.int32))
