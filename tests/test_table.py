"""specs.table: one reader for the run tables; every bad cell is named by its line and column, good rows still read."""

from __future__ import annotations

import pytest

from specs.errors import TunerError
from specs.table import BadCell, Column, read_table

TABLE = (
    Column("name"),
    Column("n", int, low=1),
    Column("time_s", float, "s", low=0, low_open=True),
    Column("note", optional=True, default="-"),
)
GOOD = "a,2,1.5,hi"


def _read(tmp_path, *rows: str, header: str = "name,n,time_s,note", build=lambda line, v: (line, dict(v))):
    f = tmp_path / "t.csv"
    f.write_text("\n".join([header, *rows]) + "\n")
    return read_table(f, TABLE, build, what="--data 't.csv'", table="test", comment="#")


def test_good_rows_read_with_defaults_and_comments_skipped(tmp_path):
    rows, errors = _read(
        tmp_path, "2,hi,a,1.5,x", "# a comment", "3,,b,0.25,y", header="n,note,name,time_s,extra"
    )  # any order, more columns
    assert errors == []
    assert rows == [
        (2, {"name": "a", "n": 2, "time_s": 1.5, "note": "hi"}),
        (3, {"name": "b", "n": 3, "time_s": 0.25, "note": "-"}),
    ]
    rows, errors = _read(tmp_path, "c,1,2", header="name,n,time_s")  # an optional column may be absent
    assert rows == [(2, {"name": "c", "n": 1, "time_s": 2.0, "note": "-"})] and errors == []


@pytest.mark.parametrize(
    "row, message",
    [
        (",2,1.5,", "line 2: column name: cannot read ''"), ("a,two,1.5,", "line 2: column n: cannot read 'two'"),
        ("a,0,1.5,", "line 2: column n: cannot read '0'"),
        ("a,2,0,", "line 2: column time_s: cannot read '0' (a positive finite number)"),
        ("a,2,nan,", "line 2: column time_s: cannot read 'nan' (a positive finite number)"),
        ("a,2,inf,", "line 2: column time_s: cannot read 'inf' (a positive finite number)"),
        ("a,2", "line 2: column time_s: cannot read '' (a positive finite number)"),
    ],
)
def test_a_bad_cell_is_named_and_the_other_rows_still_read(tmp_path, row, message):
    rows, errors = _read(tmp_path, row, GOOD)
    assert errors == [message] and [line for line, _ in rows] == [3]


def test_build_refuses_a_combination_by_its_column(tmp_path):
    def build(line, v):
        if v["n"] > 2:
            raise BadCell("n", " (at most 2 here)")
        if v["name"] == "x":
            raise TunerError("x is taken")
        return v["name"]

    rows, errors = _read(tmp_path, GOOD, "b,3,1,", "x,1,1,", build=build)
    assert rows == ["a"] and errors == ["line 3: column n: cannot read '3' (at most 2 here)", "line 4: x is taken"]


def test_a_file_without_required_columns_or_unreadable_is_one_message(tmp_path):
    with pytest.raises(
        TunerError, match=r"^--data 't.csv': missing columns n, time_s; a test table has name, n, time_s, note$"
    ):
        _read(tmp_path, "a", header="name")
    with pytest.raises(TunerError, match="--data 'nope': cannot read it"):
        read_table(tmp_path / "nope.csv", TABLE, lambda line, v: v, what="--data 'nope'", table="test")
