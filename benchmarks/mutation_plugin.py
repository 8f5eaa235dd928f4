"""A pytest plugin that applies one cost-model mutation before any test imports the code (see mutate_terms.py).

Loaded with ``-p benchmarks.mutation_plugin`` (the repository root on PYTHONPATH); the mutation is the JSON object in
the environment variable ``COST_MODEL_MUTATION``:

- ``{"kind": "scale", "target": "cost_model.terms.params:dense_params", "factor": 1.1}``: the function
  returns ``factor`` x its value (bool arrays are negated; tuples are scaled element by element);
- ``{"kind": "edit", "target": "module:function", "old": "...", "new": "..."}``: the function is
  recompiled from its source with ``old`` (which must occur exactly once) replaced by ``new``;
- ``{"kind": "const", "target": "module:NAME", "value": 8.0}``: a module constant is replaced;
- ``{"kind": "exec", "code": "..."}``: Python run once (e.g. to change an enum's traits row).

Terms call each other through their modules and the module globals are replaced, so every use sees
the mutant.
"""

from __future__ import annotations
import __future__

import functools
import importlib
import inspect
import json
import os
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, tuple):
        return tuple(_scaled(v, factor) for v in value)
    if isinstance(value, np.ndarray) and value.dtype == np.bool_:
        return ~value
    if isinstance(value, (np.ndarray, float, int, np.floating)) and not isinstance(value, bool):
        return value * factor
    raise TypeError(f"cannot scale a {type(value).__name__}")


def _split(target: str) -> tuple[Any, str]:
    mod, _, name = target.partition(":")
    return importlib.import_module(mod), name


def apply(m: dict[str, Any]) -> None:
    """Apply mutation ``m`` (the forms in the module docstring)."""
    kind = m["kind"]
    if kind == "exec":
        exec(m["code"], {})
        return
    module, name = _split(m["target"])
    if kind == "const":
        assert hasattr(module, name), m
        setattr(module, name, m["value"])
        return
    fn: Callable[..., Any] = getattr(module, name)
    if kind == "scale":
        factor = float(m.get("factor", 1.1))

        @functools.wraps(fn)
        def mutant(*a: Any, **k: Any) -> Any:
            return _scaled(fn(*a, **k), factor)

        setattr(module, name, mutant)
        return
    if kind == "edit":
        src = textwrap.dedent(inspect.getsource(fn))
        count = src.count(m["old"])
        if count != 1:
            raise RuntimeError(f"mutation {m.get('name')}: {m['old']!r} occurs {count} times in {m['target']}")
        code = compile(
            src.replace(m["old"], m["new"]), inspect.getfile(fn), "exec", flags=__future__.annotations.compiler_flag
        )
        exec(code, module.__dict__)
        return
    raise ValueError(f"unknown mutation kind {kind!r}")


_RAW = os.environ.get("COST_MODEL_MUTATION")
if _RAW:
    apply(json.loads(_RAW))
