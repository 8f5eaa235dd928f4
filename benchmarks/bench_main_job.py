"""Benchmark: the main job against its floor, enumerate + estimate of the main job's own space, in the same run.

Targets: the main job ``tune --model MiniMax-M2 --gpus 64xH200`` (a fresh study each run) within 2x of its cold floor,
and at most 2 storage writes per trial of the ``model`` backend.

    python benchmarks/bench_main_job.py [--runs 3] [--checkout DIR]

``--checkout DIR`` times the main job of another copy of the project instead (its code first on PYTHONPATH; the
floor and the write counter stay this one's), e.g. an earlier commit:
``mkdir /tmp/base && git archive a375e6a | tar -x -C /tmp/base``.

Each run measures, one after the other so that they share the machine's load:

* ``floor_wall_s``: a new process (``--floor``) that imports what enumerate + estimate need (specs, search_spaces,
  cost_model; not the study, the CLI or Optuna), builds the main job's space as ``tuner.study.prepare`` does for
  ``--stack slime`` and the ``model`` backend (the default space without the allgather dispatcher, production run
  options, the cluster's rule environment), enumerates, rule-checks and estimates it once, cold, and exits; its
  ``floor_s`` (the same, inside the process after Python's start-up), its considered / valid counts, which must be
  the main job's (checked), and its fitting count (at the default memory headroom);
* ``main_job_wall_s``: ``tune --model MiniMax-M2 --gpus 64xH200`` (as ``python -m tuner.cli``) as a user runs it
  (Python start-up, imports, enumerate, estimate, the study, the recipe, exit), in its own process;
* the same job once more in a process that counts (``--driver``): ``imports_s`` (``import tuner.cli``), ``job_s``
  (the command after its imports), the phases (``prepare_s``, ``study_s`` = ``run_study``, ``report_s`` = the
  rest: front, recipe files, report, printing) and the storage writes: SQL transactions that wrote while the study
  was opened and while its trials ran (tests/tuner_tests/write_counter.py), per evaluated trial.

Prints one JSON line per run with ``ratio_wall`` = main_job_wall_s / floor_wall_s and ``ratio_cpu`` (the same for the
two processes' user + system CPU time, the steadier figure on a loaded machine), then one summary line (median and
range over the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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
    from write_counter import count_storage_writes  # this copy's (tests/tuner_tests on the driver's PYTHONPATH)

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
        "imports_s": round(t1 - t0, 3),
        "job_s": round(t3 - t2, 3),
        "prepare_s": round(marks["prepare1"] - marks["prepare0"], 3),
        "study_s": round(marks["study1"] - marks["study0"], 3),
        "report_s": round(t3 - marks["study1"], 3),
        "writes_open": counts["tx_open"],
        "writes_trials": counts["tx_trials"],
        "evaluated": counts["evaluated"],
        "skipped": counts["skipped"],
        "writes_per_trial": round(counts["tx_trials"] / max(1, counts["evaluated"]), 3),
    }
    print("BENCH " + json.dumps(out))


def _floor() -> None:
    """Enumerate, rule-check and estimate the main job's space once, cold (see the module's docstring)."""
    t0 = time.perf_counter()
    from cost_model.estimate import estimate_table
    from search_spaces.rules import RuleEnv
    from search_spaces.space import SearchSpace, enumerate_layouts
    from specs import DEFAULT_RUN_OPTIONS, Workload, load_model, parse_gpus
    from specs.layout import Dispatcher

    t1 = time.perf_counter()
    model, cluster = load_model(JOB[1]), parse_gpus(JOB[3], require_network=True)
    w = Workload()
    space = SearchSpace.load(None)
    space = space.replace(dispatcher=tuple(d for d in space.dispatcher if d != Dispatcher.allgather))
    en = enumerate_layouts(space, model, cluster.num_gpus, w, RuleEnv.of(cluster, DEFAULT_RUN_OPTIONS))
    est = estimate_table(model, cluster, w, en.valid, options=DEFAULT_RUN_OPTIONS)
    fit = int((est.fits & est.host_fits).sum())
    t2 = time.perf_counter()
    print(
        "FLOOR "
        + json.dumps(
            {
                "floor_imports_s": round(t1 - t0, 3),
                "floor_s": round(t2 - t0, 3),
                "considered": en.considered,
                "valid": len(en.valid),
                "fit": fit,
            }
        )
    )


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _wall(cmd: list[str], code: Path = ROOT, *more: Path) -> tuple[float, str, float]:
    """Run ``cmd`` in ``code`` with ``code`` (then ``more``) as its PYTHONPATH: its wall time, stdout and CPU time
    (user + system)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (code, *more))}
    c, t = _children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=code, env=env)
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return wall, p.stdout, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--checkout", type=Path, default=ROOT,
        help="the copy of the project whose main job is timed (default: this one)",
    )
    ap.add_argument("--driver", help=argparse.SUPPRESS)
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver:
        _driver(a.driver)
        return
    if a.floor:
        _floor()
        return
    code = a.checkout.resolve()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1, a.runs + 1):
            floor_wall, fl_out, floor_cpu = _wall([sys.executable, str(Path(__file__).resolve()), "--floor"])
            fl = json.loads(next(x for x in fl_out.splitlines() if x.startswith("FLOOR "))[6:])
            wall, job_out, cpu = _wall([sys.executable, "-m", "tuner.cli", *JOB, "--results-dir", f"{tmp}/w{i}"], code)
            if f"Space: {fl['considered']:,} layouts, {fl['valid']:,} valid, " not in job_out:
                raise SystemExit(
                    f"the floor's space ({fl['considered']:,} layouts, {fl['valid']:,} valid) is not the main "
                    f"job's:\n{job_out[:1500]}"
                )
            _, drv, _ = _wall(
                [sys.executable, str(Path(__file__).resolve()), "--driver", f"{tmp}/d{i}"],
                code,
                ROOT / "tests" / "tuner_tests",
            )
            d = json.loads(next(x for x in drv.splitlines() if x.startswith("BENCH "))[6:])
            row = {
                "benchmark": "main_job",
                "run": i,
                "floor_wall_s": round(floor_wall, 2),
                "floor_cpu_s": round(floor_cpu, 2),
                **fl,
                "main_job_wall_s": round(wall, 2),
                "main_job_cpu_s": round(cpu, 2),
                **d,
                "ratio_wall": round(wall / floor_wall, 2),
                "ratio_cpu": round(cpu / floor_cpu, 2),
                "ratio_job_floor": round(d["job_s"] / fl["floor_s"], 2),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {
        "benchmark": "main_job_summary",
        "checkout": str(code),
        "runs": len(rows),
        "target_ratio": 2.0,
        "target_writes_per_trial": 2,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    for k in (
        "floor_wall_s", "floor_cpu_s", "floor_s", "main_job_wall_s", "main_job_cpu_s", "job_s", "study_s", "ratio_wall",
        "ratio_cpu", "ratio_job_floor", "writes_per_trial",
    ):
        v = [r[k] for r in rows]
        summary[k] = {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
