"""The PNG figures of the Jacobian-regularisation report (`experiments.jacobian.report`).

References:
  Bai, Koltun, Kolter, "Stabilizing Equilibrium Models by Jacobian Regularization",
  ICML 2021 (Figure 5 and Table 3).
"""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _gammas(section: dict[str, Any]) -> list[str]:
    return [k for k, v in section.items() if isinstance(v, dict) and "nstep_mean" in v]


def plot_surface(report: dict[str, Any], path: str) -> str:
    """``f(z; x) - z`` over the z-grid, one panel per gamma, one curve per ``x``."""
    section = report["synthetic_1d"]
    gammas = _gammas(section)
    fig, axes = plt.subplots(1, len(gammas), figsize=(4 * len(gammas), 3.4), squeeze=False)
    for ax, gamma in zip(axes[0], gammas, strict=True):
        for x, values in section[gamma]["surface"].items():
            ax.plot(section["z_grid"], values, label=f"x = {x}")
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_title(f"gamma = {gamma}")
        ax.set_xlabel("z")
    axes[0][0].set_ylabel("f(z; x) - z")
    axes[0][-1].legend(fontsize=7)
    return _save(fig, path)


def plot_convergence(report: dict[str, Any], path: str) -> str:
    """Mean relative residual per Anderson iteration over validation, per gamma."""
    section = report["synthetic_1d"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for gamma in _gammas(section):
        trace = section[gamma]["convergence"]
        ax.semilogy(range(1, len(trace) + 1), trace, label=f"gamma = {gamma}")
    ax.axhline(1e-3, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xlabel("function evaluations")
    ax.set_ylabel("mean relative residual")
    ax.set_title("synthetic 1-D: fixed-point convergence")
    ax.legend()
    return _save(fig, path)


def plot_seeds(report: dict[str, Any], path: str) -> str:
    """Validation MSE against Anderson steps for every synthetic run, per gamma.

    One small marker per seed, a large one at the medians over seeds; the dashed line is
    the label noise floor (0.05^2), below which no model can go on average.
    """
    section = report["synthetic_1d"]
    fig, ax = plt.subplots(figsize=(5.4, 3.8))
    for i, gamma in enumerate(_gammas(section)):
        entry, color = section[gamma], f"C{i}"
        runs = entry.get("seeds") or [entry]
        ax.scatter([r["nstep_mean"] for r in runs], [r["mse"] for r in runs], s=14, color=color)
        ax.scatter(
            [entry.get("nstep_mean_seed_median", entry["nstep_mean"])],
            [entry.get("mse_seed_median", entry["mse"])],
            s=90,
            marker="*",
            color=color,
            label=f"gamma = {gamma} ({len(runs)} seed{'s' if len(runs) > 1 else ''})",
        )
    ax.axhline(0.05**2, color="gray", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("Anderson steps to relative residual 1e-3 (validation mean)")
    ax.set_ylabel("validation MSE")
    ax.set_title("synthetic 1-D: every seed (star: medians)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_budget(report: dict[str, Any], path: str) -> str:
    """Digits test accuracy against the inference budget (NFE), per gamma."""
    section = report["digits"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for gamma in _gammas(section):
        by_nfe = section[gamma]["accuracy_at_nfe"]
        ax.plot(
            [int(k) for k in by_nfe], list(by_nfe.values()), marker="o", label=f"gamma = {gamma}"
        )
    ax.set_xlabel("inference budget (NFE)")
    ax.set_ylabel("test accuracy")
    ax.set_title("digits: accuracy at a fixed solver budget")
    ax.legend()
    return _save(fig, path)


def plot_spectral(report: dict[str, Any], path: str) -> str:
    """The power-method spectral radius of ``J_f(z*)`` over training, both tasks."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, task in zip(axes, ("synthetic_1d", "digits"), strict=True):
        section = report[task]
        for gamma in _gammas(section):
            history = section[gamma]["spectral_radius"]
            if history:
                steps, rho = zip(*history, strict=True)
                ax.plot(steps, rho, label=f"gamma = {gamma}")
        ax.set_title(task)
        ax.set_xlabel("train step")
        ax.set_ylabel("spectral radius of J_f(z*)")
        ax.legend()
    return _save(fig, path)


def plot_all(report: dict[str, Any], workdir: str) -> list[str]:
    """Writes every figure into ``workdir``; returns their paths."""
    join = lambda name: os.path.join(workdir, name)
    return [
        plot_surface(report, join("synthetic_surface.png")),
        plot_convergence(report, join("synthetic_convergence.png")),
        plot_seeds(report, join("synthetic_seeds.png")),
        plot_budget(report, join("digits_budget.png")),
        plot_spectral(report, join("spectral_radius.png")),
    ]


def _save(fig: Any, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
