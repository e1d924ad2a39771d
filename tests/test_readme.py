"""The README's Python examples run as written, each on its own, and its install extras exist."""

import configparser
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_examples_run_each_on_its_own():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    namespaces = []
    for block in blocks:
        namespace = {}  # no block may lean on names an earlier block defined
        exec(compile(block, str(README), "exec"), namespace)
        namespaces.append(namespace)
    assert namespaces[0]["sol"].stats.nstep.shape == (8,)
    assert namespaces[1]["z_star"].shape == (8, 16)


def test_readme_install_extras_are_defined():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    extras = parser["options.extras_require"]
    lists = re.findall(r'pip install -e "\.\[([\w,]+)\]"', README.read_text())
    used = {extra for names in lists for extra in names.split(",")}
    assert "train,test" in lists, "the set-up command installs the train and test extras"
    assert {"train", "test", "tensorboard"} <= used
    for extra in used:
        assert extra in extras, f"README installs .[{extra}], which setup.cfg does not define"
    assert "tensorboard" in extras["tensorboard"].split()
