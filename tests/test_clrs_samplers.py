"""Tests for the CLRS-30 samplers: specs, graphs, algorithms against networkx/scipy, splits."""

import time

import networkx as nx
import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.csgraph

from deq_jax.models import clrs
from deq_jax.tasks import data

N, NODES = 32, 16  # examples and nodes of the datasets most tests check


def _dataset(algorithm, n=NODES, seed=0, **kwargs):
    return clrs.sample_dataset(algorithm, N, n, seed, **kwargs)


def _source(ds, i):
    return int(np.argmax(ds.inputs["s"][i]))


def _graph(ds, i):
    return ds.inputs["A"][i].astype(np.float64)


# -- specs ------------------------------------------------------------------------------


def test_specs_follow_clrs():
    assert clrs.ALGORITHMS == (
        "bellman_ford",
        "bfs",
        "dfs",
        "dijkstra",
        "mst_kruskal",
        "mst_prim",
    )
    bfs = clrs.SPECS["bfs"]
    assert bfs["s"] == ("input", "node", "mask_one")
    assert bfs["pi"] == ("output", "node", "pointer")
    assert bfs["reach_h"] == ("hint", "node", "mask")
    assert bfs["pi_h"] == ("hint", "node", "pointer")
    assert clrs.SPECS["mst_kruskal"]["in_mst"] == ("output", "edge", "mask")
    assert clrs.SPECS["dfs"]["time"] == ("hint", "graph", "scalar")
    for algorithm, spec in clrs.SPECS.items():
        assert spec["pos"] == ("input", "node", "scalar")
        assert spec["A"] == ("input", "edge", "scalar")
        assert spec["adj"] == ("input", "edge", "mask")
        for name, (_, _, type_) in spec.items():
            if type_ == clrs.Type.CATEGORICAL:
                assert clrs.NUM_CATEGORIES[algorithm][name] == 3
    assert clrs.feature_shape("dfs", "color", 5) == (5, 3)
    assert clrs.feature_shape("mst_kruskal", "phase", 5) == (3,)
    assert clrs.feature_shape("bfs", "adj", 5) == (5, 5)


@pytest.mark.parametrize(
    "call",
    [
        lambda: clrs.sample_dataset("quicksort", 2, 4, 0),
        lambda: clrs.clrs30_splits("bfs_typo"),
        lambda: clrs.run_algorithm("prim", np.zeros((3, 3)), 0),
        lambda: clrs.feature_shape("dijkstr", "pi", 4),
    ],
)
def test_unknown_algorithm_lists_the_valid_ones(call):
    with pytest.raises(ValueError, match="Valid algorithms: bellman_ford, bfs, dfs, dijkstra"):
        call()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_examples"):
        clrs.sample_dataset("bfs", 0, 4, 0)
    with pytest.raises(ValueError, match="num_nodes"):
        clrs.sample_dataset("bfs", 2, 0, 0)
    with pytest.raises(ValueError, match="multiplier"):
        clrs.clrs30_splits("bfs", multiplier=0)
    with pytest.raises(ValueError, match="source"):
        clrs.run_algorithm("dijkstra", np.ones((3, 3)))
    with pytest.raises(ValueError, match="square"):
        clrs.run_algorithm("dfs", np.ones((3, 4)))
    with pytest.raises(ValueError, match="feature"):
        clrs.feature_shape("bfs", "key", 4)
    with pytest.raises(ValueError, match="p must lie"):
        clrs.er_graph(np.random.default_rng(0), 4, 1.5)


# -- graphs -----------------------------------------------------------------------------


def test_er_graphs_follow_the_clrs_distribution():
    rng = np.random.default_rng(0)
    off = ~np.eye(64, dtype=bool)
    und = np.stack([clrs.er_graph(rng, 64, 0.5, weighted=True) for _ in range(20)])
    assert np.array_equal(und, np.swapaxes(und, 1, 2))
    edges = und[:, off]
    # An undirected edge needs both ordered draws: probability p ** 2.
    assert abs(np.mean(edges != 0) - 0.25) < 0.02
    weights = edges[edges != 0]
    assert weights.min() >= np.sqrt(1e-3) and weights.max() < np.sqrt(1 + 1e-3)
    directed = np.stack([clrs.er_graph(rng, 64, 0.5, directed=True) for _ in range(20)])
    assert abs(np.mean(directed[:, off]) - 0.5) < 0.02
    assert set(np.unique(directed)) <= {0.0, 1.0}
    dag = clrs.er_graph(rng, 32, 0.5, directed=True, acyclic=True)
    assert nx.is_directed_acyclic_graph(nx.from_numpy_array(dag, create_using=nx.DiGraph))
    assert np.array_equal(np.diag(clrs.adjacency(np.zeros((3, 3)))), np.ones(3))


