"""The table of `ablations.sh`: each variant of the neural solver's fit over its seeds.

Reads ``OUT_DIR/VARIANT/sSEED/{neural_solver.json, solver_pareto.json}`` and prints, per
variant, the budget at which the fitted solver first reaches Anderson's best metric less
the margin (each seed), the speed-up over Anderson in evaluations and in wall time (the
neural overhead included; mean +- std over the seeds), the relative residual at ``K``
and ``2K`` against Anderson's, and the fit's cost; then the metric at every budget (mean
over the seeds). Writes ``OUT_DIR/ablations.json``::

    python -m experiments.neural_solver.ablation_table /tmp/ns_ablations/prefix_sum

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from deq_jax.training.run.writers import write_json
from experiments.neural_solver.pareto import summarize


def _read(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _stat(values: Sequence[float | None], fmt: str = ".2f") -> str:
    """``mean +- std`` of the values that exist (``n/m`` when some seeds have none)."""
    have = [v for v in values if v is not None]
    if not have:
        return "-"
    text = f"{np.mean(have):{fmt}}"
    if len(have) > 1:
        text += f" ± {np.std(have):{fmt}}"
    return text + ("" if len(have) == len(values) else f" ({len(have)}/{len(values)})")


def variant_row(name: str, runs: list[tuple[dict, dict]]) -> dict[str, Any]:
    """One variant's numbers over its seeds' ``(fit report, sweep report)``."""
    sweeps = [  # summarised again: a sweep written before a change to `summarize` agrees
        summarize(s["table"], s["residual_curves"], s["unroll_steps"], s["margin"]) for _, s in runs
    ]
    fits = [f for f, _ in runs]
    neural = [s["hyper_anderson"] for s in sweeps]
    anderson = [s["anderson"] for s in sweeps]
    return {
        "variant": name,
        "seeds": [f["spec"]["seed"] for f in fits],
        "metric": sweeps[0]["metric"],
        "target": sweeps[0]["metric_target"],
        "anderson_budget": [a["budget_to_metric"] for a in anderson],
        "budget": [n["budget_to_metric"] for n in neural],
        "evals_ratio": [n["evals_ratio_metric_vs_anderson"] for n in neural],
        "speedup": [n["speedup_metric_vs_anderson"] for n in neural],
        "residual_K": [n["residual_at_K"] for n in neural],
        "residual_2K": [n["residual_at_2K"] for n in neural],
        "anderson_residual_2K": [a["residual_at_2K"] for a in anderson],
        "fit_seconds": [f["fit_seconds"]["hyper_anderson"] for f in fits],
        "target_seconds": [f["target_seconds"] for f in fits],
        "time_fraction": [f["time_fraction"] for f in fits],
        "by_budget": {
            name: _by_budget([s["table"][name] for _, s in runs], sweeps[0]["metric"])
            for name in runs[0][1]["table"]
        },
    }


def _by_budget(tables: list[list[dict]], key: str) -> dict[int, list[float]]:
    """``{budget: [metric per seed]}``."""
    out: dict[int, list[float]] = {}
    for rows in tables:
        for row in rows:
            out.setdefault(int(row["budget"]), []).append(float(row[key]))
    return out


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown tables."""
    head = (
        "| variant | seeds | Anderson budget | budget to target (per seed) | speed-up in "
        "evaluations | speed-up in time | residual at K / 2K | Anderson at 2K | fit s "
        "(targets s) |"
    )
    out = [head, "|" + " --- |" * (head.count(" | ") + 1)]
    for r in rows:
        budgets = ", ".join("-" if b is None else str(b) for b in r["budget"])
        out.append(
            f"| {r['variant']} | {len(r['seeds'])} | {_stat(r['anderson_budget'], '.0f')} | "
            f"{budgets} | {_stat(r['evals_ratio'])}x | {_stat(r['speedup'])}x | "
            f"{_stat(r['residual_K'], '.1e')} / {_stat(r['residual_2K'], '.1e')} | "
            f"{_stat(r['anderson_residual_2K'], '.1e')} | {_stat(r['fit_seconds'], '.0f')} "
            f"({_stat(r['target_seconds'], '.0f')}) |"
        )
    budgets = sorted({b for r in rows for b in r["by_budget"]["hyper_anderson"]})
    out += ["", f"{rows[0]['metric']} by budget (mean over the seeds):", ""]
    out.append("| solver | " + " | ".join(str(b) for b in budgets) + " |")
    out.append("|" + " --- |" * (len(budgets) + 1))
    first = rows[0]["by_budget"]
    for name in [n for n in first if n != "hyper_anderson"]:
        cells = [f"{np.mean(first[name][b]):.4f}" for b in budgets]
        out.append(f"| {name} ({rows[0]['variant']}) | " + " | ".join(cells) + " |")
    for r in rows:
        cells = [f"{np.mean(r['by_budget']['hyper_anderson'][b]):.4f}" for b in budgets]
        out.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
    return out


def main(argv: Sequence[str]) -> dict[str, Any]:
    """``argv[1]``: the ablations' OUT_DIR; prints the tables, writes ``ablations.json``."""
    out = argv[1]
    rows = []
    for variant in sorted(d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d))):
        seeds = sorted(d for d in os.listdir(os.path.join(out, variant)) if d.startswith("s"))
        runs = []
        for seed in seeds:
            where = os.path.join(out, variant, seed)
            fit, sweep = (
                _read(os.path.join(where, f)) for f in ("neural_solver.json", "solver_pareto.json")
            )
            if fit and sweep:
                runs.append((fit, sweep))
        if runs:
            rows.append(variant_row(variant, runs))
    order = ["paper", "previous"]
    rows.sort(
        key=lambda r: (order.index(r["variant"]) if r["variant"] in order else 2, r["variant"])
    )
    for line in lines(rows):
        print(line)
    write_json(os.path.join(out, "ablations.json"), rows, indent=2, sort_keys=True)
    return {r["variant"]: r for r in rows}


if __name__ == "__main__":
    main(sys.argv)
