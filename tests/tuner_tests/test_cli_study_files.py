"""An output path that is a study's own file, and a resumed study under another storage, are refused (bad input loses
nothing: the study's database and its folder's files are left byte for byte)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli import app

runner = CliRunner()
MAIN = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", "base"]


def _digest(folder: Path) -> dict[str, str]:
    """Each file's sha256; the database by its rows (SQLite's own checkpoint of the write-ahead log, when an earlier
    in-process connection is collected, moves bytes between study.db and study.db-wal without changing a row)."""
    out = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
           if p.is_file() and not p.name.startswith("study.db")}
    with sqlite3.connect(folder / "study.db") as db:
        out["study.db"] = hashlib.sha256("\n".join(db.iterdump()).encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    r = runner.invoke(app, [*MAIN, "--results-dir", str(root / "results")])
    assert r.exit_code == 0, r.output
    return root


@pytest.mark.parametrize(("args", "flag", "target"), [
    (["export", "--format", "recipe"], "--out", "study.db"),
    (["export", "--format", "slime"], "--out", "config.yaml"),
    (["timeline"], "--out", "study.db"),
    (["report"], "--out", "study.db"),
    (["pareto"], "--csv", "study.db"),
])
def test_an_output_over_the_study_s_own_files_is_refused(study, args, flag, target):
    folder = study / "results" / "base"
    before = _digest(folder)
    r = runner.invoke(app, [*args, "--study", "base", "--results-dir", str(study / "results"), flag, str(folder / target)])
    assert r.exit_code == 2, r.output
    assert f"{flag} '{folder / target}' is a study's own file" in r.output and "Traceback" not in r.output
    assert _digest(folder) == before


def test_a_plot_over_a_database_or_under_a_file_is_refused(study):
    db = study / "results" / "base" / "study.db"
    for path, needle in ((db, "is a study's own file"), (db / "x.png", f"{db} is a file, not a folder")):
        r = runner.invoke(app, ["estimate", "--model", "Llama-3.1-8B", "--gpus", "8xH200", "--plot", str(path)])
        assert r.exit_code == 2 and needle in r.output, r.output


def test_resuming_under_another_storage_is_refused(study):
    folder = study / "results" / "base"
    before = _digest(folder)
    journal = study / "other.log"
    r = runner.invoke(app, [*MAIN, "--results-dir", str(study / "results"), "--storage", f"journal:{journal}"])
    assert r.exit_code == 2, r.output
    assert "study 'base'" in r.output and "is kept in 'sqlite:///" in r.output and "Resume it with no --storage" in r.output
    assert _digest(folder) == before and not journal.exists()
    # the same database named by its absolute path is the same storage: the study resumes
    r = runner.invoke(app, [*MAIN, "--trials", "1", "--results-dir", str(study / "results"), "--storage", f"sqlite:///{(folder / 'study.db').resolve()}"])
    assert r.exit_code == 0, r.output
