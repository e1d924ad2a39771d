"""The suite's module order under xdist (tests/conftest.py): the longest modules first,
then by number of tests; each module's tests together and in their order."""

import types

import conftest


def _items(nodeids):
    return [types.SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


NODEIDS = [
    "tests/test_a.py::test_1",
    "tests/test_b.py::test_1",
    "tests/test_b.py::test_2",
    "tests/test_a.py::test_2",
    "tests/test_a.py::test_3",
    "tests/test_mdeq_step_cost.py::test_1",
    "tests/test_neural_solver_launch.py::test_1",
    "tests/test_neural_solver_launch.py::Case::test_2",
]


def test_longest_modules_first_then_by_number_of_tests(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    items = _items(NODEIDS)
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [
        "tests/test_neural_solver_launch.py::test_1",  # first in LONGEST_MODULES
        "tests/test_neural_solver_launch.py::Case::test_2",
        "tests/test_mdeq_step_cost.py::test_1",
        "tests/test_a.py::test_1",  # three tests
        "tests/test_a.py::test_2",
        "tests/test_a.py::test_3",
        "tests/test_b.py::test_1",  # two tests
        "tests/test_b.py::test_2",
    ]


def test_a_run_without_xdist_keeps_the_file_order(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    items = _items(NODEIDS)
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == NODEIDS


def test_xdist_by_count_order_is_turned_off_for_loadscope_only():
    loadscope = types.SimpleNamespace(option=types.SimpleNamespace(dist="loadscope"))
    loadscope.option.loadscopereorder = True
    conftest.pytest_configure(loadscope)
    assert loadscope.option.loadscopereorder is False
    load = types.SimpleNamespace(option=types.SimpleNamespace(dist="load"))
    load.option.loadscopereorder = True
    conftest.pytest_configure(load)
    assert load.option.loadscopereorder is True
    conftest.pytest_configure(types.SimpleNamespace(option=types.SimpleNamespace()))  # no xdist
