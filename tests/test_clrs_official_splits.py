"""The ``"clrs30"`` sampler draws CLRS-30's official splits, graph for graph (issue 35).

The pinned digests were computed once with DeepMind's own code, dm-clrs 2.0.3 from
PyPI (``pip download --no-deps dm-clrs``; the package is not a dependency and nothing
here imports it). A throwaway script put the unpacked wheel on ``sys.path``,
registered a stub ``tensorflow`` module (``clrs/_src/probing.py`` imports it but
sampling never calls it) and a bare ``clrs`` package (to skip ``clrs/__init__``), then
for each algorithm and split ran::

    sampler, _ = clrs._src.samplers.build_sampler(
        algorithm, num_samples, seed=CLRS30[split]["seed"], length=CLRS30[split]["length"])
    feedback = sampler.next()   # the whole dataset, as dataset.py's _create_data

with ``num_samples`` CLRS30's (1000 / 32 / 32) or the first ``k`` graphs, and hashed
the feedback with `_digest`'s layout: for ``inputs``, ``hints``, ``outputs`` in turn,
each probe in sorted name order as ``"<stage>/<name>"`` then its data as C-ordered
float32 bytes (hints swapped to batch-first ``[N, T, ...]``), then the lengths as
int32. The same script also compared every array of the full train, val and test
splits of the six algorithms with ``sample_dataset(..., sampler="clrs30")``: all equal.
`OFFICIAL_TEST_OUTPUTS` hashes dm-clrs's test-split outputs alone (int32 bytes).
"""

import hashlib

import numpy as np
import pytest

from configs import clrs as clrs_configs
from deq_jax import tasks
from deq_jax.models import clrs

# {(split, graphs): {algorithm: sha256}}; graphs = the split's first k (None: all).
OFFICIAL = {
    ("val", None): {
        "bellman_ford": "3642eec89683e41406ea9ec229a2b25840c88129852ae42465ce35af12121c68",
        "bfs": "c03d58d9fc368d9b26fb68382999750c8eb078639215004aa30c4d2c957a3aed",
        "dfs": "1aa83059c0111460f74441c2f9216d46b65a1ff91f32093293416b16db05de81",
        "dijkstra": "5d7911779b061639641c91d2cbb9d6fffb4d09fec19acdeef46d86feab6b81ea",
        "mst_kruskal": "46e367d92f037809649c646b3cf37edf440b3d2994fac3201a89de4450de39f0",
        "mst_prim": "4cfd3105f8515d3a053bb4cd2a40080cd7f7299e39a3ecbf202e65fbaa464682",
    },
    ("train", 4): {
        "bellman_ford": "5e4b850f391c7efbaf71afd507b7fecd75cb57b90ef28913e291da63d01e2f99",
        "bfs": "09c89794fe71a8d662a26d2b91b494f225906f7daceb613928ab923199bea694",
        "dfs": "0712675565820317d2e2ae4540b72a671f20080e1183ee6e4141847a787a72e5",
        "dijkstra": "a0835475b2b93002eac627dd8bdd41f3b093b42bac25ec91222cc48e28c83849",
        "mst_kruskal": "f5bf3a2e0a5401095ef9a9968775797ce7d81b7aedb29cf1ccd2a6f46f914b3b",
        "mst_prim": "a7544b0f06ba5cb4d78e1b54e75cb494884f045a9cbe13fe9fa0dbb41530f04b",
    },
    ("test", 2): {
        "bellman_ford": "c24ed422b6f3e6df65ce76b4da0d8854f4dbab0bf73ac06d1352b1b4001990a4",
        "bfs": "bd00b1f99b80460e8890f92e104226a5efe7c4682dfbe194dfe00cc50729eccf",
        "dfs": "5e939b6e2d13a5354a5792e8fb05fc650862983532b07b7d63bb6b5320a0727d",
        "dijkstra": "4df7da3db1229955ffc2cae8ca9463d61a6aacba1ba9d81a8c5b589781f310b6",
        "mst_kruskal": "133633b4c4640ca907ea23d9ad0293e049aba3b11ba996e7598156c8a6627482",
        "mst_prim": "d61a04811d84729b39fe3ae8543c17d3c78da31e378f003d76e25b4356e2455c",
    },
    ("test", None): {
        "bellman_ford": "f4ca18afd552711acdac50783082131e75fb2eb45059311fa5b5953597c5383f",
        "bfs": "1c04ad383b820d1bed67b4c58ad7e1638bcddb191a87a2a7e8e01f1597a6e029",
        "dfs": "a2bf1c3d419cbbeff293455eaa9b2c8012441451210790240b968e76e1d64563",
        "dijkstra": "bbe99de0e5120bdca1e7aa4534b529470882354cbadd8a8d02b73cf2e590e83c",
        "mst_kruskal": "1ccafe6c54351bc3f2aee829243455917e4de02ec3ea62996f6ab22b277ed68d",
        "mst_prim": "80c2485810b0efb41a471989b99fdecb29a79b81cdb601975013feb78f0d3f5b",
    },
    ("train", None): {
        "bellman_ford": "521e6e6875c32eaac97d9df0aba5519216a019b1f2087918425c704a8d516e91",
        "bfs": "73b1079016ea53cb96b0ecfd6047367acd936f6ba0056d3c1e95d164a27379ec",
        "dfs": "8b803a62b8ab826d0542f81371eed2a605ec182f04a19e0d9257dd5bed2c84ae",
        "dijkstra": "c7d9b0df2d815c09cab73bc86eb33fd70f6848ea5a17c0062e19f4e60a169865",
        "mst_kruskal": "3ee17c5667332a518799cb53281df358e223b08066c2830d63bcad8e4c6813e6",
        "mst_prim": "c8c1c11fbc0dd1558de705df99b6706787c0c0d7025e7eed901dd716ac3125f7",
    },
}

