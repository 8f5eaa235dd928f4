"""Several ``tune`` workers on one study, with real (command) trials of a fake launch, over SQLite, an Optuna journal
and PostgreSQL; then a worker stopped with SIGTERM and one killed with ``kill -9`` mid-trial (docs/reliability.md).

    python benchmarks/workers_battery.py [--workers 4] [--trials 50] [--storages sqlite,journal,postgres] [--out F]

PostgreSQL: ``TUNE_TEST_POSTGRES_URL`` names a server (``.ci/postgres`` starts a throwaway one); each storage gets a
fresh database. SQLite: one file outside the workers' study folders (a study's own ``study.db`` takes a one-process
lock). Each worker is ``tune --backend command`` with ``tests/launch_tests/fake_trial.py`` as its launch (Megatron's
log lines, no GPU), its own ``--results-dir`` and seed, all started together.

Counted per storage: the workers' exit codes, the trials measured (a result or a failure recorded) and how many
distinct layouts they are (equal: no layout measured twice), trials left RUNNING, and for the stopped and killed
workers whether their trial's process group (``trials/<n>/process.json``) was gone within 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = [
    "--model", "MiniMax-M2", "--layers", "8", "--gpus", "64xH200", "--global-batch", "256", "--stack", "megatron",
    "--backend", "command", "--trial-steps", "4", "--trial-policy", "queue", "--study", "w",
]


def _template(folder: Path, step_s: float) -> Path:
    import yaml

    tpl = folder / "t.yaml"
    tpl.write_text(
        yaml.safe_dump(
            {
                "argv": [
                    sys.executable, str(ROOT / "tests" / "launch_tests" / "fake_trial.py"), "--FAKE_FORMAT=megatron",
                    "--FAKE_STEPS={steps}", f"--FAKE_STEP_S={step_s}", "--FAKE_REPORT_STEP_S=2.0", "{layout_args}",
                ]
            }
        )
    )
    return tpl


def _storage(kind: str, folder: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{folder / 'shared.db'}"
    if kind == "journal":
        return f"journal:{folder / 'shared.log'}"
    base = os.environ.get("TUNE_TEST_POSTGRES_URL")
    if not base:
        raise SystemExit("postgres: set TUNE_TEST_POSTGRES_URL (source .ci/postgres starts a server)")
    import psycopg

    name = f"w{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base.replace("+psycopg", ""), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + "/" + name


def _measured(url: str) -> tuple[list[str], int]:
    import optuna

    from tuner.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.load_study(study_name="w", storage=open_storage(url))
    ran = [t.user_attrs["key"] for t in st.trials if "result" in t.user_attrs or "failure" in t.user_attrs]
    running = sum(t.state == optuna.trial.TrialState.RUNNING for t in st.trials)
    return ran, running


def _gone(pgid: int, within: float = 30.0) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return round(time.monotonic() - t0, 2)
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
    return None


def run(kind: str, workers: int, trials: int, kill: bool) -> dict[str, object]:
    """One storage: ``workers`` workers of ``trials`` trials each (``kill``: slow trials, worker 0 gets SIGTERM and
    worker 1 ``kill -9`` once each has a trial running)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as t:
        folder = Path(t)
        url = _storage(kind, folder)
        tpl = _template(folder, 1.0 if kill else 0.0)
        t0 = time.monotonic()
        procs = [
            subprocess.Popen(
                [
                    sys.executable, "-m", "tuner.cli", *JOB, "--command-template", str(tpl), "--trials", str(trials),
                    "--storage", url, "--seed", str(i), "--results-dir", str(folder / f"r{i}"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=folder,
            )
            for i in range(workers)
        ]
        row: dict[str, object] = {"storage": kind, "workers": workers, "trials_each": trials}
        if kill:
            groups: dict[str, object] = {}
            for i, sig in ((0, signal.SIGTERM), (1, signal.SIGKILL)):
                rec = None
                while procs[i].poll() is None and rec is None:
                    recs = sorted((folder / f"r{i}" / "w" / "trials").glob("*/process.json"))
                    rec = recs[-1] if recs else None
                    time.sleep(0.05)
                if rec is None:
                    groups[sig.name] = "no trial started"
                    continue
                time.sleep(0.3)
                pgid = json.loads(rec.read_text())["pgid"]
                procs[i].send_signal(sig)
                procs[i].wait(60)
                groups[sig.name] = {"exit": procs[i].returncode, "group_gone_after_s": _gone(pgid)}
            row["stopped"] = groups
        outs = [p.communicate(timeout=3600)[0] for p in procs]
        row["seconds"] = round(time.monotonic() - t0, 1)
        row["exits"] = [p.returncode for p in procs]
        ran, running = _measured(url)
        row |= {"measured": len(ran), "distinct_layouts": len(set(ran)), "left_running": running}
        bad = [o for p, o in zip(procs, outs, strict=True) if p.returncode not in (0, 130, -9)]
        if bad:
            row["first_failure"] = bad[0][-600:]
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--storages", default="sqlite,journal,postgres")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = []
    for kind in a.storages.split(","):
        for kill in (False, True):
            row = run(kind, a.workers, a.trials if not kill else 3, kill)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
