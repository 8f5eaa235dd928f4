"""A trial dies with its driver: ``kill -9`` of the driver leaves no process of the trial's group (the watchdog),
SIGTERM
of ``tune`` ends the run as Ctrl-C does, and an orphan that outlived both keeps the next trial from starting beside
it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specs.errors import TunerError

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import os, sys, time
from pathlib import Path
from launch._trial import LocalProcess
d = Path(sys.argv[1]) / "0"
d.mkdir(parents=True)
p = LocalProcess(["bash", "-c", "sleep 300 & sleep 300"], log_path=d / "log.txt", env=dict(os.environ), trial_dir=d)
print(p.proc.pid, p.watchdog.pid, flush=True)
time.sleep(300)
"""


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _gone(pgid: int, within_s: float = 20.0) -> bool:
    end = time.monotonic() + within_s
    while _alive(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    return not _alive(pgid)


def _driver(trials: Path) -> tuple[subprocess.Popen[str], int, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    d = subprocess.Popen([sys.executable, "-c", DRIVER, str(trials)], stdout=subprocess.PIPE, text=True, env=env)
    pgid, watchdog = (int(x) for x in d.stdout.readline().split())
    return d, pgid, watchdog


def test_kill_9_of_the_driver_kills_the_trials_group(tmp_path):
    d, pgid, _ = _driver(tmp_path)
    assert json.loads((tmp_path / "0" / "process.json").read_text())["pgid"] == pgid
    os.kill(d.pid, signal.SIGKILL)
    d.wait()
    assert _gone(pgid)  # the trial's shell and its background child


def test_an_orphan_keeps_the_next_trial_from_starting_beside_it(tmp_path):
    from launch._trial import LocalProcess

    d, pgid, watchdog = _driver(tmp_path)
    os.kill(watchdog, signal.SIGKILL)  # the driver and its watchdog both killed: the group is an orphan
    os.kill(d.pid, signal.SIGKILL)
    d.wait()
    try:
        (tmp_path / "1").mkdir()
        with pytest.raises(TunerError, match=rf"trial 0 \(process group {pgid}\) of an earlier run still run"):
            LocalProcess(["true"], log_path=tmp_path / "1" / "log.txt", env=dict(os.environ), trial_dir=tmp_path / "1")
    finally:
        os.killpg(pgid, signal.SIGKILL)


def test_sigterm_of_tune_ends_the_run_as_ctrl_c_and_its_trial_with_it(tmp_path):
    tpl = tmp_path / "t.yaml"
    tpl.write_text(yaml.safe_dump({"argv": ["bash", "-c", "sleep 300 & sleep 300"]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tune = subprocess.Popen(
        [
            sys.executable, "-m", "tuner.cli", "--model", "Llama-3.1-8B", "--layers", "2", "--gpus", "1xH200",
            "--backend", "command", "--command-template", str(tpl), "--trials", "1", "--study", "s", "--results-dir",
            str(tmp_path / "r"),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rec = tmp_path / "r" / "s" / "trials" / "0" / "process.json"
    end = time.monotonic() + 120
    while not rec.exists() and tune.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert rec.exists(), tune.communicate()[0]
    time.sleep(0.2)  # the record is written as the trial starts
    pgid = json.loads(rec.read_text())["pgid"]
    tune.send_signal(signal.SIGTERM)
    out = tune.communicate(timeout=60)[0]
    assert tune.returncode == 130 and "Traceback" not in out, out
    assert _gone(pgid)
