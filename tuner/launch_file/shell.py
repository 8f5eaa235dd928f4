"""Shell text: the command of a launch script with the most ``--`` arguments, its ``NAME=value`` and ``NAME=( ... )``
variables (and those of the files it sources) expanded where the command uses them, in the file's order as bash
does. ``${NAME:-default}`` / ``${NAME-default}`` take the file's value of ``NAME``, else the default: the launch is read
from the file, never from the reader's environment."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from specs.errors import TunerError
from specs.files import read_user_text

_SEPARATORS = set(";&|\n")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(\[@\]|\[\*\])?\}|([A-Za-z_][A-Za-z0-9_]*))$")
#: ``${NAME:-default}``, ``${NAME-default}``, ``${NAME}`` or ``$NAME`` inside a word (bash's parameter expansion).
_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^{}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _shell_statements(text: str) -> tuple[list[list[str]], dict[str, list[str]]]:
    """The simple commands of ``text`` (lists of words, quotes removed) and its variables (``NAME=value`` and
    ``NAME=( ... )`` arrays), by :mod:`shlex` with bash's separators as punctuation. Command substitutions ``$( ... )``
    are left out."""
    lx = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|()\n")
    lx.whitespace = " \t\r"
    lx.whitespace_split = True
    try:
        tokens = list(lx)
    except ValueError as e:
        raise TunerError(f"not a shell script shlex can read ({e})") from None
    stmts: list[list[str]] = [[]]
    variables: dict[str, list[str]] = {}
    i = 0
    while i < len(tokens):
        t = tokens[i]
        is_punct = bool(t) and all(ch in ";&|()\n" for ch in t)
        if is_punct and "(" in t:
            prev = stmts[-1][-1] if stmts[-1] else ""
            depth = t.count("(") - t.count(")")
            body: list[str] = []
            i += 1
            while i < len(tokens) and depth > 0:
                u = tokens[i]
                if u and all(ch in ";&|()\n" for ch in u):
                    depth += u.count("(") - u.count(")")
                else:
                    body.append(u)
                i += 1
            m = _ASSIGN.match(prev)
            if m and not m.group(2):  # NAME=( ... ): an array
                variables[m.group(1)] = [w for b in body for w in _expand(b, variables)]
                stmts[-1].pop()
            elif prev.endswith("$"):  # $( ... ): a command substitution, its value unknown
                stmts[-1][-1] = prev[:-1] + "$(...)"
            continue
        if is_punct:
            if any(ch in _SEPARATORS for ch in t):
                _assign(stmts, variables)
                stmts.append([])
            i += 1
            continue
        stmts[-1].append(t)
        i += 1
    _assign(stmts, variables)
    return [st for st in stmts if st], variables


def _assign(stmts: list[list[str]], variables: dict[str, list[str]]) -> None:
    """The last statement of ``stmts``, when it is ``[export] NAME=value ...``: its values (expanded) into
    ``variables``, the statement emptied."""
    st = stmts[-1]
    words = st[1:] if st[:1] == ["export"] else st
    if words and all(_ASSIGN.match(w) for w in words):
        for w in words:
            m = _ASSIGN.match(w)
            assert m is not None
            variables[m.group(1)] = [_substitute(m.group(2), variables)]
        st.clear()


def _substitute(word: str, variables: Mapping[str, list[str]]) -> str:
    """``word`` with its ``${NAME:-default}`` / ``${NAME-default}`` (the file's value, else the default: ``:-`` also
    when the value is empty) and its ``$NAME`` / ``${NAME}`` the file sets replaced, as bash expands them; a variable
    the file does not set, without a default, stays as it is (to be named)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        value = " ".join(variables[name]) if name in variables else None
        if m.group(2):
            unset = value is None or (m.group(2) == ":-" and not value)
            return _substitute(m.group(3), variables) if unset else str(value)
        return m.group(0) if value is None else value

    return _PARAM.sub(one, word)


def _expand(word: str, variables: Mapping[str, list[str]]) -> list[str]:
    """``word`` with a whole-word ``$NAME``, ``${NAME}`` or ``${NAME[@]}`` replaced by the variable's value(s) when the
    file sets it, else its parameter expansions (:func:`_substitute`)."""
    m = _VAR.match(word)
    if not m:
        return [_substitute(word, variables)]
    name = m.group(1) or m.group(3)
    if name in variables:
        return list(variables[name]) if m.group(2) else [" ".join(variables[name])]
    return [word]


def _sourced(stmts: list[list[str]], base: Path | None, depth: int = 0) -> dict[str, list[str]]:
    """The variables of the files the script ``source``-s (``source F`` / ``. F``): ``F`` relative to ``base`` (the
    script's folder), a leading ``${SCRIPT_DIR}/``-style variable read as that folder (slime's scripts source
    ``"${SCRIPT_DIR}/models/<model>.sh"``). Files not found are skipped (their variables stay unexpanded, and are
    named)."""
    out: dict[str, list[str]] = {}
    if base is None or depth > 4:
        return out
    for st in stmts:
        if len(st) >= 2 and st[0] in ("source", "."):
            rel = re.sub(r"^\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/", "", st[1])
            f = base / rel
            if f.is_file():
                try:
                    sub, variables = _shell_statements(read_user_text(f, str(f), "a shell script"))
                except TunerError:
                    continue
                out |= _sourced(sub, f.parent, depth + 1) | variables
    return out


def _launch_args(text: str, base: Path | None = None) -> tuple[list[str], list[str]]:
    """(the launcher's arguments, the training arguments) of the script's command with the most ``--`` arguments; a
    variable the script uses there but neither sets nor sources stays as it is (``${MODEL_ARGS[@]}``), to be named."""
    stmts, own = _shell_statements(text)
    if not stmts:
        raise TunerError("it holds no command")
    variables = _sourced(stmts, base) | own
    def score(stmt: list[str]) -> int:
        return sum(x.startswith("--") for w in stmt for x in _expand(w, variables))

    best = max(stmts, key=score)
    words = [x for w in best for x in _expand(w, variables)]
    cut = next((i + 1 for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")), None)
    if cut is None and "-m" in words:
        cut = words.index("-m") + 2
    launcher = words[:cut] if cut else []
    rest = words[cut:] if cut else words
    first = next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))
    # ${MODEL_ARGS[@]} before the first flag: named
    unset = [w for w in rest[:first] if (v := _VAR.match(w)) and v.group(2)]
    return launcher, unset + rest[first:]
