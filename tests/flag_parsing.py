"""Test helpers: Megatron / slime command lines as ``{flag: values}``, and a launch file read as the main job reads
it (shared by the launch and ``--from`` tests)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any


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


def launch_inputs_of(path: Path, gpus: str | None = "H200", model: str | None = None) -> Any:
    """``tune --from path`` 's inputs (:func:`tuner.cli._from.launch_inputs`) with the main job's default flags."""
    from specs.stacks import RunFlags
    from tuner.cli._common import RunChoice
    from tuner.cli._from import launch_inputs

    return launch_inputs(path, None, model=model, gpus=gpus, seq_len=8192, global_batch=128, precision="bf16",
                         layers=None, run=RunChoice(stack=None, flags=RunFlags()))
