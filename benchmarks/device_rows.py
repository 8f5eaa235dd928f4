"""Reading the device benchmarks' JSON-lines rows back here, checked field by field (``h200_cpu_adam.py --compare``,
``h200_offload.py --compare``): one message per bad input, naming the file, the line and what would be accepted."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from specs.errors import TunerError


def finite_number(v: Any, positive: bool) -> bool:
    """Whether ``v`` is a JSON number (not a boolean) that is finite, and > 0 when ``positive`` (else any finite)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v) and (v > 0 or not positive)
    except OverflowError:
        return False


def read_rows(path: Path, what: str) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for each non-blank line of ``path``, each a JSON object.

    Raises:
        TunerError: the file cannot be read, a line is not JSON or not a JSON object, or it has no rows.
    """
    from tuner.validate_trials import json_lines

    out = []
    for _, where, d in json_lines(path, str(path), f"expected the rows {what} writes"):
        if not isinstance(d, dict):
            raise TunerError(f"{where}: not a JSON object; expected the rows {what} writes")
        out.append((where, d))
    if not out:
        raise TunerError(f"{path}: no rows; expected the rows {what} writes")
    return out


def number(
    d: dict[str, Any],
    key: str,
    where: str,
    *,
    positive: bool = True,
    integer: bool = False,
    at_most: float | None = None,
) -> float:
    """``d[key]`` as a finite number (not a boolean or a string): > 0 when ``positive`` (else >= 0), a whole number
    >= 1 when ``integer``, and at most ``at_most`` when given.

    Raises:
        TunerError: the field is missing or is not such a number, naming ``where`` and ``key``.
    """
    v = d.get(key)
    want = ("a whole number >= 1" if integer else "a finite number " + ("> 0" if positive else ">= 0")) + (
        f" and <= {at_most:g}" if at_most is not None else ""
    )
    ok = finite_number(v, positive or integer) and (positive or integer or v >= 0)
    if ok and integer:
        ok = float(v).is_integer()
    if ok and at_most is not None:
        ok = v <= at_most
    if not ok:
        raise TunerError(f"{where}: {key} must be {want}, got {v!r:.40}")
    return int(v) if integer else float(v)


def flag(d: dict[str, Any], key: str, where: str, default: bool | None = None) -> bool:
    """``d[key]`` as a JSON boolean (``default`` when absent and a default is given).

    Raises:
        TunerError: the field is not true or false (or is absent without a default).
    """
    if key not in d and default is not None:
        return default
    v = d.get(key)
    if not isinstance(v, bool):
        raise TunerError(f"{where}: {key} must be true or false, got {v!r:.40}")
    return v


def text(d: dict[str, Any], key: str, where: str, choices: tuple[str, ...] | None = None) -> str:
    """``d[key]`` as a string (one of ``choices`` when given).

    Raises:
        TunerError: the field is not such a string.
    """
    v = d.get(key)
    if not isinstance(v, str) or (choices is not None and v not in choices):
        want = f"one of {', '.join(choices)}" if choices else "a string"
        raise TunerError(f"{where}: {key} must be {want}, got {v!r:.40}")
    return v