# sha256 of dm-clrs's official test outputs (32 graphs of 64 nodes, seed 3), int32.
OFFICIAL_TEST_OUTPUTS = {
    "bellman_ford": "d1b1ed6d803b717d27060067941709718c284255021ee86022238e071474226f",
}

# `_digest` of ``sample_dataset(algorithm, 4, 16, 1)`` on the code before issue 35
# (numpy Generator draws; commit 8de672b): ``sampler="generator"`` keeps those graphs.
GENERATOR_SEED_1 = {
    "bellman_ford": "eac83dc710c4ac304c1b1a81c595818b7934e19fad6778afbbfd294251bf2a8e",
    "bfs": "02fcc4b1a369b24de003016eb823c9b34b8295f23a940bfa6c03ff264c0e5012",
    "dfs": "ae900d92496d92feacfb10a182dabe757b74e9944e424bc82b83732708edf9a2",
    "dijkstra": "b27804372c57a923283a524e1706c3f92acb532459648c6b7cc3b5273bfbfccf",
    "mst_kruskal": "698886d0d4cac303007abb249d74ae68411a18850ecca4c31d4367d28e32fefd",
    "mst_prim": "d208783a460639167e57478509164a837eed7e27f0fe7ecbf2ce91dc22f58fa1",
}

# CLRS-30's splits (clrs/_src/samplers.py, CLRS30): (graphs, nodes, seed).
CLRS30 = {"train": (1000, 16, 1), "val": (32, 16, 2), "test": (32, 64, 3)}


def _digest(ds: clrs.ClrsDataset) -> str:
    """sha256 of a dataset in the reference layout (module docstring)."""
    h = hashlib.sha256()
    for stage, arrays in (("inputs", ds.inputs), ("hints", ds.hints), ("outputs", ds.outputs)):
        for name in sorted(arrays):
            h.update(f"{stage}/{name}".encode())
            h.update(np.ascontiguousarray(arrays[name], np.float32).tobytes())
    h.update(np.asarray(ds.lengths, np.int32).tobytes())
    return h.hexdigest()


def _sha(array, dtype) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype).tobytes()).hexdigest()


def _official(split, graphs, algorithm):
    count, nodes, seed = CLRS30[split]
    return clrs.sample_dataset(algorithm, graphs or count, nodes, seed, sampler="clrs30")


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
@pytest.mark.parametrize("split, graphs", [("val", None), ("train", 4), ("test", 2)])
def test_clrs30_sampler_draws_the_official_graphs(split, graphs, algorithm):
    assert _digest(_official(split, graphs, algorithm)) == OFFICIAL[split, graphs][algorithm]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_whole_official_train_and_test_splits(split, algorithm):
    assert _digest(_official(split, None, algorithm)) == OFFICIAL[split, None][algorithm]


def test_clrs30_splits_default_to_the_official_ones():
    splits = clrs.clrs30_splits("bfs", train_size=4)
    assert _digest(splits["val"]) == OFFICIAL["val", None]["bfs"]
    assert _digest(splits["train"]) == OFFICIAL["train", 4]["bfs"]
    assert _digest(clrs.sample_dataset("bfs", 4, 16, 1)) == OFFICIAL["train", 4]["bfs"]


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_generator_sampler_keeps_the_earlier_graphs(algorithm):
    ds = clrs.sample_dataset(algorithm, 4, 16, 1, sampler="generator")
    assert _digest(ds) == GENERATOR_SEED_1[algorithm]
    assert _digest(ds) != OFFICIAL["train", 4][algorithm]


@pytest.mark.parametrize("algorithm", clrs.ALGORITHMS)
def test_every_clrs_config_draws_the_official_splits(algorithm):
    config = clrs_configs.clrs_config(algorithm)
    assert config.task.sampler == "clrs30"
    task = config.task
    assert (task.train_size, task.train_nodes, task.eval_size, task.multiplier) == (1000, 16, 32, 1)
    assert 64 in task.test_nodes and task.seed == 0


def test_bellman_ford_config_tests_on_the_official_test_split():
    fields = {k: v for k, v in clrs_configs.clrs_config("bellman_ford").task.items() if k != "name"}
    task = tasks.get("clrs", **{**fields, "train_size": 4})
    arrays = task.source("test_64")
    assert arrays["targets"].shape == (32, 64)
    assert _sha(arrays["targets"], np.int32) == OFFICIAL_TEST_OUTPUTS["bellman_ford"]
    val = task.source("val")
    official_val = _official("val", None, "bellman_ford")
    np.testing.assert_array_equal(val["input_A"], official_val.inputs["A"])
    np.testing.assert_array_equal(val["targets"], official_val.outputs["pi"])


def test_task_sampler_generator_gives_other_graphs():
    official = clrs.ClrsTask(clrs.ClrsConfig("bfs", eval_size=4)).source("val")
    earlier = clrs.ClrsTask(clrs.ClrsConfig("bfs", eval_size=4, sampler="generator")).source("val")
    np.testing.assert_array_equal(
        earlier["input_A"], clrs.sample_dataset("bfs", 4, 16, 2, sampler="generator").inputs["A"]
    )
    assert not np.array_equal(official["input_A"], earlier["input_A"])


def test_unknown_sampler_names_the_valid_ones():
    with pytest.raises(ValueError, match="Valid samplers: clrs30, generator"):
        clrs.sample_dataset("bfs", 2, 4, 0, sampler="numpy")
    with pytest.raises(ValueError, match="task.sampler.*clrs30, generator"):
        clrs.ClrsConfig("bfs", sampler="RandomState")
