"""The path-independence study grid: which models to train, at what size, and for how long.

The study of Anil et al. (2022), Section 4 / Figures 3 and 4, at a size a CPU can run:
many prefix-sum (and maze) models that vary the training depth, weight norm, learning
rate (1e-2, 1e-3, 1e-4), forward solver (``fixed_point_iteration``, ``anderson``) and
gradient (``unrolled``: backprop through the unrolled solve at a fixed depth;
``implicit``: the IFT backward mode with a tolerance-stopped solve), each trained until it
fits its training lengths or a step cap; then the three interventions (mixed
initialisation, randomised depth, the alignment penalty) on some of the unroll + backprop
models. Flag-free: `experiments.path_independence.report` ``--study`` runs it
(`experiments.path_independence.runner`).

* `RunSpec`: one named run, its config overrides (`RunSpec.overrides`).
* `StudyScale`: the sizes shared by every run (`CPU_SCALE`, `GPU_SCALE`, `SMOKE_SCALE`).
* `study_specs`: the grid of a scale; `spec_config`: a spec's full config.

The stopping rule (`experiments.path_independence.runner.train_until_fit`): train in chunks
of ``chunk_steps``, check whole-answer accuracy on the training length at the training
depth after each, stop at ``fit_threshold`` or at ``cap_steps``.

References:
  Anil, Pokle, Liang, Treutlein, Wu, Bai, Kolter & Grosse, "Path Independent
  Equilibrium Models Can Better Exploit Test-Time Computation", NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.path_independence import analysis

GRADIENTS = ("unrolled", "implicit")
SOLVERS = ("fixed_point_iteration", "anderson")
INTERVENTIONS = ("mixed_init", "random_depth", "alignment")
# Per task: the whole-answer metric, and the splits of the training length (the fit
# check) and of the harder inputs (accuracy at 1x-8x the budget, the attack).
TASK_SPLITS = {
    "prefix_sum": dict(metric="string_accuracy", size_key="task.train_length"),
    "mazes": dict(metric="maze_accuracy", size_key="task.train_maze_size"),
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the study.

    Attributes:
      task: ``"prefix_sum"`` or ``"mazes"``.
      gradient: ``"unrolled"`` (fixed-point iteration or Anderson run for exactly
        ``depth`` steps, backprop through them) or ``"implicit"`` (IFT gradients, the
        solve stopped at its tolerance or ``depth``).
      solver: ``"fixed_point_iteration"`` or ``"anderson"``.
      depth: the training solver budget (``deq.train_max_iter``).
      learning_rate: the peak learning rate.
      weight_norm: weight-normalised convolutions in the cell.
      intervention: ``""`` or one of `INTERVENTIONS`, applied on top.
    """

    task: str
    gradient: str
    solver: str
    depth: int
    learning_rate: float
    weight_norm: bool = False
    intervention: str = ""

    def __post_init__(self):
        for field, value, valid in (
            ("task", self.task, tuple(TASK_SPLITS)),
            ("gradient", self.gradient, GRADIENTS),
            ("solver", self.solver, SOLVERS),
            ("intervention", self.intervention, ("", *INTERVENTIONS)),
        ):
            if value not in valid:
                raise ValueError(f"RunSpec.{field}={value!r}; valid: {', '.join(valid)}.")

    @property
    def base(self) -> RunSpec:
        """The same run without its intervention."""
        return dataclasses.replace(self, intervention="")

    @property
    def name(self) -> str:
        """``ub_fpi_d8_wn_lr1e-03+mixed_init``: gradient, solver, depth, norm, rate."""
        grad = {"unrolled": "ub", "implicit": "ift"}[self.gradient]
        solver = {"fixed_point_iteration": "fpi", "anderson": "and"}[self.solver]
        name = f"{grad}_{solver}_d{self.depth}_{'wn_' if self.weight_norm else ''}"
        name += f"lr{self.learning_rate:.0e}"
        return name + (f"+{self.intervention}" if self.intervention else "")

    def overrides(self) -> dict[str, Any]:
        """The ``"section.field"`` config overrides of this run (a zeros start unless
        the intervention says otherwise)."""
        out = {
            "deq.solver.name": self.solver,
            "deq.solver.full_budget": self.gradient == "unrolled",
            "deq.backward.name": "unrolled" if self.gradient == "unrolled" else "ift",
            "deq.train_max_iter": self.depth,
            "deq.eval_max_iter": self.depth,  # the fit check runs at the training depth
            "deq.z_init": "zeros",
            "model.weight_norm": self.weight_norm,
            "train.learning_rate": self.learning_rate,
        }
        if self.intervention == "mixed_init":
            out["deq.z_init"] = "mixed"
        elif self.intervention == "random_depth":
            out["path_independence.budget_min"] = max(1, self.depth // 2)
            out["path_independence.budget_max"] = 2 * self.depth
        elif self.intervention == "alignment":
            out["path_independence.alignment_weight"] = 1.0
        return out


@dataclasses.dataclass(frozen=True)
class StudyScale:
    """The sizes every run of a study shares.

    Attributes:
      name: what the scale is called (``"cpu"``, ``"gpu"``, ``"smoke"``).
      prefix_sum: config overrides of every prefix-sum run (task, model, batch sizes).
      mazes: the same for every maze run.
      train_lengths: per task, the training size (bits, maze side) and the harder one.
      depths: the training depths of the grid (shallow, deep).
      chunk_steps: steps between two fit checks.
      cap_steps: the most steps a run trains (its learning-rate schedule spans them).
      fit_threshold: whole-answer accuracy on the training size that counts as fit.
      aa_batch: examples per split for the AA score.
      attack_batch: examples attacked per run.
      multipliers: the test-time budgets, multiples of the training depth.
      maze_specs: how many maze runs of the grid to keep (0: none).
      intervened_bases: how many of the `intervened` base runs per task get the
        interventions.
    """

    name: str
    prefix_sum: dict[str, Any]
    mazes: dict[str, Any]
    train_lengths: dict[str, tuple[int, int]]
    depths: tuple[int, int]
    chunk_steps: int
    cap_steps: int
    fit_threshold: float = 0.99
    aa_batch: int = 64
    attack_batch: int = 16
    multipliers: tuple[int, ...] = (1, 2, 4, 8)
    maze_specs: int = 8
    intervened_bases: int = 2

    def target_split(self, task: str) -> str:
        """The split of harder inputs (accuracy at every budget, AA, attack)."""
        return f"test_{self.train_lengths[task][1]}"

    def fit_split(self, task: str) -> str:
        """The split of the training size (the fit check)."""
        return f"test_{self.train_lengths[task][0]}"


def _shared(chunk: int, eval_batch: int) -> dict[str, Any]:
    """Evaluation, logging and checkpoint settings of every run: one fit check (and a
    checkpoint) per chunk, no TensorBoard, a one-budget final report."""
    return {
        "eval.every_steps": chunk,
        "eval.batch_size": eval_batch,
        "eval.max_batches": 1,
        "eval.report_max_batches": 1,
        "eval.budget_multipliers": (1,),
        "ckpt.every_steps": chunk,
        "ckpt.keep": 1,
        "log.every_steps": chunk,
        "log.tensorboard": False,
    }


# A few minutes per prefix-sum run on a shared 2-core CPU (the default cell, 32 channels
# and two blocks, no norm layer; 2,048 12-bit strings, tested on 48), a 1,200-step cap,
# fit at 95% (16 channels and one block fitted 8.5% of strings in 1,200 steps).
CPU_SCALE = StudyScale(
    name="cpu",
    prefix_sum={
        "model.norm": "",
        "task.train_size": 2048,
        "task.test_size": 200,
        "task.val_size": 200,
        "model.width": 32,
        "model.num_blocks": 2,
        "train.batch_size": 32,
        "train.warmup_steps": 50,
    },
    mazes={
        "model.norm": "",
        "task.train_size": 2048,
        "task.test_size": 100,
        "task.val_size": 100,
        "model.width": 12,
        "model.num_blocks": 1,
        "train.batch_size": 16,
        "train.warmup_steps": 50,
    },
    train_lengths={"prefix_sum": (12, 48), "mazes": (5, 9)},
    depths=(6, 12),
    chunk_steps=400,
    cap_steps=1200,
    fit_threshold=0.95,
    intervened_bases=1,
)
# The paper's sizes: 32-bit strings tested on 128, 9x9 mazes tested on 13x13.
GPU_SCALE = dataclasses.replace(
    CPU_SCALE,
    name="gpu",
    prefix_sum={**CPU_SCALE.prefix_sum, "task.train_size": 10_000},
    mazes={**CPU_SCALE.mazes, "task.train_size": 10_000, "model.width": 32},
    train_lengths={"prefix_sum": (32, 128), "mazes": (9, 13)},
    depths=(16, 32),
    chunk_steps=1000,
    cap_steps=20_000,
    fit_threshold=0.99,
    intervened_bases=2,
    aa_batch=100,
    attack_batch=32,
)
# Seconds per run: the test of the whole study path.
SMOKE_SCALE = StudyScale(
    name="smoke",
    prefix_sum={
        "model.norm": "",
        "task.train_size": 64,
        "task.test_size": 16,
        "task.val_size": 16,
        "model.width": 4,
        "model.num_blocks": 1,
        "train.batch_size": 8,
        "train.warmup_steps": 1,
    },
    mazes={},
    train_lengths={"prefix_sum": (8, 16), "mazes": (5, 7)},
    depths=(3, 4),
    chunk_steps=2,
    cap_steps=4,
    aa_batch=8,
    attack_batch=4,
    multipliers=(1, 2),
    maze_specs=0,
)
SCALES = {s.name: s for s in (CPU_SCALE, GPU_SCALE, SMOKE_SCALE)}


def prefix_sum_grid(depths: tuple[int, int]) -> list[RunSpec]:
    """The 16 prefix-sum runs: unroll + backprop and implicit models, each gradient over
    both solvers, both depths, three learning rates and weight norm on and off (a
    fraction of the full product, every value of each factor present)."""
    shallow, deep = depths
    grid = [
        ("unrolled", "fixed_point_iteration", shallow, 1e-3, False),
        ("unrolled", "fixed_point_iteration", shallow, 1e-2, False),
        ("unrolled", "fixed_point_iteration", shallow, 1e-4, False),
        ("unrolled", "fixed_point_iteration", deep, 1e-3, False),
        ("unrolled", "fixed_point_iteration", shallow, 1e-3, True),
        ("unrolled", "fixed_point_iteration", deep, 1e-3, True),
        ("unrolled", "anderson", shallow, 1e-3, False),
        ("unrolled", "anderson", deep, 1e-2, False),
        ("implicit", "fixed_point_iteration", deep, 1e-3, False),
        ("implicit", "fixed_point_iteration", deep, 1e-3, True),
        ("implicit", "anderson", deep, 1e-3, False),
        ("implicit", "anderson", deep, 1e-2, False),
        ("implicit", "anderson", deep, 1e-4, False),
        ("implicit", "anderson", deep, 1e-3, True),
        ("implicit", "anderson", shallow, 1e-3, False),
        ("implicit", "fixed_point_iteration", shallow, 1e-2, False),
    ]
    unrolled, implicit = grid[:8], grid[8:]  # interleaved: a study cut short has both
    pairs = zip(unrolled, implicit, strict=True)
    return [RunSpec("prefix_sum", *row) for pair in pairs for row in pair]


def maze_grid(depths: tuple[int, int]) -> list[RunSpec]:
    """The 8 maze runs: both gradients and solvers, two learning rates, the deep budget
    (a maze path is longer than a prefix-sum carry), weight norm on one of each."""
    _, deep = depths
    grid = [
        ("unrolled", "fixed_point_iteration", deep, 1e-3, False),
        ("unrolled", "fixed_point_iteration", deep, 1e-2, False),
        ("unrolled", "anderson", deep, 1e-3, False),
        ("unrolled", "fixed_point_iteration", deep, 1e-3, True),
        ("implicit", "anderson", deep, 1e-3, False),
        ("implicit", "anderson", deep, 1e-2, False),
        ("implicit", "fixed_point_iteration", deep, 1e-3, False),
        ("implicit", "anderson", deep, 1e-3, True),
    ]
    return [RunSpec("mazes", *row) for row in grid]


def intervened(specs: list[RunSpec], bases: int = 2) -> list[RunSpec]:
    """Each intervention on the first ``bases`` unroll + backprop, fixed-point-iteration,
    learning rate 1e-3, no-weight-norm runs among ``specs`` (the paper's path-dependent
    setting)."""
    picked = [
        s
        for s in specs
        if s.gradient == "unrolled"
        and s.solver == "fixed_point_iteration"
        and s.learning_rate == 1e-3
        and not s.weight_norm
    ]
    return [dataclasses.replace(s, intervention=i) for s in picked[:bases] for i in INTERVENTIONS]


def study_specs(scale: StudyScale, tasks: tuple[str, ...] = ("prefix_sum", "mazes")) -> list:
    """Every run of the study at ``scale``, in the order they train: per task the grid,
    each intervened run right after its base (the smoke scale keeps two prefix-sum runs
    and one intervention; the mazes one intervention)."""
    specs = []
    if "prefix_sum" in tasks:
        grid = prefix_sum_grid(scale.depths)
        if scale.name == "smoke":
            grid = grid[:2]
        extra = intervened(grid, scale.intervened_bases)
        specs += _after_bases(grid, extra[:1] if scale.name == "smoke" else extra)
    if "mazes" in tasks and scale.maze_specs:
        grid = maze_grid(scale.depths)[: scale.maze_specs]
        specs += _after_bases(grid, intervened(grid, 1)[:1])
    return specs


def _after_bases(grid: list[RunSpec], extra: list[RunSpec]) -> list[RunSpec]:
    """``grid`` with each intervened run of ``extra`` right after its base, so a study
    cut short has whole comparisons."""
    out = []
    for spec in grid:
        out += [spec] + [e for e in extra if e.base == spec]
    return out


def spec_config(spec: RunSpec, scale: StudyScale, data_dir: str = "") -> Any:
    """The full config of ``spec`` at ``scale`` (``data_dir``: one shared data folder)."""
    train_size, test_size = scale.train_lengths[spec.task]
    size_key = TASK_SPLITS[spec.task]["size_key"]
    tests_key = "task.test_lengths" if spec.task == "prefix_sum" else "task.test_maze_sizes"
    overrides = {
        **(scale.prefix_sum if spec.task == "prefix_sum" else scale.mazes),
        **_shared(scale.chunk_steps, 200 if scale.name != "smoke" else 16),
        size_key: train_size,
        tests_key: (train_size, test_size),
        "eval.splits": (scale.fit_split(spec.task),),
        "train.steps": scale.cap_steps,
        **spec.overrides(),
    }
    if data_dir:
        overrides["task.data_dir"] = data_dir
    config = analysis.task_config(spec.task, overrides, smoke=scale.name == "smoke")
    return config
