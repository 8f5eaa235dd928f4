"""What a study's folder (``results/<study>/``) holds, and the check that keeps an output from writing over it.

``tune`` and ``tune rl`` write their outputs (``--out``, ``--export``, ``--csv``, ...) through
:func:`check_output_path` first, so that no output overwrites a study's database, journal or record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specs.errors import TunerError

#: The files a study's folder keeps for itself (``results/<study>/``): an output written over one loses the study.
#: SQLite's own side files of ``study.db`` (``study.db-wal``, ``-shm``, ``-journal``) count too (:func:`_own_name`).
STUDY_OWN_FILES = ("study.db", "config.yaml", ".tune.lock")
_SQLITE_MAGIC = b"SQLite format 3\x00"


#: Files ``tune`` writes into a study's folder besides its record (``config.yaml``) and database (``study.db``).
STUDY_OUTPUT_FILES = ("pareto.csv", "pareto.png", "recipe.yaml", "run_slime.sh", "megatron_args.sh", "report.html")

#: What reading a study's record can raise on a damaged file (a binary, a nesting deeper than Python's stack, a NUL in a
#: path); each is a user's file to name, not an internal error.
RECORD_ERRORS: tuple[type[BaseException], ...] = (OSError, UnicodeDecodeError, RecursionError, ValueError)


def _own_name(name: str) -> bool:
    return name in STUDY_OWN_FILES or name.startswith("study.db-")


def read_study_record(path: Path) -> Any:
    """The parsed ``config.yaml`` of a study folder (any YAML value; the caller checks its shape).

    Raises the errors of :data:`RECORD_ERRORS` and ``yaml.YAMLError``: unreadable, not text, not YAML, nested too
    deeply."""
    import yaml

    from specs.files import parse_errors, read_user_text

    label = str(path)
    text = read_user_text(path, label, "a study's record written by tune")
    with parse_errors(label, "a study's record written by tune"):
        return yaml.safe_load(text)


def _is_study_record(path: Path) -> bool:
    """A study's ``config.yaml`` (its record: the ``config`` and ``resolved`` mappings ``tune`` writes), whatever its
    storage (a journal-backed study's folder has no study.db to tell it by)."""
    import yaml

    try:
        data = read_study_record(path)
    except RECORD_ERRORS + (yaml.YAMLError,):
        return False
    return isinstance(data, dict) and isinstance(data.get("config"), dict) and "resolved" in data


def is_study_folder(folder: Path) -> bool:
    """A folder ``tune`` made for a study: it holds ``study.db`` or a study's record."""
    return (folder / "study.db").exists() or _is_study_record(folder / "config.yaml")


def check_output_path(option: str, path: Path, *, writes: str | None = None, study: str | None = None,
                      force: bool = False) -> None:
    """Refuse an output file (``--out``, ``--csv``, ``--png``, ``--export``, ...) that would overwrite a study: an
    SQLite database (an Optuna RDB storage), an Optuna journal (JSON lines with ``op_code``), a file a study's folder
    keeps for itself (:data:`STUDY_OWN_FILES`), or a path under a file. In a study's folder a study output
    (:data:`STUDY_OUTPUT_FILES`) is only replaced by the same output (``writes``, e.g. ``recipe.yaml``) of the same
    ``study``. A folder is refused; a link or a special file is replaced only with ``force`` (the link itself,
    :func:`specs.files.write_output`).

    Raises TunerError: naming ``option``, the path and why."""
    if not path.parent.is_dir():
        what = "is a file, not a folder" if path.parent.exists() else "does not exist; create it first"
        raise TunerError(f"{option} {str(path)!r}: {path.parent} {what}")
    if path.is_dir() and not path.is_symlink():
        raise TunerError(f"{option} {str(path)!r} is a folder; give a file path")
    if not force and (path.is_symlink() or (path.exists() and not path.is_file() and not path.is_dir())):
        raise TunerError(f"{option} {str(path)!r} is {'a link' if path.is_symlink() else 'not a regular file'}; give "
                         "another path, or --force to replace it")
    if not path.is_file():
        return
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return  # the write itself reports it
    in_study = is_study_folder(path.parent)
    own = _own_name(path.name) and in_study
    if head.startswith(_SQLITE_MAGIC) or own or (head.startswith(b"{") and b'"op_code"' in head.split(b"\n", 1)[0]):
        raise TunerError(f"{option} {str(path)!r} is a study's own file (its storage or its record); writing there "
                         "would lose the study and its trials: give another path")
    if path.name in STUDY_OUTPUT_FILES and in_study:
        if study is not None and path.parent.name != study:
            raise TunerError(f"{option} {str(path)!r} is study {path.parent.name!r}'s own {path.name}; this writes "
                             f"study {study!r}'s: give another path")
        if path.name != writes:
            raise TunerError(f"{option} {str(path)!r} would write over the study's own {path.name} with another kind "
                             "of file"
                             f"{'' if writes is None else ' (the study keeps this kind as ' + writes + ')'}: give "
                             "another path")
