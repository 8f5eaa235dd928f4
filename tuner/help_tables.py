"""``tune --help`` laid out for a narrow terminal: typer's help tables (typer/rich_utils.py, 0.29) with an option's
names in one cell, long types broken at ``|`` and folded rather than cut help text. :func:`install` patches typer's
``rich_utils`` when a help screen is asked for (``--help`` on the command line), so that no other command imports it.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import typer.rich_utils
from rich.columns import Columns
from rich.table import Table
from rich.text import Text


class _FoldingHelpTable(Table):
    """The tables of typer's ``--help`` panels, laid out for a narrow terminal. Typer (typer/rich_utils.py, 0.29) gives
    an option's long, short and ``--no-`` names a column each, and rich shrinks the widest columns alike, folding
    long names mid-word; here:

    * an option's names share one cell, one a line (a short name beside the first), as wide as the longest name;
    * a type wider than :data:`_TYPE_WIDTH` (``<bf16|fp8|checkpoint>``) breaks after a ``|`` or at a space;
    * only the last column, the help, gives way (rich ``ratio``); cells fold instead of being cut with ``…``.
    """

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        if len(renderables) >= 6:  # an options panel: [required,] long, short, --no- long, --no- short, type, help
            *head, long, short, neg, neg_short, types, text = renderables
            kind = Text("") if types.plain == "<bool>" else _break_type(types)  # a flag takes no value
            renderables = (*head, _option_names(long, short, neg, neg_short), kind, text)
        super().add_row(*renderables, **kwargs)
        for column in self.columns:
            column.overflow = "fold"
        self.columns[-1].ratio = 1


_TYPE_WIDTH = 15


def _option_names(long: Text, short: Text, neg: Text, neg_short: Text) -> Text:
    """``--seq-len`` / ``--seq-length``, ``--model, -m``, ``--rows`` / ``--no-rows``: one name a line."""
    def names(cell: Text) -> list[str]:
        return [n for n in cell.plain.split(",") if n]

    lines = names(long) or [""]
    lines[0] = ", ".join([lines[0], *names(short)]).strip(", ")
    hi, neg_hi = typer.rich_utils.highlighter, typer.rich_utils.negative_highlighter
    return Text("\n").join([hi(Text(n)) for n in lines] + [neg_hi(Text(n)) for n in names(neg) + names(neg_short)])


def _break_type(types: Text) -> Text:
    """``<bf16|fp8|checkpoint>``, ``<int range> [5<=x<=10000]`` as lines of at most :data:`_TYPE_WIDTH` cells, each
    broken after a ``|`` or at a space."""
    if types.cell_len <= _TYPE_WIDTH:
        return types
    lines = [""]
    for piece in re.findall(r"[^ |]*\||[^ |]+| ", types.plain):
        if lines[-1].strip() and len(lines[-1] + piece) > _TYPE_WIDTH:
            lines[-1:] = [lines[-1].rstrip(), piece.strip()]
        else:
            lines[-1] += piece
    return typer.rich_utils.types_highlighter(Text("\n".join(lines), style=types.style))


def _folding_help_columns(renderables: Any = None, *args: Any, **kwargs: Any) -> Columns:
    """An option's help in typer's ``--help`` (rich ``Columns``), its words folded rather than cut with ``…``."""
    for r in renderables or ():
        if isinstance(r, Text) and r.overflow is None:
            r.overflow = "fold"
    return Columns(renderables, *args, **kwargs)


_typer_rich_text = typer.rich_utils._make_rich_text


def _reflowed_rich_text(*, text: str, **kwargs: Any) -> Any:
    """typer's help text with each paragraph's single line breaks made spaces, as click does (typer keeps them in its
    rich markup mode: a docstring's lines, wrapped for the source, showed as broken lines); a ``\\b`` paragraph and a
    line that starts a list item (``* ``, ``- ``) keep theirs."""
    def reflow(par: str) -> str:
        if par.startswith("\b"):
            return par
        return "".join(("\n" if line.startswith(("* ", "- ")) else " ") + line for line in par.split("\n")).strip()

    return _typer_rich_text(text="\n\n".join(map(reflow, inspect.cleandoc(text).split("\n\n"))), **kwargs)



def install() -> None:
    """Patch typer's help rendering with this module's tables (idempotent)."""
    # typer.rich_utils imports these two from rich without re-exporting them, hence attr-defined
    typer.rich_utils.Table = _FoldingHelpTable  # type: ignore[attr-defined]
    typer.rich_utils.Columns = _folding_help_columns  # type: ignore[attr-defined,assignment]
    typer.rich_utils._make_rich_text = _reflowed_rich_text
