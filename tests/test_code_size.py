"""Functions and modules of a readable size (CONTRIBUTING.md): no function over 100 lines, no module over 800, in the
packages and modules brought to that size. A package joins :data:`PACKAGES` (a module of another package,
:data:`MODULES`) once it holds to it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specs", "search_spaces", "cost_model", "rl")
MODULES = ("tuner/study/run.py", "tuner/study/policy.py", "tuner/study/policy_trials.py")
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 800


@pytest.mark.parametrize("package", PACKAGES + MODULES)
def test_no_long_function_or_module(package):
    too_long = []
    path = ROOT / package
    for f in [path] if path.is_file() else sorted(path.rglob("*.py")):
        text = f.read_text()
        name = f.relative_to(ROOT).as_posix()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
            ):
                too_long.append(f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "split by concern: " + "; ".join(too_long)
