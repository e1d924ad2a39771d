"""The language-model launches end to end on a small text file: training with the
segment memory, an exact resume, 1 against 8 devices, sampling, the neural solver, and
the errors a user meets first."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from conftest import run_module, run_on_devices

from configs import lm_shakespeare, lm_shakespeare_hypersolver, lm_wikitext103
from deq_jax.training import family_for, train_and_evaluate
from deq_jax.training.families.lm_evaluate import check_token_ids, evaluate_lm_checkpoint
from deq_jax.training.families.lm_family import REPORT_FILE, LanguageModelFamily
from deq_jax.training.families.lm_generate import generate
from deq_jax.training.families.lm_setup import VocabularyMismatchError, restore_language_model
from deq_jax.training.run import writers
from deq_jax.training.solver_fit.hypersolver import train_hypersolver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = (
    "ROMEO: But soft, what light through yonder window breaks?",
    "JULIET: O Romeo, Romeo, wherefore art thou Romeo?",
    "FRIAR: These violent delights have violent ends.",
    "NURSE: Go, girl, seek happy nights to happy days.",
)


def write_corpus(path, repeats=40):
    rng = np.random.default_rng(0)
    text = "\n".join(LINES[i] for i in rng.integers(0, len(LINES), repeats * len(LINES)))
    path.write_text(text + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("text") / "plays.txt")


def smoke_config(corpus, arg="smoke", **train):
    config = lm_shakespeare.get_config(arg)
    config.task.path = corpus
    config.log.tensorboard = False
    config.train.update(train)
    return config


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("lm"))
    lines = []
    config = smoke_config(corpus)
    config.eval.max_batches = 0  # the periodic evaluation streams whole splits
    config.eval.report_max_batches = 0  # and so does the final one (smoke: 2 segments)
    result = train_and_evaluate(config, workdir, emit=lines.append)
    return workdir, result, lines


def test_smoke_run_writes_report_checkpoints_and_metrics(trained):
    workdir, result, lines = trained
    assert result.step == 4
    with open(os.path.join(workdir, REPORT_FILE)) as f:
        report = json.load(f)
    for split in ("valid", "test"):
        metrics = report["eval"][split]
        assert np.isfinite(metrics["bpc"]) and 0 < metrics["bpc"] < 8
        assert metrics["tokens"] > 0 and metrics["nstep_mean"] >= 1
    assert report["train_tokens_per_second"] > 0
    records = writers.read_metrics(workdir)
    train = [r for r in records if r["split"] == "train"]
    assert train and all(np.isfinite(r["loss"]) for r in train)
    # The periodic evaluation (step 2) reads valid only; test is read once, at the end.
    periodic = {r["split"] for r in records if r["split"] != "train" and r["step"] < result.step}
    assert periodic == {"valid"}
    assert {r["split"] for r in records if r["step"] == result.step} >= {"valid", "test"}
    assert any("warm-up done" in line for line in lines)  # 2 weight-tied, then 2 DEQ steps
    assert os.path.exists(os.path.join(workdir, "vocab.json"))


def test_eval_scores_every_token_of_the_split(corpus, trained, tmp_path):
    from deq_jax import tasks

    _, result, _ = trained
    task = tasks.get("char_text", path=corpus, data_dir=str(tmp_path / "data"))
    for split in ("valid", "test"):
        assert result.eval_metrics[split]["tokens"] == task.num_tokens(split) - 1


def test_checkpoint_evaluation_at_other_budgets_with_segments(corpus, trained, tmp_path):
    workdir, result, _ = trained
    lines = []
    config = smoke_config(corpus)
    report = evaluate_lm_checkpoint(
        config, workdir, splits=("valid",), max_iters=(1, 4), emit=lines.append, exclude="ROMEO"
    )
    assert lines[0].startswith("Checkpoint step") and "max_iter=1" in lines[-1]
    assert set(report) == {"max_iter=1", "max_iter=4"}
    at_eval_budget = report["max_iter=4"]["valid"]  # the smoke config's eval budget
    # the checkpoint training scored last, scored again: the same numbers
    np.testing.assert_allclose(at_eval_budget["bpc"], result.eval_metrics["valid"]["bpc"], 1e-5)
    assert report["max_iter=1"]["valid"]["nstep_max"] == 1
    segments = at_eval_budget["segments"]
    tokens = sum(s["tokens"] for s in segments)
    assert len(segments) > 1 and tokens == at_eval_budget["tokens"]
    nll = sum(s["nll"] * s["tokens"] for s in segments) / tokens
    np.testing.assert_allclose(nll, at_eval_budget["nll"], rtol=1e-5)
    assert 0 < at_eval_budget["worst_5pct_share"] < 1
    # --exclude: the same pass also scores exactly the targets outside the matches
    from deq_jax import tasks
    from deq_jax.tasks.text_vocab import pattern_mask

    task = tasks.get("char_text", path=corpus, data_dir=str(tmp_path / "data"))
    inside = pattern_mask(task.vocab, task.tokens("valid"), "ROMEO")[1:]  # the targets
    assert inside.any() and "outside /ROMEO/" in lines[1]
    np.testing.assert_allclose(at_eval_budget["matched_fraction"], inside.mean(), rtol=1e-6)
    assert np.isfinite([at_eval_budget["kept_bpc"], at_eval_budget["matched_bpc"]]).all()
    assert abs(at_eval_budget["kept_bpc"] - at_eval_budget["bpc"]) > 1e-4
    # a pattern that matches nothing keeps every target: the kept sums are the whole's
    nothing = evaluate_lm_checkpoint(
        config, workdir, splits=("valid",), max_iters=(4,), emit=lambda _: None, exclude="Q{9}"
    )["max_iter=4"]["valid"]
    assert nothing["matched_fraction"] == 0 and np.isnan(nothing["matched_bpc"])
    np.testing.assert_allclose(nothing["kept_bpc"], at_eval_budget["bpc"], rtol=1e-6)

    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        evaluate_lm_checkpoint(smoke_config(corpus), str(tmp_path / "empty"))
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    os.remove(os.path.join(copy, "vocab.json"))
    with pytest.raises(FileNotFoundError, match="language-model run"):
        evaluate_lm_checkpoint(smoke_config(corpus), copy)


def test_resume_is_exact(corpus, trained, tmp_path):
    workdir, result, _ = trained

    def config(**train):  # no periodic evaluation: it leaves the parameters alone
        config = smoke_config(corpus, **train)
        config.eval.update(dict(every_steps=0, splits=("valid",)))
        return config

    train_and_evaluate(config(stop_at_step=2), str(tmp_path), emit=lambda _: None)
    resumed = train_and_evaluate(config(), str(tmp_path), emit=lambda _: None)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
        jax.device_get(resumed.state.params),
        jax.device_get(result.state.params),
    )


def test_weight_averaging_leaves_training_alone_and_logs_the_raw_weights(corpus, trained, tmp_path):
    _, result, _ = trained
    config = smoke_config(corpus, ema_decay=0.5)
    config.eval.update(dict(max_batches=0, score_raw_weights=True))
    lines = []
    averaged = train_and_evaluate(config, str(tmp_path), emit=lines.append)
    # The same trained weights, their average beside them. The two train steps are
    # different programs (the averaging's ops join the update), which XLA may round
    # differently; the average itself is far outside the tolerance.
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
        jax.device_get(averaged.state.params),
        jax.device_get(result.state.params),
    )
    assert averaged.state.has_average
    moved = jax.tree_util.tree_map(
        lambda a, b: float(np.max(np.abs(a - b))),
        jax.device_get(averaged.state.eval_params),
        jax.device_get(averaged.state.params),
    )
    assert max(jax.tree_util.tree_leaves(moved)) > 1e-4
    splits = {record["split"] for record in writers.read_metrics(str(tmp_path))}
    assert {"valid", "valid_raw"} <= splits
    assert any(line.startswith("eval step 2 valid_raw: ") for line in lines)


@pytest.mark.slow  # the main loop's test_a_larger_train_steps_continues... in CI form:
# test_earlier_report_is_the_one_written_at_or_before_the_restored_step
def test_a_larger_train_steps_continues_and_keeps_the_time(corpus, trained, tmp_path):
    workdir, _, _ = trained
    run_dir = tmp_path / "run"
    shutil.copytree(workdir, run_dir)
    report_path = run_dir / REPORT_FILE
    saved = json.loads(report_path.read_text())
    saved["train_seconds"] = 1000.0  # a known earlier training time
    report_path.write_text(json.dumps(saved))
    config = smoke_config(corpus)
    config.train.steps += 2
    result = train_and_evaluate(config, str(run_dir), emit=lambda _: None)
    assert result.step == config.train.steps
    report = json.loads(report_path.read_text())
    assert report["step"] == config.train.steps and report["train_seconds"] > 1000.0


def test_rerunning_a_finished_run_says_so_and_writes_nothing(corpus, trained):
    workdir, result, _ = trained

    def tree():
        found = {}
        for root, dirs, files in os.walk(workdir):
            found[root] = sorted(dirs)
            for name in files:
                path = os.path.join(root, name)
                found[path] = (os.path.getmtime(path), os.path.getsize(path))
        return found

    before = tree()
    lines = []
    again = train_and_evaluate(smoke_config(corpus), workdir, emit=lines.append)
    assert len(lines) == 1 and f"The run in {workdir} is finished (step 4" in lines[0]
    assert tree() == before
    assert again.step == 4
    for split in ("valid", "test"):
        np.testing.assert_allclose(
            again.eval_metrics[split]["bpc"], result.eval_metrics[split]["bpc"], rtol=1e-6
        )


def test_other_vocabulary_is_refused(trained, tmp_path):
    workdir, _, _ = trained
    other = tmp_path / "other.txt"
    other.write_text("completely different text 0123456789 " * 200, encoding="utf-8")
    with pytest.raises(VocabularyMismatchError, match="another vocabulary"):
        train_and_evaluate(smoke_config(str(other)), workdir, emit=lambda _: None)


def test_generate_with_memory_and_warm_start(corpus, trained):
    workdir, _, _ = trained
    config = smoke_config(corpus)
    model, variables, vocab, step = restore_language_model(config, workdir)
    assert step == 4
    prompt = vocab.encode("ROMEO:")
    out = generate(
        model, variables, prompt, 12, key=jax.random.PRNGKey(0), seq_len=config.train.seq_len
    )
    assert out.tokens.shape == (12,) and out.nstep.shape == (12,)
    assert ((out.tokens >= 0) & (out.tokens < vocab.size)).all()
    greedy = [
        generate(model, variables, prompt, 6, key=jax.random.PRNGKey(s), seq_len=8, temperature=0)
        for s in (0, 1)
    ]
    np.testing.assert_array_equal(greedy[0].tokens, greedy[1].tokens)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, variables, np.array([vocab.size]), 2, key=jax.random.PRNGKey(0), seq_len=8)


@pytest.mark.slow
def test_sample_launch_and_bad_prompt(corpus, trained):
    workdir, _, _ = trained
    common = [
        "--config=configs/lm_shakespeare.py:smoke",
        f"--workdir={workdir}",
        f"--config.task.path={corpus}",
    ]
    proc = run_module("launch.sample", *common, "--prompt=ROMEO:", "--length=20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ROMEO:" in proc.stdout and "solver steps per token" in proc.stdout
    bad = run_module("launch.sample", *common, "--prompt=ROMEO: \u00a7", "--length=5")
    assert bad.returncode != 0 and "\u00a7" in bad.stderr


@pytest.mark.slow
def test_evaluate_launch_streams_a_language_model(corpus, trained, tmp_path):
    workdir, _, _ = trained
    output = str(tmp_path / "evaluation.json")
    proc = run_module(
        "launch.evaluate",
        "--config=configs/lm_shakespeare.py:smoke",
        f"--workdir={workdir}",
        f"--config.task.path={corpus}",
        "--splits=test",
        "--max_iters=2",
        f"--output={output}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max_iter=2 test: bpc" in proc.stdout
    with open(output) as f:
        test = json.load(f)["max_iter=2"]["test"]
    assert test["nstep_max"] <= 2 and test["segments"] and np.isfinite(test["bpc"])


def _solver_config(corpus, workdir):
    config = lm_shakespeare_hypersolver.get_config("smoke")
    config.task.path = corpus
    config.neural_solver.deq_workdir = workdir
    config.neural_solver.max_target_residual = 10.0  # a 4-step model barely converges
    return config


def test_lm_solver_without_a_trained_model_says_what_to_do(corpus, tmp_path):
    config = _solver_config(corpus, str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="train the language model there first"):
        train_hypersolver(config, str(tmp_path / "solver"), emit=lambda _: None)


@pytest.mark.slow
def test_neural_solver_fit_on_the_language_model(corpus, trained, tmp_path):
    workdir, _, _ = trained
    config = _solver_config(corpus, workdir)
    config.neural_solver.ablations = False
    run = train_hypersolver(config, str(tmp_path), emit=lambda _: None)
    report = run.report
    assert report["state_shape"] == [config.train.seq_len, config.model.d_model]
    assert report["input_shape"][-1] == 3 * config.model.d_model  # reads the injection
    assert report["param_fraction"] > 0  # the smoke LM is smaller than its solver
    for name in ("anderson", "neural", "neural_2K"):
        assert np.isfinite(report["eval"][name]["bpc"])
        assert report["eval"][name]["seconds_per_batch"] > 0
    assert set(run.solvers) == {"hyper_anderson"}


@pytest.mark.slow
def test_solver_sweep_on_the_language_model(corpus, trained, tmp_path):
    from experiments.neural_solver.pareto import run_pareto

    workdir, _, _ = trained
    config = _solver_config(corpus, workdir)
    run = train_hypersolver(config, str(tmp_path), emit=lambda _: None)
    assert set(run.solvers) == {"hyper_anderson", "no_init", "ls_alpha"}
    pareto = run_pareto(
        config, str(tmp_path), budgets=(2,), repeats=1, max_batches=2, emit=lambda _: None
    )
    assert pareto["summary"]["metric"] == "bpc"
    assert pareto["summary"]["metric_target"] == pytest.approx(
        pareto["table"]["anderson"][0]["bpc"] + 0.005
    )
    assert os.path.exists(tmp_path / "solver_pareto.png")


_MULTI = """
import json, sys
import jax
from configs import lm_shakespeare
from deq_jax.training.run import writers
from deq_jax.training import train_and_evaluate

