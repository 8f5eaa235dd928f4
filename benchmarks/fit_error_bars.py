"""Fit the model's error bars (``cost_model/data/error_bars.yaml``) and judge them held out by model.

    PYTHONPATH=. python benchmarks/fit_error_bars.py --heldout ROWS.jsonl [--write] [--out DIR]

Inputs:
- ``--heldout``: every published run predicted by a calibration fitted without its model
  (``benchmarks/bench_validation.py --rows ROWS.jsonl``): throughput residuals;
- the one-GPU H200 trial rows with Transformer Engine (``benchmarks/results/h200_te_*/*/sweep.jsonl`` and
  ``probe*.jsonl``, read by ``tune validate --trials``): throughput residuals out of the fit's sample, and
  the measured reserved peaks (the memory band's high end);
- the published runs (``benchmarks/data/published_runs.csv``) under the shipped calibration: each ran, so its
  GPU memory over the predicted peak bounds measured / predicted from above (the memory band's low end).

Method, per family (dense / MoE x bf16 / fp8 recipes, and ``all``): ``x = log(measured / predicted)``; each
end of the band is the split-conformal quantile of ``x`` at ``a = 0.05`` per end (:func:`conformal_ends`: the
``k``-th smallest and the ``k``-th largest of the ``n`` rows, ``k = ceil((n + 1)(1 - a))``; Vovk, Gammerman and
Shafer, "Algorithmic Learning in a Random World", Springer 2005; Lei, G'Sell, Rinaldo, Tibshirani and
Wasserman, "Distribution-Free Predictive Inference for Regression", JASA 113(523), 2018), so that a new row
exchangeable with the fitted ones falls outside each end with probability at most ``a``. Each end is then
pulled towards the pooled band's with weight ``K / (n + K)`` (n rows in the family, K = :data:`SHRINK_ROWS`),
so a family of a few rows is not narrower than the evidence allows. Judged by leave-one-model-out: each
model's rows are judged against bands fitted on the other models' rows only. Prints one JSON object;
``--write`` writes the YAML.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]

#: Rows a family's own percentiles count as, against the pooled band (shrinkage weight K / (n + K)).
SHRINK_ROWS = 10
#: Share of the published runs that ran which the memory band's low end may call "surely over" the GPU.
MEMORY_LOW_QUANTILE = 0.01
#: Percentiles of the memory band's trial rows.
QUANTILES = (0.05, 0.95)
#: Miscoverage of each end of the 90% throughput band (split-conformal, :func:`conformal_ends`).
ALPHA_PER_END = 0.05


def _family(is_moe: bool, precision: str) -> str:
    return f"{'moe' if is_moe else 'dense'}-{'bf16' if precision.lower() == 'bf16' else 'fp8'}"


def heldout_rows(path: Path) -> list[dict[str, Any]]:
    """Published runs predicted held out by model: model, family, log(measured / predicted)."""
    moe = {}
    with open(ROOT / "benchmarks" / "data" / "published_runs.csv", newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            moe[r["id"]] = r["is_moe"].strip().upper().startswith("Y")
    with open(ROOT / "cost_model" / "data" / "seed_runs.csv", newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            moe.setdefault(r["id"], True)
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if not (d["predicted"] > 0 and d["published"] > 0):
            continue
        out.append(
            {
                "source": "published",
                "model": d["model"],
                "family": _family(moe.get(str(d["run_id"]), False), d["precision"]),
                "x": math.log(d["published"] / d["predicted"]),
            }
        )
    return out


def trial_rows() -> tuple[list[dict[str, Any]], list[float], list[str]]:
    """H200 trial rows with TE: throughput residuals, log(measured / predicted) of the reserved peak, and each
    row's job (model and precision: the rows that differ in layout only)."""
    from tuner.validate_trials import predict_trials, read_trials

    files = sorted(
        glob.glob(str(ROOT / "benchmarks/results/h200_te_*/*/sweep.jsonl"))
        + glob.glob(str(ROOT / "benchmarks/results/h200_te_*/*/probe*.jsonl"))
    )
    rows, _ = read_trials(files)
    preds = predict_trials(rows)
    tput, mem, jobs = [], [], []
    for p in preds:
        prec = str(getattr(p.row.workload.precision, "value", p.row.workload.precision))
        tput.append(
            {
                "source": "h200_trials",
                "model": p.row.model.name.split("[")[0],
                "family": _family(bool(p.row.model.num_experts), prec),
                "x": math.log(1.0 + p.step_error),
            }
        )  # measured / predicted tokens/s = predicted / measured step
        mem.append(-math.log(1.0 + p.memory_error))
        jobs.append(f"{p.row.model.name}/{prec}")
    return tput, mem, jobs


