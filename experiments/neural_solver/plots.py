"""The PNGs of `experiments.neural_solver`: the sweep's and the diagnostic's.

`plot_pareto` (the paper's Figure 4 and Figure 8a in one image). Left: the task metric
against wall time per batch; middle: the relative residual against wall time (log
scale), one line per solver over its budgets; right: the mean relative residual after
each solver step, with the neural solver's training horizon ``K`` marked.

`plot_diagnosis` (``diagnose.py``). Left: the relative error per step of the learned
solver and of Anderson (from ``h_phi(x)`` and from zero), on the fit's batches (solid)
and held-out ones (dashed); middle: each trained step's share of the weighted loss;
right: ``beta_k`` and the weight on the newest image.

References:
  Bai, Koltun & Kolter, "Neural Deep Equilibrium Solvers", ICLR 2022 (Figures 4, 8a).
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_STYLES = {
    "anderson": ("tab:blue", "-"),
    "broyden": ("tab:orange", "-"),
    "fixed_point_iteration": ("tab:gray", "-"),
    "hyper_anderson": ("tab:red", "-"),
    "hyper_anderson_tail": ("tab:brown", "-."),
    "hyper_anderson_no_tail": ("tab:brown", ":"),
    "no_init": ("tab:red", ":"),
    "ls_alpha": ("tab:purple", "--"),
    "init_only": ("tab:green", "--"),
}


def plot_pareto(report: dict[str, Any], path: str) -> str:
    """Writes the three panels to ``path``; returns it."""
    key = report["summary"]["metric"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for name, rows in report["table"].items():
        color, style = _STYLES.get(name, ("black", "-"))
        rows = sorted(rows, key=lambda r: r["budget"])
        ms = [1000 * r["seconds"] for r in rows]
        axes[0].plot(ms, [r[key] for r in rows], style, color=color, marker="o", ms=3, label=name)
        axes[1].plot(ms, [r["rel_residual"] for r in rows], style, color=color, marker="o", ms=3)
        curve = report["residual_curves"].get(name, [])
        axes[2].plot(range(1, len(curve) + 1), curve, style, color=color, label=name)
    axes[0].set(xlabel="ms per batch", ylabel=key, title=f"{key} vs time ({report['split']})")
    axes[1].set(xlabel="ms per batch", ylabel="relative residual", yscale="log")
    axes[1].axhline(report["summary"]["residual_goal"], color="black", lw=0.5)
    axes[1].set_title("residual vs time")
    axes[2].set(xlabel="solver step", ylabel="relative residual", yscale="log")
    axes[2].axvline(report["unroll_steps"], color="black", lw=0.5, ls=":")
    axes[2].set_title("residual vs step (dotted: trained K)")
    axes[0].legend(fontsize=7)
    return _save(fig, axes, path)


def _save(fig: Any, axes: Any, path: str) -> str:
    """Grids ``axes``, writes ``fig`` to ``path`` and closes it; returns ``path``."""
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_DIAGNOSIS = {
    "hyper_anderson": "tab:red",
    "anderson_from_init": "tab:green",
    "anderson_from_zero": "tab:blue",
}


def plot_diagnosis(report: dict[str, Any], path: str) -> str:
    """Writes the diagnostic's three panels to ``path``; returns it."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    k = report["unroll_steps"]
    for name, color in _DIAGNOSIS.items():
        for where, style in (("fit", "-"), ("held_out", "--")):
            curve = report[where][name]
            axes[0].plot(range(len(curve)), curve, style, color=color, label=f"{name} ({where})")
    axes[0].set(xlabel="solver step", ylabel="||z_k - z*|| / ||z*||", yscale="log")
    axes[0].axvline(k, color="black", lw=0.5, ls=":")
    axes[0].set_title("relative error (dotted: trained K)")
    axes[0].legend(fontsize=6)
    shares = report["fit"]["loss_share"]
    axes[1].bar(range(1, len(shares) + 1), [100 * s for s in shares], color="tab:red")
    axes[1].set(xlabel="trained step k", ylabel="% of the weighted loss", yscale="log")
    axes[1].set_title(f"share of the loss ({report['error']} error, fit batches)")
    fit = report["fit"]
    steps = range(1, len(fit["beta"]) + 1)
    axes[2].plot(steps, fit["beta"], color="tab:purple", label="beta_k")
    axes[2].plot(steps, fit["alpha_newest"], color="tab:orange", label="alpha on the newest")
    axes[2].plot(steps, fit["alpha_negative_mass"], color="tab:gray", label="negative alpha mass")
    axes[2].axvline(k, color="black", lw=0.5, ls=":")
    axes[2].set(xlabel="solver step", title="the learned update (fit batches)")
    axes[2].legend(fontsize=7)
    return _save(fig, axes, path)
