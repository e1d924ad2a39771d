"""The CLRS report's rows and tables: one row per run (`report_row`), the per-run markdown
table (`markdown`), and the mean +- standard deviation over train seeds (`summary_rows`,
`summary_markdown`), against the goals (`GOALS`: the DEQ column of Xhonneux et al.
(2024) at 64 nodes). `experiments.clrs.report` fills and writes them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from experiments.clrs.report_plots import REFERENCE_RULES
from launch import seeds

# Test score at 64 nodes of the DEQ column of Xhonneux et al. (2024), in percent.
GOALS = {
    "bellman_ford": 96.4,
    "dijkstra": 78.8,
    "bfs": 53.8,
    "dfs": 5.0,
    "mst_kruskal": 82.3,
    "mst_prim": 75.2,
}
TARGET = "test_64"
# The row values averaged over seeds (`summary_rows`).
SEED_KEYS = (
    "val_score",
    "test_score",
    "gap",
    "val_nstep_mean",
    "test_nstep_mean",
    "train_seconds",
)


def report_row(algorithm: str, mode: str, splits: dict[str, dict], seconds: float | None) -> dict:
    """One table row: scores and steps at 16 and 64 nodes, the goal and the gap."""
    goal = GOALS[algorithm]
    val, test = splits.get("val", {}), splits.get(TARGET, {})
    score = test.get("score")
    return dict(
        algorithm=algorithm,
        mode=mode,
        val_score=val.get("score"),
        test_score=score,
        goal=goal,
        gap=None if score is None else 100.0 * score - goal,
        val_nstep_mean=val.get("nstep_mean"),
        val_nstep_max=val.get("nstep_max"),
        test_nstep_mean=test.get("nstep_mean"),
        test_nstep_max=test.get("nstep_max"),
        val_answer_mean=val.get("answer_mean"),
        test_answer_mean=test.get("answer_mean"),
        train_seconds=seconds,
        splits=splits,
    )


def _cell(value: Any, percent: bool = False, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.{digits}f}" if percent else f"{value:.{digits}f}"


def markdown(rows: Sequence[dict]) -> str:
    """The report as a markdown table (scores in percent)."""
    answers = any(r.get("val_answer_mean") is not None for r in rows)
    lines = [
        f"| algorithm | mode | val score (16) | test score ({TARGET[5:]}) | goal (DEQ column) | "
        "gap | steps mean/max (16) | steps mean/max (64) | "
        + ("answer settled mean (16 / 64) | " if answers else "")
        + "train s |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if answers else "") + "---|",
    ]
    references = {}  # the MSTs' reference rules (`REFERENCE_RULES`) on the target split
    for r in rows:
        target = r.get("splits", {}).get(TARGET, {})
        for key, rule in REFERENCE_RULES.items():
            if target.get(key) is not None:
                references.setdefault(r["algorithm"], (rule, target[key]))
        mode = r["mode"] if r.get("seed") is None else f"{r['mode']} (seed {r['seed']})"
        if "diverged" in r:
            empty = "| " * (5 if answers else 4)
            lines.append(f"| {r['algorithm']} | {mode} | diverged | | {r['goal']} {empty}|")
            continue
        gap = "-" if r["gap"] is None else f"{r['gap']:+.1f}"
        steps = [
            f"{_cell(r[f'{k}_nstep_mean'])} / {_cell(r[f'{k}_nstep_max'], digits=0)}"
            for k in ("val", "test")
        ]
        answer = (
            f"{_cell(r.get('val_answer_mean'))} / {_cell(r.get('test_answer_mean'))} | "
            if answers
            else ""
        )
        lines.append(
            f"| {r['algorithm']} | {mode} | {_cell(r['val_score'], True)} | "
            f"{_cell(r['test_score'], True)} | {r['goal']} | {gap} | {steps[0]} | {steps[1]} | "
            f"{answer}{_cell(r['train_seconds'], digits=0)} |"
        )
    for algorithm, (rule, reference) in references.items():
        lines.append(f"\n{algorithm}: {rule} scores {100 * reference:.1f} on the {TARGET} graphs.")
    return "\n".join(lines) + "\n"


def summary_rows(rows: Sequence[dict]) -> list[dict]:
    """Per algorithm and mode, the mean and standard deviation over seeds of the
    `SEED_KEYS` (`launch.seeds.aggregate`: a diverged seed counts as missing, and
    ``{key}_n`` says how many seeds each mean has), with the goal."""
    out = seeds.aggregate(rows, ("algorithm", "mode"), SEED_KEYS)
    for row in out:
        row["goal"] = GOALS[row["algorithm"]]
    return out


def summary_markdown(summary: Sequence[dict]) -> str:
    """The mean +- std table over seeds (scores in percent, gap in points)."""
    lines = [
        f"| algorithm | mode | seeds | val score (16) | test score ({TARGET[5:]}) | goal | gap | "
        "steps mean (16) | steps mean (64) | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        cell = functools.partial(seeds.format_mean_std, r)
        lines.append(
            f"| {r['algorithm']} | {r['mode']} | {r['test_score_n']}/{len(r['seeds'])} | "
            f"{cell('val_score', 100)} | {cell('test_score', 100)} | {r['goal']} | "
            f"{cell('gap', signed=True)} | {cell('val_nstep_mean')} | {cell('test_nstep_mean')} | "
            f"{cell('train_seconds', digits=0)} |"
        )
    return "\n".join(lines) + "\n"