def shared_share(x: list[float], groups: list[str], min_rows: int = 3) -> float:
    """The share of the variance of ``x`` common to the rows of a group: ``1 - s_w^2 / s^2``, ``s_w`` the pooled
    within-group standard deviation over groups of at least ``min_rows`` rows, ``s`` the standard deviation of all
    (both with ``ddof = 1``), clipped to [0, 1]. The same reading as the trial policy's ``shared`` of throughput."""
    by: dict[str, list[float]] = defaultdict(list)
    for v, g in zip(x, groups, strict=True):
        by[g].append(v)
    big = [np.asarray(v) for v in by.values() if len(v) >= min_rows]
    within = sum(float(((v - v.mean()) ** 2).sum()) for v in big) / sum(len(v) - 1 for v in big)
    return float(min(1.0, max(0.0, 1.0 - within / float(np.var(x, ddof=1)))))


def published_memory_bounds() -> list[dict[str, Any]]:
    """log(HBM / predicted peak) of every representable published run (each ran, so it fitted its GPU)."""
    from cost_model.validate import predict_runs, read_runs

    data = ROOT / "benchmarks" / "data" / "published_runs.csv"
    with open(data, newline="", encoding="utf-8") as fh:
        fsdp = {r["id"] for r in csv.DictReader(fh) if r["use_megatron_fsdp"].strip().lower() == "true"}
    runs, _ = read_runs([data])
    out = []
    for p in predict_runs(runs):
        r = p.run
        if r.run_id in fsdp:  # Megatron-FSDP shards what the search space's layouts keep whole: not comparable
            continue
        assert r.cluster is not None and r.model is not None
        out.append(
            {
                "model": r.model_name,
                "family": _family(bool(r.model.num_experts), r.precision),
                "bound": math.log(r.cluster.gpu.hbm_bytes / 2**30 / p.peak_gib),
                "predicted_over_hbm": p.peak_gib > r.cluster.gpu.hbm_bytes / 2**30,
            }
        )
    return out


def _quantiles(x: list[float]) -> tuple[float, float]:
    lo, hi = np.quantile(np.asarray(x), QUANTILES)
    return float(lo), float(hi)


def conformal_ends(x: list[float], alpha: float = ALPHA_PER_END) -> tuple[float, float]:
    """The split-conformal lower and upper ends of ``x`` (n values): the ``k``-th smallest and the ``k``-th largest
    value, ``k = ceil((n + 1)(1 - alpha))`` (the empirical quantile of level ``k / n``, numpy's
    ``method="inverted_cdf"``). For ``n`` exchangeable values and one more, the new one is above the upper end
    (below the lower end) with probability at most ``alpha`` (Lei et al., JASA 2018, Theorem 2.1). Where
    ``k > n`` (fewer than ``1 / alpha - 1`` values) the exact end is infinite; the extreme value is taken and
    the family shrinkage of :func:`fit_bands` widens it towards the pooled band.

    Raises:
        ValueError: ``x`` is empty.
    """
    if not x:
        raise ValueError("conformal_ends: no values")
    xs = np.sort(np.asarray(x, dtype=float))
    n = len(xs)
    k = min(n, math.ceil((n + 1) * (1 - alpha) - 1e-9))  # the tolerance keeps an exact integer product exact
    return float(xs[n - k]), float(xs[k - 1])


