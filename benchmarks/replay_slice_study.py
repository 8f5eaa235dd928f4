"""The trial policy on a measured one-GPU slice study, replayed: its pick's gap to the measured best and its cost.

    PYTHONPATH=. python benchmarks/replay_slice_study.py RUNS.jsonl [--hbm-gib 79.6] [--orders 20]

``RUNS.jsonl`` is ``benchmarks/slice_study.py``'s output: every layout of the study measured twice (two passes).
The reference best is the layout of highest mean tokens/s/GPU over its runs. The policy
(:class:`tuner.study.policy.GainPolicy`, with the error bars and defaults the main job gives it) is run over the same
layouts; when it asks for a trial of a layout, it gets that layout's next recorded run (its tokens/s/GPU, or its
failure) and the run's recorded wall time as its cost (one GPU). Which of the two recorded runs comes first is drawn
per layout, ``--orders`` times (order 0: the first pass first). Prints one JSON object: the policy's pick, its gap
to the reference best, the trials and GPU-minutes it spent against measuring everything once and twice.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

GIB = 2**30


def _cases(path: Path) -> dict[str, dict[str, Any]]:
    cases: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        c = cases.setdefault(
            r["case"],
            {
                "layout": r["layout"],
                "runs": [],
                "pred_tps": r.get("pred_tokens_per_s_per_gpu"),
                "pred_step": r.get("pred_step_time_s"),
                "pred_peak_gib": r.get("pred_peak_gib"),
            },
        )
        c["runs"].append(r)
    return {k: v for k, v in cases.items() if v["pred_tps"] and v["pred_step"]}


def _codes(layouts: list[dict[str, Any]]) -> np.ndarray:
    keys = sorted({k for d in layouts for k in d if k != "world_size"})
    cols = []
    for k in keys:
        vals = [json.dumps(d.get(k), sort_keys=True) for d in layouts]
        uniq = sorted(set(vals))
        if len(uniq) > 1:
            cols.append([uniq.index(v) for v in vals])
    return np.asarray(cols, dtype=np.int64).T if cols else np.zeros((len(layouts), 1), dtype=np.int64)


def replay(
    cases: dict[str, dict[str, Any]], *, hbm_gib: float, order: int, live: Any = None, gpu_hours: float | None = None
) -> dict[str, Any]:
    from cost_model.uncertainty import error_bars
    from specs import load_model, parse_gpus
    from tuner.study.policy import GainPolicy, PolicyParams

    names = sorted(cases)
    bars = error_bars(load_model("Qwen3-30B-A3B"), parse_gpus("1xH100").gpu, "bf16")
    rng = np.random.default_rng(order)
    runs = {
        n: (list(cases[n]["runs"]) if order == 0 or rng.random() < 0.5 else list(reversed(cases[n]["runs"])))
        for n in names
    }
    pol = GainPolicy(
        predicted=np.array([cases[n]["pred_tps"] for n in names], float),
        step_time_s=np.array([cases[n]["pred_step"] for n in names], float),
        peak_bytes=np.array([(cases[n]["pred_peak_gib"] or 0.0) * GIB for n in names], float),
        codes=_codes([cases[n]["layout"] for n in names]),
        hbm_bytes=hbm_gib * GIB,
        gpus=1,
        params=PolicyParams(
            sigma=bars.throughput.sigma, bias=bars.throughput.mu, memory_sigma=bars.memory.sigma, startup_s=60.0,
            steps=8, max_runs=2, max_trials=40, gpu_hours=gpu_hours,
        ),
    )
    used = dict.fromkeys(names, 0)
    trials = []
    while True:
        d = pol.next()
        if d.index is None:
            reason = d.reason
            break
        n = names[d.index]
        if live is not None:  # run it now on this machine's GPU
            runs[n].append(live(n, len(trials)))
        if used[n] >= len(runs[n]):
            pol.failed[d.index] = True  # no recorded run left for it
            continue
        r = runs[n][used[n]]
        used[n] += 1
        wall = float(r.get("wall_s") or 0.0)
        steps = float(sum(r.get("step_times_s") or ()))
        ok = r.get("status") == "ok"
        peak = r.get("peak_reserved_gib")
        pol.observe(
            d.index,
            float(r["tokens_per_s_per_gpu"]) if ok else None,
            gpu_hours=wall / 3600,
            failed=not ok,
            startup_s=(wall - steps) if ok else None,
            peak_bytes=float(peak) * 2**30 if ok and peak else None,
            out_of_memory=r.get("status") == "oom",
        )
        trials.append(n)
    inc = pol.incumbent()
    means = {
        n: statistics.mean(r["tokens_per_s_per_gpu"] for r in runs[n] if r.get("status") == "ok")
        for n in names
        if any(r.get("status") == "ok" for r in runs[n])
    }
    best = max(means, key=lambda n: means[n]) if means else None
    pick = names[inc] if inc is not None else None
    return {
        "order": order,
        "pick": pick,
        "reference_best": best,
        "gap": (means[pick] / means[best] - 1) if pick in means and best else None,
        "trials": len(trials),
        "distinct_layouts": len(set(trials)),
        "gpu_minutes": pol.spent_gpu_hours * 60,
        "stop": reason,
    }


def _live(cases: dict[str, dict[str, Any]], hbm_gib: float) -> dict[str, Any]:
    """The policy run live: each trial it asks for is a new run of that layout on this machine's GPU."""
    from benchmarks import slice_study
    from benchmarks.slice_study_layouts import CASES

    by_id = {c["id"]: c for c in CASES}
    name = slice_study.card()
    gpus = "1xH200" if "H200" in name else "1xH100"
    slice_study.OUT.mkdir(parents=True, exist_ok=True)
    slice_study.WORK.mkdir(parents=True, exist_ok=True)
    live_rows: list[dict[str, Any]] = []

    def run(case: str, k: int) -> dict[str, Any]:
        row = slice_study.run_case(by_id[case], f"live{k}-{case}", name, gpus, 240.0)
        if row is None:
            raise SystemExit("the sweep refused before any trial")
        row["pass"] = "live"
        live_rows.append(row)
        (slice_study.OUT / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live_rows))
        return row

    # the policy sees only its own live runs; the recorded runs are the reference
    fresh = {n: {**c, "runs": []} for n, c in cases.items()}
    out = replay(fresh, hbm_gib=hbm_gib, order=0, live=run, gpu_hours=9 / 60)  # within one 10-minute device call
    ok = {n: [r["tokens_per_s_per_gpu"] for r in c["runs"] if r.get("status") == "ok"] for n, c in cases.items()}
    means = {n: statistics.mean(v) for n, v in ok.items() if v}
    best = max(means, key=lambda n: means[n])
    pick = out["pick"]
    out.update(
        reference_best=best,
        reference="mean of the recorded runs (RUNS.jsonl)",
        gap=(means[pick] / means[best] - 1) if pick in means else None,
        gpu_minutes_measuring_everything_twice=sum(
            float(r.get("wall_s") or 0) for c in cases.values() for r in c["runs"]
        )
        / 60,
        trials_run=[r["run_id"] for r in live_rows],
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs")
    ap.add_argument(
        "--hbm-gib", type=float, default=79.6, help="the card's memory (H100 80 GB: 79.6 GiB as nvidia-smi reports it)"
    )
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument(
        "--live",
        action="store_true",
        help="on the GPU machine: run each trial the policy asks for now (benchmarks/slice_study.py's run), "
        "and judge its pick against RUNS.jsonl's means; writes $OUT/live.jsonl",
    )
    a = ap.parse_args()
    cases = _cases(Path(a.runs))
    if a.live:
        print(json.dumps(_live(cases, a.hbm_gib), indent=2))
        return
    all_runs = [r for c in cases.values() for r in c["runs"]]
    everything = sum(float(r.get("wall_s") or 0) for r in all_runs) / 60
    once = sum(float(c["runs"][0].get("wall_s") or 0) for c in cases.values()) / 60
    res = [replay(cases, hbm_gib=a.hbm_gib, order=k) for k in range(a.orders)]
    gaps = [r["gap"] for r in res if r["gap"] is not None]
    print(
        json.dumps(
            {
                "layouts": len(cases),
                "runs": len(all_runs),
                "gpu_minutes_measuring_everything_twice": everything,
                "gpu_minutes_measuring_everything_once": once,
                "policy": {
                    "orders": len(res),
                    "median_gap": statistics.median(gaps) if gaps else None,
                    "worst_gap": min(gaps) if gaps else None,
                    "within_3pct": sum(1 for g in gaps if g >= -0.03) / len(res),
                    "median_gpu_minutes": statistics.median(r["gpu_minutes"] for r in res),
                    "median_trials": statistics.median(r["trials"] for r in res),
                },
                "replays": res,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
