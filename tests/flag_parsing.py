"""Test helper: Megatron / slime command lines as ``{flag: values}`` (shared by the launch tests)."""

from __future__ import annotations

import shlex


def argv_flags(tokens: list[str]) -> dict[str, tuple[str, ...]]:
    """``{flag: values}`` from the first ``--flag`` on; an array expansion (``${MODEL_ARGS[@]}``) ends the current flag.

    Raises:
        AssertionError: a flag given twice or a value before any flag.
    """
    flags: dict[str, tuple[str, ...]] = {}
    cur = None
    for tok in tokens[tokens.index(next(t for t in tokens if t.startswith("--"))) :]:
        if "_ARGS[@]}" in tok:
            cur = None
        elif tok.startswith("--"):
            assert tok not in flags, f"{tok} given twice"
            cur, flags[tok] = tok, ()
        else:
            assert cur is not None, f"value {tok!r} without a flag"
            flags[cur] += (tok,)
    return flags


def command_flags(script: str) -> dict[str, tuple[str, ...]]:
    """``{flag: values}`` of the ``python3 -m ...`` (or ``"$PYTHON" -m ...``, ``"$PYTHON" "$SLIME_ENTRY"``) command of a
    run script."""
    text = script.replace("\\\n", " ")
    line = next(
        ln
        for ln in text.splitlines()
        if ln.strip().startswith(("python3 -m", '"$PYTHON" -m', '"$PYTHON" "$SLIME_ENTRY"'))
    )
    return argv_flags(shlex.split(line))
