"""Reading a user's files and writing outputs.

Reading (:func:`read_user_text`, :func:`load_user_json`): parsers' recursion and conversion errors come back as one
:class:`TunerError` naming the file. Writing (:func:`write_output`): a temporary file in the same folder renamed over
the target, so a reader never sees half a file and a full disk leaves the old one; a link, a folder or another kind of
file at the target is refused unless ``force``; the folder must exist; a failed write names the file."""

from __future__ import annotations

import csv
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specs.errors import TunerError


@contextmanager
def parse_errors(label: str, expected: str) -> Iterator[None]:
    """Turn what a parser raises on a hostile document into one :class:`TunerError` naming ``label``: nesting deeper
    than Python's stack (``RecursionError``), an integer too long to convert (``ValueError``, Python's 4,300-digit
    limit) and a CSV cell past ``csv``'s field limit (``csv.Error``). A :class:`TunerError` passes as it is."""
    try:
        yield
    except TunerError:
        raise
    except RecursionError:
        raise TunerError(f"{label}: nested too deeply to read; {expected} is expected") from None
    except (ValueError, csv.Error) as e:
        raise TunerError(f"{label}: cannot read it ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__}); "
                         f"{expected} is expected") from None


def read_user_text(path: str | Path, label: str, expected: str, *, encoding: str = "utf-8",
                   errors: str = "strict") -> str:
    """The text of a user's file; ``label`` names it in messages (``--space PATH``), ``expected`` says what it should
    be ("a YAML search space"); ``encoding`` ``utf-8-sig`` drops a spreadsheet's byte-order mark, ``errors``
    ``replace`` keeps a log's stray bytes.

    Raises TunerError: missing or unreadable (a folder), or not text in ``encoding``."""
    try:
        data = Path(path).read_bytes()
    except (OSError, ValueError) as e:
        raise TunerError(f"{label}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        return data.decode(encoding, errors)
    except UnicodeDecodeError:
        raise TunerError(f"{label}: not a text file ({expected} is expected)") from None


class RepeatedKey(ValueError):
    """A key written twice in one JSON object (its ``args[0]``)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: the object, or :class:`RepeatedKey` naming a key written twice."""
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise RepeatedKey(k)
        d[k] = v
    return d


def load_user_json(path: str | Path, label: str, expected: str) -> Any:
    """A user's JSON file, read with :func:`read_user_text`; a key written twice in one object is refused (``json``
    keeps the last one silently, as PyYAML would: the YAML readers refuse it too).

    Raises TunerError: as :func:`read_user_text`, not JSON, a repeated key, or as :func:`parse_errors`."""
    text = read_user_text(path, label, expected)
    with parse_errors(label, expected):
        try:
            return json.loads(text, object_pairs_hook=unique_keys)
        except RepeatedKey as e:
            raise TunerError(f"{label}: key {e.args[0]!r:.60} appears twice in one object (JSON keeps only the last); "
                             "write it once") from None
        except json.JSONDecodeError as e:
            raise TunerError(f"{label}: not JSON ({e.msg}, line {e.lineno}); {expected} is expected") from None


def _same_kind(old: bytes, new: bytes) -> bool:
    """Whether an existing file's first bytes say it is the kind being written: the same first line (the shebang,
    ``<!DOCTYPE html>``, a CSV header, ``# recipe.yaml``, PNG's signature) over its first 16 bytes or the file's
    length."""
    head = new.split(b"\n", 1)[0][:16]
    n = min(len(old), len(head))
    return old[:n] == head[:n]


def refuse_another_kind(path: str | Path, text: str | bytes, *, label: str = "") -> None:
    """Refuse to replace the non-empty file at ``path`` whose first line is not the one ``text`` starts with (the kind
    of file being written: :func:`write_output`'s check, for a command to make before work that takes long). A missing
    or unreadable file passes (the write reports it).

    Raises TunerError: naming the file; ``--force`` replaces it."""
    data = text.encode() if isinstance(text, str) else text
    try:
        with open(path, "rb") as fh:
            old = fh.read(16)
    except OSError:
        return
    if not _same_kind(old, data):
        name = f"{label} {str(path)!r}" if label else str(path)
        raise TunerError(f"{name} holds another kind of file; give another path, or --force to replace it")


def write_output(path: str | Path, text: str | bytes, *, label: str = "", force: bool = False,
                 executable: bool = False) -> Path:
    """Write ``text`` (``str``: UTF-8) to ``path`` atomically: a temporary file in the same folder, renamed over
    ``path``; mode 0o755 with ``executable``, else 0o644, less the umask. ``label`` names the output in messages
    (``--out``); ``force`` replaces a link (the link, never its target) or a file of another kind. Returns ``path``.

    Raises TunerError: a missing folder; ``path`` a folder; without ``force``, a link, not a regular file, or a
    non-empty file whose first line is not this output's; or a failed write (a full disk said so). Nothing is changed
    then."""
    p = Path(path)
    data = text.encode() if isinstance(text, str) else text
    name = f"{label} {str(p)!r}" if label else str(p)
    if not p.parent.is_dir():
        raise TunerError(f"{name}: no folder {str(p.parent)!r}; create it first, or give a path in an existing folder")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise TunerError(f"{name}: cannot write it ({e.strerror or e})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise TunerError(f"{name} is a folder; give a file path")
        why = ("is a link (the file it points to would be written)" if stat.S_ISLNK(st.st_mode)
               else "is not a regular file" if not stat.S_ISREG(st.st_mode) else "")
        if not why and not force:
            refuse_another_kind(p, data, label=label)
        if why and not force:
            raise TunerError(f"{name} {why}; give another path, or --force to replace it")
    mask = os.umask(0)
    os.umask(mask)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:64]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, (0o755 if executable else 0o644) & ~mask)
        os.replace(tmp, p)
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise write_error(name, e) from None
    return p


def write_error(name: str, e: OSError) -> TunerError:
    """The one message for a failed write of the file ``name``: a full disk (or quota) said so, else the system's
    reason."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return TunerError(f"{name}: the disk is full (no space left to write it); nothing was written")
    return TunerError(f"{name}: cannot write it ({e.strerror or e})")
