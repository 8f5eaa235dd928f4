"""RL benchmarks: the step model against NeMo-RL's published step times, the engine model against published decode runs.

    python benchmarks/bench_rl.py            # both parts; needs the `rl` extra (aiconfigurator==0.12.0)
    python benchmarks/bench_rl.py steps      # fit per-cluster factors on NeMo-RL v0.4 + v0.5, judge on v0.6
    python benchmarks/bench_rl.py engine     # benchmarks/data/engine_decode.csv + aiconfigurator's silicon samples

``steps`` prints the fitted factors per GPU, the step-time errors of the fit and judge sets, the
colocated-vs-split verdicts on the judge set, and the rows that cannot be predicted (with why).

``engine`` predicts every row of ``benchmarks/data/engine_decode.csv`` (published vLLM / SGLang
serving runs of MoE models on H100 / H200, provenance in ``engine_decode.md``) with the engine model
``tune rl`` uses (aiconfigurator's per-iteration latency driving the continuous-batching simulator,
:mod:`benchmarks.rl_serving`) and prints the error of each row, the median |error| of the closed-load
(decode) rows, TPOT rows alone and throughput rows alone, the open-load (``--request-rate inf``) rows
apart, and aiconfigurator's own silicon samples apart again (not independent of it). Nothing is fitted.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.rl_serving import ServingPrediction, predict_serving, read_serving_runs, silicon_runs, summarise_serving
from rl.calibration import DEFAULT_RL_CALIBRATION
from rl.validate import fit_calibration, fit_calibrations, predict_rows, read_runs, recalibrate

ROOT = Path(__file__).resolve().parents[1]


def _judge(name: str, sub: list, cals: dict) -> tuple[dict[str, object], list[str]]:
    errs, lines = [], []
    for r in sub:
        if r.plan is None:
            lines.append(f"  not predicted: {r.row.label}: {r.error[:400]}")
            continue
        t = recalibrate(r.plan, DEFAULT_RL_CALIBRATION, cals.get(r.row.gpu, DEFAULT_RL_CALIBRATION))
        e = t / r.row.step_time_s - 1
        errs.append(abs(e))
        lines.append(f"  {r.row.label:58s} measured {r.row.step_time_s:6.1f} predicted {t:6.1f} ({e:+.0%})")
    out = {
        "rows": len(sub),
        "predicted": len(errs),
        "median_abs_error": float(np.median(errs)) if errs else None,
        "max_abs_error": max(errs) if errs else None,
    }
    return out, lines


def _verdicts(judge: list, cals: dict) -> list[str]:
    groups: dict[tuple[str, str, int], dict[object, float]] = {}
    for r in judge:
        if r.plan is not None:
            t = recalibrate(r.plan, DEFAULT_RL_CALIBRATION, cals.get(r.row.gpu, DEFAULT_RL_CALIBRATION))
            g = groups.setdefault((r.row.model, r.row.gpu, r.row.num_gpus), {})
            g[r.row.colocated] = t
            g[("measured", r.row.colocated)] = r.row.step_time_s
    out = []
    for k, g in sorted(groups.items()):
        if True in g and False in g:
            pm = "split" if g[False] < g[True] else "colocated"
            mm = "split" if g[("measured", False)] < g[("measured", True)] else "colocated"
            out.append(
                f"colocated vs split {k}: measured faster {mm} ({g[('measured', True)]:g} vs "
                f"{g[('measured', False)]:g} s), "
                f"predicted faster {pm} ({g[True]:.1f} vs {g[False]:.1f} s) ({'agree' if pm == mm else 'MISS'})"
            )
    return out


def _factors(cals: dict) -> dict[str, dict[str, float]]:
    return {
        g: {
            k: round(getattr(c, k), 3)
            for k in ("generation_scale", "training_scale", "switch_fixed_s", "step_overhead_s")
        }
        for g, c in cals.items()
    }


def steps() -> int:
    """The step-model part: fit on v0.4 + v0.5, judge on v0.6 (never fitted).

    The protocol's factors: per-GPU generation and training scales, fixed costs (switch, step
    overhead) shared by all GPUs (:func:`rl.validate.fit_calibrations`). The per-GPU fit
    of all four (:func:`~rl.validate.fit_calibration` per GPU) is printed after it for comparison.
    """
    rows, errors = read_runs(ROOT / "benchmarks" / "data" / "rl_runs.csv")
    res = predict_rows(rows)
    fit = [r for r in res if r.row.source in ("nemo-rl-v0.4", "nemo-rl-v0.5")]
    judge = [r for r in res if r.row.source == "nemo-rl-v0.6"]
    shared = fit_calibrations(fit, source="fit on NeMo-RL v0.4+v0.5")
    for name, sub in (("fit", fit), ("judge", judge)):
        summary, lines = _judge(name, sub, shared)
        print(f"{name}: " + json.dumps(summary))
        print("\n".join(lines))
    print("\n".join(_verdicts(judge, shared)))
    print("calibration (per-GPU scales, shared fixed costs):", json.dumps(_factors(shared)))
    per_gpu = {
        g: fit_calibration([r for r in fit if r.row.gpu == g], source=f"fit on NeMo-RL v0.4+v0.5 {g} rows")
        for g in sorted({r.row.gpu for r in fit if r.plan})
    }
    print("comparison: every factor fitted per GPU:", json.dumps(_factors(per_gpu)))
    for name, sub in (("fit", fit), ("judge", judge)):
        print(f"  {name}: " + json.dumps(_judge(name, sub, per_gpu)[0]))
    print("  " + "\n  ".join(_verdicts(judge, per_gpu)))
    print("unreadable rows:", errors or "none")
    return 0


def _print_rows(results: list[ServingPrediction]) -> None:
    for r in results:
        row = r.row
        head = f"  {row.id:44s} {row.metric:21s} measured {row.measured:9.2f}"
        if r.predicted is None:
            print(f"{head}  not predicted: {r.error[:150]}")
        else:
            assert r.rel_error is not None
            print(f"{head} predicted {r.predicted:9.2f} ({r.rel_error:+.0%})")


def engine() -> int:
    """The engine-model part: published decode runs, then aiconfigurator's silicon samples."""
    rows, errors = read_serving_runs(ROOT / "benchmarks" / "data" / "engine_decode.csv")
    res = [predict_serving(r) for r in rows]
    closed = [r for r in res if r.row.load == "closed"]
    opened = [r for r in res if r.row.load == "open"]
    print("published closed-load (--max-concurrency) rows: the decode target")
    _print_rows(closed)
    print("published open-load (--request-rate inf) rows: serving throughput, reported apart")
    _print_rows(opened)
    summary = {
        "closed, every metric (the target: median |error| <= 25%)": summarise_serving(closed),
        "closed, tpot_ms only": summarise_serving([r for r in closed if r.row.metric == "tpot_ms"]),
        "closed, throughput only": summarise_serving([r for r in closed if r.row.metric != "tpot_ms"]),
        "open (rate inf), throughput": summarise_serving(opened),
    }
    for k, v in summary.items():
        print(f"{k}: {json.dumps(v)}")
    print("unreadable rows:", errors or "none")
    try:
        srows, skipped = silicon_runs()
    except Exception as e:  # aiconfigurator missing: the published part above still ran
        print(f"silicon samples: not run ({e})")
        return 0
    sres = [predict_serving(r) for r in srows]
    groups: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for r in sres:
        if r.rel_error is not None:
            groups[(r.row.notes, r.row.gpu, str(r.row.engine), r.row.shape.label)].append(r.rel_error)
    print(
        "aiconfigurator silicon samples (H100 / H200, vLLM / SGLang, MoE; NOT independent of aiconfigurator), TPOT by "
        "model and shape:"
    )
    for k, v in sorted(groups.items()):
        print(
            f"  {' '.join(k):62s} rows {len(v):3d} median error {np.median(v):+.0%} median |error| "
            f"{np.median(np.abs(v)):.0%}"
        )
    print(
        "silicon samples, TPOT: "
        + json.dumps(summarise_serving(sres))
        + f"; set aside: {len(skipped)} (inconsistent shapes)"
    )
    for r in sres:
        if r.predicted is None:
            print(f"  not predicted: {r.row.id}: {r.error[:150]}")
    return 0


def main(argv: list[str]) -> int:
    parts = argv or ["steps", "engine"]
    unknown = [p for p in parts if p not in ("steps", "engine")]
    if unknown:
        print(f"unknown part(s) {unknown}; accepted: steps, engine", file=sys.stderr)
        return 2
    rc = 0
    for p in parts:
        print(f"=== {p}")
        rc |= steps() if p == "steps" else engine()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
