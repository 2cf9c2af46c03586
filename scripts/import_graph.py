"""The figures issue 18 tracks for src/titan_core, measured with the stdlib ``ast``.

- cycles between the direct children of ``titan_core`` (modules and subpackages), counting
  imports inside functions too and leaving out ``if TYPE_CHECKING:`` imports;
- function-level imports of ``titan_core`` modules inside ``titan_core`` (import statements);
- parameters annotated ``Any`` in src (``*args`` / ``**kwargs`` not counted);
- at file level (each module and package ``__init__`` a node; ``if TYPE_CHECKING:`` imports
  counted too, since a reader follows them, but not the package root's lazy re-export list):
  the import circles, and the arrows running back up: imports of a module in a higher layer of
  the import-linter contract (pyproject.toml), which lint-imports does not see when they are
  type-only;
- the top-level modules of ``titan_core`` (files directly in the package).

    python scripts/import_graph.py            # the three figures and each cycle
    python scripts/import_graph.py --list     # also every function-level import, with its reason
    python scripts/import_graph.py --edges    # also every edge between units

It only reads files, so it runs without the package installed.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "src" / "titan_core"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class Imports(ast.NodeVisitor):
    """Every titan_core import in one module: (target module, in a function?, line)."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[tuple[str, bool, int]] = []
        self.depth = 0

    with_type_checking = False

    def visit_If(self, node: ast.If) -> None:
        if is_type_checking(node.test) and not self.with_type_checking:
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "titan_core" or alias.name.startswith("titan_core."):
                self.found.append((alias.name, self.depth > 0, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target != "titan_core" and not target.startswith("titan_core."):
            return
        # `from pkg import name`: name may be a submodule; record the most precise target.
        for alias in node.names:
            self.found.append((f"{target}.{alias.name}", self.depth > 0, node.lineno))


def lazy_names() -> dict[str, str]:
    """titan_core/__init__.py's public name -> defining module (read from its one list, the TYPE_CHECKING imports)."""
    import titan_core  # cheap: the package imports nothing heavy until a public name is used
    from titan_core import plugin_api  # the contract's names: served through it, defined further down

    def defined_in(name: str, module: str) -> str:
        return plugin_api._WHERE.get(name, module) if module == "plugin_api" else module

    return {k: f"titan_core.{defined_in(k, v)}" for k, v in titan_core._LAZY.items()}


def resolve(target: str, modules: set[str], lazy: dict[str, str]) -> str | None:
    """The module an import target lands in (a name imported from a module -> that module)."""
    if target.startswith("titan_core.") and target.count(".") == 1:
        name = target.split(".", 1)[1]
        if name in lazy and target not in modules:
            return lazy[name]
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "titan_core"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def any_params(tree: ast.AST) -> list[int]:
    def is_any(ann: ast.expr | None) -> bool:
        if ann is None:
            return False
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            return ann.value.strip() in ("Any", "typing.Any")
        return (isinstance(ann, ast.Name) and ann.id == "Any") or (
            isinstance(ann, ast.Attribute) and ann.attr == "Any"
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if is_any(arg.annotation):
                    lines.append(arg.lineno)
    return lines


def contract_layers() -> dict[str, int]:
    """titan_core unit -> its layer's index in the import-linter contract (0 = top)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return {name.strip(): i for i, layer in enumerate(layers) for name in layer.split("|")}


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    parts = module.split(".")
    for k in range(len(parts), 1, -1):
        if ".".join(parts[:k]) in layers:
            return layers[".".join(parts[:k])]
    return None


def file_level(files: list[Path], modules: set[str], lazy: dict[str, str]) -> tuple[list[list[str]], list[str]]:
    """(import circles between files, arrows running back up), TYPE_CHECKING imports included."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in files:
        mod = module_name(path)
        if mod == "titan_core":
            continue  # the root's TYPE_CHECKING block is the public name list, loaded lazily
        visitor = Imports(mod, path.name == "__init__.py")
        visitor.with_type_checking = True
        visitor.visit(ast.parse(path.read_text()))
        for target, _in_function, _lineno in visitor.found:
            dest = resolve(target, modules, lazy)
            if dest is not None and dest != mod and dest != "titan_core":
                graph[mod].add(dest)
    layers = contract_layers()
    up = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of(a, layers), layer_of(b, layers)
            if la is not None and lb is not None and lb < la:
                up.append(f"{a} -> {b}")
    return strongly_connected(graph), up


def report(title: str, found: list[str], show: bool) -> None:
    """``title: <how many>``, then each of ``found`` on its own line when ``show`` (the command's flag)."""
    print(f"{title}: {len(found)}")
    if show:
        for line in found:
            print(f"  {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every function-level import")
    parser.add_argument("--edges", action="store_true", help="print every edge between units")
    parser.add_argument("--any", action="store_true", help="print every parameter annotated Any")
    parser.add_argument("--files", action="store_true", help="print each file-level circle and arrow back up")
    parser.add_argument("--modules", action="store_true",
                        help="also check module-level imports between modules for cycles (an import-time crash risk)")
    args = parser.parse_args()

    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(p) for p in files}
    lazy = lazy_names()
    graph: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    function_level: list[str] = []
    top_graph: dict[str, set[str]] = defaultdict(set)  # module -> modules its top level imports
    any_where: list[str] = []
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        lines = source.splitlines()
        mod = module_name(path)
        visitor = Imports(mod, path.name == "__init__.py")
        visitor.visit(tree)
        seen_lines: set[int] = set()
        for target, in_function, lineno in visitor.found:
            dest = resolve(target, modules, lazy)
            if dest is None:
                continue
            if in_function and lineno not in seen_lines:
                seen_lines.add(lineno)
                function_level.append(f"{path.relative_to(ROOT)}:{lineno}: {lines[lineno - 1].strip()}")
            if not in_function and dest != mod:
                # importing a submodule runs its packages' __init__ first
                parts = dest.split(".")
                for i in range(2, len(parts) + 1):
                    parent = ".".join(parts[:i])
                    if parent != mod and not mod.startswith(parent + "."):
                        top_graph[mod].add(parent)
            a, b = unit(mod), unit(dest)
            if a != b and a != "titan_core" and b != "titan_core":
                graph[a].add(b)
                why[(a, b)].append(f"{mod} -> {dest}{' (in a function)' if in_function else ''}")
        any_where += [f"{path.relative_to(ROOT)}:{n}" for n in any_params(tree)]

    cycles = strongly_connected(graph)
    print(f"cycles between direct children of titan_core: {len(cycles)}"
          f" (units in them: {sum(len(c) for c in cycles)})")
    for comp in cycles:
        print(f"  {len(comp)} units: {', '.join(comp)}")
        if args.edges:
            for a in comp:
                for b in sorted(graph[a] & set(comp)):
                    print(f"    {a} -> {b}: {'; '.join(why[(a, b)][:3])}")
    report("function-level imports of titan_core modules inside titan_core", function_level, args.list)
    report("parameters annotated Any in src (not *args/**kwargs)", any_where, args.any)
    circles, up = file_level(files, modules, lazy)
    report("file-level import circles", [", ".join(comp) for comp in circles], args.files)
    report("file-level arrows running back up a layer", up, args.files)
    top = sorted(p.stem for p in PKG.glob("*.py"))
    print(f"top-level modules of titan_core: {len(top)} ({', '.join(top)})")
    if args.modules:
        module_cycles = strongly_connected(top_graph)
        print(f"cycles between modules through module-level imports: {len(module_cycles)}")
        for comp in module_cycles:
            print(f"  {', '.join(comp)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
