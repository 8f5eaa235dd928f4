"""Bash text for the exported scripts: every argument is ``shlex.quote``-d unless marked :class:`Sh` (an intended
expansion), so ``'Et|(tt|)*30tL'`` or ``'[1]*62'`` reaches the program unchanged."""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Iterable, Sequence

#: First line of every exported script: found on PATH, so it runs the same on Linux and macOS.
SHEBANG = "#!/usr/bin/env bash"

#: Bash strict mode: stop at the first failing command, an unset variable or a failing pipe stage.
STRICT_MODE = "set -euo pipefail"


class Sh(str):
    """Shell text written as it is, not quoted: an intended expansion such as ``"$HF_CKPT"`` or ``"${MODEL_ARGS[@]}"``.
    """

    __slots__ = ()


def word(x: str) -> str:
    """One shell word: ``x`` quoted with :func:`shlex.quote`, or as it is when it is :class:`Sh`."""
    return str(x) if isinstance(x, Sh) else shlex.quote(str(x))


def group_flags(argv: Sequence[str]) -> list[list[str]]:
    """Split argv into one group per flag: ``--flag`` followed by its values."""
    groups: list[list[str]] = []
    for x in argv:
        if x.startswith("--") or not groups:
            groups.append([x])
        else:
            groups[-1].append(x)
    return groups


def comment(text: str, width: int | None = 110) -> list[str]:
    """``text`` as ``# `` lines of at most ``width`` characters (None: one line); a character that is not printable
    becomes a space, so a value cannot end the comment and become a command."""
    flat = "".join(c if c.isprintable() else " " for c in str(text))
    return ["# " + line for line in (textwrap.wrap(flat, width, break_on_hyphens=False) if width else [flat])]


def with_note(text: str, note: str) -> str:
    """``text`` with ``note`` (none when "") as :func:`comment` lines after its first line (a shebang or the header)."""
    if not note:
        return text
    first, _, rest = text.partition("\n")
    return "\n".join([first, *comment(note[0].upper() + note[1:] + ".")]) + "\n" + rest


def words(group: Iterable[str]) -> str:
    """A line of shell words (:func:`word` each), separated by spaces."""
    return " ".join(word(x) for x in group)


def bash_array(name: str, argv: Sequence[str]) -> str:
    """``NAME=(`` one quoted flag and its values per line ``)``."""
    body = "".join(f"  {words(g)}\n" for g in group_flags(argv))
    return f"{name}=(\n{body})\n"


def command(head: Sequence[str], groups: Sequence[Sequence[str]]) -> list[str]:
    """A command over several lines: ``head`` then one flag group per line, joined by backslash-newlines."""
    lines = [words(head)] + ["  " + words(g) for g in groups]
    return [ln + " \\" for ln in lines[:-1]] + [lines[-1]]


def user_arg_variables(args: Sequence[str], known: Sequence[str] = ()) -> list[tuple[str, str, str | None]]:
    """The shell variables the user's kept arguments expand, less ``known``, as :func:`require_set` entries."""
    names: list[str] = []
    for a in args:
        for n in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", str(a)):
            if n not in names and n not in known:
                names.append(n)
    return [(n, "the value your launch used for it", None) for n in names]


def require_set(script: str, needed: Sequence[tuple[str, str, str | None]], indent: str = "") -> list[str]:
    """Bash lines that name every unset variable of ``needed`` (``(NAME, WHAT, CONDITION or None)``) on stderr and
    exit 2 before anything runs."""
    lines = ["_missing=()"]
    for name, what, condition in needed:
        check = f'[ -n "${{{name}:-}}" ] || _missing+=({shlex.quote(f"set {name} to {what}")})'
        lines.append(f"if {condition}; then {check}; fi" if condition else check)
    lines += [
        'if [ "${#_missing[@]}" -gt 0 ]; then',
        f"  printf '%s: these variables are needed and not set:\\n' {shlex.quote(script)} >&2",
        "  printf '  %s\\n' \"${_missing[@]}\" >&2",
        "  exit 2",
        "fi",
    ]
    return [indent + ln for ln in lines]
