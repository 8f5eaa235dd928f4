"""Functions and modules of a readable size (CONTRIBUTING.md): no function over 100 lines, no module over 800, in every
product package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specs", "search_spaces", "cost_model", "launch", "rl", "tuner")
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 800


@pytest.mark.parametrize("package", PACKAGES)
def test_no_long_function_or_module(package):
    too_long = []
    for f in sorted((ROOT / package).rglob("*.py")):
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
