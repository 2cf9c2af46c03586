"""``titan-plugin new``: the packages it writes, and the two examples checked against them."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from titan_core.commands.titan_plugin import main
from titan_core.scaffold import write_package

REPO = Path(__file__).resolve().parents[1]
EXPECTED = {
    "converter": {"pyproject.toml", "README.md", "tests/test_conformance.py", "src/titan_{n}/__init__.py",
                  "src/titan_{n}/config.py", "src/titan_{n}/converter.py"},
    "spec": {"pyproject.toml", "README.md", "tests/test_conformance.py", "src/titan_{n}/__init__.py",
             "src/titan_{n}/model.py", "src/titan_{n}/tp_plan.py", "src/titan_{n}/spec.py"},
}
GROUP = {"converter": "titan.model_converters", "spec": "titan.train_specs"}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("kind", ["converter", "spec"])
def test_new_writes_a_package_with_its_entry_point(tmp_path: Path, kind: str) -> None:
    assert main(["new", kind, "my_thing", "--dir", str(tmp_path / "pkg")]) == 0
    root = tmp_path / "pkg"
    assert _files(root) == {f.format(n="my_thing") for f in EXPECTED[kind]}
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "titan-my-thing"
    (entry,) = meta["project"]["entry-points"][GROUP[kind]].items()
    assert entry[0] == "my_thing" and entry[1].startswith("titan_my_thing.")
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")  # every file is valid Python


def test_new_refuses_a_bad_name_and_a_used_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new", "spec", "My-Model", "--dir", str(tmp_path / "a")]) == 2
    assert '"My-Model" cannot name a spec: use lower-case letters' in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("mine")
    assert main(["new", "converter", "ok", "--dir", str(tmp_path / "b")]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "b" / "keep.txt").read_text() == "mine" and _files(tmp_path / "b") == {"keep.txt"}


@pytest.mark.parametrize(("example", "kind", "name"), [("titan-int8-fake", "converter", "int8fake"),
                                                       ("titan-tinygpt", "spec", "tinygpt")])
def test_examples_have_the_scaffold_shape(tmp_path: Path, example: str, kind: str, name: str) -> None:
    """Same top-level files, build system, dependencies, test extra and conformance test as `new` writes."""
    ours, theirs = REPO / "examples" / example, write_package(kind, name, tmp_path / name)
    for rel in ("pyproject.toml", "README.md", "tests/test_conformance.py"):
        assert (ours / rel).is_file(), rel
    assert (ours / "tests/test_conformance.py").read_text() == (theirs / "tests/test_conformance.py").read_text()
    a, b = (tomllib.loads((p / "pyproject.toml").read_text()) for p in (ours, theirs))
    assert a["build-system"] == b["build-system"]
    assert sorted(a["project"]["dependencies"]) == sorted(b["project"]["dependencies"])
    assert a["project"]["optional-dependencies"]["test"] == b["project"]["optional-dependencies"]["test"]
    assert list(a["project"]["entry-points"]) == [GROUP[kind]] and name in a["project"]["entry-points"][GROUP[kind]]
    assert "titan-plugin check" in (ours / "README.md").read_text()
