"""An output path that is a study's own file, and a resumed study under another storage, are refused (bad input loses
nothing: the study's database and its folder's files are left byte for byte)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli import app

pytestmark = pytest.mark.slow  # whole studies through the command line

runner = CliRunner()
MAIN = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", "base"]


def _digest(folder: Path) -> dict[str, str]:
    """Each file's sha256; the database by its rows (SQLite's own checkpoint of the write-ahead log, when an earlier
    in-process connection is collected, moves bytes between study.db and study.db-wal without changing a row)."""
    out = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.startswith("study.db")
    }
    with sqlite3.connect(folder / "study.db") as db:
        out["study.db"] = hashlib.sha256("\n".join(db.iterdump()).encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    r = runner.invoke(app, [*MAIN, "--results-dir", str(root / "results")])
    assert r.exit_code == 0, r.output
    return root


@pytest.mark.parametrize(
    ("args", "flag", "target"),
    [
        (["export", "--format", "recipe"], "--out", "study.db"),
        (["export", "--format", "slime"], "--out", "config.yaml"), (["timeline"], "--out", "study.db"),
        (["report"], "--out", "study.db"), (["pareto"], "--csv", "study.db"),
    ],
)
def test_an_output_over_the_study_s_own_files_is_refused(study, args, flag, target):
    folder = study / "results" / "base"
    before = _digest(folder)
    r = runner.invoke(
        app, [*args, "--study", "base", "--results-dir", str(study / "results"), flag, str(folder / target)]
    )
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
    assert (
        "study 'base'" in r.output
        and "is kept in 'sqlite:///" in r.output
        and "Resume it with no --storage" in r.output
    )
    assert _digest(folder) == before and not journal.exists()
    # the same database named by its absolute path is the same storage: the study resumes
    r = runner.invoke(
        app,
        [
            *MAIN, "--trials", "1", "--results-dir", str(study / "results"), "--storage",
            f"sqlite:///{(folder / 'study.db').resolve()}",
        ],
    )
    assert r.exit_code == 0, r.output


def _journal_study(tmp_path: Path, name: str) -> tuple[Path, Path, list[str]]:
    res, journal = tmp_path / "results", tmp_path / f"{name}.log"
    args = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", name, "--results-dir", str(res)]
    r = runner.invoke(app, [*args, "--storage", f"journal:{journal}"])
    assert r.exit_code == 0, r.output
    return res / name, journal, args


def test_a_journal_study_s_record_is_not_overwritten(tmp_path):
    """Its folder has no study.db, so config.yaml (where its trials are kept) was written over before."""
    folder, journal, _ = _journal_study(tmp_path, "sj")
    rec = (folder / "config.yaml").read_bytes()
    r = runner.invoke(
        app,
        [
            "export", "--study", "sj", "--results-dir", str(tmp_path / "results"), "--format", "slime", "--out",
            str(folder / "config.yaml"),
        ],
    )
    assert r.exit_code == 2 and "is a study's own file" in r.output, r.output
    assert (folder / "config.yaml").read_bytes() == rec


def test_a_journal_with_a_cut_last_line_is_read_by_reading_commands_and_refused_by_a_run(tmp_path):
    folder, journal, args = _journal_study(tmp_path, "cut")
    with journal.open("a") as f:
        f.write('{"op_code": 5, "worker_id": "x", "trial_id": 1, "user_attr')  # a worker killed mid-line
    before = journal.read_bytes()
    r = runner.invoke(app, ["pareto", "--study", "cut", "--results-dir", str(tmp_path / "results")])
    assert r.exit_code == 0 and "last line of" in r.output and "2 layouts evaluated" in r.output, r.output
    r = runner.invoke(app, [*args, "--storage", f"journal:{journal}"])
    assert r.exit_code == 2 and "not an Optuna journal file" in r.output, r.output
    assert journal.read_bytes() == before


@pytest.mark.parametrize("damage", ["garbled", "binary", "not a record"])
def test_a_resume_with_an_unreadable_record_is_refused_not_forked(tmp_path, damage):
    """Before, a garbled config.yaml made the resume start a new empty SQLite study beside the journal's trials and
    rewrite the folder's outputs; a binary one crashed (UnicodeDecodeError)."""
    folder, journal, args = _journal_study(tmp_path, "sj2")
    (folder / "config.yaml").write_bytes(
        {"garbled": b"config: [unclosed\n", "binary": bytes(range(128, 256)), "not a record": b"- 1\n- 2\n"}[damage]
    )
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    jbefore = journal.read_bytes()
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "config.yaml cannot be read" in r.output and "internal error" not in r.output, r.output
    after = {
        p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".tune.lock"
    }  # the run's lock stays, by design
    assert after == before and journal.read_bytes() == jbefore


