"""The solver fit's report file: read back as written, a clear error where none is."""

import json

import pytest

from deq_jax.training.solver_fit.hypersolver import REPORT_FILE, read_solver_report


def test_reads_the_report_a_fit_wrote(tmp_path):
    report = {"spec": {"unroll_steps": 10}, "solver_params": 2626}
    (tmp_path / REPORT_FILE).write_text(json.dumps(report))
    assert read_solver_report(str(tmp_path)) == report


def test_missing_report_names_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"No {REPORT_FILE} in .*_hypersolver config"):
        read_solver_report(str(tmp_path))
