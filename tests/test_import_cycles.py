"""No module of the six packages imports another in a cycle (a networkx graph of the imports read from the source).

Like tests/test_package_order.py, every import counts, at module level or inside a function, so a
cycle cannot be hidden by importing late. ``from a.b import c`` is an edge to the module ``a.b.c``
when that is a module, else to ``a.b``; a package's ``__init__`` importing its own submodules is
the usual direction and is not a cycle unless a submodule imports the package back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["specs", "search_spaces", "cost_model", "launch", "rl", "tuner"]


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only: no import at run time)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """Modules of the packages under ``root`` as nodes, ``a -> b`` when module ``a`` imports module ``b``."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    g = nx.DiGraph()
    for mod, path in mods.items():
        g.add_node(mod)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                dep = resolve(t)
                if dep is not None and dep != mod:
                    g.add_edge(mod, dep)
    return g


def test_no_import_cycles():
    cycles = sorted(" -> ".join(c + c[:1]) for c in nx.simple_cycles(import_graph()))
    assert not cycles, "\n".join(cycles)


def test_the_cli_is_split_by_area_without_a_cycle():
    g = import_graph()
    areas = [m for m in g if m.startswith("tuner.cli.") and m != "tuner.cli.__main__"]  # __main__ runs the package
    assert {
        "tuner.cli._common",
        "tuner.cli.main_job",
        "tuner.cli.estimate",
        "tuner.cli.studies",
        "tuner.cli.fit",
        "tuner.cli.verify_cmd",
        "tuner.cli.catalogue",
    } <= set(areas)
    assert not [m for m in areas if g.has_edge(m, "tuner.cli")], "an area module imports the package that composes it"
    assert not any(d.startswith("tuner.cli") for d in g.successors("tuner.cli._common"))


def test_the_checker_sees_a_cycle(tmp_path):
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "tuner" / "a.py").write_text("from tuner.b import x\n")
    (tmp_path / "tuner" / "b.py").write_text("def f():\n    from tuner import a\n")  # late, inside a function
    (tmp_path / "tuner" / "c.py").write_text("from . import a\n")  # relative: an edge, not a cycle
    cycles = list(nx.simple_cycles(import_graph(tmp_path)))
    assert sorted(map(sorted, cycles)) == [["tuner.a", "tuner.b"]]