def test_a_folder_without_its_record_is_not_resumed_into_another_storage(tmp_path):
    folder, journal, args = _journal_study(tmp_path, "sj3")
    (folder / "config.yaml").unlink()
    r = runner.invoke(app, args)  # no --storage: would start a SQLite study beside the journal study's outputs
    assert r.exit_code == 2 and "holds a study's outputs" in r.output and "no config.yaml or study.db" in r.output, (
        r.output
    )
    assert not (folder / "study.db").exists()
    r = runner.invoke(app, [*args, "--storage", f"journal:{journal}"])  # with its storage: resumed
    assert r.exit_code == 0 and "4 layouts evaluated in total" in r.output, r.output


@pytest.mark.parametrize(
    ("args", "flag", "target", "ok"),
    [
        (
            ["export", "--format", "slime"],
            "--out",
            "recipe.yaml",
            False,
        ),  # a shell script into the recipe: written before
        (["export", "--format", "megatron"], "--out", "pareto.csv", False),
        (["pareto"], "--csv", "recipe.yaml", False),
        (["report"], "--out", "pareto.csv", False),
        (["timeline"], "--out", "recipe.yaml", False),
        (
            ["export", "--format", "recipe"],
            "--out",
            "recipe.yaml",
            True,
        ),  # the same kind of file: the user's to rewrite
        (["pareto"], "--csv", "pareto.csv", True),
    ],
)
def test_a_study_s_outputs_are_only_rewritten_by_their_own_kind(study, args, flag, target, ok):
    folder = study / "results" / "base"
    before = (folder / target).read_bytes()
    r = runner.invoke(
        app, [*args, "--study", "base", "--results-dir", str(study / "results"), flag, str(folder / target)]
    )
    if ok:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2 and f"would write over the study's own {target} with another kind of file" in r.output, (
        r.output
    )
    assert (folder / target).read_bytes() == before


def _run(args, cwd=None, monkeypatch=None):
    if cwd is not None:
        monkeypatch.chdir(cwd)
    return runner.invoke(app, args)


def test_a_relative_storage_is_the_same_file_from_any_folder(tmp_path, monkeypatch):
    """The record keeps the store resolved where it was written: the same journal named absolutely from elsewhere
    resumes
    (refused before); the same relative name from another folder, a different file, is refused (it forked before)."""
    k, other = tmp_path / "k", tmp_path / "other"
    (k / "J").mkdir(parents=True)
    (other / "J").mkdir(parents=True)
    args = [
        "--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", "s", "--results-dir", str(k / "R"),
    ]
    assert _run([*args, "--storage", "journal:J/s.log"], k, monkeypatch).exit_code == 0
    pareto = (k / "R" / "s" / "pareto.csv").read_bytes()
    r = _run([*args, "--storage", "journal:J/s.log"], other, monkeypatch)
    assert r.exit_code == 2 and f"is kept in 'journal:{(k / 'J' / 's.log').resolve()}'" in r.output, r.output
    assert (k / "R" / "s" / "pareto.csv").read_bytes() == pareto and not (other / "J" / "s.log").exists()
    r = _run([*args, "--storage", f"journal:{k / 'J' / 's.log'}"], other, monkeypatch)
    assert r.exit_code == 0 and "4 layouts evaluated in total" in r.output, r.output
    r = _run(
        ["pareto", "--study", "s", "--results-dir", str(k / "R")], other, monkeypatch
    )  # the recorded store, found from here
    assert r.exit_code == 0 and "Pareto front" in r.output, r.output


def test_a_moved_study_folder_resumes_and_is_not_forked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", "s"]
    assert runner.invoke(app, [*args, "--results-dir", "M", "--storage", "sqlite:///M/s/study.db"]).exit_code == 0
    (tmp_path / "M").rename(tmp_path / "M2")
    (tmp_path / "M" / "s").mkdir(parents=True)
    r = runner.invoke(
        app, [*args, "--results-dir", "M2", "--storage", "sqlite:///M/s/study.db"]
    )  # a new empty store: forked before
    assert r.exit_code == 2 and "holds study.db, and this run would start a new store" in r.output, r.output
    assert not (tmp_path / "M" / "s" / "study.db").exists()
    r = runner.invoke(app, [*args, "--results-dir", "M2"])  # refused before: the record named M's database
    assert r.exit_code == 0 and "4 layouts evaluated in total" in r.output, r.output


