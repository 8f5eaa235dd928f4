"""Benchmark (issue 3 targets): k-fold-by-model error of the cost model on published runs.

    PYTHONPATH=. python benchmarks/bench_validation.py [--data benchmarks/data/published_runs.csv] [--processes 2]
        [--hold-out MODEL ...] [--fine-tuning]

Each model's runs are predicted by a calibration fitted (``cost_model.calibrate``) on the
other models' runs (and the seed's two runs), so no number comes from fitting the rows it
is judged on. Prints one JSON object:
- ``moe_h100_b200``: H100 and B200 MoE rows, bf16 and fp8 recipes (fp8, fp8 blockwise,
  mxfp8): median |error| of tokens/s/GPU (target <= 15%) and Spearman within each model's
  rows that differ in layout (target >= 0.8);
- ``dense``: every dense row (target median |error| <= 10%);
- ``fine_tuning``: the SFT and LoRA rows (target median |error| <= 15%), each row listed;
- ``all`` and per-fold figures; ``seed_anchors``: the seed's runs under the shipped calibration.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from cost_model.calibrate import kfold_by_model
from cost_model.calibration import DEFAULT_CALIBRATION
from cost_model.validate import Prediction, _layout_groups, predict_runs, read_runs, spearman

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT / "benchmarks" / "data" / "published_runs.csv"))
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--max-nfev", type=int, default=60)
    ap.add_argument("--rows", default=None, help="also write every held-out row's prediction here (JSON lines)")
    ap.add_argument(
        "--hold-out", action="append", default=None, metavar="MODEL",
        help="run only this model's fold (repeatable; each still fitted on every other model's rows)",
    )
    ap.add_argument(
        "--fine-tuning",
        action="store_true",
        help="run only the folds of the models with SFT or LoRA rows (added to any --hold-out)",
    )
    a = ap.parse_args()
    t0 = time.perf_counter()
    runs, problems = read_runs([a.data, str(ROOT / "cost_model" / "data" / "seed_runs.csv")])
    models = a.hold_out
    if a.fine_tuning:
        tuned_models = {
            r.model.name
            for r in runs
            if r.model is not None and r.workload is not None and r.workload.task != "pretrain"
        }
        models = sorted(set(models or ()) | tuned_models)
    folds = kfold_by_model(runs, processes=a.processes, max_nfev=a.max_nfev, models=models)
    preds: list[Prediction] = []
    for f in folds.values():
        for r, p in zip(f["runs"], f["predicted"]):
            tok, tfl = (p, 0.0) if r.metric == "tokens" else (0.0, p)
            preds.append(Prediction(r, tok, tfl, True, 0.0))

    def stats(sel: list[Prediction]) -> dict[str, object]:
        e = np.abs([p.error for p in sel])
        rho: dict[str, float] = {}
        for m in sorted({p.run.model.name for p in sel}):
            pr, pu = _layout_groups([p for p in sel if p.run.model.name == m])
            v = spearman(pr, pu)
            if v == v:
                rho[m] = round(v, 3)
        return {
            "rows": len(sel),
            "median_abs_error": round(float(np.median(e)), 4) if len(e) else None,
            "mape": round(float(np.mean(e)), 4) if len(e) else None,
            "spearman_by_model": rho,
            "spearman_median": round(statistics.median(rho.values()), 3) if rho else None,
        }

    if a.rows:
        with open(a.rows, "w", encoding="utf-8") as fh:
            for p in preds:
                fh.write(
                    json.dumps(
                        {
                            "run_id": p.run.run_id,
                            "model": p.run.model.name,
                            "gpu_type": p.run.gpu_type,
                            "precision": p.run.precision,
                            "metric": p.run.metric,
                            "predicted": round(p.predicted, 2),
                            "published": p.published,
                            "error": round(p.error, 4),
                        }
                    )
                    + "\n"
                )
    moe = [
        p
        for p in preds
        if p.run.is_moe
        and p.run.gpu_type in ("H100", "B200")
        and p.run.precision != "nvfp4"
        and p.run.metric == "tokens"
    ]
    dense = [p for p in preds if not p.run.model.is_moe]
    tuned = [p for p in preds if p.run.workload.task in ("sft", "lora")]
    seed = {
        p.run.run_id: round(p.tokens_per_s_per_gpu, 1)
        for p in predict_runs([r for r in runs if "seed" in r.run_id], DEFAULT_CALIBRATION)
    }
    out = {
        "benchmark": "kfold_by_model",
        "data": a.data,
        "rows_estimated": len(preds),
        "rows_not_representable": sum(1 for r in runs if r.unrepresentable),
        "moe_h100_b200": stats(moe),
        "moe_h100_b200_by_precision": {
            k: stats([p for p in moe if p.run.precision == k]) for k in sorted({p.run.precision for p in moe})
        },
        "dense": stats(dense),
        "fine_tuning": {
            **stats(tuned),
            **{t: stats([p for p in tuned if p.run.workload.task == t]) for t in ("sft", "lora")},
            "rows_each": [
                {
                    "run_id": p.run.run_id,
                    "task": p.run.task,
                    "model": p.run.model.name,
                    "gpus": f"{p.run.num_gpus}x{p.run.gpu_type}",
                    "precision": p.run.precision,
                    "layout": p.run.layout.label,
                    "published": p.published,
                    "predicted": round(p.predicted, 1),
                    "error": round(p.error, 4),
                }
                for p in tuned
            ],
        },
        "all": stats(preds),
        "per_model": {m: stats([p for p in preds if p.run.model.name == m]) for m in folds},
        # each fold's release gain per month, measured on its training models' repeats
        # (cost_model.validate.measure_release_gain)
        "release_gain_per_month_by_fold": {m: round(f["release_gain"], 5) for m, f in folds.items()},
        "seed_anchors_shipped_calibration": {
            "tuned (measured 2034.42)": seed.get("seed-tuned"),
            "reference (measured 557.8)": seed.get("seed-reference"),
        },
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