workdir, corpus = sys.argv[1], sys.argv[2]
config = lm_shakespeare.get_config("smoke")
config.task.path = corpus
config.log.tensorboard = False
config.log.every_steps = 1
config.train.batch_size = 8
# One train program (the DEQ's: the warm-up's is the same data-parallel step) and one
# evaluation, the final one, on the valid split.
config.train.pretrain_steps = 0
config.eval.every_steps = 0
config.eval.splits = ("valid",)
config.eval.batch_size = 8
config.ckpt.every_steps = 4
result = train_and_evaluate(config, workdir, emit=lambda line: None)
losses = [r["loss"] for r in writers.read_metrics(workdir) if r["split"] == "train"]
valid = result.eval_metrics["valid"]
print("RESULT " + json.dumps({"devices": jax.device_count(), "losses": losses,
                             "bpc": valid["bpc"], "nstep": valid["nstep_mean"]}))
"""


def _run_devices(devices, workdir, corpus):
    return run_on_devices(_MULTI, workdir, corpus, devices=devices)


def test_same_numbers_on_one_and_eight_devices(corpus, tmp_path):
    one = _run_devices(1, tmp_path / "one", corpus)
    eight = _run_devices(8, tmp_path / "eight", corpus)
    assert (one["devices"], eight["devices"]) == (1, 8)
    assert len(one["losses"]) == 4
    np.testing.assert_allclose(eight["losses"], one["losses"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        [eight["bpc"], eight["nstep"]], [one["bpc"], one["nstep"]], atol=1e-4
    )


@pytest.mark.parametrize(
    "arg",
    [
        "smoke,unrolled",
        pytest.param("smoke,weight_tied", marks=pytest.mark.slow),
        pytest.param("smoke,untied", marks=pytest.mark.slow),
        pytest.param("smoke,pre_ln,jacobian", marks=pytest.mark.slow),
    ],
)
def test_variants_train(corpus, tmp_path, arg):
    config = smoke_config(corpus, arg, steps=2)
    config.eval.max_batches = 1
    result = train_and_evaluate(config, str(tmp_path), emit=lambda _: None)
    assert np.isfinite(result.eval_metrics["valid"]["bpc"])


def test_jacobian_term_needs_a_training_solve(corpus, tmp_path):
    config = smoke_config(corpus, "smoke,unrolled,jacobian", steps=2)
    with pytest.raises(ValueError, match="trains without a solve"):
        train_and_evaluate(config, str(tmp_path), emit=lambda _: None)


@pytest.mark.slow
def test_wikitext_smoke(tmp_path):
    words = "the cat sat on a mat and the dog ran to the park with a red ball".split()
    rng = np.random.default_rng(1)
    for split, n in (("train", 400), ("valid", 60), ("test", 60)):
        lines = [" ".join(rng.choice(words, 12)) for _ in range(n // 12 + 1)]
        (tmp_path / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    config = lm_wikitext103.get_config("smoke")
    config.task.path = str(tmp_path)
    config.log.tensorboard = False
    result = train_and_evaluate(config, str(tmp_path / "run"), emit=lambda _: None)
    assert np.isfinite(result.eval_metrics["valid"]["ppl"])


def test_configs_document_their_commands():
    for module, name in ((lm_shakespeare, "lm_shakespeare"), (lm_wikitext103, "lm_wikitext103")):
        assert f"python -m launch.main --config configs/{name}.py" in module.__doc__
    with pytest.raises(ValueError, match="more than one mode"):
        lm_shakespeare.get_config("untied,weight_tied")
    assert lm_shakespeare.get_config("pre_ln").model.ln_placement == "pre"


def test_lm_table_over_seeds(trained, tmp_path):
    from experiments.language_model import table as lm_table

    workdir, _, _ = trained
    assert lm_table.parse_group(f"deq={workdir},{workdir}") == ("deq", [workdir, workdir])
    with pytest.raises(ValueError, match="name=workdir"):
        lm_table.parse_group("deq")
    row = lm_table.summarize("deq", [lm_table.read_run(workdir)] * 2)
    assert row["seeds"] == 2 and row["valid"][1] == 0.0 and row["bwd_nstep"][0] is not None
    assert "| deq | 2 |" in lm_table.markdown([row])
    with pytest.raises(FileNotFoundError, match="did not finish"):
        lm_table.read_run(str(tmp_path))


def test_the_one_loop_picks_the_language_model_family(corpus):
    from configs import prefix_sum
    from deq_jax.training import TaskFamily

    assert isinstance(family_for(smoke_config(corpus)), LanguageModelFamily)
    assert isinstance(family_for(prefix_sum.get_config("smoke")), TaskFamily)


def test_alternating_solver_training_is_refused_for_the_language_model(corpus, tmp_path):
    config = smoke_config(corpus)
    config.neural_solver.alternating = True
    with pytest.raises(ValueError, match="alternating trains task models; LanguageModelFamily"):
        train_and_evaluate(config, str(tmp_path / "lm"), emit=lambda line: None)


def test_token_ids_outside_the_vocabulary_are_refused_before_the_step():
    batch = {"inputs": np.array([[0, 3], [1, 2]]), "targets": np.array([[3, 1], [2, 4]])}
    check_token_ids(batch, vocab_size=5)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, vocab_size=4\)"):
        check_token_ids(batch, vocab_size=4)
    with pytest.raises(ValueError, match="inputs"):
        check_token_ids(dict(batch, inputs=np.array([[-1, 0], [0, 0]])), vocab_size=5)


def test_the_final_report_reads_report_max_batches_segments(corpus, tmp_path):
    config = smoke_config(corpus, steps=2, pretrain_steps=0)
    config.eval.update(dict(every_steps=0, report_max_batches=1))
    lines = []
    result = train_and_evaluate(config, str(tmp_path), emit=lines.append)
    segment = config.eval.batch_size * (config.eval.seq_len or config.train.seq_len)
    for split in ("valid", "test"):
        assert 0 < result.eval_metrics[split]["tokens"] <= segment
    assert any("on the first 1 segments of ('valid', 'test')" in line for line in lines)
    assert not any("Per-length" in line for line in lines)
    assert any(line.startswith("bpc per split at the eval budget") for line in lines)
    with open(os.path.join(str(tmp_path), REPORT_FILE)) as f:
        assert json.load(f)["eval"]["test"]["tokens"] == result.eval_metrics["test"]["tokens"]
