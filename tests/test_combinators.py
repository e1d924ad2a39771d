"""Composed solvers: sequence, fallback, restart, their statistics and config specs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import jit_as_users_compile, tanh_cell, tanh_problem

import deq_jax as dj
from configs import default
from deq_jax import solvers as S
from deq_jax.nn import DEQ, MLPCell
from deq_jax.training.run.build import build_solver

B, D = 4, 16


def _solve(solver, f=tanh_cell, args=None, z0=None, jit=True):
    args = tanh_problem(jax.random.PRNGKey(0), batch=B, d=D, norm=0.9) if args is None else args
    z0 = jnp.zeros((B, D)) if z0 is None else z0
    run = lambda z0, args: dj.fixed_point(f, z0, args, solver=solver)
    return (jit_as_users_compile(run) if jit else run)(z0, args)


def _last_iterate(solver, fn, z0, steps):
    """The iterate after ``steps`` proposals of ``solver`` (its last, not its best)."""
    z, aux = z0, solver.init(z0)
    for k in range(1, steps + 1):
        z, aux = solver.propose(aux, z, fn(z), k)
    return z


@pytest.mark.parametrize("jit", [False, True])
def test_sequence_is_its_parts_one_after_the_other(jit, x64):
    # sequence((fixed_point_iteration, 3), anderson) by hand: three plain steps, then
    # Anderson started afresh at the fourth iterate. Traces: the first 4 evaluations
    # are iteration's, the rest Anderson's from z3 (whose first evaluation is f(z3)).
    # In float64 (x64): the eager run (each op a program of its own) and the compiled
    # ones agree far below the tolerances, however XLA's emitters round each program.
    w, x = args = tanh_problem(jax.random.PRNGKey(0), batch=B, d=D, norm=0.9)
    fn = lambda z: tanh_cell(z, args)
    tol, budget = 1e-30, 12
    fpi, anderson = S.fixed_point_iteration(), S.anderson(m=4)
    composed = S.sequence((fpi, 3), anderson, tol=tol, max_iter=budget)
    got = _solve(composed, args=args, jit=jit)
    z3 = _last_iterate(fpi, fn, jnp.zeros((B, D)), 3)
    head = _solve(fpi.replace(tol=tol, max_iter=4), args=args)
    tail = _solve(anderson.replace(tol=tol, max_iter=budget - 3), args=args, z0=z3)
    np.testing.assert_allclose(got.stats.trace[:, :4], head.stats.trace, rtol=1e-6)
    np.testing.assert_allclose(got.stats.trace[:, 3:], tail.stats.trace, rtol=1e-5)
    np.testing.assert_allclose(got.value, tail.value, atol=1e-6)
    np.testing.assert_array_equal(got.stats.part, 1)
    np.testing.assert_array_equal(got.stats.switched_at, 3)
    # the budget keywords default to the last part's
    assert S.sequence((fpi, 2), S.anderson(tol=1e-7, max_iter=9)).tol == 1e-7
    assert composed.replace(max_iter=5).max_iter == 5


def test_sequence_records_the_part_each_sample_stopped_in():
    # An easy problem: with a long warm-up some samples converge during iteration.
    args = tanh_problem(jax.random.PRNGKey(1), batch=B, d=D, norm=0.3)
    composed = S.sequence((S.fixed_point_iteration(), 5), S.anderson(), tol=1e-3)
    sol = _solve(composed, args=args)
    nstep, part = np.asarray(sol.stats.nstep), np.asarray(sol.stats.part)
    # the iterate of evaluation n was proposed after evaluation n - 1
    np.testing.assert_array_equal(part, (nstep - 1 > 5).astype(int))
    np.testing.assert_array_equal(sol.stats.switched_at, np.where(part == 1, 5, 0))
    assert part.min() == 0  # the case the test is about occurred
    plain = _solve(S.fixed_point_iteration(tol=1e-3))
    assert plain.stats.part is None and plain.stats.switched_at is None


def test_sequence_of_one_solver_and_bad_stages():
    plain = _solve(S.anderson(tol=1e-30, max_iter=10))
    one = _solve(S.sequence(S.anderson(tol=1e-30, max_iter=10)))
    np.testing.assert_array_equal(one.stats.trace, plain.stats.trace)
    with pytest.raises(ValueError, match=r"\(solver, steps\) pair"):
        S.sequence(S.anderson(), S.broyden())
    with pytest.raises(ValueError, match="integer >= 0"):
        S.sequence((S.anderson(), -1), S.broyden())
    with pytest.raises(TypeError, match="must be a deq_jax Solver"):
        S.sequence(("anderson", 2), S.broyden())
    with pytest.raises(ValueError, match="one step count per solver"):
        S.sequence(solvers=(S.anderson(), S.broyden()), steps=())
    with pytest.raises(
        TypeError, match=r"Unknown sequence keyword\(s\) \['memory'\]; valid: solvers"
    ):
        S.sequence(S.anderson(), memory=3)
    with pytest.raises(
        TypeError, match=r"Unknown restart keyword\(s\) \['m'\]; valid: solver, pat"
    ):
        S.restart(S.anderson(), 3, m=4)


# Rows in BAD: the affine map f(z) = z / 2 + c with c = +-1/8 per entry (fixed point 2c).
# From z0 = 0 its residuals c, c / 2, ... are parallel, so Anderson without a ridge
# (lam=0) meets a singular least-squares system at its second step (the Gram entries are
# exact binary fractions: the Cholesky pivot is exactly 0) and proposes NaN; Broyden
# solves the map exactly. Other rows: the contractive tanh cell, on which that
# Anderson converges.
BAD = jnp.array([False, True, False, False])


def _target(x):
    return 0.25 * jnp.sign(x)


def _mixed_cell(z, args):
    w, x = args
    affine = 0.5 * z + 0.125 * jnp.sign(x)
    return jnp.where(BAD[:, None], affine, jnp.tanh(z @ w + x))


def test_fallback_rescues_a_singular_anderson_and_leaves_other_samples_alone():
    args = tanh_problem(jax.random.PRNGKey(2), batch=B, d=D, norm=0.9)
    primary = S.anderson(m=5, lam=0.0, tol=1e-5, max_iter=150)
    plain = _solve(primary, f=_mixed_cell, args=args)
    assert bool(plain.stats.diverged[1]) and not bool(plain.stats.converged[1])
    rescued = _solve(S.fallback(primary=primary, backup=S.broyden()), f=_mixed_cell, args=args)
    assert bool(jnp.all(rescued.stats.converged))
    np.testing.assert_allclose(rescued.value[1], _target(args[1][1]), atol=1e-6)
    np.testing.assert_array_equal(rescued.stats.part, [0, 1, 0, 0])
    np.testing.assert_array_equal(rescued.stats.switched_at, [0, 2, 0, 0])
    # the other samples: bit for bit the plain primary's iterates
    good = np.asarray(~BAD)
    np.testing.assert_array_equal(rescued.value[good], plain.value[good])
    np.testing.assert_array_equal(rescued.stats.trace[good], plain.stats.trace[good])
    np.testing.assert_array_equal(rescued.stats.nstep[good], plain.stats.nstep[good])


def test_fallback_backup_starts_from_the_best_iterate():
    # Hand-written: the bad sample runs Anderson for its first evaluation (z1 = f(z0)),
    # its best iterate is then z1 (the lower residual), and Broyden starts there afresh.
    args = tanh_problem(jax.random.PRNGKey(2), batch=B, d=D, norm=0.9)
    primary, backup = S.anderson(m=5, lam=0.0), S.broyden()
    composed = S.fallback(primary=primary, backup=backup, tol=1e-30, max_iter=8)
    got = _solve(composed, f=_mixed_cell, args=args)
    fn = lambda z: _mixed_cell(z, args)
    z1 = fn(jnp.zeros((B, D)))
    by_hand = _solve(backup.replace(tol=1e-30, max_iter=7), f=_mixed_cell, args=args, z0=z1)
    # evaluations 1, 2 are z0, z1 (Anderson, whose next proposal is NaN); evaluation 3
    # is z1 again (the sample's best iterate, rewound), and from there Broyden's run
    np.testing.assert_allclose(got.stats.trace[1, 2:], by_hand.stats.trace[1, :6], rtol=1e-5)
    np.testing.assert_array_equal(got.stats.switched_at, [0, 2, 0, 0])


def test_fallback_on_a_stall_and_its_triggers():
    # "stalled" alone: on f(z) = z + 1 the absolute residual stays put, so iteration
    # stalls and switches after `patience` evaluations that do not improve on the best.
    stuck = lambda z, args: z + 1.0
    composed = S.fallback(
        primary=S.fixed_point_iteration(stop_mode="abs"),
        backup=S.broyden(),
        when="stalled",
        patience=3,
    )
    sol = _solve(composed.replace(max_iter=10), f=stuck)
    np.testing.assert_array_equal(sol.stats.part, 1)
    # evaluation 1 sets the best; evaluations 2, 3, 4 do not improve it
    np.testing.assert_array_equal(sol.stats.switched_at, 4)
    # on a contraction the residual improves every step: no switch
    calm = _solve(composed.replace(max_iter=10, stop_mode="rel"))
    np.testing.assert_array_equal(calm.stats.part, 0)
    assert composed.when == ("stalled",)
    with pytest.raises(ValueError, match="nonfinite, diverging, stalled"):
        S.fallback(primary=S.anderson(), backup=S.broyden(), when=("exploded",))
    with pytest.raises(ValueError, match="patience"):
        S.fallback(primary=S.anderson(), backup=S.broyden(), patience=0)
    with pytest.raises(TypeError, match="backup must be a deq_jax Solver"):
        S.fallback(primary=S.anderson(), backup="broyden")


def test_a_fallback_nested_in_a_sequence_gets_the_loop_hooks():
    # The loop hands the residual to the sequence (`Solver.book`) and takes the marks
    # from it (`Solver.rewind`); both reach the fallback inside, and the restart inside
    # that. From fixed-point steps on, the bad sample's residuals stay parallel, so the
    # Anderson without a ridge still proposes NaN: the fallback rescues it as above.
    args = tanh_problem(jax.random.PRNGKey(2), batch=B, d=D, norm=0.9)
    head = (S.fixed_point_iteration(), 2)
    primary = S.restart(S.anderson(m=5, lam=0.0), 4)
    plain = _solve(S.sequence(head, primary, tol=1e-6, max_iter=60), f=_mixed_cell, args=args)
    assert bool(plain.stats.diverged[1])
    nested = S.sequence(
        head, S.fallback(primary=primary, backup=S.broyden()), tol=1e-6, max_iter=60
    )
    got = _solve(nested, f=_mixed_cell, args=args)
    assert bool(jnp.all(got.stats.converged))
    np.testing.assert_allclose(got.value[1], _target(args[1][1]), atol=1e-6)
    good = np.asarray(~BAD)
    np.testing.assert_array_equal(got.stats.trace[good], plain.stats.trace[good])


def test_nested_parts_see_their_own_counts_and_residuals():
    # On `_switching_cell` in "abs" mode sample 1 (f(z) = z + 1) stalls: the restart
    # inside the fallback restarts it (its iterate returns to an earlier one) until the
    # fallback's own stall rule (patience 10) hands it to Broyden.
    args = tanh_problem(jax.random.PRNGKey(6), batch=B, d=D, norm=0.9)
    fn = lambda z: _switching_cell(z, args)
    budget = dict(tol=1e-30, max_iter=18, stop_mode="abs")
    inner = S.restart(S.anderson(m=5), 3, **budget)
    part = S.fallback(primary=inner, backup=S.broyden(), when="stalled", **budget)
    nested = S.sequence((S.fixed_point_iteration(), 2), part, **budget).replace(max_iter=20)
    observe = lambda z, fz: z  # one observer object: jit compiles each solver once
    jitted = jit_as_users_compile(S.iterate_observed, static_argnums=(0, 1, 3, 4))
    iterates = lambda solver, z0: jax.device_get(jitted(solver, fn, z0, solver.max_iter, observe))
    z0 = jnp.zeros((B, D))
    in_sequence = iterates(nested, z0)
    z3 = in_sequence[:, 2]
    alone = _solve(part, f=_switching_cell, args=args, z0=z3)
    np.testing.assert_array_equal(alone.stats.part, [0, 1, 0, 0])
    np.testing.assert_array_equal(alone.stats.switched_at, [0, 13, 0, 0])
    # in the sequence, the fallback's iterates are its own from the third iterate on
    of_part = iterates(part, z3)
    np.testing.assert_array_equal(in_sequence[:, 2:], of_part)
    # and until it switches, the stalled sample's iterates are the restart's alone,
    # which restarts it (the 7th iterate is an earlier one again)
    mine, by_itself = of_part[1, :13], iterates(inner, z3)[1, :13]
    np.testing.assert_array_equal(mine, by_itself)
    assert any(np.array_equal(mine[6], mine[j]) for j in range(6))


def test_a_part_taking_over_books_the_evaluation_it_starts_from():
    # f(z) = z + 1 from 0 under fixed-point steps: integer iterates, the absolute
    # residual exactly 4 every time. The fallback takes over at the third iterate; it
    # counts that evaluation as its first (its best), stalls on the next three and
    # switches after the 6th: the 7th iterate is the solve's best, z0 = 0 (exactly).
    stuck = lambda z, args: z + 1.0
    budget = dict(tol=1e-30, max_iter=10, stop_mode="abs")
    part = S.fallback(
        primary=S.fixed_point_iteration(), backup=S.broyden(), when="stalled", patience=3, **budget
    )
    nested = S.sequence((S.fixed_point_iteration(), 2), part, **budget)
    fn = lambda z: stuck(z, None)
    z = jax.jit(lambda z0: S.iterate_observed(nested, fn, z0, 10, lambda z, fz: z))(
        jnp.zeros((B, D))
    )
    np.testing.assert_array_equal(z[0, :7, 0], [0, 1, 2, 3, 4, 5, 0])


def test_restart_is_the_solver_until_a_stall_then_restarts_that_sample_only():
    args = tanh_problem(jax.random.PRNGKey(3), batch=B, d=D, norm=0.9)
    plain = _solve(S.anderson(tol=1e-30, max_iter=15), args=args)
    never = _solve(S.restart(S.anderson(tol=1e-30, max_iter=15), 100), args=args)
    np.testing.assert_array_equal(never.stats.trace, plain.stats.trace)
    np.testing.assert_array_equal(never.stats.switched_at, 0)
    # Sample 1 gets a cell with no fixed point (f(z) = z + 1: the absolute residual
    # never improves); it restarts every 4 evaluations, the others are untouched.
    cell = lambda z, a: jnp.where(BAD[:, None], z + 1.0, tanh_cell(z, a))
    base = S.anderson(tol=1e-30, max_iter=15, stop_mode="abs")
    plain = _solve(base, f=cell, args=args)
    got = _solve(S.restart(base, patience=3), f=cell, args=args)
    good = np.asarray(~BAD)
    np.testing.assert_array_equal(got.stats.trace[good], plain.stats.trace[good])
    np.testing.assert_array_equal(got.value[good], plain.value[good])
    # stall counts 1, 2, 3 at evaluations 2, 3, 4: restart after 4; evaluation 5 is the
    # best iterate again (it does not count), 6, 7, 8 stall: again after 8, then 12
    np.testing.assert_array_equal(got.stats.switched_at, [0, 12, 0, 0])
    np.testing.assert_array_equal(got.stats.part, 0)


@pytest.mark.parametrize("patience", [1, 2])
def test_restart_equals_the_solver_restarted_by_hand(patience):
    # By hand, the rule as documented: after each evaluation book the best iterate; when
    # the residual has not improved for `patience` evaluations, the best iterate is
    # evaluated again next, and Anderson starts afresh (count 1) from it and its image;
    # that evaluation does not count as a stall.
    # W = -4 I + (a matrix of norm 0.5): Anderson with memory 2 oscillates (with
    # patience 1 it restarts every other evaluation, with 2 once).
    w, x = tanh_problem(jax.random.PRNGKey(0), batch=1, d=D, norm=0.5)
    args = (w - 4.0 * jnp.eye(D), x)
    fn = lambda z: tanh_cell(z, args)
    base, budget = S.anderson(m=2, tol=1e-30), 20
    got = _solve(S.restart(base, patience, max_iter=budget), args=args, z0=jnp.zeros((1, D)))
    z, aux, local, stall = jnp.zeros((1, D)), base.init(jnp.zeros((1, D))), 0, 0
    best, best_z, rewound, trace, restarts = np.inf, None, False, [], []
    for k in range(1, budget + 1):
        fz = fn(z)
        res = float(dj.solvers.residuals(z, fz)[1][0])
        trace.append(res)
        if k == budget:
            break
        if res < best:
            best, best_z, stall = res, z, 0
        else:
            stall += 1
        if rewound:  # z is the best iterate: Anderson starts afresh from it
            aux, local, stall, rewound = base.init(z), 0, 0, False
        elif stall >= patience:
            z, stall, rewound = best_z, 0, True
            restarts.append(k)
            continue
        local += 1
        z, aux = base.propose(aux, z, fz, local)
    assert len(restarts) >= 3 - patience, "the problem must make Anderson stall"
    np.testing.assert_allclose(got.stats.trace[0], trace, rtol=1e-4)
    assert int(got.stats.switched_at[0]) == restarts[-1]


def test_sequence_phases_run_each_part_in_its_own_stretch():
    # parts with 0 steps are skipped; a later part's first step (taking over) is apart
    fpi, anderson, broyden = S.fixed_point_iteration(), S.anderson(), S.broyden()
    phases = S.sequence((fpi, 3), (anderson, 0), broyden).phases()
    stays = [p.stay for p in phases]
    assert len(phases) == 3 and stays[-1] is None
    assert [bool(stay(None, 3)) for stay in stays[:2]] == [True, True]
    assert [bool(stay(None, 4)) for stay in stays[:2]] == [False, True]
    assert not bool(stays[1](None, 5))
    assert S.anderson().phases() is None


def _switching_cell(z, args):
    # sample 1 is f(z) = z + 1 (it stalls: fallback switches, restart restarts), sample
    # 2 the singular affine map of BAD (Anderson without a ridge proposes NaN)
    w, x = args
    stuck = jnp.arange(B)[:, None] == 1
    singular = jnp.arange(B)[:, None] == 2
    cell = jnp.where(stuck, z + 1.0, jnp.tanh(z @ w + x))
    return jnp.where(singular, 0.5 * z + 0.125 * jnp.sign(x), cell)


PHASED = (
    S.sequence(
        (S.fixed_point_iteration(), 3),
        (S.broyden(), 0),
        (S.anderson(m=3), 4),
        S.anderson(tol=1e-30, max_iter=25),
    ),
    S.fallback(
        primary=S.anderson(m=5, lam=0.0, tol=1e-30, max_iter=25), backup=S.broyden(), patience=4
    ),
    S.restart(S.anderson(m=5, lam=1e-4, tol=1e-30, max_iter=25, stop_mode="abs"), 3),
)


@functools.lru_cache
def _phased_run(composed, loop):
    """``S.iterate`` of `_switching_cell` from zeros under ``loop``, jitted except for
    "python"; kept for the module (the next test reads the "while" runs again)."""
    args = tanh_problem(jax.random.PRNGKey(6), batch=B, d=D, norm=0.9)
    fn = lambda z: _switching_cell(z, args)
    run = lambda z0: S.iterate(composed, fn, z0, loop=loop)
    run = jit_as_users_compile(run) if loop != "python" else run
    return jax.device_get(run(jnp.zeros((B, D))))


@pytest.mark.parametrize("composed", PHASED, ids=lambda s: s.name)
def test_phased_loops_give_the_iterates_of_the_single_step(composed):
    # "while" and "python" run `phases()`, each stretch in a loop of its own; "scan"
    # runs `propose`, which chooses the branch on every step. Same iterates, bit for bit.
    z_while, st_while = _phased_run(composed, "while")
    z_scan, st_scan = _phased_run(composed, "scan")
    np.testing.assert_array_equal(z_while, z_scan)
    for a, b in zip(st_while, st_scan, strict=True):
        np.testing.assert_array_equal(a, b)
    if composed.name != "sequence":  # the switch happened, mid-solve
        assert 0 < int(st_while.switched_at[1]) < 25
    assert len(composed.phases()) >= 2


@pytest.mark.parametrize(
    "composed",
    [
        PHASED[0],
        # slow: eager, each op compiled (10-20 CPU s a solver); the python loop's stretches
        # are checked on sequence's four above, fallback's and restart's `phases()` under
        # "while" in test_phased_loops_give_the_iterates_of_the_single_step
        pytest.param(PHASED[1], marks=pytest.mark.slow),
        pytest.param(PHASED[2], marks=pytest.mark.slow),
    ],
    ids=lambda s: s.name,
)
def test_python_loop_gives_the_iterates_of_the_while_loop(composed):
    z_while, st_while = _phased_run(composed, "while")
    z_python, st_python = _phased_run(composed, "python")
    calm = np.array([0, 3])  # (eager rounding drifts on the stuck and singular samples)
    np.testing.assert_allclose(z_python[calm], z_while[calm], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(st_python.switched_at[1:3], st_while.switched_at[1:3])


@pytest.mark.parametrize(
    "make",
    [
        lambda: S.sequence((S.fixed_point_iteration(), 3), S.anderson(tol=1e-6, max_iter=60)),
        # slow: the same gradient path as sequence's; their values are tested above
        pytest.param(
            lambda: S.fallback(primary=S.anderson(tol=1e-6, max_iter=60), backup=S.broyden()),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda: S.restart(S.anderson(tol=1e-6, max_iter=60), 5), marks=pytest.mark.slow
        ),
    ],
)
def test_gradients_through_fixed_point_with_a_composed_solver(make, x64):
    w, x = tanh_problem(jax.random.PRNGKey(4), batch=2, d=6, norm=0.8, dtype="float64")
    solver = make()
    assert hash(solver) == hash(make()) and solver == make()

    def loss(w, x, solver):
        backward = dj.backward.ift(solver=solver.replace(tol=1e-10, max_iter=200))
        z = dj.fixed_point(tanh_cell, jnp.zeros_like(x), (w, x), solver=solver, backward=backward)
        return jnp.sum(z.value**2)

    reference = S.anderson(tol=1e-12, max_iter=200)
    grad_fn = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    grad, want = grad_fn(w, x, solver), grad_fn(w, x, reference)
    for g, r in zip(grad, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-7)
    # and against finite differences of the loss along one direction
    v = jax.random.normal(jax.random.PRNGKey(5), x.shape, jnp.float64)
    eps = 1e-5
    jit_loss = jax.jit(loss, static_argnums=2)  # one program for both evaluations
    fd = (jit_loss(w, x + eps * v, reference) - jit_loss(w, x - eps * v, reference)) / (2 * eps)
    np.testing.assert_allclose(jnp.sum(grad[1] * v), fd, rtol=1e-5)


def test_combinators_take_their_parts_positionally_or_by_keyword():
    a, b = S.anderson(m=3), S.broyden()
    assert S.fallback(a, b, patience=4) == S.fallback(primary=a, backup=b, patience=4)
    assert hash(S.fallback(a, b)) == hash(S.fallback(primary=a, backup=b))
    assert S.restart(a, 4) == S.restart(solver=a, patience=4) == S.restart(a, patience=4)
    assert S.sequence((a, 3), b) == S.sequence(solvers=(a, b), steps=(3,))
    # and by name, the parts as keywords
    assert S.get("fallback", primary=a, backup=b) == S.fallback(a, b)
    assert S.get("restart", solver=a) == S.restart(a)
    assert S.get("sequence", solvers=(a, b), steps=(3,)) == S.sequence((a, 3), b)
    with pytest.raises(TypeError, match="positional"):
        S.fallback(a, b, ("stalled",))  # the options are keywords
    with pytest.raises(TypeError, match="fallback's backup must be a deq_jax Solver"):
        S.fallback(a, "broyden")
    rescued = _solve(S.fallback(S.anderson(tol=1e-5), S.broyden()))
    assert bool(jnp.all(rescued.stats.converged))


def test_get_reads_a_name_or_a_spec_string():
    assert S.get("fallback(anderson, broyden)") == S.fallback(S.anderson(), S.broyden())
    built = S.get(
        "restart(anderson)", tol=1e-5, anderson={"m": 3}, restart={"patience": 7}, broyden={}
    )
    assert built == S.restart(S.anderson(m=3, tol=1e-5), 7, tol=1e-5)
    # a plain name reads its own section too (as a one-solver spec)
    assert S.get("anderson", tol=1e-5, anderson={"m": 3}) == S.anderson(m=3, tol=1e-5)
    assert S.from_spec("fallback(anderson, broyden)", {"fallback": {"patience": 2}}, tol=1e-3) == (
        S.get("fallback(anderson, broyden)", tol=1e-3, fallback={"patience": 2})
    )
    valid = "Valid solvers: anderson, broyden, fallback, fixed_point_iteration"  # and more
    with pytest.raises(ValueError, match=f"Unknown solver 'andersn'. {valid}.*spec string"):
        S.get("andersn")
    with pytest.raises(
        ValueError, match=f"'brodyen' in spec 'fallback.anderson, brodyen.'. {valid}"
    ):
        S.get("fallback(anderson, brodyen)")
    with pytest.raises(ValueError, match=r"Cannot read solver spec 'anderson \+ broyden'"):
        S.get("anderson + broyden")
    with pytest.raises(ValueError, match=r"fallback takes 2 part.*spec 'fallback'.*\(anderson"):
        S.get("fallback")  # a combinator named without its parts
    with pytest.raises(ValueError, match="Unknown keyword.*'memory'.*anderson"):
        S.get("fallback(anderson, broyden)", memory=3)
    with pytest.raises(TypeError, match="string"):
        S.get(S.anderson())


def test_spec_strings_build_composed_solvers_and_name_bad_parts():
    hyper = {"anderson": {"m": 3}, "fallback": {"patience": 4}}
    built = S.get(
        "fallback(sequence(fixed_point_iteration:3, anderson), broyden)", **hyper, tol=1e-5
    )
    want = S.fallback(
        primary=S.sequence(
            (S.fixed_point_iteration(tol=1e-5), 3), S.anderson(m=3, tol=1e-5), tol=1e-5
        ),
        backup=S.broyden(tol=1e-5),
        patience=4,
        tol=1e-5,
    )
    assert built == want
    assert S.from_spec("restart(anderson)", {"restart": {"patience": 7}}) == S.restart(
        S.anderson(), 7
    )
    bad = {
        "fallback(anderson, brodyen)": "Unknown solver 'brodyen'.*Valid solvers: anderson",
        "fallback(anderson)": "fallback takes 2 part",
        "sequence(anderson, broyden)": "needs ':steps'",
        "fallback(anderson:3, broyden)": "Only sequence stages",
        "anderson(broyden)": "takes no parts",
        "sequence(anderson:3, broyden": "missing '\\)'",
    }
    for spec, message in bad.items():
        with pytest.raises(ValueError, match=message):
            S.get(spec)
        with pytest.raises(ValueError, match=message):
            S.from_spec(spec)


def test_config_names_a_composed_solver():
    config = default.get_config()
    config.deq.solver.name = "fallback(anderson, broyden)"
    config.deq.solver.fallback.patience = 3
    solver = build_solver(config.deq.solver)
    assert isinstance(solver, S.fallback) and solver.patience == 3
    assert solver.primary == S.anderson(tol=1e-3, m=5, beta=1.0, lam=1e-4)
    assert solver.tol == 1e-3
    config.deq.solver.name = "sequence(fixed_point_iteration:2, andersen)"
    with pytest.raises(ValueError, match="Unknown solver 'andersen'.*Valid solvers"):
        build_solver(config.deq.solver)


def test_deq_layer_trains_with_a_composed_solver():
    # The DEQ layer takes a composed solver like any other: its fixed point satisfies
    # the cell, the stats say which part finished, and a gradient step goes through.
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 3))
    cell = MLPCell(features=8, hidden=16)
    solver = S.fallback(primary=S.anderson(tol=1e-5, max_iter=60), backup=S.broyden())
    model = DEQ(cell, solver=solver)
    variables = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(x)
    z, stats = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x)
    assert bool(jnp.all(stats.converged)) and stats.part.shape == (4,)
    fz = jax.jit(cell.apply)({"params": variables["params"]["cell"]}, z, x)
    np.testing.assert_allclose(fz, z, atol=1e-4)
    loss = lambda p: jnp.sum(model.apply({"params": p}, x, train=True)[0] ** 2)
    grads = jax.jit(jax.grad(loss))(variables["params"])
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree_util.tree_leaves(grads)]
    assert all(np.isfinite(norms)) and max(norms) > 0
