"""Bad inputs, damaged studies, hostile outputs and killed drivers against ``tune`` (docs/reliability.md).

    python benchmarks/reliability_battery.py [--out battery.jsonl]

Each bad-input case runs one ``tune`` command in this process (typer's runner) in a scratch folder and passes when it
exits 2 with one ``error:`` line (``tune check``: its list of broken rules), no traceback and no internal error, and
(where it names them) the files it must not change are byte for byte the same and no folder was made. A few cases
must succeed instead (exit 0, files unchanged): reading a study on a read-only filesystem, and a journal whose last
line was cut. As root (Linux), a read-only study is a read-only bind mount and a full disk a 256 KiB tmpfs filled to
the last byte; without root those cases are left out, and the totals say so. Each process case starts a trial's
process group under a driver, kills the driver (``kill -9``) or sends ``tune`` SIGTERM, and passes when no process of
the group is left. Prints one line per case that failed and the totals; ``--out`` writes every case as a JSON line.
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
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from tuner.cli import app

ROOT = Path(__file__).resolve().parents[1]


PRESET = ROOT / "specs" / "data" / "models" / "Qwen3-30B-A3B.json"
RUN = ["--gpus", "8xH200", "--trials", "1"]
DATA = str(ROOT / "benchmarks" / "data" / "published_runs.csv")
RL_FIT = ["--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--rollout-gpus", "32", "--colocated", "--rollout-layout",
          "vllm:tp=2,ep=1,pp=1", "--trainer-layout", "megatron:tp=1,cp=1,ep=8,pp=1,vpp=1"]
RL_CALIBRATE = ["rl", "calibrate", "--log", str(ROOT / "tests" / "fixtures" / "rl_logs" / "nemo_rl_grpo_sync.log"),
                *RL_FIT]


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
        "not JSON": lambda t: _model(t, text="{nope"),
        "a list": lambda t: _model(t, text="[1, 2]"),
        "empty": lambda t: _model(t, text=""),
        "missing": lambda t: str(t / "none.json"),
        "binary": lambda t: _model(t, text="\x00\x01"),
    }
    for name, make in model_files.items():
        # estimate launches nothing: it may read launch arguments
        for cmd in ([], ["estimate"]) if name != "extra launch args" else ([],):
            cases.append((f"--model {name} ({'tune' if not cmd else cmd[0]})",
                          lambda t, m=make, c=cmd: [*c, "--model", m(t), *RUN[:2]]))
    job = ["--model", "Llama-3.1-8B", *RUN]
    for flag in ("--space", "--calibration"):
        for name, make in HOSTILE_TEXTS.items():
            cases.append((f"{flag} {name}", lambda t, f=flag, m=make: [*job, f, m(t, "x.yaml"),
                                                                         "--results-dir", str(t / "r")]))
    for name, make in HOSTILE_TEXTS.items():
        cases.append((f"--command-template {name}", lambda t, m=make: [
            *job, "--backend", "command", "--command-template", m(t, "c.yaml"), "--results-dir", str(t / "r")]))
    csvs = {
        "a 200 KB cell": lambda t: _file(t, "r.csv", "model,gpu\n" + "x" * 200_000 + ",H200\n"),
        "binary": lambda t: _file(t, "r.csv", b"\xff\xfe\x00" * 50),
        "missing": lambda t: str(t / "none.csv"),
        "no columns": lambda t: _file(t, "r.csv", "a,b\n1,2\n"),
    }
    for name, make in csvs.items():
        cases.append((f"validate --data {name}", lambda t, m=make: ["validate", "--data", m(t)]))
        cases.append((f"rl validate --data {name}", lambda t, m=make: ["rl", "validate", "--data", m(t)]))
    for gpus in ("0x8xH200", "8xH2000", "1e9xH200"):
        for cmd in ([], ["estimate"], ["rl"]):
            cases.append((f"--gpus {gpus[:16]} ({cmd[0] if cmd else 'tune'})",
                          lambda t, g=gpus, c=cmd: [*c, "--model", "Qwen3-30B-A3B", "--gpus", g]))
    for study in ("name\n", "../up", "", "a" * 129, "-x", "a b"):
        for cmd in ("pareto", "export", "report"):
            cases.append((f"{cmd} --study {study[:12]!r}",
                          lambda t, s=study, c=cmd: [c, "--study", s, "--results-dir", str(t)]))
    for url in ("postgresql://u:pw@127.0.0.1:1/db", "mysql://u:pw@127.0.0.1:1/db", "sqlite:///:memory:", "nope",
                "journal:"):
        cases.append((f"--storage {url[:24]}", lambda t, u=url: [*job, "--storage", u, "--results-dir", str(t)]))
    return cases


def _plain_db(src: Path, dst: Path) -> None:
    """Copy the SQLite file ``src`` to ``dst`` as one file (its WAL folded in, no side files)."""
    import sqlite3

    for side in dst.parent.glob(dst.name + "-*"):
        side.unlink()
    tmp = dst.with_suffix(".copy")
    a, b = sqlite3.connect(src), sqlite3.connect(tmp)
    a.backup(b)
    b.execute("PRAGMA journal_mode=DELETE")
    a.close()
    b.close()
    os.replace(tmp, dst)


def study_cases(study_root: Path) -> list[tuple[str, Callable[[Path], list[str]], str]]:
    """(name, make argv, folder whose files must not change) of commands on a damaged study or into hostile outputs."""
    import shutil

    def copy(t: Path, damage: str) -> Path:
        res = t / "results"
        shutil.copytree(study_root, res)
        db = res / "base" / "study.db"
        _plain_db(study_root / "base" / "study.db", db)
        if damage == "delete":
            db.unlink()
        elif damage == "empty":
            db.write_bytes(b"")
        elif damage == "truncated":
            db.write_bytes(db.read_bytes()[:4096])
        elif damage == "garbage":
            db.write_bytes(b"garbage" * 1000)
        elif damage == "another study":
            _plain_db(study_root / "other" / "study.db", db)
        return res

    cases: list[tuple[str, Callable[[Path], list[str]], str]] = []
    reads = ([], ["pareto"], ["export"], ["report"], ["timeline"])
    for damage in ("delete", "empty", "truncated", "garbage", "another study"):
        for cmd in reads:
            args = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--trials", "2"] if not cmd else cmd
            cases.append((f"study.db {damage} ({cmd[0] if cmd else 'tune'})",
                          lambda t, d=damage, a=args: [*a, "--study", "base", "--results-dir", str(copy(t, d))],
                          "results/base"))

    def config(t: Path, study: str, make: Callable[[Path, str], str]) -> Path:
        res = copy(t, "none")
        made = Path(make(t, "config.yaml"))
        (res / study / "config.yaml").unlink()
        if made.is_file():
            os.replace(made, res / study / "config.yaml")
        return res

    # the record says where a study is kept: a run reads it; a reading command reads it when the folder has no
    # study.db
    resume = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--resume", "--trials", "1"]
    for name in ("twice", "alias", "binary", "deep", "int-5000", "missing"):
        for cmd in reads:
            study, args = ("base", resume) if not cmd else ("jbase", cmd)
            if not cmd and name == "missing":
                continue  # a study.db without its record resumes: the record is written again
            cases.append((f"config.yaml {name} ({cmd[0] if cmd else 'tune'})",
                          lambda t, n=name, a=args, s=study: [
                              *a, "--study", s, "--results-dir", str(config(t, s, HOSTILE_TEXTS[n]))],
                          f"results/{study}"))
    outputs = {
        "export --out": ["export", "--format", "slime", "--out"],
        "export --out (recipe)": ["export", "--out"],
        "export --out (megatron)": ["export", "--format", "megatron", "--out"],
        "pareto --csv": ["pareto", "--csv"],
        "report --out": ["report", "--out"],
        "timeline --out": ["timeline", "--out"],
        "timeline --png": ["timeline", "--png"],
    }
    others = {
        "estimate --plot": lambda o: ["estimate", "--model", "Llama-3.1-8B", "--gpus", "8xH200", "--plot", o],
        "calibrate --out": lambda o: ["calibrate", "--data", DATA, "--max-nfev", "5", "--out", o],
        "rl --export": lambda o: ["rl", "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--export", o],
        "rl calibrate --out": lambda o: [*RL_CALIBRATE, "--out", o],
    }
    kinds = (("a link", lambda t: _link(t, "o.png")), ("a missing folder", lambda t: str(t / "no" / "dir" / "o.png")),
             ("a FIFO", lambda t: _fifo(t, "o.png")), ("another kind", lambda t: _file(t, "o.png", "my notes\n")),
             ("a folder", lambda t: str(t)))
    for name, head in outputs.items():
        for kind, make in kinds:
            cases.append((f"{name} into {kind}", lambda t, h=head, m=make: [
                *h, m(t), "--study", "base", "--results-dir", str(copy(t, "none"))], "."))
    for name, argv in others.items():
        for kind, make in kinds:
            cases.append((f"{name} into {kind}", lambda t, a=argv, m=make: a(m(t)), "."))
    return cases


BIG = "9" * 5000
FLOAT_BAD = ("nan", "inf", "-1")


def option_cases(study_root: Path) -> list[tuple[str, Callable[[Path], list[str]]]]:
    """(name, make argv) of an option given a value outside what it accepts, on every command that takes it."""
    job = ["--model", "Llama-3.1-8B", "--gpus", "8xH200"]
    moe = ["--model", "Qwen3-30B-A3B", "--gpus", "8xH200"]
    run = ["--trials", "1"]
    common = {  # options of tune, estimate and check
        "--seq-len": ("0", "-8", BIG, "abc"), "--global-batch": ("0", "-1", BIG), "--layers": ("0", "-1", BIG),
        "--gpus-per-node": ("0", "3", BIG), "--precision": ("fp4", ""), "--task": ("rlhf",), "--stack": ("nope",),
        "--megatron-core": ("0.1", "9.99", "0.13x"), "--network": ("nope",), "--cuda-graph-impl": ("nope",),
        "--fp8-recipe": ("nope",), "--cp-comm-type": ("nope",), "--transformer-impl": ("nope",),
        "--optimizer": ("nope",), "--cpu-offloading-num-layers": ("-1",), "--cuda-graph-scope": ("nope",),
        "--cross-entropy-fusion-impl": ("nope",),
    }
    cases: list[tuple[str, Callable[[Path], list[str]]]] = []
    for cmd in ([], ["estimate"], ["check"]):
        name = cmd[0] if cmd else "tune"
        tail = (lambda t: [*run, "--results-dir", str(t / "r")]) if not cmd else (lambda t: [])
        for opt, values in common.items():
            for v in values:
                cases.append((f"{opt} {v[:8]!r} ({name})",
                              lambda t, c=cmd, o=opt, v=v, tl=tail: [*c, *job, o, v, *tl(t)]))
        for opt in ("--lora-rank", "--lora-target-modules"):
            v = "0" if opt == "--lora-rank" else "nope"
            cases.append((f"{opt} {v} ({name})",
                          lambda t, c=cmd, o=opt, v=v, tl=tail: [*c, *job, "--task", "lora", o, v, *tl(t)]))
    for cmd in ([], ["estimate"]):
        name = cmd[0] if cmd else "tune"
        tail = (lambda t: [*run, "--results-dir", str(t / "r")]) if not cmd else (lambda t: [])
        for opt, values in {"--network-gbps": ("0", *FLOAT_BAD), "--host-memory-gib": ("0", "nan"),
                            "--usd-per-gpu-hour": FLOAT_BAD, "--memory-headroom": ("1.5", "-0.1", "nan")}.items():
            for v in values:
                cases.append((f"{opt} {v} ({name})",
                              lambda t, c=cmd, o=opt, v=v, tl=tail: [*c, *job, o, v, *tl(t)]))
    layout = {"--tp": ("0", "-2", BIG), "--pp": ("0",), "--vpp": ("0",), "--cp": ("0",), "--ep": ("0",),
              "--etp": ("0",),
              "--micro-batch-size": ("0", "-1"), "--recompute": ("nope",), "--recompute-method": ("nope",),
              "--dispatcher": ("nope",), "--optimizer-offload-fraction": ("2", "nan", "-1"),
              "--pipeline-layout": ("E|t\n", "((("), "--exp-avg-dtype": ("nope",), "--recompute-modules": ("nope",),
              "--first-stage-layers": ("-1",)}
    for cmd in ("estimate", "check"):
        for opt, values in layout.items():
            for v in values:
                cases.append((f"{opt} {v[:8]!r} ({cmd})", lambda t, c=cmd, o=opt, v=v: [c, *moe, o, v]))
    for opt, values in {"--trials": ("0",), "--trial-steps": ("0",), "--trial-warmup-steps": ("-1", "99"),
                        "--trial-timeout": ("0", "nan", "-1"), "--recalibrate-after": ("-1",),
                        "--confirm-runs": ("-1",), "--parallel-trials": ("0",), "--prune-margin": ("nan",),
                        "--trial-policy": ("nope",), "--gpu-hours": ("0", "nan", "-1"),
                        "--stop-confidence": ("1.5", "nan"), "--stop-gain": ("-1", "nan"), "--backend": ("nope",),
                        "--top": ("-1",), "--trial-env": ("NOEQUALS",)}.items():
        for v in values:
            cases.append((f"{opt} {v[:8]!r} (tune)", lambda t, o=opt, v=v: [
                *job, *(run if o != "--trials" else []), o, v, "--results-dir", str(t / "r")]))
    import shutil

    def study(t: Path) -> list[str]:
        shutil.copytree(study_root, t / "results")
        return ["--study", "base", "--results-dir", str(t / "results")]

    ref = ["verify", "--reference", "tp=1,pp=1"]
    for name, argv in {"export --format nope": ["export", "--format", "nope"],
                       "export --trial 999": ["export", "--trial", "999"],
                       "export --trial -1": ["export", "--trial", "-1"],
                       "timeline --trial 999": ["timeline", "--trial", "999"],
                       "pareto --top -1": ["pareto", "--top", "-1"],
                       "verify --reference junk": ["verify", "--reference", "junk"],
                       "verify --candidate tp=x": [*ref, "--candidate", "tp=x"],
                       "verify --steps 0": [*ref, "--steps", "0"],
                       "verify --fault nope": [*ref, "--fault", "nope"],
                       "verify --lr nan": [*ref, "--lr", "nan"],
                       "verify --trial 999": [*ref, "--trial", "999"]}.items():
        cases.append((name, lambda t, a=argv: [*a, *study(t)]))
    rl = ["rl", "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100"]
    for opt, values in {"--prompt-len": ("0", BIG), "--response-len": ("-1",), "--mean-prompt-len": ("nan", "-1"),
                        "--mean-response-len": ("inf",), "--generations-per-prompt": ("0",),
                        "--prompts-per-step": ("0",), "--max-seq-len": ("1",), "--logprob-passes": ("0",),
                        "--training-precision": ("nope",), "--async-steps": ("-1", "99"),
                        "--rollout-gpus": ("3", "0"), "--engine-tp": ("0", "3"), "--engine-ep": ("0",),
                        "--gpu-memory-utilization": ("0", "1.5", "nan"), "--max-num-seqs": ("0",),
                        "--trainer-backend": ("nope",), "--trainer-layout": ("junk", "megatron:tp=x"),
                        "--top": ("-1",), "--framework": ("nope",), "--engine": ("nope",),
                        "--train-global-batch": ("-1", "7")}.items():
        for v in values:
            cases.append((f"rl {opt} {v[:8]!r}", lambda t, o=opt, v=v: [*rl, o, v]))
    for opt, v in (("--rollout-layout", "junk"), ("--rollout-layout", "vllm:tp=0"),
                   ("--trainer-layout", "megatron:tp=\n"), ("--prompt-len", "0"), ("--generations-per-prompt", "-1"),
                   ("--rollout-gpus", "33")):
        cases.append((f"rl calibrate {opt} {v[:10]!r}", lambda t, o=opt, v=v: [*RL_CALIBRATE, o, v]))
    for name, argv in {"calibrate --max-nfev 1": ["calibrate", "--data", DATA, "--max-nfev", "1"],
                       "calibrate --processes 0": ["calibrate", "--data", DATA, "--processes", "0"],
                       "calibrate without data": ["calibrate"],
                       "calibrate --study missing": ["calibrate", "--study", "missing"],
                       "validate without data": ["validate"]}.items():
        cases.append((name, lambda t, a=argv: [*a, "--out", str(t / "c.yaml"), "--results-dir", str(t)]
                      if a[0] == "calibrate" else a))
    return cases


def file_cases() -> list[tuple[str, Callable[[Path], list[str]]]]:
    """(name, make argv) of every other file a command reads, given each hostile file."""
    job = ["--model", "Llama-3.1-8B", "--gpus", "8xH200"]
    rl = ["rl", "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100"]

    def out(t: Path) -> list[str]:
        return ["--out", str(t / "c.yaml"), "--results-dir", str(t)]

    readers: dict[str, Callable[[Path, str], list[str]]] = {
        "--from": lambda t, f: ["--from", f, "--gpus", "8xH200", "--trials", "1", "--results-dir", str(t / "r")],
        "estimate --calibration": lambda t, f: ["estimate", *job, "--calibration", f],
        "estimate --model": lambda t, f: ["estimate", "--model", f, "--gpus", "8xH200"],
        "validate --trials": lambda t, f: ["validate", "--trials", f],
        "validate --calibration": lambda t, f: ["validate", "--data", DATA, "--calibration", f],
        "calibrate --data": lambda t, f: ["calibrate", "--data", f, *out(t)],
        "calibrate --calibration": lambda t, f: ["calibrate", "--data", DATA, "--calibration", f, "--max-nfev", "5",
                                                 *out(t)],
        "rl --response-lengths": lambda t, f: [*rl, "--response-lengths", f],
        "rl --calibration": lambda t, f: [*rl, "--calibration", f],
        "rl --model": lambda t, f: ["rl", "--model", f, "--gpus", "4x8xH100"],
        "rl calibrate --log": lambda t, f: ["rl", "calibrate", "--log", f, *RL_FIT],
        "rl validate --calibration": lambda t, f: [
            "rl", "validate", "--data", str(ROOT / "benchmarks" / "data" / "rl_runs.csv"), "--calibration", f],
    }
    data_files = ("validate --trials", "calibrate --data", "rl --response-lengths", "rl calibrate --log")
    cases: list[tuple[str, Callable[[Path], list[str]]]] = []
    for reader, argv in readers.items():
        for name, make in HOSTILE_TEXTS.items():
            if name == "int-5000" and reader in data_files:
                continue  # a long number in a data file is a value, not a document
            cases.append((f"{reader} {name}", lambda t, a=argv, m=make: a(t, m(t, "x.yaml"))))
    return cases


#: Run after each case (unmounting what it mounted).
CLEANUP: list[Callable[[], None]] = []
#: Where a mount is possible (root): the read-only and full-disk cases run.
CAN_MOUNT = os.geteuid() == 0 and sys.platform == "linux"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _read_only(folder: Path) -> Path:
    """Make ``folder`` read-only (a read-only bind mount of itself: root writes through ``chmod a-w``)."""
    _mount("--bind", str(folder), str(folder))
    CLEANUP.append(lambda: subprocess.run(["umount", "-l", str(folder)], check=False))
    _mount("-o", "remount,bind,ro", str(folder))
    return folder


def _full_disk(t: Path) -> Path:
    """A 256 KiB tmpfs at ``t/full``, filled to the last byte."""
    d = t / "full"
    d.mkdir()
    _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d))
    CLEANUP.append(lambda: subprocess.run(["umount", "-l", str(d)], check=False))
    with open(d / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    return d


Case = tuple[str, Callable[[Path], list[str]], str, int, str]
"""(name, make argv in a scratch folder, folder whose files must not change ("" none), exit code expected, words the
output must hold)."""


def store_cases(study_root: Path) -> list[Case]:
    """A journal study damaged, a journal with a cut last line, a read-only study and a full disk."""
    import shutil

    def copy(t: Path, damage: str = "none") -> tuple[Path, str]:
        res = t / "results"
        shutil.copytree(study_root, res)
        _plain_db(study_root / "base" / "study.db", res / "base" / "study.db")
        j = res / "jbase.log"
        lines = j.read_bytes().splitlines(keepends=True)
        if damage == "cut last line":
            j.write_bytes(b"".join(lines)[:-7])
        elif damage == "cut middle line":
            j.write_bytes(b"".join(lines[:2]) + lines[2][:-7] + b"\n" + b"".join(lines[3:]))
        elif damage == "empty":
            j.write_bytes(b"")
        elif damage == "delete":
            j.unlink()
        elif damage == "garbage":
            j.write_bytes(b"garbage\n" * 100)
        elif damage == "binary":
            j.write_bytes(b"\x00\xff" * 1000)
        return res, f"journal:{j}"

    reads = ([], ["pareto"], ["export"], ["report"], ["timeline"])
    cases: list[Case] = []
    for damage in ("cut middle line", "empty", "delete", "garbage", "binary", "cut last line"):
        for cmd in reads:
            def make(t: Path, d: str = damage, c: list[str] = cmd) -> list[str]:
                res, url = copy(t, d)
                if not c:  # a run of the journal's study from a new folder: the journal itself is what is refused
                    return ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--resume", "--trials", "1",
                            "--study", "jbase", "--results-dir", str(t / "fresh"), "--storage", url]
                tail = ["--out", str(t / "o.out")] if c in (["export"], ["report"], ["timeline"]) else []
                return [*c, *tail, "--study", "jbase", "--results-dir", str(res), "--storage", url]
            if not cmd and damage in ("empty", "delete"):
                continue  # a run into an empty or new journal from a new folder starts the study there
            readable = damage == "cut last line" and cmd
            cases.append((f"journal {damage} ({cmd[0] if cmd else 'tune'})", make, "results", 0 if readable else 2,
                          "cut" if readable else ""))
    if not CAN_MOUNT:
        return cases
    ro_reads = {"pareto": [], "pareto --csv": ["--csv", "{t}/o.csv"], "export --out": ["--out", "{t}/o.yaml"],
                "export slime --out": ["--format", "slime", "--out", "{t}/o.sh"],
                "report --out": ["--out", "{t}/r.html"], "timeline --out": ["--out", "{t}/t.json"]}
    for study, store in (("base", False), ("jbase", True)):
        for name, extra in ro_reads.items():
            def make(t: Path, n: str = name, e: list[str] = extra, s: str = study, j: bool = store) -> list[str]:
                res, url = copy(t)
                _read_only(res)
                return [n.split()[0], *[x.format(t=t) for x in e], "--study", s, "--results-dir", str(res),
                        *(["--storage", url] if j else [])]
            cases.append((f"read-only {'journal ' if store else ''}study: {name}", make, "results", 0, ""))
    resume = ["--model", "Llama-3.1-8B", "--gpus", "8xH200", "--resume", "--trials", "1"]
    for name, argv in {"report into the study": ["report"], "tune --resume": resume}.items():
        def make_ro(t: Path, a: list[str] = argv) -> list[str]:
            res, _ = copy(t)
            _read_only(res)
            return [*a, "--study", "base", "--results-dir", str(res)]
        cases.append((f"read-only study: {name}", make_ro, "results", 2, ""))
    full = {"export --out": ["export", "--format", "slime", "--out", "{f}/o.sh"],
            "report --out": ["report", "--out", "{f}/r.html"], "pareto --csv": ["pareto", "--csv", "{f}/o.csv"],
            "timeline --out": ["timeline", "--out", "{f}/t.json"], "timeline --png": ["timeline", "--png", "{f}/t.png"],
            "export --out (recipe)": ["export", "--out", "{f}/o.yaml"]}
    for name, argv in full.items():
        def make_full(t: Path, a: list[str] = argv) -> list[str]:
            res, _ = copy(t)
            f = _full_disk(t)
            return [*[x.format(f=f) for x in a], "--study", "base", "--results-dir", str(res)]
        cases.append((f"full disk: {name}", make_full, "full", 2, "disk is full"))
    job = ["--model", "Llama-3.1-8B", "--gpus", "8xH200"]
    for name, argv in {"tune (a new study)": [*job, "--trials", "2"],
                       "estimate --plot": ["estimate", *job, "--plot", "{f}/p.png"],
                       "rl --export": ["rl", "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--export",
                                       "{f}/rl.yaml"]}.items():
        def make_new(t: Path, a: list[str] = argv) -> list[str]:
            f = _full_disk(t)
            return [*[x.format(f=f) for x in a], *(["--results-dir", str(f / "r")] if a[0] == "--model" else [])]
        cases.append((f"full disk: {name}", make_new, "full", 2, "disk is full"))
    return cases


def _clean(r: object) -> tuple[bool, str]:
    out = r.output  # type: ignore[attr-defined]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    # one error line, or tune check's list of broken rules
    answer = sum(ln.startswith("error:") for ln in lines) == 1 or (lines and lines[0].startswith("invalid: "))
    ok = (r.exit_code == 2 and answer  # type: ignore[attr-defined]
          and "Traceback" not in out and "internal error" not in out)
    return ok, (lines[-1] if lines else "")[:200]


def process_cases(reps: int) -> list[dict[str, object]]:
    """Kill the driver of a trial (``kill -9``) ``reps`` times, and SIGTERM ``tune`` with a command trial twice."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = ("import os, sys, time\nfrom pathlib import Path\nfrom launch._trial import LocalProcess\n"
              "d = Path(sys.argv[1]) / '0'\nd.mkdir(parents=True)\n"
              "p = LocalProcess(['bash', '-c', 'sleep 300 & sleep 300'], log_path=d / 'log.txt',\n"
              "                 env=dict(os.environ), trial_dir=d)\n"
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
            p = subprocess.Popen([sys.executable, "-m", "tuner.cli", "--model", "Llama-3.1-8B", "--layers", "2",
                                  "--gpus", "1xH200", "--backend", "command", "--command-template", str(tpl),
                                  "--trials", "1", "--study", "s", "--results-dir", f"{t}/r"],
                                 env=env, cwd=t, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rec = Path(t) / "r" / "s" / "trials" / "0" / "process.json"
            while not rec.exists() and p.poll() is None:
                time.sleep(0.05)
            time.sleep(0.2)
            pgid = json.loads(rec.read_text())["pgid"]
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
            s = gone(pgid)
            rows.append({"case": f"SIGTERM of tune #{i + 1}", "ok": s is not None and rc == 130, "exit": rc,
                         "seconds_to_gone": s})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--kill-reps", type=int, default=5, help="kill -9 cases (0: no process cases)")
    ap.add_argument("--match", default="", help="run only the cases whose name holds this")
    ap.add_argument("--case-timeout", type=int, default=60, help="seconds a case may take before it counts as a hang")
    ap.add_argument("--memory-gib", type=float, default=4.0,
                    help="address-space limit of this process (a case past it fails)")
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
        for argv in (["--model", "Llama-3.1-8B", "--study", "base"], ["--model", "Qwen3-30B-A3B", "--study", "other"],
                     ["--model", "Llama-3.1-8B", "--study", "jbase", "--storage", f"journal:{study}/jbase.log"]):
            r = runner.invoke(app, [*argv, "--gpus", "8xH200", "--trials", "2", "--results-dir", str(study)])
            assert r.exit_code == 0, r.output  # type: ignore[attr-defined]
        cases: list[Case] = [(n, m, "", 2, "") for n, m in (*input_cases(), *option_cases(study), *file_cases())]
        cases += [(n, m, keep, 2, "") for n, m, keep in study_cases(study)]
        cases += store_cases(study)
        for i, (name, make, keep, expect, say) in enumerate(cases):
            if a.match and a.match not in name:
                continue
            t = Path(root) / f"c{i}"
            t.mkdir()
            try:
                args = make(t)
                folder = t / keep if keep else None
                before = _digest(folder) if folder is not None and folder.is_dir() else {}
                victim = (t / "victim.txt").read_bytes() if (t / "victim.txt").exists() else None
                t0 = time.monotonic()
                r = runner.invoke(app, args)
                seconds = round(time.monotonic() - t0, 2)
                if expect == 2:
                    ok, line = _clean(r)
                else:
                    out = r.output  # type: ignore[attr-defined]
                    ok = r.exit_code == 0 and "Traceback" not in out  # type: ignore[attr-defined]
                    line = ([ln for ln in out.splitlines() if ln.strip()] or [""])[-1][:200]
                said = say.lower() in " ".join(r.output.split()).lower()  # type: ignore[attr-defined]
                same = (_digest(folder) if folder is not None and folder.is_dir() else {}) == before
                intact = victim is None or (t / "victim.txt").read_bytes() == victim
                made = not (t / "no").exists()
                pwned = (Path.cwd() / "PWNED").exists()
                rows.append({"case": name, "ok": ok and said and same and intact and made and not pwned,
                             "exit": r.exit_code, "line": line, "unchanged": same and intact, "no_folder_made": made,
                             "seconds": seconds})
            finally:
                while CLEANUP:
                    CLEANUP.pop()()
    rows += process_cases(a.kill_reps) if a.kill_reps else []
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(textwrap.fill(f"FAIL {r['case']}: exit {r.get('exit')} {r.get('line', '')}", 80, subsequent_indent="  "))
    kills = [r["seconds_to_gone"] for r in rows if r.get("seconds_to_gone") is not None]
    print(f"{len(rows) - len(bad)} of {len(rows)} cases passed")
    if kills:
        print(f"trial groups gone after their driver died in at most {max(kills):.2f} s")
    if not CAN_MOUNT:
        print("read-only and full-disk cases left out: they need root (Linux)\n"
              "to mount a folder read-only or a small tmpfs")
    if a.out:
        a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
