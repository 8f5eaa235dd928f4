"""Benchmark (issue 14): published runs that differ in one setting: is the predicted order the measured order?

    PYTHONPATH=. python benchmarks/bench_published_pairs.py [--calibration FILE] [--json]

Pairs: ``benchmarks/data/published_pairs.csv`` (``docs/published_pairs.md``: two rows of
``benchmarks/data/published_runs.csv`` that agree on everything but one setting). For each pair whose changed setting
is the dispatcher, the EP size, the EP A2A overlap or the recompute modules, both rows are predicted with the given
calibration (default: the shipped one) and the predicted ratio b/a is compared with the published one. The target
(dispatcher and EP pairs): the predicted order is the measured order. Caveat of the data: every pair but one spans two
releases, whose own differences reach 2x (docs/published_pairs.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from cost_model.calibration import load_calibration
from cost_model.validate import predict_runs, read_runs

ROOT = Path(__file__).resolve().parents[1]


TARGET = ("dispatcher", "ep")
REPORTED = ("dispatcher", "ep", "a2a_overlap", "recompute")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    runs, _ = read_runs([ROOT / "benchmarks/data/published_runs.csv"])
    preds = {p.run.run_id: p for p in predict_runs(runs, load_calibration(a.calibration))}
    why = {r.run_id: r.unrepresentable for r in runs if r.unrepresentable}
    out = []
    for row in csv.DictReader((ROOT / "benchmarks/data/published_pairs.csv").open()):
        if row["changed"] not in REPORTED:
            continue
        pa, pb = preds.get(row["id_a"]), preds.get(row["id_b"])
        item = {
            "a": row["id_a"],
            "b": row["id_b"],
            "model": row["model"],
            "gpu": row["gpu_type"],
            "changed": row["changed"],
            "a_value": row["value_a"],
            "b_value": row["value_b"],
            "measured_ratio": float(row["ratio_b_over_a"]),
            "target": row["changed"] in TARGET,
        }
        if pa is None or pb is None:
            item["predicted_ratio"] = None
            item["note"] = "; ".join(
                f"{k}: {why.get(k, 'not estimated')}" for k in (row["id_a"], row["id_b"]) if k not in preds
            )
        else:
            item["predicted_ratio"] = pb.predicted / pa.predicted
            item["same_order"] = (item["predicted_ratio"] > 1) == (item["measured_ratio"] > 1)
        out.append(item)
    tgt = [x for x in out if x["target"] and x.get("predicted_ratio") is not None]
    ok = sum(1 for x in tgt if x["same_order"])
    if a.json:
        print(json.dumps({"pairs": out, "target_pairs": len(tgt), "target_same_order": ok}, indent=2))
        return 0
    print(
        f"{'pair':>9} {'model':18} {'GPU':6} {'changed':11} {'a -> b':28} {'measured b/a':>12} {'predicted b/a':>13} "
        "order"
    )
    for x in out:
        pr = "-" if x["predicted_ratio"] is None else f"{x['predicted_ratio']:.3f}"
        order = "" if x["predicted_ratio"] is None else ("same" if x["same_order"] else "WRONG")
        print(
            f"{x['a'] + '->' + x['b']:>9} {x['model'][:18]:18} {x['gpu']:6} {x['changed']:11} "
            f"{(x['a_value'] + ' -> ' + x['b_value'])[:28]:28} "
            f"{x['measured_ratio']:>12.3f} {pr:>13} {order}{('  ' + x['note']) if x.get('note') else ''}"
        )
    print(f"dispatcher / EP pairs (the target): predicted order = measured order in {ok} of {len(tgt)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
