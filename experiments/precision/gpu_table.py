"""The table of ``experiments/gpu/precision.sh``: bfloat16 against default precision on a
GPU, against the torchdeq twins, and the goals of issue 78 met or not.

Reads ``OUT_DIR/steps.jsonl`` (`benchmarks.step_time` records tagged
``{lm,mdeq}_{default,bfloat16}_{round}``), ``OUT_DIR/twin.jsonl`` (the twins' records
tagged ``{lm,mdeq}_tf32_{0,1}``), and per precision ``OUT_DIR/train_{precision}.log``
and ``eval_{precision}.json`` (the Shakespeare runs), and ``loop_cost.jsonl`` (the
solver loop against jaxopt); any of them may be missing. Writes
``OUT_DIR/table.md`` and ``OUT_DIR/table.json`` and prints the markdown::

    python -m experiments.precision.gpu_table /tmp/precision
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from typing import Any

PRECISIONS = ("default", "bfloat16")
# The goals: bf16 step / default step, f(z*) TFLOP/s, valid bpc difference.
STEP_RATIO_GOAL, TFLOPS_GOAL, BPC_GOAL = 0.6, 150.0, 0.02


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (none if it is missing)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _median(records: list[dict], key: str, field: str = "median") -> float | None:
    values = [r[key][field] if isinstance(r[key], dict) else r[key] for r in records if key in r]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def step_rows(records: list[dict]) -> list[dict[str, Any]]:
    """One row per model and precision: medians over the rounds."""
    rows = []
    for model in ("lm", "mdeq"):
        for precision in PRECISIONS:
            mine = [r for r in records if r.get("tag", "").startswith(f"{model}_{precision}_")]
            if not mine:
                continue
            budget = mine[0]["config"]["deq"]["train_max_iter"]
            rows.append(
                dict(
                    model=model,
                    precision=precision,
                    rounds=len(mine),
                    train_ms=_median(mine, "train_ms"),
                    eval_ms=_median(mine, "eval_ms"),
                    f_ms=_median(mine, "f_eval_ms"),
                    f_tflops=_median(mine, "f_eval_tflops_per_s"),
                    fraction_of_peak=_median(mine, "f_eval_fraction_of_peak"),
                    budget=budget,
                    fwd_nstep=_median(mine, "train_fwd_nstep_mean", "mean"),
                    fwd_nstep_max=max(r["train_fwd_nstep_max"]["max"] for r in mine),
                    bwd_nstep=_median(mine, "train_bwd_nstep_mean", "mean"),
                    eval_nstep=_median(mine, "eval_nstep_mean", "mean"),
                    floor=_median(mine, "train_fwd_floor", "mean"),
                    at_floor=_median(mine, "train_fwd_at_floor", "mean"),
                )
            )
    return rows


def twin_ms(twins: list[dict], model: str, tf32: int, key: str = "train_ms") -> float | None:
    """The twin's median ``key`` at ``model``, with or without TF32."""
    mine = [r for r in twins if r.get("tag") == f"{model}_tf32_{tf32}"]
    return _median(mine, key) if mine else None


def training(out: str) -> dict[str, dict[str, Any]]:
    """Per precision: the last logged step and solver steps (mean over the batch, and
    its max) of the train run, its forward budget, and the valid bpc of its last
    checkpoint."""
    result = {}
    for precision in PRECISIONS:
        row: dict[str, Any] = {}
        log = os.path.join(out, f"train_{precision}.log")
        if os.path.exists(log):
            with open(log) as f:
                lines = re.findall(
                    r"step (\d+)/\d+ .*solver steps ([\d.]+) \(max (\d+)\)", f.read()
                )
            if lines:
                step, mean, top = lines[-1]
                row.update(step=int(step), solver_steps=float(mean), solver_steps_max=int(top))
        config = os.path.join(out, f"train_{precision}", "config.json")
        if os.path.exists(config):
            with open(config) as f:
                row["budget"] = json.load(f)["deq"]["train_max_iter"]
        report = os.path.join(out, f"eval_{precision}.json")
        if os.path.exists(report):
            with open(report) as f:
                evaluated = json.load(f)
            for budget in evaluated.values():
                if isinstance(budget, dict) and "valid" in budget:
                    row["valid_bpc"] = budget["valid"].get("bpc")
                    break
        result[precision] = row
    return result


