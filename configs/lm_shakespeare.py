"""Character-level DEQ-Transformer language model on Shakespeare's complete plays.

The corpus is prepared once (it is never fetched at training time)::

    python -m launch.prepare_data shakespeare --out ~/.cache/deq_jax/shakespeare

Then train (28 to 38 minutes on a 2-core CPU shared with other runs, 1,500 steps) and
sample::

    python -m launch.main --config configs/lm_shakespeare.py --workdir /tmp/lm
    python -m launch.sample --config configs/lm_shakespeare.py --workdir /tmp/lm \\
        --prompt "ROMEO:" --length 500

`deq_jax.models.language.DEQTransformerLM`: one Transformer-XL block (relative
positions, weight-normalised projections, post-LN as locuslab's) solved to its fixed
point by Anderson, implicit (IFT) backward; the first ``train.pretrain_steps`` train the
same parameters as a 2-layer weight-tied stack. Variants (alone or joined by commas)::

    python -m launch.main --config configs/lm_shakespeare.py:smoke --workdir /tmp/lm_smoke
    python -m launch.main --config configs/lm_shakespeare.py:weight_tied --workdir /tmp/lm_wt
    python -m launch.main --config configs/lm_shakespeare.py:untied --workdir /tmp/lm_untied
    python -m launch.main --config configs/lm_shakespeare.py:jacobian --workdir /tmp/lm_jac
    python -m launch.main --config configs/lm_shakespeare.py:pre_ln,jacobian --workdir /tmp/lm_pre
    python -m launch.main --config configs/lm_shakespeare.py:unrolled --workdir /tmp/lm_unrolled
    python -m launch.main --config configs/lm_shakespeare.py:reversible --workdir /tmp/lm_rev
    python -m launch.main --config configs/lm_shakespeare.py:gpu --workdir /tmp/lm_gpu

``weight_tied``: the block stacked ``n_layer`` times with shared weights (same
parameters and steps as the DEQ); ``untied``: 6 blocks with their own weights and a
narrower feed-forward (d_inner 192: 3.1x the DEQ's parameters); ``jacobian``: the
Jacobian regulariser of Bai et al. 2021; ``pre_ln``: torchdeq's pre-LN cell;
``unrolled``: torchdeq's deq-lm recipe (K unrolled steps plus the fixed-point
correction loss in training, a solve in evaluation); ``reversible``: the reversible DEQ
of McCallum et al. 2025 (b 0.5, 9 evaluations, the exact gradient in constant memory,
docs/results/reversible.md); ``gpu``: a model sized for one
accelerator; ``smoke``: for tests, a tiny model, 4 steps and 2 segments per split
evaluated (25-31 s of wall time on an idle 2-core CPU, 2026-12-01, of which about 9 s
compile: 21 s with the compilation cached).

Results: BUILD_NOTES.md, "DEQ-Transformer language model".

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Geng & Kolter, "TorchDEQ: A Library for Deep Equilibrium Models", 2023.
  McCallum, Arora & Foster, "Reversible Deep Equilibrium Models", 2025.
"""

from ml_collections import ConfigDict

from configs import default

VARIANTS = ("smoke", "gpu", "weight_tied", "untied", "jacobian", "pre_ln", "unrolled", "reversible")
MODES = ("weight_tied", "untied", "unrolled")
SIZES = ("smoke", "gpu")


def variants(arg: str | None) -> tuple[str, ...]:
    """The variants named by ``arg`` (comma-separated; at most one mode and one size).

    Raises:
      ValueError: for an unknown or repeated name, two modes or two sizes.
    """
    return default.variants(arg, VARIANTS, {"mode": MODES, "size": SIZES})


def lm_config() -> ConfigDict:
    """The sections every language-model config shares (`default.get_config` plus the
    segment lengths and the weight-tied warm-up)."""
    config = default.get_config()
    del config.path_independence  # no randomised budgets or alignment for the LM
    config.train.seq_len = 64
    # the periodic evaluation reads the validation split only (it selects the
    # checkpoint); the final evaluation reads valid and test, test once
    config.eval.update(dict(seq_len=0, budget_multipliers=(1,), splits=("valid",)))
    return config


# The language models' smoke run (`configs/lm_wikitext103.py` shares it): `default.smoke`'s
# sizes and the model's.
SMOKE = dict(
    steps=4,
    batch_size=4,
    warmup_steps=1,
    eval_every=2,
    eval_batch_size=4,
    budgets=(4, 4),
    max_batches=2,
    budget_multipliers=(1,),
)
SMOKE_MODEL = dict(d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=8)


def get_config(arg: str | None = None) -> ConfigDict:
    """The Shakespeare config with the variants of ``arg`` (module docstring)."""
    names = variants(arg)
    config = lm_config()
    config.task = ConfigDict(
        dict(name="char_text", path="~/.cache/deq_jax/shakespeare", data_dir="")
    )
    config.model = ConfigDict(
        dict(
            name="deq_transformer_lm",
            vocab_size=0,
            d_model=128,
            n_head=4,
            d_head=32,
            d_inner=512,
            mem_len=64,
            dropout=0.1,
            dropatt=0.0,
            dropouti=0.1,
            ln_placement="post",
            weight_norm=True,
            tie_weights=True,
            cutoffs=(),
            div_val=1,
            mode="deq",
            n_layer=2,
            unroll_steps=6,
            correction_states=2,
            correction_gamma=0.8,
        )
    )
    config.deq.train_max_iter = 20
    config.deq.backward.ift.max_iter = 20
    config.train.update(
        dict(
            steps=1_500,
            batch_size=16,
            pretrain_steps=300,
            optimizer="adam",
            grad_clip_norm=0.25,
        )
    )
    config.eval.update(dict(batch_size=16, max_batches=40))
    config.ckpt.every_steps = 250
    if "pre_ln" in names:
        config.model.ln_placement = "pre"
    if "jacobian" in names:
        # locuslab's regularised WikiText-103 recipe: weight 2 on 40% of the steps
        config.regularizer.update(dict(jacobian_weight=2.0, jacobian_freq=0.4))
    if "reversible" in names:
        # McCallum et al.'s language settings: b = 0.5 (the solver's default), four
        # coupled steps (9 evaluations of the cell in training and evaluation), the
        # exact reversible backward
        config.deq.solver.name = "reversible"
        config.deq.backward.name = "reversible"
        config.deq.update(dict(train_max_iter=9, eval_max_iter=9))
    if "weight_tied" in names:
        config.model.mode = "weight_tied"
        config.train.pretrain_steps = 0
    if "untied" in names:
        config.model.update(dict(mode="untied", n_layer=6, d_inner=192))  # ~3x the DEQ
        config.train.pretrain_steps = 0
    if "unrolled" in names:
        config.model.mode = "unrolled"
        config.train.pretrain_steps = 0
    if "gpu" in names:
        config.model.update(dict(d_model=512, n_head=8, d_head=64, d_inner=2048, mem_len=256))
        config.train.update(dict(steps=20_000, batch_size=64, seq_len=256, pretrain_steps=2_000))
        config.eval.update(dict(every_steps=2_000, batch_size=64, max_batches=0))
        config.ckpt.every_steps = 2_000
        config.log.every_steps = 100
    if "smoke" in names:
        default.smoke(config, **SMOKE, model=SMOKE_MODEL, train=dict(seq_len=8))
        if config.train.pretrain_steps:
            config.train.pretrain_steps = 2  # two warm-up steps, then two DEQ steps
    return config