def test_charts_are_not_a_study_and_side_files_are_its_own(tmp_path):
    res = tmp_path / "results"
    (res / "new").mkdir(parents=True)
    (res / "new" / "pareto.png").write_bytes(b"\x89PNG")  # e.g. `tune estimate --plot results/new/pareto.png`
    args = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--results-dir", str(res)]
    assert runner.invoke(app, [*args, "--study", "new"]).exit_code == 0
    folder, journal, jargs = _journal_study(tmp_path, "j")
    for target in (folder / ".tune.lock", res / "new" / "study.db-wal"):
        target.write_text("x") if not target.exists() else None
        r = runner.invoke(
            app, ["export", "--study", "new", "--results-dir", str(res), "--format", "recipe", "--out", str(target)]
        )
        assert r.exit_code == 2 and "is a study's own file" in r.output, (target, r.output)
    r = runner.invoke(
        app,
        [
            "export", "--study", "new", "--results-dir", str(res), "--format", "recipe", "--out",
            str(folder / "recipe.yaml"),
        ],
    )
    assert r.exit_code == 2 and "is study 'j''s own recipe.yaml; this writes study 'new''s" in r.output, r.output


@pytest.mark.parametrize("record", [b"[" * 5000 + b"]" * 5000, b""])
def test_a_damaged_record_is_a_users_file_not_an_internal_error(tmp_path, record):
    res = tmp_path / "results"
    args = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", "s", "--results-dir", str(res)]
    assert runner.invoke(app, args).exit_code == 0
    (res / "s" / "config.yaml").write_bytes(record)
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "internal error" not in r.output and "config.yaml" in r.output, r.output
    assert (
        "delete it to resume the folder's study.db with no --storage" in r.output
    )  # not "remove the folder": it holds the trials
    r = runner.invoke(app, ["pareto", "--study", "s", "--results-dir", str(res)])  # study.db is beside it: still read
    assert r.exit_code == 0, r.output


def test_verify_may_rewrite_the_study_s_recipe(study):
    """tune verify --out writes the recipe with its correctness block: the study's recipe.yaml is its kind of file (it
    was refused as another kind). Without torch the command then stops on the harness's needs, before any write."""
    folder = study / "results" / "base"
    r = runner.invoke(
        app,
        [
            "verify", "--study", "base", "--results-dir", str(study / "results"), "--trial", "0", "--reference",
            "tp=2,pp=1", "--out", str(folder / "recipe.yaml"),
        ],
    )
    assert "would write over" not in r.output and "is a study's own file" not in r.output, r.output
    r = runner.invoke(
        app,
        [
            "verify", "--study", "base", "--results-dir", str(study / "results"), "--trial", "0", "--reference",
            "tp=2,pp=1", "--out", str(folder / "pareto.csv"),
        ],
    )
    assert r.exit_code == 2 and "would write over the study's own pareto.csv" in r.output, r.output


