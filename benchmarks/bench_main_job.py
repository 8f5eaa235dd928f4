"""Benchmark: the main job against enumerate + estimate of the whole space, in the same run (issue 13, item 7).

Targets: the main job ``tune --model MiniMax-M2 --gpus 64xH200`` (a fresh study each run) within 1.5x of
``benchmarks/bench_enumerate_estimate.py`` (enumerate, rule-check and estimate the whole default space: its
``total_s``), and at most 2 storage writes per trial of the ``model`` backend.

    python benchmarks/bench_main_job.py [--runs 3] [--checkout DIR]

``--checkout DIR`` times the main job of another copy of the project instead (its code first on PYTHONPATH; the
estimate benchmark and the write counter stay this one's), e.g. an earlier commit:
``mkdir /tmp/base && git archive a375e6a | tar -x -C /tmp/base``.

Each run measures, one after the other so that they share the machine's load:

* ``estimate_s``: ``bench_enumerate_estimate.py --repeat 3`` (median of 3 after a warm-up), in its own process;
* ``main_job_wall_s``: ``tune --model MiniMax-M2 --gpus 64xH200`` (as ``python -m tuner.cli``) as a user runs it
  (Python start-up, imports, enumerate, estimate, the study, the plot, the recipe, exit), in its own process;
* the same job once more in a process that counts (``--driver``): ``imports_s`` (``import tuner.cli``), ``job_s``
  (the command after its imports), the phases (``prepare_s``, ``study_s`` = ``run_study``, ``report_s`` = the
  rest: front, plot, recipe files, printing) and the storage writes: SQL transactions that wrote while the study
  was opened and while its trials ran (tests/tuner_tests/write_counter.py), per evaluated trial.

Prints one JSON line per run with ``ratio_wall`` = main_job_wall_s / estimate_s and ``ratio_job`` = job_s /
estimate_s, then one summary line (median and range over the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ["--model", "MiniMax-M2", "--gpus", "64xH200"]


def _driver(results_dir: str) -> None:
    """The main job in this process, timed by phase, its storage writes counted."""
    t0 = time.perf_counter()
    import tuner.cli as cli

    t1 = time.perf_counter()
    sys.path.insert(0, str(ROOT / "tests" / "tuner_tests"))  # this copy's write counter
    from write_counter import count_storage_writes

    import tuner.study as study_pkg

    marks: dict[str, float] = {}
    counts: dict[str, int] = {}
    prepare, run_study = study_pkg.prepare, study_pkg.run_study

    def timed_prepare(cfg):  # noqa: ANN001, ANN202
        marks["prepare0"] = time.perf_counter()
        try:
            return prepare(cfg)
        finally:
            marks["prepare1"] = time.perf_counter()

    def timed_run_study(prep, *, on_trial=None, backend=None):  # noqa: ANN001, ANN202
        def on(done: int, total: int) -> None:
            if done == 0:
                counts["tx_open"] = w.transactions
            if on_trial:
                on_trial(done, total)

        marks["study0"] = time.perf_counter()
        tx0 = w.transactions
        try:
            res = run_study(prep, on_trial=on, backend=backend)
            counts["evaluated"] = res.evaluated_now
            counts["skipped"] = res.skipped_now
            return res
        finally:
            marks["study1"] = time.perf_counter()
            counts["tx_open"] = counts.get("tx_open", w.transactions) - tx0
            counts["tx_trials"] = w.transactions - tx0 - counts["tx_open"]

    study_pkg.prepare, study_pkg.run_study = timed_prepare, timed_run_study
    with count_storage_writes() as w:
        t2 = time.perf_counter()
        try:
            cli.app([*JOB, "--results-dir", results_dir], standalone_mode=False)
        finally:
            t3 = time.perf_counter()
    out = {
        "imports_s": round(t1 - t0, 3), "job_s": round(t3 - t2, 3),
        "prepare_s": round(marks["prepare1"] - marks["prepare0"], 3), "study_s": round(marks["study1"] - marks["study0"], 3),
        "report_s": round(t3 - marks["study1"], 3),
        "writes_open": counts["tx_open"], "writes_trials": counts["tx_trials"], "evaluated": counts["evaluated"], "skipped": counts["skipped"],
        "writes_per_trial": round(counts["tx_trials"] / max(1, counts["evaluated"]), 3),
    }
    print("BENCH " + json.dumps(out))


def _wall(cmd: list[str], code: Path = ROOT) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=code, env=env)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return wall, p.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the copy of the project whose main job is timed (default: this one)")
    ap.add_argument("--driver", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver:
        _driver(a.driver)
        return
    code = a.checkout.resolve()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1, a.runs + 1):
            _, est_out = _wall([sys.executable, str(ROOT / "benchmarks" / "bench_enumerate_estimate.py"), "--repeat", "3"])
            est = json.loads(est_out.strip().splitlines()[-1])
            wall, _ = _wall([sys.executable, "-m", "tuner.cli", *JOB, "--results-dir", f"{tmp}/w{i}"], code)
            _, drv = _wall([sys.executable, str(Path(__file__).resolve()), "--driver", f"{tmp}/d{i}"], code)
            d = json.loads(next(x for x in drv.splitlines() if x.startswith("BENCH "))[6:])
            row = {"benchmark": "main_job", "run": i, "estimate_s": est["total_s"], "main_job_wall_s": round(wall, 2), **d,
                   "ratio_wall": round(wall / est["total_s"], 2), "ratio_job": round(d["job_s"] / est["total_s"], 2),
                   "load_avg_1m": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {"benchmark": "main_job_summary", "checkout": str(code), "runs": len(rows), "target_ratio": 1.5, "target_writes_per_trial": 2,
               "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    for k in ("estimate_s", "main_job_wall_s", "job_s", "study_s", "ratio_wall", "ratio_job", "writes_per_trial"):
        v = [r[k] for r in rows]
        summary[k] = {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
