"""A battery of bad inputs, damaged studies, hostile outputs and killed drivers against ``tune`` (docs/reliability.md).

    python benchmarks/reliability_battery.py [--out battery.jsonl]

Each bad-input case runs one ``tune`` command in this process (typer's runner) in a scratch folder and passes when it
exits 2 with one ``error:`` line, no traceback and no internal error, and (where it names them) the files it must not
change are byte for byte the same. Each process case starts a trial's process group under a driver, kills the driver
(``kill -9``) or sends ``tune`` SIGTERM, and passes when no process of the group is left. Prints one line per case
that failed and the totals; ``--out`` writes every case as a JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from typer.testing import CliRunner  # noqa: E402

from tuner.cli import app  # noqa: E402

PRESET = ROOT / "specs" / "data" / "models" / "Qwen3-30B-A3B.json"
RUN = ["--gpus", "8xH200", "--trials", "1"]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith("study.db-")}


def _model(t: Path, name: str = "m", text: str | None = None, **changes: object) -> str:
    d = t / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**json.loads(PRESET.read_text()), **changes}
    (d / "config.json").write_text(text if text is not None else json.dumps(cfg))
    return str(d / "config.json")


def _file(t: Path, name: str, data: str | bytes) -> str:
    p = t / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(p)


def _fifo(t: Path, name: str) -> str:
    os.mkfifo(t / name)
    return str(t / name)


def _link(t: Path, name: str) -> str:
    (t / "victim.txt").write_text("keep\n")
    (t / name).symlink_to(t / "victim.txt")
    return str(t / name)


HOSTILE_TEXTS: dict[str, Callable[[Path, str], str]] = {
    "deep": lambda t, n: _file(t, n, "a: " + "[" * 50_000 + "]" * 50_000),
    "twice": lambda t, n: _file(t, n, "a: 1\na: 1\n"),
    "alias": lambda t, n: _file(t, n, "a: &x [1]\nb: *x\n"),
    "binary": lambda t, n: _file(t, n, b"\x8e\x00\xff" * 100),
    "huge": lambda t, n: _file(t, n, "a: [" + "1, " * 600_000 + "1]\n"),
    "dev-zero": lambda t, n: "/dev/zero",
    "fifo": _fifo,
    "folder": lambda t, n: str(t),
    "missing": lambda t, n: str(t / "no" / n),
    "int-5000": lambda t, n: _file(t, n, "a: " + "9" * 5000 + "\n"),
}


def input_cases() -> list[tuple[str, Callable[[Path], list[str]]]]:
    """(name, make argv in a scratch folder) of every bad input."""
    cases: list[tuple[str, Callable[[Path], list[str]]]] = []
    model_files = {
        "control-char folder": lambda t: _model(t, "x\ntouch PWNED #"),
        "extra launch args": lambda t: _model(t, tuner={"extra_megatron_args": ["--load", "/elsewhere"]}),
        "5000-digit int": lambda t: _model(t, text='{"num_hidden_layers": ' + "9" * 5000 + "}"),
        "deep nesting": lambda t: _model(t, text="[" * 100_000 + "]" * 100_000),
        "duplicate key": lambda t: _model(t, text='{"vocab_size": 1, "vocab_size": 2}'),
        "oversized": lambda t: _model(t, text=" " * (2**20 + 1)),
        "not JSON": lambda t: _model(t, text="{nope"),
        "a list": lambda t: _model(t, text="[1, 2]"),
        "empty": lambda t: _model(t, text=""),
        "/dev/zero": lambda t: "/dev/zero",
        "fifo": lambda t: _fifo(t, "f.json"),
        "missing": lambda t: str(t / "none.json"),
        "binary": lambda t: _model(t, text="\x00\x01"),
    }
    for name, make in model_files.items():
        for cmd in ([], ["estimate"]) if name != "extra launch args" else ([],):  # estimate launches nothing: it may read them
            cases.append((f"--model {name} ({'tune' if not cmd else cmd[0]})", lambda t, m=make, c=cmd: [*c, "--model", m(t), *RUN[:2]]))
    for flag in ("--space", "--calibration"):
        for name, make in HOSTILE_TEXTS.items():
            cases.append((f"{flag} {name}", lambda t, f=flag, m=make: ["--model", "Llama-3.1-8B", *RUN, f, m(t, "x.yaml"),
                                                                         "--results-dir", str(t / "r")]))
    for name, make in HOSTILE_TEXTS.items():
        cases.append((f"--command-template {name}", lambda t, m=make: ["--model", "Llama-3.1-8B", *RUN, "--backend", "command",
                                                                        "--command-template", m(t, "c.yaml"), "--results-dir", str(t / "r")]))
    csvs = {
        "/dev/zero": lambda t: "/dev/zero",
        "a 200 KB cell": lambda t: _file(t, "r.csv", "model,gpu\n" + "x" * 200_000 + ",H200\n"),
        "binary": lambda t: _file(t, "r.csv", b"\xff\xfe\x00" * 50),
        "missing": lambda t: str(t / "none.csv"),
        "fifo": lambda t: _fifo(t, "r.csv"),
        "no columns": lambda t: _file(t, "r.csv", "a,b\n1,2\n"),
    }
    for name, make in csvs.items():
        cases.append((f"validate --data {name}", lambda t, m=make: ["validate", "--data", m(t)]))
        cases.append((f"rl validate --data {name}", lambda t, m=make: ["rl", "validate", "--data", m(t)]))
    for gpus in ("100000x8xH200", "9" * 5000 + "xH200", "0x8xH200", "8xH2000", "1e9xH200"):
        for cmd in ([], ["estimate"], ["rl"]):
            cases.append((f"--gpus {gpus[:16]} ({cmd[0] if cmd else 'tune'})",
                          lambda t, g=gpus, c=cmd: [*c, "--model", "Qwen3-30B-A3B", "--gpus", g]))
    for study in ("name\n", "../up", "", "a" * 129, "-x", "a b"):
        for cmd in ("pareto", "export", "report"):
            cases.append((f"{cmd} --study {study[:12]!r}", lambda t, s=study, c=cmd: [c, "--study", s, "--results-dir", str(t)]))
    for url in ("postgresql://u:pw@127.0.0.1:1/db", "mysql://u:pw@127.0.0.1:1/db", "sqlite:///:memory:", "nope", "journal:"):
        cases.append((f"--storage {url[:24]}", lambda t, u=url: ["--model", "Llama-3.1-8B", *RUN, "--storage", u, "--results-dir", str(t)]))
    return cases


def study_cases(study_root: Path) -> list[tuple[str, Callable[[Path], list[str]], str]]:
    """(name, make argv, folder whose files must not change) of commands on a damaged study or into hostile outputs."""
    import shutil
    import sqlite3

    def copy(t: Path, damage: str) -> Path:
        res = t / "results"
        shutil.copytree(study_root, res)
        db = res / "base" / "study.db"
        for side in res.glob("base/study.db-*"):
            side.unlink()
        src, dst = sqlite3.connect(study_root / "base" / "study.db"), sqlite3.connect(t / "copy.db")
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")
        src.close()
        dst.close()
        db.write_bytes((t / "copy.db").read_bytes())
        if damage == "delete":
            db.unlink()
        elif damage == "empty":
            db.write_bytes(b"")
        elif damage == "truncated":
            db.write_bytes(db.read_bytes()[:4096])
        elif damage == "garbage":
            db.write_bytes(b"garbage" * 1000)
        return res

    cases: list[tuple[str, Callable[[Path], list[str]], str]] = []
    for damage in ("delete", "empty", "truncated", "garbage"):
        for cmd in ([], ["pareto"], ["export"], ["report"], ["timeline"]):
            args = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2"] if not cmd else cmd
            cases.append((f"study.db {damage} ({cmd[0] if cmd else 'tune'})",
                          lambda t, d=damage, a=args: [*a, "--study", "base", "--results-dir", str(copy(t, d))], "results/base"))
    outputs = {
        "export --out": ["export", "--format", "slime", "--out"],
        "export --out (recipe)": ["export", "--out"],
        "pareto --csv": ["pareto", "--csv"],
        "report --out": ["report", "--out"],
        "timeline --out": ["timeline", "--out"],
        "timeline --png": ["timeline", "--png"],
    }
    for name, head in outputs.items():
        for kind, make in (("a link", lambda t: _link(t, "o.png")), ("a missing folder", lambda t: str(t / "no" / "dir" / "o.png")),
                           ("a FIFO", lambda t: _fifo(t, "o.png")), ("another kind", lambda t: _file(t, "o.png", "my notes\n"))):
            cases.append((f"{name} into {kind}", lambda t, h=head, m=make: [*h, m(t), "--study", "base", "--results-dir",
                                                                            str(copy(t, "none"))], "."))
    return cases


def _clean(r: object) -> tuple[bool, str]:
    out = r.output  # type: ignore[attr-defined]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    ok = (r.exit_code == 2 and sum(ln.startswith("error:") for ln in lines) == 1  # type: ignore[attr-defined]
          and "Traceback" not in out and "internal error" not in out)
    return ok, (lines[-1] if lines else "")[:200]


def process_cases(reps: int) -> list[dict[str, object]]:
    """Kill the driver of a trial (``kill -9``) ``reps`` times, and SIGTERM ``tune`` with a command trial twice."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = ("import os, sys, time\nfrom pathlib import Path\nfrom launch._trial import LocalProcess\n"
              "d = Path(sys.argv[1]) / '0'\nd.mkdir(parents=True)\n"
              "p = LocalProcess(['bash', '-c', 'sleep 300 & sleep 300'], log_path=d / 'log.txt', env=dict(os.environ), trial_dir=d)\n"
              "print(p.proc.pid, flush=True)\ntime.sleep(300)\n")
    rows: list[dict[str, object]] = []

    def gone(pgid: int) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return time.monotonic() - t0
            time.sleep(0.05)
        os.killpg(pgid, signal.SIGKILL)
        return None

    for i in range(reps):
        with tempfile.TemporaryDirectory() as t:
            d = subprocess.Popen([sys.executable, "-c", driver, t], stdout=subprocess.PIPE, text=True, env=env)
            pgid = int(d.stdout.readline())  # type: ignore[union-attr]
            os.kill(d.pid, signal.SIGKILL)
            d.wait()
            s = gone(pgid)
            rows.append({"case": f"kill -9 of the driver #{i + 1}", "ok": s is not None, "seconds_to_gone": s})
    for i in range(2):
        with tempfile.TemporaryDirectory() as t:
            tpl = Path(t) / "t.yaml"
            tpl.write_text('argv: [bash, -c, "sleep 300 & sleep 300"]\n')
            p = subprocess.Popen([sys.executable, "-m", "tuner.cli", "--model", "Llama-3.1-8B", "--layers", "2", "--gpus", "1xH200",
                                  "--backend", "command", "--command-template", str(tpl), "--trials", "1", "--study", "s",
                                  "--results-dir", f"{t}/r"], env=env, cwd=t, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rec = Path(t) / "r" / "s" / "trials" / "0" / "process.json"
            while not rec.exists() and p.poll() is None:
                time.sleep(0.05)
            time.sleep(0.2)
            pgid = json.loads(rec.read_text())["pgid"]
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
            s = gone(pgid)
            rows.append({"case": f"SIGTERM of tune #{i + 1}", "ok": s is not None and rc == 130, "exit": rc, "seconds_to_gone": s})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--kill-reps", type=int, default=5, help="kill -9 cases (0: no process cases)")
    ap.add_argument("--case-timeout", type=int, default=60, help="seconds a case may take before it counts as a hang")
    ap.add_argument("--memory-gib", type=float, default=8.0, help="address-space limit of this process (a case past it fails)")
    a = ap.parse_args()
    import resource

    limit = int(a.memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    class Hang(Exception):
        pass

    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"no answer in {a.case_timeout} s")

    signal.signal(signal.SIGALRM, on_alarm)
    cli = CliRunner()

    class _Result:
        def __init__(self, e: BaseException) -> None:
            self.exit_code, self.output = -1, f"{type(e).__name__}: {e}"

    class runner:  # noqa: N801 - a CliRunner whose cases are cut off by the alarm and the memory limit
        @staticmethod
        def invoke(app_: object, args: list[str]) -> object:
            signal.alarm(a.case_timeout)
            try:
                return cli.invoke(app_, args)
            except (Hang, MemoryError) as e:
                return _Result(e)
            finally:
                signal.alarm(0)

    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as root:
        study = Path(root) / "study"
        r = runner.invoke(app, ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2", "--study", "base", "--results-dir", str(study)])
        assert r.exit_code == 0, r.output
        for i, (name, make) in enumerate(input_cases()):
            t = Path(root) / f"c{i}"
            t.mkdir()
            r = runner.invoke(app, make(t))
            ok, line = _clean(r)
            ok = ok and not (Path.cwd() / "PWNED").exists()
            rows.append({"case": name, "ok": ok, "exit": r.exit_code, "line": line})
        for i, (name, make, keep) in enumerate(study_cases(study)):
            t = Path(root) / f"s{i}"
            t.mkdir()
            args = make(t)
            folder = t / keep
            before = _digest(folder) if folder.is_dir() else {}
            victim = (t / "victim.txt").read_bytes() if (t / "victim.txt").exists() else None
            r = runner.invoke(app, args)
            ok, line = _clean(r)
            same = (_digest(folder) if folder.is_dir() else {}) == before
            intact = victim is None or (t / "victim.txt").read_bytes() == victim
            made = not (t / "no").exists()
            rows.append({"case": name, "ok": ok and same and intact and made, "exit": r.exit_code, "line": line,
                         "unchanged": same and intact, "no_folder_made": made})
    rows += process_cases(a.kill_reps) if a.kill_reps else []
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"FAIL {r['case']}: exit {r.get('exit')} {r.get('line', '')}")
    kills = [r["seconds_to_gone"] for r in rows if "seconds_to_gone" in r and r["seconds_to_gone"] is not None]
    print(f"{len(rows) - len(bad)} of {len(rows)} cases passed" + (f"; trial groups gone after their driver died in at most "
                                                                   f"{max(kills):.2f} s" if kills else ""))
    if a.out:
        a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
