"""Several `tune` workers on one study through a shared storage (Optuna's JournalStorage, or an RDB): no layout
is evaluated twice, each worker's --trials counts its own layouts, and a worker that dies loses nothing (Optuna's
heartbeat fails its trial and the layout is run again)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner.study import open_storage

pytestmark = pytest.mark.slow  # worker processes, heartbeats and their grace period

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parent


def test_two_workers_with_trials_10_each_evaluate_20_distinct_layouts(tmp_path):
    journal = tmp_path / "shared" / "study.log"
    journal.parent.mkdir()  # the shared folder exists (a mistyped one is refused)
    cmd = [
        sys.executable, "-m", "tuner.cli", "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200",
        "--global-batch", "8", "--stack", "megatron", "--trials", "10", "--study", "w", "--storage",
        f"journal:{journal}", "--results-dir", str(tmp_path / "res"),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [*cmd, "--seed", str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    now = [int(re.search(r"\((\d+) now[;)]", o).group(1)) for o in outs]
    assert now == [10, 10], outs  # each worker evaluated the 10 layouts its --trials asked for ...
    st = optuna.load_study(study_name="w", storage=open_storage(f"journal:{journal}"))
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE and "result" in t.user_attrs]
    keys = [t.user_attrs["key"] for t in done]
    assert len(keys) == len(set(keys)) == 20  # ... and none of them was the other's
    # what else is in the journal: only claims that lost a race for a layout (both workers took it at once)
    assert all("duplicate" in t.user_attrs.get("skipped", "") for t in st.trials if t not in done)


def fresh_postgres() -> str:
    """A new, empty database on the PostgreSQL server named by ``TUNE_TEST_POSTGRES_URL`` (.ci/run starts one), as a
    storage URL; skips the test without one."""
    import uuid

    base = os.environ.get("TUNE_TEST_POSTGRES_URL")
    if not base:
        pytest.skip("no PostgreSQL server: set TUNE_TEST_POSTGRES_URL (.ci/run starts one)")
    psycopg = pytest.importorskip("psycopg")
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base.replace("+psycopg", ""), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + "/" + name


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_four_workers_started_together_on_a_fresh_database_measure_each_layout_once(tmp_path, kind):
    """Real (command) trials: 4 workers started at once on an empty database all start (Optuna's tables are created
    once), and no layout is measured twice (the 4 x 50 battery measured one twice on PostgreSQL before; on a SQLite
    file 3 of 4 workers failed creating the tables, and 2 of 4 died popping one queued trial twice)."""
    import yaml

    url = fresh_postgres() if kind == "postgres" else f"sqlite:///{tmp_path / 'shared.db'}"
    tpl = tmp_path / "t.yaml"
    fake = str(HERE.parent / "launch_tests" / "fake_trial.py")
    tpl.write_text(
        yaml.safe_dump(
            {
                "argv": [
                    sys.executable, fake, "--FAKE_FORMAT=megatron", "--FAKE_STEPS={steps}", "--FAKE_STEP_S=0",
                    "--FAKE_REPORT_STEP_S=2.0", "{layout_args}",
                ]
            }
        )
    )
    cmd = [
        sys.executable, "-m", "tuner.cli", "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200",
        "--global-batch", "8", "--stack", "megatron", "--backend", "command", "--command-template", str(tpl),
        "--trials", "3", "--trial-steps", "4", "--trial-policy", "queue", "--study", "w", "--storage", url,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [*cmd, "--seed", str(i), "--results-dir", str(tmp_path / f"r{i}")], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    st = optuna.load_study(study_name="w", storage=url)
    ran = [t.user_attrs["key"] for t in st.trials if "result" in t.user_attrs or "failure" in t.user_attrs]
    assert len(ran) == len(set(ran)) == 12
    # no proposal that breaks a rule, does not fit or was run is a trial: the rest lost a claim to a worker starting
    # with it
    others = [
        t.user_attrs.get("skipped", "")
        for t in st.trials
        if "result" not in t.user_attrs and "failure" not in t.user_attrs
    ]
    assert all(s.endswith("at the same moment)") for s in others), others


@pytest.mark.parametrize("kind", ["journal", "rdb", "postgres"])
def test_a_killed_worker_loses_nothing(tmp_path, kind):
    """A worker is killed (kill -9) while its trial is RUNNING; a second worker fails that trial once its
    heartbeat is stale (Optuna's fail_stale_trials) and runs the layout again, recorded as a retry."""
    from study_worker import HEARTBEAT, Sleepy, config  # beside this file (pytest imports tests/tuner_tests by folder)

    from tuner.study import prepare, run_study, trial_rows

    (tmp_path / "shared").mkdir()
    storage = (
        f"journal:{tmp_path / 'shared' / 'j.log'}"
        if kind == "journal"
        else fresh_postgres()
        if kind == "postgres"
        else f"sqlite:///{tmp_path / 'shared' / 's.db'}"
    )
    marker = tmp_path / "running"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    a = subprocess.Popen(
        [sys.executable, str(HERE / "study_worker.py"), storage, str(tmp_path / "a"), str(marker)], env=env,
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        seen = []
        for line in a.stdout:  # until worker A's trial is RUNNING with a heartbeat in the storage (or A ends)
            seen.append(line)
            if line.startswith("running "):
                break
        assert seen and seen[-1].startswith("running "), "".join(seen)
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=60)
    finally:
        if a.poll() is None:
            a.kill()
    killed = int(seen[-1].split()[1])
    st = optuna.load_study(study_name="w", storage=open_storage(storage))
    (cut,) = [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]  # left RUNNING by the dead worker
    assert cut.number == killed
    # A's last heartbeat is at most as old as the kill: past the grace period (HEARTBEAT) whatever the machine's load
    time.sleep(HEARTBEAT["heartbeat_grace_s"] + 1)
    # worker B fails the stale trial as it starts and queues its layout ahead of its own first layouts; B runs it as
    # the retry, and its own later proposal of the same layout is skipped as a duplicate
    b = Sleepy(step_s=0.0)
    res = run_study(prepare(config(storage, str(tmp_path / "b"), trials=8)), backend=b)
    st = optuna.load_study(study_name="w", storage=open_storage(storage))
    trials = {t.number: t for t in st.trials}
    assert trials[killed].state == optuna.trial.TrialState.FAIL
    (again,) = [t for t in st.trials if t.user_attrs.get("retried")]
    assert again.state == optuna.trial.TrialState.COMPLETE and again.user_attrs["key"] == cut.user_attrs["key"]
    assert f"trial {killed} was left RUNNING by a worker that sent no heartbeat" in again.user_attrs["retried"]
    assert again.system_attrs["failed_trial"] == killed  # Optuna's RetryHeartbeatStaleTrialCallback made it
    assert cut.user_attrs["key"] in {r.key for r in trial_rows(st)} and b.layouts.count(cut.user_attrs["key"]) == 1
    assert res.evaluated_now == 8 and not [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert [t.number for t in st.trials if "result" not in t.user_attrs] == [killed]  # no skipped proposal is a trial


def test_journal_storage_errors_and_the_recorded_storage(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner()
    job = ["--model", "Llama-3.1-8B", "--gpus", "8xH200"]  # a small space: the journal is what is tested
    res = str(tmp_path / "res")
    bad = tmp_path / "garbage.log"
    bad.write_bytes(b"\x8e\x00not json\n")
    out = r.invoke(app, [*job, "--trials", "2", "--study", "g", "--storage", f"journal:{bad}", "--results-dir", res])
    assert out.exit_code == 2 and "not an Optuna journal file" in out.output
    assert not (tmp_path / "res" / "g").exists()  # a refused study leaves no folder behind
    other = tmp_path / "other.jsonl"  # JSON lines, but not Optuna's operations (no op_code)
    other.write_text('{"a": 1}\n')
    out = r.invoke(app, [*job, "--trials", "2", "--study", "g", "--storage", f"journal:{other}", "--results-dir", res])
    assert out.exit_code == 2 and "not an Optuna journal file" in out.output and other.read_text() == '{"a": 1}\n'
    missing = tmp_path / "missing.log"
    out = r.invoke(app, ["pareto", "--study", "nosuch", "--storage", f"journal:{missing}"])
    assert out.exit_code == 2 and "is missing" in out.output and not missing.exists()  # reading creates nothing
    typo = tmp_path / "no-such-dir" / "j.log"
    out = r.invoke(app, [*job, "--trials", "2", "--study", "t", "--storage", f"journal:{typo}", "--results-dir", res])
    assert (
        out.exit_code == 2 and "does not exist" in out.output and not typo.parent.exists()
    )  # no stray journal of its own
    j = tmp_path / "ok.log"
    out = r.invoke(app, [*job, "--trials", "3", "--study", "ok", "--storage", f"journal:{j}", "--results-dir", res])
    assert out.exit_code == 0, out.output
    out = r.invoke(
        app, ["pareto", "--study", "ok", "--results-dir", res]
    )  # no --storage: the one recorded in config.yaml
    assert out.exit_code == 0 and "Pareto front" in out.output
    # a worker killed mid-line leaves a cut last line: refused before anything is appended (an appended record would
    # make the whole journal unreadable), and the file is left byte for byte
    cut = tmp_path / "cut.log"
    cut.write_bytes(j.read_bytes() + b'{"op_code": 5, "worker_id": "x", "trial')
    before = cut.read_bytes()
    out = r.invoke(
        app,
        [
            *job, "--trials", "3", "--study", "ok", "--storage", f"journal:{cut}", "--results-dir",
            str(tmp_path / "res2"),
        ],
    )  # another folder: res/ok records ok.log as its storage
    assert out.exit_code == 2 and "line" in out.output and "left as it is" in out.output, out.output
    assert cut.read_bytes() == before


def test_a_storage_error_while_reading_a_study_is_a_user_error(monkeypatch):
    """A damaged database can pass the open and fail on a later read (Optuna's StorageInternalError): one message, exit
    2."""
    import optuna
    from typer.testing import CliRunner

    import tuner.cli.studies as studies
    from tuner.cli import app

    def damaged(*a, **k):
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit of the session")

    monkeypatch.setattr(studies, "load_study", damaged)
    r = CliRunner().invoke(app, ["pareto", "--study", "s"])
    assert r.exit_code == 2 and "storage cannot be read" in r.output and "internal error" not in r.output, r.output


def test_reading_a_study_from_a_missing_sqlite_file_creates_nothing(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    missing = tmp_path / "nosuch.db"
    r = CliRunner().invoke(app, ["pareto", "--study", "s", "--storage", f"sqlite:///{missing}"])
    assert r.exit_code == 2 and "is missing" in r.output and not missing.exists()


def test_two_workers_that_pick_one_layout_at_once_never_both_measure_it():
    """PostgreSQL can give two trials started at once one number: each worker tells its own trial by its id, and of two
    RUNNING trials holding one layout neither goes on unseen (the 4 x 50 battery measured a layout twice before)."""
    import datetime

    from optuna.trial import FrozenTrial, TrialState

    from tuner.study.records import claimed_elsewhere

    def running(trial_id: int, number: int) -> FrozenTrial:
        return FrozenTrial(
            number=number,
            state=TrialState.RUNNING,
            value=None,
            datetime_start=datetime.datetime.now(),
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={"key": "tp2-pp1"},
            system_attrs={},
            intermediate_values={},
            trial_id=trial_id,
        )

    for numbers in ((7, 7), (7, 8), (8, 7)):
        trials = [running(1, numbers[0]), running(2, numbers[1])]
        assert claimed_elsewhere(trials, 1, "tp2-pp1") or claimed_elsewhere(trials, 2, "tp2-pp1")
        assert not claimed_elsewhere(trials[:1], 1, "tp2-pp1")  # alone, a trial keeps its layout
