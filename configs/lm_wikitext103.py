"""Word-level DEQ-Transformer on WikiText-103: locuslab/deq's setting, for users with the data.

The data are the WikiText-103 token files (``wiki.train.tokens``, ``wiki.valid.tokens``,
``wiki.test.tokens``; Merity et al. 2016), which this project cannot download: put them
in a directory and point ``task.path`` at it (``wikitext`` task of `deq_jax.tasks`). Then::

    python -m launch.main --config configs/lm_wikitext103.py --workdir /tmp/wt103 \\
        --config.task.path=/data/wikitext-103

The model and training settings are those of locuslab/deq's
``DEQ-Sequence/wt103_deq_transformer.sh`` (adaptive input and softmax with
``div_val=4`` and the Transformer-XL cutoffs, d_model 700, 10 heads of 70, d_inner
48000, segments of 150 with a memory of 150, Anderson forward with 30 steps, 35 backward,
Adam at 2.5e-4 with 16k warm-up steps, 32k weight-tied warm-up steps, 300k steps,
batch 56). ``:jacobian`` adds the regularised pre-LN recipe of
``wt103_deq_transformer_preln_reg.sh`` (pre-LN, Jacobian weight 2, 14 forward and
backward steps, memory 300, the term on 40% of the steps). ``:smoke`` shrinks
everything to a few steps of a tiny model (for tests, with a small file in the WikiText
format). ``:large`` is the paper's model at d_model 768 in 12 heads of 64 (106.7M
parameters against the paper size's 96.7M; its widths are multiples of 8, so an 8-way
fsdp mesh splits the cell's matrices, where 700 leaves qkv and o_net whole): the >= 100M
model whose memory per device docs/results/mesh.md measures, compiled without running::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        python -m benchmarks.mesh_cost --parts memory --out /tmp/mesh_cost.json

References:
  Bai, Kolter & Koltun, "Deep Equilibrium Models", NeurIPS 2019.
  Bai, Koltun & Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021.
  Merity, Xiong, Bradbury & Socher, "Pointer Sentinel Mixture Models", 2016 (WikiText).
"""

from ml_collections import ConfigDict

from configs import default, lm_shakespeare


def get_config(arg: str | None = None) -> ConfigDict:
    """The WikiText-103 config; ``arg``: ``"smoke"``, ``"jacobian"``, ``"large"``, or
    several (comma)."""
    names = default.variants(arg, ("smoke", "jacobian", "large"))
    config = lm_shakespeare.lm_config()
    config.task = ConfigDict(dict(name="wikitext", path="", data_dir=""))
    config.model = lm_shakespeare.get_config().model
    config.model.update(
        dict(
            d_model=700,
            n_head=10,
            d_head=70,
            d_inner=48_000,
            mem_len=150,
            dropout=0.05,
            dropouti=0.0,
            cutoffs=(20_000, 40_000, 200_000),
            div_val=4,
        )
    )
    config.deq.backward.ift.update(dict(solver="broyden", max_iter=35))
    config.train.update(
        dict(
            steps=300_000,
            batch_size=56,
            seq_len=150,
            pretrain_steps=32_000,
            optimizer="adam",
            learning_rate=2.5e-4,
            warmup_steps=16_000,
            grad_clip_norm=0.25,
        )
    )
    config.eval.update(dict(every_steps=5_000, batch_size=8, seq_len=150))
    config.ckpt.every_steps = 5_000
    config.log.every_steps = 200
    if "large" in names:
        config.model.update(dict(d_model=768, n_head=12, d_head=64))
    if "jacobian" in names:
        config.model.update(dict(ln_placement="pre", dropout=0.06, dropatt=0.01, mem_len=300))
        config.deq.update(dict(train_max_iter=14, eval_max_iter=14))
        config.deq.backward.ift.max_iter = 14
        config.regularizer.update(dict(jacobian_weight=2.0, jacobian_freq=0.4))
    if "smoke" in names:
        default.smoke(
            config,
            **lm_shakespeare.SMOKE,
            model=dict(lm_shakespeare.SMOKE_MODEL, cutoffs=(4, 8), div_val=2),
            deq=dict(backward=dict(ift=dict(max_iter=4))),
            train=dict(seq_len=8, pretrain_steps=2),
            eval=dict(seq_len=8),
        )
    return config