def fit_bands(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Throughput bands per family (and ``all``) from rows with ``family`` and ``x``; log-scale ends."""
    pooled = conformal_ends([r["x"] for r in rows])
    out = {"all": {"lo": min(pooled[0], 0.0), "hi": max(pooled[1], 0.0), "rows": len(rows)}}
    fams: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        fams[r["family"]].append(r["x"])
        fams[r["family"].split("-")[0]].append(r["x"])
    for f, x in sorted(fams.items()):
        lo, hi = conformal_ends(x)
        w = SHRINK_ROWS / (len(x) + SHRINK_ROWS)
        lo, hi = (1 - w) * lo + w * pooled[0], (1 - w) * hi + w * pooled[1]
        out[f] = {"lo": min(lo, 0.0), "hi": max(hi, 0.0), "rows": len(x)}
    return out


def _band_of(bands: dict[str, dict[str, float]], family: str) -> dict[str, float]:
    return bands.get(family) or bands.get(family.split("-")[0]) or bands["all"]


def judge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Leave-one-model-out: coverage and median width of the 90% band over every row."""
    hits, widths, per_source = [], [], defaultdict(list)
    for m in sorted({r["model"] for r in rows}):
        bands = fit_bands([r for r in rows if r["model"] != m])
        for r in rows:
            if r["model"] != m:
                continue
            b = _band_of(bands, r["family"])
            hit = b["lo"] <= r["x"] <= b["hi"]
            hits.append(hit)
            per_source[r["source"]].append(hit)
            widths.append(math.exp(b["hi"]) - math.exp(b["lo"]))
    return {
        "rows": len(hits),
        "coverage": round(float(np.mean(hits)), 4),
        "median_width": round(float(np.median(widths)), 4),
        "coverage_by_source": {
            k: {"rows": len(v), "coverage": round(float(np.mean(v)), 4)} for k, v in per_source.items()
        },
    }


def memory_band(trial_mem: list[float], bounds: list[dict[str, Any]], shared: float) -> dict[str, dict[str, float]]:
    """The memory band (log-scale ends) per family: the high end is the largest measured / predicted peak of the
    trials; the low end (what "surely does not fit" is judged by) the :data:`MEMORY_LOW_QUANTILE` quantile of
    ``HBM / predicted`` over the published runs that ran, at most the trials' 5th percentile. ``sigma`` is the
    trials' standard deviation of ``log(measured / predicted)`` (the chance a layout fits, for the trial policy), and
    ``shared`` the share of its variance common to the layouts of one job (:func:`shared_share` by model and precision:
    what one layout's measured peak or out-of-memory says of the others')."""
    hi = max(max(trial_mem), 0.0)
    lo_trials = _quantiles(trial_mem)[0]
    sigma = float(np.std(trial_mem, ddof=1))
    out = {}
    fams: dict[str, list[float]] = defaultdict(list)
    for b in bounds:
        fams["all"].append(b["bound"])
        fams[b["family"].split("-")[0]].append(b["bound"])
    for f, x in fams.items():
        lo = float(np.quantile(np.asarray(x), MEMORY_LOW_QUANTILE))
        out[f] = {
            "lo": min(lo_trials, lo, 0.0),
            "hi": hi,
            "rows": len(x) + len(trial_mem),
            "sigma": sigma,
            "shared": shared,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heldout", required=True, help="JSON lines of bench_validation.py --rows")
    ap.add_argument("--write", action="store_true", help="write cost_model/data/error_bars.yaml")
    ap.add_argument("--out", default=None, help="also write the rows and the judgement into this folder")
    a = ap.parse_args()
    pub = heldout_rows(Path(a.heldout))
    trials, trial_mem, trial_jobs = trial_rows()
    rows = pub + trials
    bands = fit_bands(rows)
    bounds = published_memory_bounds()
    mem = memory_band(trial_mem, bounds, shared_share(trial_mem, trial_jobs))
    mem_cover = {
        "published_runs_low_end_at_or_below_hbm": round(
            float(np.mean([b["bound"] >= _band_of(mem, b["family"])["lo"] for b in bounds])), 4
        ),
        "published_runs_predicted_over_hbm": sum(b["predicted_over_hbm"] for b in bounds),
        "trial_peaks_at_or_below_high_end": round(float(np.mean([x <= mem["all"]["hi"] for x in trial_mem])), 4),
    }
    result = {
        "throughput_bands": {
            k: {"low": round(math.exp(v["lo"]), 4), "high": round(math.exp(v["hi"]), 4), "rows": v["rows"]}
            for k, v in bands.items()
        },
        "memory_bands": {
            k: {
                "low": round(math.exp(v["lo"]), 4),
                "high": round(math.exp(v["hi"]), 4),
                "sigma": round(v["sigma"], 4),
                "shared": round(v["shared"], 2),
                "rows": v["rows"],
            }
            for k, v in mem.items()
        },
        "throughput_judged_leave_one_model_out": judge(rows),
        "memory_checks": mem_cover,
        "rows": {"published_heldout": len(pub), "h200_trials": len(trials), "published_memory_bounds": len(bounds)},
        "median_abs_error": {
            "published_heldout": round(statistics.median(abs(math.exp(r["x"]) - 1) for r in pub), 4),
            "h200_trials": round(statistics.median(abs(math.exp(r["x"]) - 1) for r in trials), 4),
        },
    }
    print(json.dumps(result, indent=2))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fit_error_bars.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        with open(out / "residuals.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
    if a.write:
        doc = {"level": 0.9, "throughput": result["throughput_bands"], "memory": result["memory_bands"]}
        text = (
            "# Error bars of the analytical model: 90% intervals as multipliers of the prediction (measured / "
            "predicted).\n"
            "# Written by benchmarks/fit_error_bars.py from benchmarks/results/2026-12-07_error_bars/ (method: "
            "docs/error_bars.md).\n"
        )
        (ROOT / "cost_model" / "data" / "error_bars.yaml").write_text(
            text + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8"
        )


if __name__ == "__main__":
    main()