# -- layout -----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_every_feature_matches_its_spec(algorithm):
    ds = _dataset(algorithm)
    n, t = NODES, ds.max_steps
    assert ds.num_examples == N and ds.num_nodes == n
    assert ds.lengths.dtype == np.int32 and ds.lengths.shape == (N,)
    assert ds.lengths.min() >= 1 and ds.lengths.max() == t
    stages = {"input": ds.inputs, "output": ds.outputs, "hint": ds.hints}
    assert sum(map(len, stages.values())) == len(clrs.SPECS[algorithm])
    valid = np.arange(t)[None, :] < ds.lengths[:, None]  # [N, T]
    for name, (stage, _, type_) in clrs.SPECS[algorithm].items():
        x = stages[stage][name]
        lead = (N, t) if stage == "hint" else (N,)
        assert x.shape == lead + clrs.feature_shape(algorithm, name, n), name
        assert not x.flags.writeable
        if stage == "hint":
            pad = x[~valid]
            assert not pad.any(), f"{name} is not zero past the lengths"
            x = x[valid]
        if type_ == clrs.Type.POINTER:
            assert x.dtype == np.int32 and x.min() >= 0 and x.max() < n, name
            continue
        assert x.dtype == np.float32, name
        if type_ in (clrs.Type.MASK, clrs.Type.MASK_ONE, clrs.Type.CATEGORICAL):
            assert set(np.unique(x)) <= {0.0, 1.0}, name
        if type_ in (clrs.Type.MASK_ONE, clrs.Type.CATEGORICAL):
            assert np.all(x.sum(-1) == 1), name
    np.testing.assert_allclose(ds.inputs["pos"], np.broadcast_to(np.arange(n) / n, (N, n)))
    adj = (ds.inputs["A"] != 0) | np.eye(n, dtype=bool)
    assert np.array_equal(ds.inputs["adj"], adj.astype(np.float32))


@pytest.mark.parametrize(
    "algorithm, hint, output",
    [
        ("bellman_ford", "pi_h", "pi"),
        ("bfs", "pi_h", "pi"),
        ("dfs", "pi_h", "pi"),
        ("dijkstra", "pi_h", "pi"),
        ("mst_prim", "pi_h", "pi"),
        ("mst_kruskal", "in_mst_h", "in_mst"),
    ],
)
def test_last_hint_equals_the_output(algorithm, hint, output):
    ds = _dataset(algorithm)
    last = ds.hints[hint][np.arange(N), ds.lengths - 1]
    assert np.array_equal(last, ds.outputs[output])


def test_generation_is_deterministic_by_seed():
    first = clrs.sample_dataset("bellman_ford", 8, 10, 5)
    again = clrs.sample_dataset.__wrapped__("bellman_ford", 8, 10, 5)  # uncached
    other = clrs.sample_dataset("bellman_ford", 8, 10, 6)
    for stage in ("inputs", "hints", "outputs"):
        for name, x in getattr(first, stage).items():
            assert np.array_equal(x, getattr(again, stage)[name])
    assert not np.array_equal(first.inputs["A"], other.inputs["A"])
    # As in CLRS the seed alone fixes the graphs: Dijkstra and Prim share them.
    dijkstra = clrs.sample_dataset("dijkstra", 8, 10, 5)
    assert np.array_equal(first.inputs["A"], dijkstra.inputs["A"])
    assert np.array_equal(first.inputs["s"], dijkstra.inputs["s"])


