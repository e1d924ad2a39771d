"""`benchmarks.step_time` on a tiny language model and a tiny MDEQ, their data
directories empty (synthetic data need no corpus and no image files), and the pairing
of `benchmarks.twin_ratios`.

`benchmarks.step_time` defines its flags only when it runs as the command (others of the
suite define ``--out``, ``--steps``, ``--batch`` and ``--input_shape``), so the tests call
`measure` and `write_record` in-process.
"""

import json
import math

import pytest

from benchmarks import step_bench, step_time, twin_ratios
from configs import lm_shakespeare, mdeq_fashion_mnist

TINY = step_bench.Options(warmup=1, steps=1, eval_steps=1, f_evals=2, tag="t")
TIMES = ("train_ms", "eval_ms", "f_eval_ms", "vjp_ms")


def _check_record(record, model):
    assert record["model"] == model and record["side"] == "jax" and record["tag"] == "t"
    assert record["params"] > 0 and record["data"] == "synthetic"
    for key in TIMES:
        assert set(record[key]) == {"median", "min", "max", "mean", "all"}
        assert len(record[key]["all"]) == (2 if key in ("f_eval_ms", "vjp_ms") else 1)
    numbers = [record[k]["median"] for k in TIMES]
    numbers += [record["train_ms_per_fwd_f_eval"]["mean"], record["first_step_incl_compile_s"]]
    numbers += [record["train_fwd_nstep_mean"]["mean"], record["eval_nstep_mean"]["mean"]]
    numbers += [record["train_bwd_nstep_max"]["mean"]]
    assert all(math.isfinite(x) and x > 0 for x in numbers), numbers
    assert record["env"]["jax"] and record["env"]["n_cpu_visible"] >= 1
    # XLA's count of one f(z*) and its rate; on the CPU no peak, so no fraction.
    assert record["f_eval_flops"] > 0 and record["precision"] == "default"
    rate = record["f_eval_flops"] / (record["f_eval_ms"]["median"] / 1e3) / 1e12
    assert record["f_eval_tflops_per_s"] == pytest.approx(rate)
    assert record["env"]["device_kind"] == "cpu" and record["arithmetic"] is None
    assert record["peak_tflops"] is record["f_eval_fraction_of_peak"] is None
    table = step_time.format_table(record)
    assert "train step ms" in table and "VJP of f alone ms" in table
    assert "f(z*) FLOPs (XLA count)" in table and "f(z*) TFLOP/s at median" in table
    assert "no peak known: cpu" in table


def test_the_table_gives_the_fraction_of_a_known_peak():
    ms = {"median": 2.0, "min": 1.0, "max": 3.0, "mean": 2.0, "all": [2.0]}
    stat = {"mean": 0.1, "min": 0.1, "max": 0.1, "per_step": [0.1]}
    record = {
        "model": "m",
        "variant": "v",
        "tag": "",
        "params": 1,
        "batch": 1,
        "data": "synthetic",
        "first_step_incl_compile_s": 1.0,
        **dict.fromkeys(("train_ms", "eval_ms", "train_ms_per_fwd_f_eval"), ms),
        **dict.fromkeys(("f_eval_ms", "vjp_ms"), ms),
        **dict.fromkeys(("train_fwd_rel_residual_mean", "eval_rel_residual_mean"), stat),
        "env": {"device_kind": "NVIDIA H200"},
        "f_eval_flops": 9.9e10,
        "f_eval_tflops_per_s": 49.5,
        "precision": "default",
        "arithmetic": "tf32",
        "peak_tflops": 495.0,
        "f_eval_fraction_of_peak": 0.1,
    }
    table = step_time.format_table(record)
    assert "10.00% of 495 TFLOP/s (NVIDIA H200, tf32, precision default)" in table
    assert "9.900e+10" in table
    record.update(f_eval_flops=None, f_eval_tflops_per_s=None, f_eval_fraction_of_peak=None)
    assert "(the backend counts none)" in step_time.format_table(record)


def test_step_time_times_a_language_model(tmp_path, capsys):
    config = lm_shakespeare.get_config("smoke")
    (tmp_path / "corpus").mkdir()
    config.task.path = str(tmp_path / "corpus")  # empty: no corpus is read
    with pytest.raises(ValueError, match="--vocab"):
        step_time.measure(config, TINY)
    record = step_time.measure(config, TINY._replace(vocab=12, batch=2), command="cmd")
    _check_record(record, "deq_transformer_lm")
    assert record["batch"] == 2 and record["command"] == "cmd"
    assert record["train_tokens_per_s"] > 0 and record["vocab"] == 12
    assert not any((tmp_path / "corpus").iterdir())
    out = tmp_path / "r.jsonl"
    step_time.write_record(record, str(out))
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out)


def test_step_time_times_an_image_model(tmp_path):
    # One resolution of the MDEQ smoke model on 8x8 images, its data directories empty.
    config = mdeq_fashion_mnist.get_config("smoke")
    empty = [tmp_path / "idx", tmp_path / "data"]
    for folder in empty:
        folder.mkdir()
    config.task.dir, config.task.data_dir = map(str, empty)
    config.model.channels = config.model.channels[:1]
    config.model.head_channels = config.model.head_channels[:1]
    options = TINY._replace(batch=4, full_budget=True, model_name="m")
    with pytest.raises(ValueError, match="pass --input_shape .e.g. 28,28,1"):
        step_time.measure(config, options)  # the task would read its shape from the files
    record = step_time.measure(config, options._replace(input_shape=(8, 8, 1)))
    assert not [path for folder in empty for path in folder.iterdir()]  # nothing written
    _check_record(record, "m")
    assert record["train_images_per_s"] > 0 and record["input_shape"] == [8, 8, 1]
    budget = config.deq.train_max_iter
    assert record["train_fwd_nstep_max"]["mean"] == budget  # full_budget applied


def _record(model, tag, train, eval_, f, **more):
    ms = lambda x: {"median": x, "min": x, "max": x, "mean": x, "all": [x]}
    return {"model": model, "tag": tag, "train_ms": ms(train), "eval_ms": ms(eval_), **more} | {
        "f_eval_ms": ms(f)
    }


def test_twin_ratios_pairs_records_by_model_and_tag(tmp_path):
    ours, twins = tmp_path / "jax.jsonl", tmp_path / "twin.jsonl"
    ours.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                _record("lm", "round1", 200.0, 90.0, 10.0, side="jax"),
                _record("mdeq", "round1", 50.0, 20.0, 4.0, side="jax"),
                _record("lm", "alone", 1.0, 1.0, 1.0, side="jax"),
            ]
        )
        + "\n"
    )
    twins.write_text(
        json.dumps(_record("mdeq", "round1", 100.0, 10.0, 2.0))
        + "\n"
        + json.dumps(_record("lm", "round1", 100.0, 30.0, 8.0))
        + "\n"
    )
    pairs = twin_ratios.pair(twin_ratios.read(str(ours)), twin_ratios.read(str(twins)))
    assert [key for key, _, _ in pairs] == [("lm", "round1"), ("mdeq", "round1")]
    ratios = twin_ratios.ratios(pairs)
    assert ratios[0]["train_ms"] == pytest.approx(2.0)
    assert ratios[0]["eval_ms"] == pytest.approx(3.0)
    assert ratios[1]["train_ms"] == pytest.approx(0.5)
    assert ratios[1]["f_eval_ms"] == pytest.approx(2.0)
    table = twin_ratios.markdown(pairs)
    assert table.splitlines()[0].startswith("| model | tag |")
    assert "| lm | round1 | 200 | 100 | 2.00 |" in table
    assert "alone" not in table
