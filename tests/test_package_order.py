"""The packages form layers: each imports only the ones below it (specs < search_spaces < cost_model < launch < rl <
tuner).

Every import is read from the source (module level and inside functions alike), so a cycle cannot
be dodged by importing late.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["specs", "search_spaces", "cost_model", "launch", "rl", "tuner"]


def _imports(path: Path) -> set[str]:
    """Top-level package names this file imports (absolute imports only; relative ones stay in the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_each_package_imports_only_the_layers_below_it():
    bad = []
    for rank, pkg in enumerate(ORDER):
        allowed = set(ORDER[: rank + 1])
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for dep in _imports(path) & set(ORDER):
                if dep not in allowed:
                    bad.append(f"{path.relative_to(ROOT)} imports {dep} (above {pkg})")
    assert not bad, "\n".join(bad)


def test_no_module_getattr_reexports():
    offenders = []
    for pkg in ORDER:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


def test_the_checker_sees_a_violation(tmp_path):
    # The scan itself must catch an upward import, also one hidden inside a function.
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from tuner.study import run_study\n")
    assert "tuner" in _imports(f)
