"""specs.console: paragraphs under a hanging indent and tables, at a terminal's width, end at their last character."""

from __future__ import annotations

import io

from rich.console import Console

from specs.console import Col, fitted_table, say


def _console(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, highlight=False)


def test_a_paragraph_uses_its_first_lines_width_and_wraps_under_its_hang():
    c = _console(30)
    say("your launch (trial 0): 1,993.7 tokens/s/GPU predicted, 71.4 GiB; best: TP1 PP8", indent=0, hang=2, console=c)
    assert c.file.getvalue().splitlines() == [
        "your launch (trial 0): 1,993.7", "  tokens/s/GPU predicted, 71.4", "  GiB; best: TP1 PP8"]


def test_a_line_as_wide_as_the_terminal_is_not_wrapped_for_its_hang():
    c = _console(20)
    say("a" * 9 + " " + "b" * 10, indent=0, hang=2, console=c)  # 20 cells: fits the first line
    assert c.file.getvalue() == "a" * 9 + " " + "b" * 10 + "\n"


def test_a_tables_short_last_cell_leaves_no_padding():
    c = _console(80)
    c.print(fitted_table([Col("plan"), Col("note")], [["1", "a long note"], ["2", ""], ["3", "x"]], console=c))
    lines = c.file.getvalue().splitlines()
    assert lines == ["plan  note", "1     a long note", "2", "3     x"], lines
