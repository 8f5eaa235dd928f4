"""Several `tune` workers on one study through a shared journal storage (Optuna JournalStorage)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import optuna

from tuner.study import open_storage

ROOT = Path(__file__).parents[2]


def test_two_workers_share_a_journal_study_without_running_a_layout_twice(tmp_path):
    journal = tmp_path / "shared" / "study.log"
    journal.parent.mkdir()  # the shared folder exists (a mistyped one is refused)
    cmd = [sys.executable, "-m", "tuner.cli", "--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "14", "--study", "w",
           "--storage", f"journal:{journal}", "--results-dir", str(tmp_path / "res")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([*cmd, "--seed", str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
             for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    now = [int(re.search(r"\((\d+) now;", o).group(1)) for o in outs]
    st = optuna.load_study(study_name="w", storage=open_storage(f"journal:{journal}"))
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE and "result" in t.user_attrs]
    keys = [t.user_attrs["key"] for t in done]
    assert len(keys) == len(set(keys)), "a layout was evaluated twice"
    assert len(done) == sum(now) and all(n > 0 for n in now)  # every trial either worker finished is in the study
    assert len(st.trials) == 28  # 14 trials from each worker, none lost


def test_journal_storage_errors_and_the_recorded_storage(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner()
    res = str(tmp_path / "res")
    bad = tmp_path / "garbage.log"
    bad.write_bytes(b"\x8e\x00not json\n")
    out = r.invoke(app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "2", "--study", "g", "--storage", f"journal:{bad}", "--results-dir", res])
    assert out.exit_code == 2 and "not an Optuna journal file" in out.output
    assert not (tmp_path / "res" / "g").exists()  # a refused study leaves no folder behind
    missing = tmp_path / "missing.log"
    out = r.invoke(app, ["pareto", "--study", "nosuch", "--storage", f"journal:{missing}"])
    assert out.exit_code == 2 and "no journal file" in out.output and not missing.exists()  # reading creates nothing
    typo = tmp_path / "no-such-dir" / "j.log"
    out = r.invoke(app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "2", "--study", "t", "--storage", f"journal:{typo}", "--results-dir", res])
    assert out.exit_code == 2 and "does not exist" in out.output and not typo.parent.exists()  # no stray journal of its own
    j = tmp_path / "ok.log"
    out = r.invoke(app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "3", "--study", "ok", "--storage", f"journal:{j}", "--results-dir", res])
    assert out.exit_code == 0, out.output
    out = r.invoke(app, ["pareto", "--study", "ok", "--results-dir", res])  # no --storage: the one recorded in config.yaml
    assert out.exit_code == 0 and "Pareto front" in out.output
