"""RL step-model validation: fit per-cluster factors on NeMo-RL v0.4 + v0.5, judge on v0.6 (never fitted).

    python benchmarks/bench_rl.py            # needs the `rl` extra (aiconfigurator==0.12.0)

Prints the fitted factors per GPU, the step-time errors of the fit and judge sets, the
colocated-vs-split verdicts on the judge set, and the rows that cannot be predicted (with why).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from cost_model.rl.calibration import DEFAULT_RL_CALIBRATION
from cost_model.rl.validate import fit_calibration, predict_rows, read_runs, recalibrate

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    rows, errors = read_runs(ROOT / "benchmarks" / "data" / "rl_runs.csv")
    res = predict_rows(rows)
    fit = [r for r in res if r.row.source in ("nemo-rl-v0.4", "nemo-rl-v0.5")]
    judge = [r for r in res if r.row.source == "nemo-rl-v0.6"]
    cals = {g: fit_calibration([r for r in fit if r.row.gpu == g], source=f"fit on NeMo-RL v0.4+v0.5 {g} rows") for g in sorted({r.row.gpu for r in fit if r.plan})}
    out: dict[str, object] = {"calibration": {g: {k: round(getattr(c, k), 3) for k in ("generation_scale", "training_scale", "switch_fixed_s", "step_overhead_s")} for g, c in cals.items()}}
    for name, sub in (("fit", fit), ("judge", judge)):
        errs, lines = [], []
        for r in sub:
            if r.plan is None:
                lines.append(f"  not predicted: {r.row.label}: {r.error[:140]}")
                continue
            t = recalibrate(r.plan, DEFAULT_RL_CALIBRATION, cals.get(r.row.gpu, DEFAULT_RL_CALIBRATION))
            e = t / r.row.step_time_s - 1
            errs.append(abs(e))
            lines.append(f"  {r.row.label:58s} measured {r.row.step_time_s:6.1f} predicted {t:6.1f} ({e:+.0%})")
        out[name] = {"rows": len(sub), "predicted": len(errs), "median_abs_error": float(np.median(errs)) if errs else None, "max_abs_error": max(errs) if errs else None}
        print(f"{name}: " + json.dumps(out[name]))
        print("\n".join(lines))
    groups: dict[tuple[str, str, int], dict[bool, float]] = {}
    for r in judge:
        if r.plan is not None:
            t = recalibrate(r.plan, DEFAULT_RL_CALIBRATION, cals.get(r.row.gpu, DEFAULT_RL_CALIBRATION))
            groups.setdefault((r.row.model, r.row.gpu, r.row.num_gpus), {})[r.row.colocated] = t
            groups[(r.row.model, r.row.gpu, r.row.num_gpus)][("m", r.row.colocated)] = r.row.step_time_s  # type: ignore[index]
    for k, g in sorted(groups.items()):
        if True in g and False in g:
            pm = "split" if g[False] < g[True] else "colocated"
            mm = "split" if g[("m", False)] < g[("m", True)] else "colocated"  # type: ignore[index]
            print(f"colocated vs split {k}: measured faster {mm}, predicted faster {pm} ({'agree' if pm == mm else 'MISS'})")
    print("calibration per GPU:", json.dumps(out["calibration"]))
    print("unreadable rows:", errors or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
