"""Benchmark: does the memory model agree that NVIDIA's published runs fit? (They all ran.)

    python benchmarks/bench_memory_published.py [--data benchmarks/data/published_runs.csv]

Prints, per (dense/MoE, precision, GPU), how many representable rows are predicted to fit with
the shipped calibration and the default headroom (0.07), and the median predicted peak over the GPU's memory.
A row predicted not to fit is a memory over-prediction (the run did fit).
"""

from __future__ import annotations

import argparse
import collections
import statistics
from pathlib import Path

from cost_model.validate import predict_runs, read_runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent / "data" / "published_runs.csv"))
    a = ap.parse_args()
    runs, _ = read_runs([a.data])
    preds = predict_runs(runs)
    groups: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for p in preds:
        r = p.run
        key = ("moe" if r.model.is_moe else "dense", str(getattr(r.workload.precision, "value", r.workload.precision)), r.cluster.gpu.name)
        groups[key].append(p.peak_gib / (r.cluster.gpu.hbm_bytes / 2**30))
    n_fit = sum(p.fits for p in preds)
    print(f"{len(preds)} rows estimated; predicted to fit: {n_fit}; predicted NOT to fit (they ran): {len(preds) - n_fit}")
    print(f"{'kind':6} {'precision':9} {'GPU':6} {'rows':>4} {'fit':>4} {'median peak/HBM':>16}")
    for k in sorted(groups):
        ratios = groups[k]
        fit = sum(1 for p in preds if ("moe" if p.run.model.is_moe else "dense", str(getattr(p.run.workload.precision, "value", p.run.workload.precision)), p.run.cluster.gpu.name) == k and p.fits)
        print(f"{k[0]:6} {k[1]:9} {k[2]:6} {len(ratios):>4} {fit:>4} {statistics.median(ratios):>16.2f}")


if __name__ == "__main__":
    main()
