"""The layers (docs/ARCHITECTURE.md): every module imports only its own layer and those below.

    4  spgc/app/                   the CLI, demo, benchmarks, experiments
    3  servers/   providers/       never each other (installed as spgc.servers, spgc.providers)
    2  spgc/                       the library: common < wire < protocol < privacy < learning
                                   < settings (each subpackage's "May import:" line)
    1  garbled_core/               the engine and its circuit library

Read from the source files with ``ast`` (nothing is imported), so the test sees imports inside
functions too.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("garbled_core", "spgc", "servers", "providers")
LEVEL = {"engine": 1, "library": 2, "servers": 3, "providers": 3, "app": 4}


def layer_of_module(name: str) -> str | None:
    """The layer of an imported dotted module name; None for anything not ours."""
    parts = name.split(".")
    if parts[0] == "garbled_core":
        return "engine"
    if parts[0] != "spgc":
        return None
    sub = parts[1] if len(parts) > 1 else ""
    if sub in ("servers", "providers"):
        return sub
    if sub == "app":
        return "app"
    return "library"


def module_name(path: Path) -> str:
    """The installed dotted name of a source file (servers/x.py -> spgc.servers.x)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("servers", "providers"):
        parts.insert(0, "spgc")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    target: str  # dotted module imported from
    names: tuple[str, ...]  # names taken from it (empty for `import x`)
    in_function: bool

    def __str__(self) -> str:
        rel = self.path.relative_to(ROOT)
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else self.target
        return f"{rel}:{self.line}: {what}"


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(path, child.lineno, alias.name, (), in_function))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - child.level + 1]
                    target = ".".join([*base, child.module] if child.module else base)
                else:
                    target = child.module or ""
                names = tuple(a.name for a in child.names)
                found.append(Import(path, child.lineno, target, names, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def source_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "_generated" not in path.parts:  # protoc output
                files.append(path)
    return files


def all_imports() -> list[tuple[str, Import]]:
    out = []
    for path in source_files():
        own = layer_of_module(module_name(path))
        assert own is not None, path
        out += [(own, imp) for imp in imports_of(path)]
    return out


def test_the_tree_has_every_layer() -> None:
    layers = {layer_of_module(module_name(p)) for p in source_files()}
    assert layers == set(LEVEL), layers
    assert len(source_files()) > 40


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = []
    for own, imp in all_imports():
        target = layer_of_module(imp.target)
        if target is None:
            continue
        if LEVEL[target] > LEVEL[own]:
            bad.append(f"{imp}  ({own} imports {target})")
        elif LEVEL[target] == LEVEL[own] == 3 and target != own:
            bad.append(f"{imp}  ({own} imports {target}: servers and providers never meet)")
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_no_function_level_import_of_our_own_modules() -> None:
    """A function-level import of our own code hides a cycle or an upward dependency."""
    bad = [str(imp) for _, imp in all_imports() if imp.in_function and layer_of_module(imp.target)]
    assert not bad, "function-level imports of our modules:\n" + "\n".join(bad)


def _package_of(module: str) -> str:
    """The package a module belongs to: garbled_core, one of the library's subpackages
    (spgc.privacy, ...; spgc for the package's own face), spgc.servers, ..."""
    layer = layer_of_module(module)
    if layer == "library":
        parts = module.split(".")
        # spgc.<x>: a subpackage, or a module moved away whose alias our code must not use.
        return ".".join(parts[:2]) if len(parts) > 1 else "spgc"
    return {"engine": "garbled_core"}.get(layer or "", f"spgc.{layer}")


def test_no_private_name_imported_across_packages() -> None:
    bad = []
    for path in source_files():
        mine = _package_of(module_name(path))
        for imp in imports_of(path):
            if layer_of_module(imp.target) is None or _package_of(imp.target) == mine:
                continue
            private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
            private += [p for p in imp.target.split(".") if p.startswith("_") and p != "__main__"]
            if private and imp.target != "spgc.wire._generated":
                bad.append(f"{imp}  (private: {', '.join(private)})")
    assert not bad, "private names used across packages:\n" + "\n".join(bad)


def library_subpackages() -> dict[str, tuple[str, ...]]:
    """The library's subpackages (spgc/<name>/, app excepted: a layer of its own) and what each
    may import, read from the "May import:" line of its docstring: the one place it is written."""
    allowed = {}
    for init in sorted((ROOT / "spgc").glob("*/__init__.py")):
        name = init.parent.name
        if name == "app":
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        lines = [ln for ln in doc.splitlines() if ln.startswith("May import:")]
        assert len(lines) == 1, (
            f"spgc/{name}/__init__.py: its docstring needs one 'May import:' line"
        )
        listed = lines[0].removeprefix("May import:").strip().rstrip(".")
        allowed[name] = (
            () if listed == "nothing of ours" else tuple(x.strip() for x in listed.split(","))
        )
    return allowed


def test_the_library_is_its_subpackages_and_its_public_face() -> None:
    """No module at spgc/'s top level but __init__.py; every library subpackage says what it
    holds (a docstring) and what it may import."""
    top = sorted(p.name for p in (ROOT / "spgc").glob("*.py"))
    assert top == ["__init__.py"], f"modules left at spgc/'s top level: {top}"
    subs = library_subpackages()
    assert set(subs) == {"common", "wire", "protocol", "privacy", "learning", "settings"}, subs
    for name, allowed in subs.items():
        for target in allowed:
            assert target == "garbled_core" or target.removeprefix("spgc.") in subs, (name, target)


def test_each_library_subpackage_imports_only_what_it_may() -> None:
    subs = library_subpackages()
    bad = []
    for path in source_files():
        mine = _package_of(module_name(path))
        if mine not in {f"spgc.{s}" for s in subs}:
            continue
        allowed = set(subs[mine.removeprefix("spgc.")]) | {mine, "spgc"}  # the face: __version__
        for imp in imports_of(path):
            layer = layer_of_module(imp.target)
            if layer is None:
                continue
            target = _package_of(imp.target) if layer == "library" else imp.target.split(".")[0]
            if target not in allowed:
                bad.append(f"{imp}  ({mine} may import {', '.join(sorted(allowed))})")
    assert not bad, "imports a subpackage's docstring does not allow:\n" + "\n".join(bad)


def test_the_subpackage_rule_sees_a_forbidden_import(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "spgc" / "common").mkdir(parents=True)
    (tmp_path / "spgc" / "common" / "__init__.py").write_text(
        '"""x.\n\nMay import: nothing of ours.\n"""\n'
    )
    (tmp_path / "spgc" / "common" / "bad.py").write_text("from spgc.privacy.noise import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "FOLDERS", ("spgc",))
    assert library_subpackages() == {"common": ()}
    with pytest.raises(AssertionError, match=r"bad\.py:1: from spgc\.privacy\.noise import x"):
        test_each_library_subpackage_imports_only_what_it_may()


def _names_bound_in(path: Path) -> set[str]:
    """Top-level names a module binds (defs, classes, assignments, imports)."""
    bound: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return bound


def import_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports, at any level (functions and TYPE_CHECKING blocks
    included: a type-only import still ties the two modules together). ``from pkg import n``
    goes to the module pkg.n when there is one (or when pkg binds no such name: a compiled
    submodule), else to pkg itself."""
    modules = {module_name(p): p for p in source_files()}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_of(path):
            if layer_of_module(imp.target) is None:
                continue
            targets = set()
            package = modules.get(imp.target)
            for n in imp.names:
                sub = f"{imp.target}.{n}"
                if sub in modules or (
                    package is not None
                    and package.name == "__init__.py"
                    and n not in _names_bound_in(package)
                ):
                    targets.add(sub)
                else:
                    targets.add(imp.target)
            if not imp.names:
                targets.add(imp.target)
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_between_any_of_our_modules() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other (directly or round a loop):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_cycle_finder_finds_loops_of_any_length() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(import_cycles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


# The checker itself, on small made-up trees: it must see what it is meant to see.


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("garbled_core.circuit", "engine"),
        ("spgc", "library"),
        ("spgc.wire.tls", "library"),
        ("spgc.servers.daemon", "servers"),
        ("spgc.providers", "providers"),
        ("spgc.app.cli", "app"),
        ("spgc.app.api", "app"),
        ("numpy", None),
    ],
)
def test_layer_of_module(module: str, layer: str | None) -> None:
    assert layer_of_module(module) == layer


def test_imports_are_found_inside_functions_and_relative(tmp_path: Path, monkeypatch) -> None:
    fake_root = tmp_path
    (fake_root / "spgc").mkdir()
    src = fake_root / "spgc" / "thing.py"
    src.write_text(
        "from spgc.servers import daemon\n"
        "def f():\n"
        "    from spgc.app import cli\n"
        "    from .modes import _TABLE\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    found = imports_of(src)
    assert [(i.target, i.in_function) for i in found] == [
        ("spgc.servers", False),
        ("spgc.app", True),
        ("spgc.modes", True),
    ]
    assert found[2].names == ("_TABLE",)
