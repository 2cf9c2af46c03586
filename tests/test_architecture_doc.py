"""docs/architecture.md draws the layers as the import contract enforces them, and the contract covers the
whole package (import-linter leaves a module that no layer names unchecked)."""

from __future__ import annotations

import re
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conftest import REPO

PACKAGE = REPO / "src/titan_core"
DOC = REPO / "docs/architecture.md"


def _contract_layers() -> list[set[str]]:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [{name.strip().removeprefix("titan_core.") for name in layer.split("|")} for layer in layers]


def _doc_layers() -> list[set[str]]:
    block = DOC.read_text().split("## Layers", 1)[1].split("```\n", 2)[1]
    layers: list[set[str]] = []
    for line in block.splitlines():
        names = {n.strip().rstrip("/") for n in line[15:].split("|") if n.strip()}
        if line[15:].lstrip().startswith("|"):  # a wrapped line continues the layer above
            layers[-1] |= names
        else:
            layers.append(names)
    return layers


def _children() -> set[str]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return modules | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def test_every_module_of_the_package_sits_in_one_layer_of_the_contract() -> None:
    layers = _contract_layers()
    named = [name for layer in layers for name in layer]
    assert len(named) == len(set(named)), "a module is named in two layers"
    assert set(named) == _children(), (
        f"not in any layer: {sorted(_children() - set(named))}; named but absent: {sorted(set(named) - _children())}")


def test_the_doc_draws_the_contracts_layers_in_order() -> None:
    assert _doc_layers() == _contract_layers()


def test_the_doc_names_every_distribution_and_the_core_forbids_importing_each_plugin() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (forbidden,) = [set(c["forbidden_modules"]) for c in contracts
                    if c["type"] == "forbidden" and "torchao" in c["forbidden_modules"]]
    table = DOC.read_text().split("## Distributions", 1)[1].split("##", 1)[0]
    for plugin in sorted((REPO / "plugins").iterdir()):
        package = tomllib.loads((plugin / "pyproject.toml").read_text())["project"]["name"]
        module = package.replace("-", "_")
        assert f"`plugins/{plugin.name}/` | `{package}` | `{module}`" in table, plugin.name
        assert module in forbidden, f"the core's forbidden contract does not name {module}"


def test_the_doc_gives_the_number_of_imports_made_inside_functions() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts/import_graph.py")], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}).stdout
    count = re.search(r"function-level imports of titan_core modules inside titan_core: (\d+)", out)
    assert count is not None, out
    assert re.search(rf"imports made inside\s+functions \({count.group(1)},", DOC.read_text()), out
    assert "cycles between direct children of titan_core: 0 " in out, out


def test_every_function_level_import_says_why() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts/import_graph.py"), "--list"], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}).stdout
    lines = [line for line in out.splitlines() if line.startswith("  src/")]
    assert lines and all("#" in line and line.split("#", 1)[1].strip() for line in lines), out


def _figures() -> str:
    return subprocess.run([sys.executable, str(REPO / "scripts/import_graph.py"), "--files"], capture_output=True,
                          text=True, check=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}).stdout


def test_the_layout_figures_issue_28_tracks() -> None:
    """At most 12 top-level modules, no import circle between files (type-only imports included), at most 5
    file-level arrows back up a layer; the doc states the true counts."""
    out = _figures()
    top = re.search(r"top-level modules of titan_core: (\d+)", out)
    circles = re.search(r"file-level import circles: (\d+)", out)
    up = re.search(r"file-level arrows running back up a layer: (\d+)", out)
    assert top and circles and up, out
    assert int(top.group(1)) <= 12, out
    assert int(circles.group(1)) == 0, out
    assert int(up.group(1)) <= 5, out
    doc = " ".join(DOC.read_text().split())
    assert f"the arrows running back up a layer ({up.group(1)}:" in doc, out


def test_every_package_docstring_says_what_lives_there_and_what_it_may_import() -> None:
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = init.read_text().split('"""')[1] if init.read_text().lstrip().startswith('"""') else ""
        assert len(doc.split()) >= 15, f"{init.relative_to(REPO)} has no docstring saying what lives there"