def goals(rows: list[dict], trained: dict[str, dict]) -> dict[str, Any]:
    """The issue's GPU goals, each ``[value, met]``."""
    by = {(r["model"], r["precision"]): r for r in rows}
    out: dict[str, Any] = {}
    for model in ("lm", "mdeq"):
        bf16, base = by.get((model, "bfloat16")), by.get((model, "default"))
        if bf16 and base and bf16["train_ms"] and base["train_ms"]:
            ratio = bf16["train_ms"] / base["train_ms"]
            out[f"{model}_bf16_step_ratio"] = [ratio, ratio <= STEP_RATIO_GOAL]
        if bf16:
            no_burn = bf16["fwd_nstep_max"] < bf16["budget"]
            out[f"{model}_bf16_solves_end_by_tol_or_floor"] = [bf16["fwd_nstep_max"], no_burn]
    lm = by.get(("lm", "bfloat16"))
    if lm and lm["f_tflops"]:
        out["lm_bf16_f_tflops"] = [lm["f_tflops"], lm["f_tflops"] >= TFLOPS_GOAL]
    bpc = {p: trained.get(p, {}).get("valid_bpc") for p in PRECISIONS}
    if None not in bpc.values():
        gap = bpc["bfloat16"] - bpc["default"]
        out["bpc_bf16_minus_default"] = [gap, gap <= BPC_GOAL]
    run = trained.get("bfloat16", {})
    if "solver_steps" in run and "budget" in run:
        no_burn = run["solver_steps"] < run["budget"]
        out["tpu_default_arithmetic_trains_without_burn"] = [run["solver_steps"], no_burn]
    return out


def markdown(rows: list[dict], twins: list[dict], trained: dict, met: dict) -> str:
    """The tables as markdown."""
    fmt = lambda v: "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
    keys = (
        "model",
        "precision",
        "train_ms",
        "eval_ms",
        "f_ms",
        "f_tflops",
        "fraction_of_peak",
        "fwd_nstep",
        "budget",
        "bwd_nstep",
        "eval_nstep",
        "floor",
        "at_floor",
    )
    lines = ["| " + " | ".join(keys) + " | twin train ms (TF32 off / on) |"]
    lines.append("|" + " --- |" * (len(keys) + 1))
    for row in rows:
        twin = " / ".join(fmt(twin_ms(twins, row["model"], t)) for t in (0, 1))
        lines.append("| " + " | ".join(fmt(row[k]) for k in keys) + f" | {twin} |")
    lines += ["", "| training run | step reached | solver steps (max) | budget | valid bpc |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for precision, run in trained.items():
        steps = f"{fmt(run.get('solver_steps'))} ({fmt(run.get('solver_steps_max'))})"
        cells = (fmt(run.get("step")), steps, fmt(run.get("budget")), fmt(run.get("valid_bpc")))
        lines.append(f"| {precision} | " + " | ".join(cells) + " |")
    lines += ["", "| goal | value | met |", "| --- | --- | --- |"]
    lines += [f"| {name} | {fmt(value)} | {ok} |" for name, (value, ok) in met.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> dict[str, Any]:
    """Reads the script's outputs under ``argv[1]``, writes and prints the tables."""
    out = argv[1]
    rows = step_rows(read_jsonl(os.path.join(out, "steps.jsonl")))
    twins = read_jsonl(os.path.join(out, "twin.jsonl"))
    trained = training(out)
    met = goals(rows, trained)
    loop = [r for r in read_jsonl(os.path.join(out, "loop_cost.jsonl")) if "measurement" in r]
    text = markdown(rows, twins, trained, met)
    for row in loop:  # the solver loop against jaxopt (benchmarks.loop_cost)
        text += "\n" + json.dumps(row)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n")
    result = dict(steps=rows, training=trained, goals=met, loop_cost=loop)
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(text)
    return result


if __name__ == "__main__":
    main(sys.argv)