def _bytes(folder: Path) -> dict[str, str]:
    """Each file's sha256 (SQLite's side files -wal and -shm left out: a reader may make them, the store is
    study.db)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.startswith("study.db-") and p.name != ".tune.lock"
    }  # the lock holds the running pid


def _other_study_db(tmp_path: Path) -> bytes:
    r = runner.invoke(
        app,
        [
            "--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "1", "--study", "other", "--results-dir",
            str(tmp_path / "o"),
        ],
    )
    assert r.exit_code == 0, r.output
    return _db_bytes(tmp_path / "o" / "other" / "study.db", tmp_path / "other.db")


def _db_bytes(db: Path, copy: Path) -> bytes:
    """The bytes of a SQLite file with its write-ahead log in it (a copy made with SQLite's backup)."""
    src, dst = sqlite3.connect(db), sqlite3.connect(copy)
    src.backup(dst)
    dst.execute("PRAGMA journal_mode=DELETE")
    src.close()
    dst.close()
    return copy.read_bytes()


DAMAGES = {"delete": "no study database", "empty": "is empty", "other": "holds 'other' instead"}


@pytest.fixture(scope="module")
def studies_made_elsewhere(tmp_path_factory) -> dict[str, Path]:
    """For each damage of :data:`DAMAGES`, a results folder holding a study of its own ("base"), all made by the main
    job (``python -m tuner.cli``) in one other process: no connection of this one is left on their files."""
    import json
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("made")
    res = {d: root / d / "results" for d in DAMAGES}
    runs = [[*MAIN, "--results-dir", str(r)] for r in res.values()]
    code = (
        "import json, runpy, sys\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    sys.argv = ['tune', *argv]\n"
        "    try:\n"
        "        runpy.run_module('tuner.cli', run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as e:\n"
        "        if e.code not in (None, 0):\n"
        "            raise\n"
    )
    made = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    return res


@pytest.mark.parametrize(("damage", "needle"), DAMAGES.items())
def test_a_study_whose_store_is_gone_is_never_silently_replaced(studies_made_elsewhere, tmp_path, damage, needle):
    """config.yaml records the study: a deleted, emptied or swapped study.db is refused by the main job and by every
    reading command, and no refused command changes a byte of the folder."""

    # a study of its own, made in another process: its record names its store
    res = studies_made_elsewhere[damage]
    db = res / "base" / "study.db"
    db.write_bytes(_db_bytes(db, tmp_path / "base.db"))
    for side in res.glob("base/study.db-*"):
        side.unlink()
    if damage == "delete":
        db.unlink()
    else:
        db.write_bytes(b"" if damage == "empty" else _other_study_db(tmp_path))
    before = _bytes(res / "base")
    for args in ([*MAIN], ["pareto", "--study", "base"], ["export", "--study", "base"], ["report", "--study", "base"]):
        r = runner.invoke(app, [*args, "--results-dir", str(res)])
        want = "is missing" if damage == "delete" and args == MAIN else needle
        assert r.exit_code == 2 and want in r.output and "Traceback" not in r.output, (args, r.output)
        assert _bytes(res / "base") == before


def test_an_output_link_or_a_missing_folder_is_refused_and_force_replaces_the_link(study, tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("mine\n")
    link = tmp_path / "run.sh"
    link.symlink_to(target)
    base = ["export", "--study", "base", "--results-dir", str(study / "results"), "--format", "slime", "--out"]
    r = runner.invoke(app, [*base, str(link)])
    assert r.exit_code == 2 and "is a link" in r.output and "--force" in r.output, r.output
    r = runner.invoke(app, [*base, str(tmp_path / "no" / "dir" / "run.sh")])
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "no").exists(), r.output
    r = runner.invoke(app, [*base, str(link), "--force"])
    assert r.exit_code == 0 and not link.is_symlink() and link.read_text().startswith("#!/usr/bin/env bash"), r.output
    assert target.read_text() == "mine\n"


@pytest.fixture
def read_only_copy(study, tmp_path) -> Path:
    """A copy of the study's results on a read-only filesystem: a read-only bind mount as root (for whom ``chmod a-w``
    changes nothing), else the folder's write bits taken off; skips where neither holds."""
    import os
    import shutil
    import subprocess

    res = tmp_path / "results"
    shutil.copytree(study / "results", res)
    if os.geteuid() != 0:
        for p in (res, *res.rglob("*")):
            p.chmod(p.stat().st_mode & ~0o222)
        yield res
        for p in (res, *res.rglob("*")):
            p.chmod(p.stat().st_mode | 0o200)
        return
    mounted = subprocess.run(["mount", "--bind", str(res), str(res)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("root without mount: a read-only folder cannot be made here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(res)], check=True, capture_output=True)
        yield res
    finally:
        subprocess.run(["umount", "-l", str(res)], check=False)


def test_a_read_only_study_is_read_by_the_reading_commands_and_refused_by_a_run(read_only_copy, tmp_path):
    """SQLite opened read-only (``immutable=1`` where its ``-shm`` cannot be made): a study on a read-only filesystem
    could not be read before."""
    res = read_only_copy
    folder = res / "base"
    before = _digest(folder)
    for args in (
        ["pareto"], ["export", "--out", str(tmp_path / "r.yaml")], ["report", "--out", str(tmp_path / "r.html")],
        ["timeline", "--out", str(tmp_path / "t.json")],
    ):
        r = runner.invoke(app, [*args, "--study", "base", "--results-dir", str(res)])
        assert r.exit_code == 0 and "Traceback" not in r.output, (args, r.output)
    assert (tmp_path / "r.yaml").is_file() and (tmp_path / "r.html").is_file()
    r = runner.invoke(app, [*MAIN, "--resume", "--results-dir", str(res)])
    assert r.exit_code == 2 and r.output.count("error:") == 1 and "internal error" not in r.output, r.output
    assert _digest(folder) == before