def test_feedback_and_flat_source_round_trip():
    ds = _dataset("dijkstra")
    feedback = ds.feedback()
    assert feedback.features.inputs is ds.inputs and feedback.outputs is ds.outputs
    assert feedback.features.lengths is ds.lengths
    batch = next(data.eval_batches(ds.as_source(), 5))
    rebuilt = clrs.feedback_from_batch(batch)
    assert set(rebuilt.features.inputs) == set(ds.inputs)
    assert set(rebuilt.features.hints) == set(ds.hints)
    assert set(rebuilt.outputs) == set(ds.outputs)
    assert np.array_equal(rebuilt.features.hints["d"], ds.hints["d"][:5])
    assert np.array_equal(rebuilt.features.lengths, ds.lengths[:5])


def test_without_hints_keeps_outputs_and_lengths():
    full = clrs.sample_dataset("mst_kruskal", 4, 12, 0)
    bare = clrs.sample_dataset("mst_kruskal", 4, 12, 0, with_hints=False)
    assert bare.hints == {} and bare.feedback().features.hints == {}
    assert np.array_equal(bare.lengths, full.lengths)
    assert np.array_equal(bare.outputs["in_mst"], full.outputs["in_mst"])


# -- known trajectories -----------------------------------------------------------------


def test_bfs_on_a_path_known_trajectory():
    path = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], float)
    ex = clrs.run_algorithm("bfs", path, 0)
    assert ex.length == 3
    np.testing.assert_array_equal(ex.hints["reach_h"], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(ex.hints["pi_h"], [[0, 1, 2], [0, 0, 2], [0, 0, 1]])
    np.testing.assert_array_equal(ex.outputs["pi"], [0, 0, 1])


def test_dfs_known_trajectory_times():
    A = np.zeros((4, 4))
    A[0, 1] = A[1, 2] = A[0, 2] = 1.0  # node 3 is its own tree
    ex = clrs.run_algorithm("dfs", A)
    assert ex.length == 3 * 4
    np.testing.assert_array_equal(ex.outputs["pi"], [0, 0, 1, 3])
    np.testing.assert_allclose(ex.hints["d"][-1], [0.01, 0.02, 0.03, 0.07], atol=1e-6)
    np.testing.assert_allclose(ex.hints["f"][-1], [0.06, 0.05, 0.04, 0.08], atol=1e-6)
    np.testing.assert_allclose(ex.hints["time"][-1], 0.08, atol=1e-6)
    np.testing.assert_array_equal(ex.hints["color"][-1], np.eye(3)[[2, 2, 2, 2]])


def test_kruskal_on_a_triangle():
    A = np.zeros((3, 3))
    A[0, 1] = A[1, 0] = 0.3
    A[1, 2] = A[2, 1] = 0.1
    A[0, 2] = A[2, 0] = 0.2
    ex = clrs.run_algorithm("mst_kruskal", A)
    expected = np.zeros((3, 3))
    expected[1, 2] = expected[2, 1] = expected[0, 2] = expected[2, 0] = 1.0
    np.testing.assert_array_equal(ex.outputs["in_mst"], expected)
    np.testing.assert_array_equal(ex.hints["phase"][0], [1, 0, 0])


# Hint and output checksums (`_checksum`) on `_golden_graph`, source 0, as computed by the
# reference implementation of dm-clrs 2.0.3 (clrs/_src/algorithms/graphs.py): pins every
# probe, step by step, to CLRS's own algorithms.
CLRS_REFERENCE = {
    "bellman_ford": (4, {"d": 237.3489, "msk": 300.0, "pi": 71.0, "pi_h": 912.0}),
    "bfs": (4, {"pi": 71.0, "pi_h": 912.0, "reach_h": 300.0}),
    "dfs": (
        21,
        {
            "color": 6682.0,
            "d": 159.51,
            "f": 141.93,
            "pi": 73.0,
            "pi_h": 13996.0,
            "s": 839.0,
            "s_last": 778.0,
            "s_prev": 17400.0,
            "time": 20.4,
            "u": 868.0,
            "v": 799.0,
        },
    ),
    "dijkstra": (
        8,
        {"d": 1201.8455, "in_queue": 334.0, "mark": 1088.0, "pi": 71.0, "pi_h": 3692.0, "u": 225.0},
    ),
    "mst_kruskal": (
        24,
        {
            "in_mst": 356.0,
            "in_mst_h": 9640.0,
            "mask_u": 1443.0,
            "mask_v": 1542.0,
            "phase": 871.0,
            "pi": 34368.0,
            "root_u": 1056.0,
            "root_v": 1097.0,
            "u": 1022.0,
            "v": 1079.0,
        },
    ),
    "mst_prim": (
        8,
        {
            "in_queue": 289.0,
            "key": 547.2742,
            "mark": 1075.0,
            "pi": 96.0,
            "pi_h": 5066.0,
            "u": 225.0,
        },
    ),
}


def _golden_graph(directed):
    """A fixed 7-node graph, self-loops allowed, independent of `clrs.er_graph`."""
    rng = np.random.default_rng(42)
    edges = rng.random((7, 7)) < (0.35 if directed else 0.7)
    weights = rng.uniform(0.1, 1.0, (7, 7))
    if not directed:
        edges, weights = edges & edges.T, (weights + weights.T) / 2
    return np.where(edges, weights, 0.0)


def _checksum(x):
    """A position-weighted sum: catches changed values, steps and permutations."""
    x = np.asarray(x, np.float64)
    return float(np.sum(x * (np.arange(x.size) % 97 + 1).reshape(x.shape)))


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_probes_match_the_clrs_reference_implementation(algorithm):
    source = 0 if clrs.SPECS[algorithm].get("s", ("",))[0] == "input" else None
    ex = clrs.run_algorithm(algorithm, _golden_graph(algorithm == "dfs"), source)
    length, sums = CLRS_REFERENCE[algorithm]
    assert ex.length == length
    probes = {**ex.hints, **ex.outputs}
    assert set(probes) == set(sums)
    for name, expected in sums.items():
        assert _checksum(probes[name]) == pytest.approx(expected, abs=2e-3), name


# -- algorithms against networkx / scipy ------------------------------------------------


def _tree_distances(A, pi, s):
    """Distance from ``s`` along the pointer tree; inf where the chain misses ``s``."""
    n = len(pi)
    out = np.full(n, np.inf)
    for v in range(n):
        total, node = 0.0, v
        for _ in range(n):
            if node == s:
                out[v] = total
                break
            parent = pi[node]
            if parent == node or A[parent, node] == 0:
                break
            total, node = total + A[parent, node], parent
    return out


@pytest.mark.parametrize("algorithm", ["bellman_ford", "dijkstra"])
@pytest.mark.parametrize("n", [NODES, 64])
def test_shortest_path_pointers_give_scipy_distances(algorithm, n):
    ds = _dataset(algorithm, n=n)
    for i in range(N):
        A, s, pi = _graph(ds, i), _source(ds, i), ds.outputs["pi"][i]
        ref = scipy.sparse.csgraph.dijkstra(scipy.sparse.csr_matrix(A), indices=s)
        np.testing.assert_allclose(_tree_distances(A, pi, s), ref, rtol=1e-6, atol=1e-6)
        unreachable = np.isinf(ref)
        assert np.array_equal(pi[unreachable], np.flatnonzero(unreachable))
        assert pi[s] == s


def test_bfs_parents_are_one_level_closer():
    ds = _dataset("bfs")
    for i in range(N):
        A, s, pi = _graph(ds, i), _source(ds, i), ds.outputs["pi"][i]
        levels = nx.single_source_shortest_path_length(nx.from_numpy_array(A), s)
        for v in range(NODES):
            if v == s or v not in levels:
                assert pi[v] == v
                continue
            assert A[pi[v], v] != 0 and levels[pi[v]] == levels[v] - 1
            # CLRS's tie-break: the lowest-index neighbour on the previous level.
            closer = [u for u in range(NODES) if A[u, v] and levels.get(u) == levels[v] - 1]
            assert pi[v] == min(closer)
        # One hint per BFS level, plus the final round that reaches nothing new.
        assert ds.lengths[i] == max(levels.values()) + 1


def _reference_dfs(A):
    """Recursive CLRS DFS: roots and neighbours in index order; times in steps of 1."""
    n = len(A)
    pi, d, f, clock = np.arange(n), np.zeros(n), np.zeros(n), [0]

    def visit(u):
        clock[0] += 1
        d[u] = clock[0]
        for v in range(n):
            if A[u, v] != 0 and d[v] == 0:
                pi[v] = u
                visit(v)
        clock[0] += 1
        f[u] = clock[0]

    for s in range(n):
        if d[s] == 0:
            visit(s)
    return pi, d, f


@pytest.mark.parametrize("n", [NODES, 64])
def test_dfs_is_the_node_order_dfs_forest(n):
    ds = _dataset("dfs", n=n)
    assert np.all(ds.lengths == 3 * n)
    for i in range(N):
        A = _graph(ds, i)
        assert not np.array_equal(A, A.T)  # directed graphs
        pi, d, f = _reference_dfs(A)
        assert np.array_equal(ds.outputs["pi"][i], pi)
        last = ds.lengths[i] - 1
        np.testing.assert_allclose(ds.hints["d"][i, last], d / 100, atol=1e-4)
        np.testing.assert_allclose(ds.hints["f"][i, last], f / 100, atol=1e-4)
        children = np.flatnonzero(pi != np.arange(n))
        assert np.all(A[pi[children], children] != 0)


@pytest.mark.parametrize("p", [None, 0.5])
def test_prim_tree_is_a_minimum_spanning_tree_of_the_source_component(p):
    ds = _dataset("mst_prim", p=p)
    for i in range(N):
        A, s, pi = _graph(ds, i), _source(ds, i), ds.outputs["pi"][i]
        graph = nx.from_numpy_array(A)
        component = nx.node_connected_component(graph, s)
        children = [v for v in range(NODES) if pi[v] != v]
        assert set(children) == component - {s} and pi[s] == s
        assert all(A[pi[v], v] != 0 for v in children)
        weight = sum(A[pi[v], v] for v in children)
        mst = nx.minimum_spanning_tree(graph.subgraph(component))
        assert weight == pytest.approx(mst.size(weight="weight"), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("p", [None, 0.5])
def test_kruskal_selects_a_minimum_spanning_forest(p):
    ds = _dataset("mst_kruskal", p=p)
    for i in range(N):
        A, in_mst = _graph(ds, i), ds.outputs["in_mst"][i]
        assert np.array_equal(in_mst, in_mst.T) and not np.diag(in_mst).any()
        assert np.all(A[in_mst == 1] != 0)
        graph = nx.from_numpy_array(A)
        forest = nx.from_numpy_array(in_mst)
        assert nx.is_forest(forest)
        assert forest.number_of_edges() == NODES - nx.number_connected_components(graph)
        weight = np.sum(A * in_mst) / 2
        mst = nx.minimum_spanning_tree(graph)  # a spanning forest if disconnected
        assert weight == pytest.approx(mst.size(weight="weight"), rel=1e-6, abs=1e-6)


# -- splits and speed -------------------------------------------------------------------


def test_clrs30_splits_sizes_and_seeds():
    splits = clrs.clrs30_splits("bfs", train_size=8, eval_size=4, multiplier=2, test_nodes=20)
    assert {k: (v.num_examples, v.num_nodes) for k, v in splits.items()} == {
        "train": (8, 16),
        "val": (8, 16),
        "test": (8, 20),
    }
    for split, seed in clrs.CLRS30_SEEDS.items():
        ref = clrs.sample_dataset("bfs", 8, splits[split].num_nodes, seed)
        assert np.array_equal(splits[split].inputs["A"], ref.inputs["A"])


def test_default_clrs30_splits_are_fast():
    timings = {}
    for algorithm in clrs.ALGORITHMS:
        start = time.perf_counter()
        splits = clrs.clrs30_splits(algorithm)
        timings[algorithm] = time.perf_counter() - start
        assert splits["train"].num_examples == 1000 and splits["train"].num_nodes == 16
        assert splits["val"].num_examples == 32 and splits["val"].num_nodes == 16
        assert splits["test"].num_examples == 32 and splits["test"].num_nodes == 64
    print("clrs30_splits seconds:", {k: round(v, 2) for k, v in timings.items()})
    assert max(timings.values()) < 10.0, timings


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_generation_at_128_nodes(algorithm):
    start = time.perf_counter()
    ds = clrs.sample_dataset(algorithm, 2, 128, 3)
    elapsed = time.perf_counter() - start
    assert ds.num_nodes == 128 and ds.lengths.min() >= 1
    assert elapsed < 5.0, elapsed
