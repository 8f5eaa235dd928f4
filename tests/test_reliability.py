"""Bad input loses nothing and runs nothing (docs/reliability.md): a user's file that cannot be parsed is one
:class:`TunerError` naming it (:mod:`specs.files`); outputs replace only their own kind; a storage password stays out
of files; a resume asks for what was left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specs import load_model
from specs.errors import TunerError

PRESET = Path(__file__).resolve().parents[1] / "specs" / "data" / "models" / "Qwen3-30B-A3B.json"


def _config(tmp_path: Path, folder: str = "m", text: str | None = None, **changes) -> Path:
    d = tmp_path / folder
    d.mkdir()
    cfg = {**json.loads(PRESET.read_text()), **changes}
    (d / "config.json").write_text(text if text is not None else json.dumps(cfg))
    return d / "config.json"


@pytest.mark.parametrize(("make", "needle"), [
    (lambda t: _config(t, folder="x\ntouch PWNED #"), "no control characters"),
    (lambda t: _config(t, tuner={"extra_megatron_args": ["--load", "/elsewhere"]}), "pass --allow-config-args"),
    (lambda t: _config(t, text='{"num_hidden_layers": ' + "9" * 5000 + "}"), "cannot read it"),
    (lambda t: _config(t, text="[" * 100_000 + "]" * 100_000), "nested too deeply"),
    (lambda t: _config(t, text='{"vocab_size": 1, "vocab_size": 2}'), "appears twice"),
])
def test_a_hostile_model_file_is_refused_in_one_line(tmp_path, make, needle):
    with pytest.raises(TunerError, match=needle):
        load_model(str(make(tmp_path)))


def test_launch_arguments_of_a_config_are_used_only_when_allowed(tmp_path):
    p = _config(tmp_path, tuner={"extra_megatron_args": ["--load", "/elsewhere"]})
    assert load_model(str(p), allow_config_args=True).extra_megatron_args == ("--load", "/elsewhere")


@pytest.mark.parametrize(("text", "needle"), [
    ("a: " + "[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ("a: 1\na: 2\n", "appears twice"),
])
def test_a_hostile_space_file_is_refused_in_one_line(tmp_path, text, needle):
    from search_spaces.space import SearchSpace

    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(TunerError, match=needle):
        SearchSpace.load(str(tmp_path / "s.yaml"))
    with pytest.raises(TunerError, match="cannot read it"):  # a folder
        SearchSpace.load(str(tmp_path))


# --------------------------------------------------------------------------- outputs


def _link(t: Path) -> Path:
    (t / "target.txt").write_text("keep me\n")
    (t / "out.sh").symlink_to(t / "target.txt")
    return t / "out.sh"


def _other_kind(t: Path) -> Path:
    (t / "out.sh").write_text("my notes\n")
    return t / "out.sh"


def _folder(t: Path) -> Path:
    (t / "out.sh").mkdir()
    return t / "out.sh"


@pytest.mark.parametrize(("make", "needle", "forced"), [
    (_link, "is a link", True),
    (_other_kind, "holds another kind of file", True),
    (lambda t: (os.mkfifo(t / "out.sh"), t / "out.sh")[1], "is not a regular file", True),
    (_folder, "is a folder", False),
    (lambda t: t / "no" / "such" / "out.sh", "no folder", False),
])
def test_an_output_replaces_only_its_own_kind(tmp_path, make, needle, forced):
    from specs.files import write_output

    p = make(tmp_path)
    before = sorted(x.name for x in tmp_path.rglob("*"))
    with pytest.raises(TunerError, match=needle):
        write_output(p, "#!/usr/bin/env bash\necho hi\n", label="--out", executable=True)
    assert sorted(x.name for x in tmp_path.rglob("*")) == before  # nothing created, no temporary file left
    if (tmp_path / "target.txt").exists():
        assert (tmp_path / "target.txt").read_text() == "keep me\n"
    if forced:
        write_output(p, "#!/usr/bin/env bash\necho hi\n", force=True, executable=True)
        assert p.is_file() and not p.is_symlink() and p.read_text().endswith("echo hi\n") and os.access(p, os.X_OK)
        if (tmp_path / "target.txt").exists():
            assert (tmp_path / "target.txt").read_text() == "keep me\n"  # the link was replaced, not its target


def test_an_output_of_the_same_kind_is_replaced_atomically(tmp_path):
    from specs.files import write_output

    p = tmp_path / "r.csv"
    write_output(p, "a,b\n1,2\n")
    old = os.stat(p).st_ino
    write_output(p, "a,b\n3,4\n")
    assert p.read_text() == "a,b\n3,4\n" and os.stat(p).st_ino != old  # a new file renamed over it
    assert [x.name for x in tmp_path.iterdir()] == ["r.csv"]


def test_a_full_disk_is_named_with_the_file(tmp_path, monkeypatch):
    import errno

    from specs.files import write_output

    (tmp_path / "r.html").write_text("<!DOCTYPE html>\nold\n")

    def full(fd, *a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(TunerError, match=r"r\.html.*the disk is full"):
        write_output(tmp_path / "r.html", "<!DOCTYPE html>\nnew\n", label="--out")
    assert (tmp_path / "r.html").read_text() == "<!DOCTYPE html>\nold\n"  # the old page stays whole
    assert [x.name for x in tmp_path.iterdir()] == ["r.html"]


def _big_cell(t: Path) -> str:
    (t / "runs.csv").write_text("model,gpu\n" + "x" * 200_000 + ",H200\n")
    return str(t / "runs.csv")


@pytest.mark.parametrize(("args", "needle"), [
    (lambda t: ["validate", "--data", _big_cell(t)], "field larger than field limit"),
    (lambda t: ["pareto", "--study", "name\n"], "a study name is"),
    (lambda t: ["--from", _text(t, "l.yaml", "a: " + "[" * 50_000 + "]" * 50_000), "--gpus", "8xH200"],
     "nested too deeply"),
    (lambda t: ["calibrate", "--data", str(Path(__file__).parents[1] / "benchmarks" / "data" / "published_runs.csv"),
                "--out", _text(t, "notes.txt", "my notes\n")],
     "holds another kind of file"),  # before the fit: no "fitting"
])
def test_hostile_command_inputs_get_one_line(tmp_path, args, needle):
    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner().invoke(app, args(tmp_path))
    assert r.exit_code == 2 and needle in r.output, r.output
    assert "Traceback" not in r.output and "fitting" not in r.output, r.output


def _text(t: Path, name: str, text: str) -> str:
    (t / name).write_text(text)
    return str(t / name)


def test_a_storage_password_stays_out_of_the_files():
    from tuner.study.config import TuneConfig, storage_place

    url = "postgresql://tuner:s3cret@db.example:5432/studies"
    kept = TuneConfig.from_dict(dict(model="m", gpus="g", storage=url)).to_dict()["storage"]
    assert kept == "postgresql://tuner@db.example:5432/studies"
    # one place, any password
    assert storage_place(url) == storage_place("postgresql://tuner:other@db.example:5432/studies")


def test_a_missing_postgresql_driver_is_named(tmp_path):
    import importlib.util

    from typer.testing import CliRunner

    from tuner.cli import app

    if importlib.util.find_spec("psycopg2") or importlib.util.find_spec("psycopg"):
        pytest.skip("a PostgreSQL driver is installed here")
    for args in (["--model", "Llama-3.1-8B", "--gpus", "8xH200"], ["pareto", "--study", "s"]):
        r = CliRunner().invoke(app, [*args, "--storage", "postgresql://u:pw@127.0.0.1:1/db",
                                     "--results-dir", str(tmp_path)])
        assert r.exit_code == 2 and "pip install psycopg[binary]" in r.output and "pw" not in r.output, r.output


def test_the_resume_command_after_an_interrupt_asks_for_what_was_left():
    from tuner.cli.main_job import _with_trials

    assert _with_trials(["--model", "M", "--trials", "50", "--study", "s"], 37) == [
        "--model", "M", "--study", "s", "--trials", "37"]
    assert _with_trials(["--model", "M", "--trials=50"], 3) == ["--model", "M", "--trials", "3"]
