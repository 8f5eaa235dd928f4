"""Benchmark: the search on simulated clusters (:mod:`benchmarks.search_bench`, :mod:`benchmarks.simulated`).

For each case, the candidates are prepared once (enumerate, check, estimate); then each world (a hidden truth drawn
from the model's held-out error structure, seeds 0 .. N-1) runs every policy: model-only top-1, the study with
today's default configuration (``queue``), the study with ``policy="gain"`` where the code has it, the gain policy
with slice trials and its sensitivity cases (``gain+slice``, ``slice-a2a``, ``slice-noa2a``, ``slice-300s``: simulated
only, ``benchmarks.search_bench.SLICE_POLICIES``), and random order with the GPU-hours of ``gain`` (else ``queue``).
Prints the table and writes the JSON (``--out``).

    python benchmarks/bench_search.py --worlds 200 --processes 2 --out benchmarks/results/<folder>/bench_search.json

Cases (``--cases``): ``minimax`` (``tune --model MiniMax-M2 --gpus 64xH200``, EFA v3 by default), ``deepseek``
(DeepSeek-V3 on 1,024 H100, ``--network ib-ndr``), ``llama70b`` (Llama-3.1-70B on 64 H100), ``small`` (a 2-layer
MiniMax-M2 slice on 8 H200, for a quick check).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from benchmarks.search_bench import POLICIES, TODAY_HEADROOM, WorldResult, prepare_case, run_world, summarize
from benchmarks.simulated import ErrorStructure, startup_seconds
from tuner.study import TuneConfig

ROOT = Path(__file__).resolve().parents[1]

#: The cases: TuneConfig fields (the ``command`` backend's run options: a production Megatron-core run with TE).
CASES: dict[str, dict[str, Any]] = {
    "minimax": {"model": "MiniMax-M2", "gpus": "64xH200"},
    "deepseek": {"model": "DeepSeek-V3", "gpus": "1024xH100", "network": "ib-ndr"},
    "llama70b": {"model": "Llama-3.1-70B", "gpus": "64xH100"},
    "small": {"model": "MiniMax-M2", "gpus": "8xH200", "layers": 2, "global_batch_size": 16},
}

_PREPARED: dict[str, Any] = {}


def _errors(case: Any, source: str) -> ErrorStructure:
    b = case.base
    return ErrorStructure.for_model(b.model, b.cluster.gpu, b.workload.precision, source=source)


def _one(task: tuple[str, int, tuple[str, ...], str]) -> list[dict[str, Any]]:
    name, seed, policies, source = task
    case = _PREPARED[name]
    return [{"case": name, **r.to_dict()} for r in run_world(case, seed, policies, errors=_errors(case, source))]


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _table(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        f"{'case':<8} {'policy':<12} {'n':>3} {'<=5%':>5} {'<=2%':>5} {'regret':>6} {'p90':>6} "
        f"{'GPU-h':>7} {'trials':>6} {'slices':>6} {'pruned':>5}"
    ]
    for case, by in summary.items():
        for p, s in by.items():
            lines.append(
                f"{case:<8} {p:<12} {s['worlds']:>3} {s['within_5pct']:>5.0%} {s['within_2pct']:>5.0%} "
                f"{s['regret_median']:>6.1%} {s['regret_p90']:>6.1%} {s['gpu_hours_median']:>7.1f} "
                f"{s['trials_median']:>6.0f} {s.get('slices_median', 0):>6.0f} {s['best_pruned']:>5.1%}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--worlds", type=int, default=200, help="worlds per case (seeds 0 .. N-1); 0 with --merge: only summarize"
    )
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--cases", default="minimax,deepseek,llama70b", help=f"comma-separated: {', '.join(CASES)}")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated: {', '.join(POLICIES)}")
    ap.add_argument(
        "--errors", choices=("bars", "kfold"), default="bars",
        help="size of the worlds' step-time error: the job's error bars (default) or the k-fold median error",
    )
    ap.add_argument(
        "--gpu-hours", type=float, default=None, help="the gain policy's budget (--gpu-hours; default none)"
    )
    ap.add_argument("--out", type=Path, help="JSON output file")
    ap.add_argument(
        "--merge", type=Path, nargs="*", default=[],
        help="JSON outputs of earlier runs: their worlds join this run's in the summary (a world run here wins)",
    )
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    policies = tuple(p for p in args.policies.split(",") if p)
    bad = [c for c in cases if c not in CASES] + [p for p in policies if p not in POLICIES]
    if bad or args.worlds < (0 if args.merge else 1) or args.processes < 1:
        ap.error(
            f"unknown case or policy {bad}; cases: {', '.join(CASES)}; policies: {', '.join(POLICIES)}"
            if bad
            else "--worlds (0 only with --merge) and --processes must be >= 1"
        )
    # each failed simulated trial (out of memory, crash, timeout) is logged by Optuna as a warning: keep errors only
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for h in logging.getLogger("optuna").handlers:
        h.addFilter(lambda r: r.levelno >= logging.ERROR)
    t0 = time.perf_counter()
    commit = _git_commit()  # the code this run imported
    meta: dict[str, Any] = {}
    for c in cases:
        t = time.perf_counter()
        case = prepare_case(TuneConfig.from_dict(dict(backend="command", gpu_hours=args.gpu_hours, **CASES[c])))
        _PREPARED[c] = case
        new, today = case.new, case.today
        e = _errors(case, args.errors)
        meta[c] = {
            "config": CASES[c],
            "cluster": new.cluster.label,
            "valid": new.n_valid,
            "candidates": new.n_fit,
            "contenders": int(new.contenders.sum()),
            "surely_fit": int(new.surely_fits.sum()),
            f"candidates_headroom_{TODAY_HEADROOM}": today.n_fit,
            "startup_s": startup_seconds(new.cluster.num_gpus),
            "errors": {
                "source": args.errors,
                "median_step_error": e.median_step_error,
                "throughput_bias": e.throughput_bias,
                "run_sigma": e.run_sigma,
                "crash_rate": e.crash_rate,
                "hang_rate": e.hang_rate,
            },
            "prepare_s": round(time.perf_counter() - t, 2),
        }
        print(
            f"{c}: {new.n_valid:,} valid, {new.n_fit:,} candidates ({meta[c]['contenders']:,} contenders),\n"
            f"  {today.n_fit:,} with headroom {TODAY_HEADROOM}; prepared in {meta[c]['prepare_s']} s",
            flush=True,
        )
    tasks = [
        (c, s, policies, args.errors) for c in cases for s in range(args.first_seed, args.first_seed + args.worlds)
    ]
    rows: list[dict[str, Any]] = []
    if args.processes > 1:
        with mp.get_context("fork").Pool(args.processes) as pool:
            for i, out in enumerate(pool.imap_unordered(_one, tasks, chunksize=1)):
                rows.extend(out)
                if (i + 1) % 20 == 0:
                    print(f"{i + 1}/{len(tasks)} worlds, {time.perf_counter() - t0:.0f} s", flush=True)
    else:
        for task in tasks:
            rows.extend(_one(task))
    have = {(r["case"], r["seed"], r["policy"]) for r in rows}
    for f in args.merge:
        old = json.loads(f.read_text())
        for r in old["worlds"]:
            k = (r["case"], r["seed"], r["policy"])
            if r["case"] in cases and k not in have:
                rows.append(r)
                have.add(k)
    summary = {
        c: summarize(WorldResult(**{k: v for k, v in r.items() if k != "case"}) for r in rows if r["case"] == c)
        for c in cases
    }
    print(_table(summary))
    seconds = time.perf_counter() - t0
    print(
        f"{len(tasks)} worlds run in {seconds:.0f} s"
        + (f", worlds of {len(args.merge)} earlier runs merged" if args.merge else "")
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "benchmark": "bench_search",
                    "argv": sys.argv[1:],
                    "merged": [str(f) for f in args.merge],
                    "commit": commit,
                    "cases": meta,
                    "policies": policies,
                    "summary": summary,
                    "worlds": sorted(rows, key=lambda r: (r["case"], r["seed"], POLICIES.index(r["policy"]))),
                    "seconds": round(seconds, 1),
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
