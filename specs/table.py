"""One reader for the CSV tables of measured runs: a table is a tuple of :class:`Column` (name, reader, unit, bounds,
optional); :func:`read_table` reads a file against it, names the line and column of every cell it cannot read, and hands
each readable row to a ``build`` function (which may refuse a combination with :class:`BadCell`)."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from specs.errors import TunerError

T = TypeVar("T")


class BadCell(ValueError):
    """A cell of a row that :func:`read_table`'s ``build`` refuses (a value that contradicts another cell)."""

    def __init__(self, column: str, hint: str = "") -> None:
        super().__init__(column)
        self.column = column
        self.hint = hint


@dataclass(frozen=True, slots=True)
class Column:
    """One column: ``parse`` turns the stripped cell into a value, raising ``ValueError`` (or ``TunerError`` with a
    message naming the column and the value); a cell must be one of ``choices`` when given, and a number finite
    and within ``low`` (exclusive when ``low_open``) and ``high``. An ``optional`` column may be absent from the
    header or blank (value ``default``)."""

    name: str
    parse: Callable[[str], Any] = str
    unit: str = ""
    """Unit of the values (``s``, ``tokens``): the table's documentation."""
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    optional: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()

    def read(self, cell: str) -> Any:
        """The value of ``cell``. Raises ValueError (or parse's TunerError) on a cell it cannot read."""
        if not cell:
            if self.optional:
                return self.default
            raise ValueError(cell)
        if self.choices and cell not in self.choices:
            raise ValueError(cell)
        v = self.parse(cell)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                (isinstance(v, float) and not math.isfinite(v))
                or (self.low is not None and (v <= self.low if self.low_open else v < self.low))
                or (self.high is not None and v > self.high)):
            raise ValueError(cell)
        return v

    @property
    def hint(self) -> str:
        """What a cell must be, when the bounds say more than the type."""
        return " (a positive finite number)" if self.low == 0 and self.low_open and self.high is None else ""


def read_table(path: str | Path, columns: Sequence[Column], build: Callable[[int, Mapping[str, Any]], T], *, what: str,
               table: str, comment: str | None = None) -> tuple[list[T], list[str]]:
    """Read the CSV file ``path`` (UTF-8, a byte-order mark allowed) against ``columns`` (the header may hold others, in
    any order); lines starting with ``comment`` are skipped. ``build`` makes a row from its line number (the header is
    line 1) and its values by column name, and may raise :class:`BadCell` or ``TunerError``. ``what`` names the file in
    messages (``"--data 'runs.csv'"``), ``table`` the kind of table (``"runs"``).

    Returns ``(rows, errors)``: the rows built, and one message per refused row naming its line and first bad column
    (``line 3: column load: cannot read 'sometimes'``).

    Raises TunerError: the file cannot be read, or its header lacks required columns (listed)."""
    from specs.files import parse_errors, read_user_text

    text = read_user_text(Path(path), what, f"a CSV {table} table", encoding="utf-8-sig")
    lines = [ln for ln in text.splitlines() if not (comment and ln.startswith(comment))]
    with parse_errors(what, f"a CSV {table} table"):
        reader = csv.DictReader(lines)
        records = list(reader)
    header = {h.strip() for h in (reader.fieldnames or [])}
    missing = [c.name for c in columns if c.name not in header and not c.optional]
    if missing:
        raise TunerError(f"{what}: missing columns {', '.join(missing)}; a {table} table has "
                         f"{', '.join(c.name for c in columns)}")
    rows: list[T] = []
    errors: list[str] = []
    by_name = {c.name: c for c in columns}
    for line, raw in enumerate(records, start=2):
        cells = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if isinstance(v, str) or v is None}
        col: Column | None = None
        try:
            values: dict[str, Any] = {}
            for col in columns:
                values[col.name] = col.read(cells.get(col.name, ""))
            col = None
            rows.append(build(line, values))
        except BadCell as e:
            known = by_name.get(e.column)
            errors.append(f"line {line}: column {e.column}: cannot read "
                          f"{cells.get(e.column, '')!r}{e.hint or (known.hint if known else '')}")
        except TunerError as e:  # its own message names the value it refused
            errors.append(f"line {line}: {e}")
        except ValueError as e:
            errors.append(f"line {line}: column {col.name}: cannot read {cells.get(col.name, '')!r}{col.hint}" if col
                          else f"line {line}: {e}")
    return rows, errors
