"""launch.runs.write_report: the JSON, the markdown beside it, one line naming them."""

import json

from launch.runs import write_report


def test_writes_json_and_markdown_and_names_every_file(tmp_path):
    lines = []
    path = str(tmp_path / "out" / "my_report.json")
    write_report(path, {"a": [1, 2]}, "| a |\n", also=["fig.png"], emit=lines.append)
    assert json.loads((tmp_path / "out" / "my_report.json").read_text()) == {"a": [1, 2]}
    assert (tmp_path / "out" / "my_report.md").read_text() == "| a |\n"
    assert lines == [f"Wrote {path}, {path[:-5]}.md, fig.png"]


def test_without_markdown_writes_only_the_json(tmp_path):
    lines = []
    write_report(str(tmp_path / "r.json"), {}, emit=lines.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert lines == [f"Wrote {tmp_path / 'r.json'}"]
