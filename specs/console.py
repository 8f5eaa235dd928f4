"""The terminal output every command line of this project shares: the two consoles, tables that fit the
terminal's width, and paragraphs with a hanging indent. (``tune`` and ``tune rl`` both print through them.)"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

# The terminal's width, or COLUMNS when the output is piped (80 when that is not set), as rich does by default.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


@dataclass(frozen=True, slots=True)
class Col:
    """One column of :func:`fitted_table`: its header, ``"left"`` or ``"right"``, and when it goes at a narrow width
    (``drop`` 0: never; otherwise the highest ``drop`` goes first)."""

    header: str
    justify: str = "left"
    drop: int = 0


class TrimmedTable(Table):
    """A :class:`rich.table.Table` whose lines end at their last character: rich pads every cell to its column's
    width, which leaves a short last cell's padding at the end of its line."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        table = cast(Iterable[Segment], super().__rich_console__(console, options))  # a Table yields only segments
        for line in Segment.split_lines(table):
            while line and not line[-1].control and not line[-1].text.rstrip():
                line.pop()
            if line and not line[-1].control:
                line[-1] = Segment(line[-1].text.rstrip(), line[-1].style)
            yield from line
            yield Segment.line()


def fitted_table(cols: Sequence[Col], rows: Sequence[Sequence[str]], console: Console | None = None) -> Table:
    """A borderless table (the main job's style) of the columns that fit ``console``'s width (default :data:`out`).

    Optional columns (``drop`` > 0) leave, highest ``drop`` first, until the widest row fits; the others always stay
    and fold rather than cut (no ``…``). Each row holds one string per column of ``cols``; what a narrow terminal
    leaves out belongs in the command's ``--json``."""
    console = console or out
    keep = list(range(len(cols)))

    def build() -> Table:
        t = TrimmedTable(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
        for i in keep:
            t.add_column(cols[i].header, justify="right" if cols[i].justify == "right" else "left", overflow="fold")
        for r in rows:
            t.add_row(*(r[i] for i in keep))
        return t

    def width(t: Table) -> int:  # unwrapped (console.measure would clamp it to the console)
        return Measurement.get(console, console.options.update_width(1 << 16), t).maximum

    t = build()
    for i in sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: -cols[i].drop):
        if width(t) <= console.width:
            break
        keep.remove(i)
        t = build()
    return t


def say(text: str, *, label: str = "", indent: int = 2, markup: bool = True, console: Console | None = None,
        hang: int | None = None) -> None:
    """Print ``text`` ``indent`` spaces in, after ``label`` (``note:``) if given, its wrapped lines under its first word
    (a hanging indent; ``hang`` cells further in than the first line if given): a long line reads as one paragraph of
    whole words at any width, with no trailing spaces."""
    console = console or out
    body = Text.from_markup(text) if markup else Text(text)
    head = (Text.from_markup(label) if markup else Text(label)) if label else Text()
    lead = head.cell_len + (1 if label else 0)  # the first line's own prefix after the indent
    hang = lead if hang is None else hang
    lines = list(body.wrap(console, max(console.width - indent - lead, 20)))
    if len(lines) > 1 and hang != lead:  # the first line as wide as its own prefix allows, the rest under the hang
        rest = body[len(lines[0].plain):]
        rest = rest[len(rest.plain) - len(rest.plain.lstrip()):]
        lines = [lines[0], *rest.wrap(console, max(console.width - indent - hang, 20))]
    for k, line in enumerate(lines):
        line.rstrip()
        prefix = Text(" " * indent) + ((head + " " if label else Text()) if k == 0 else Text(" " * hang))
        console.print(prefix + line, soft_wrap=True)
