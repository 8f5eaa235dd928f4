"""Benchmark: does the memory model agree that NVIDIA's published runs fit? (They all ran.)

    python benchmarks/bench_memory_published.py [--data benchmarks/data/published_runs.csv] [--stack-settings]

Prints, per (dense/MoE, precision, GPU), how many representable rows are predicted to fit with
the shipped calibration and the default headroom (0.07), and the median predicted peak over the GPU's memory.
A row predicted not to fit is a memory over-prediction (the run did fit).

``--stack-settings`` reads each Megatron-Bridge row (its ``framework_version`` names Megatron-Bridge) with that
stack's preset (``specs/data/stacks/megatron-bridge.yaml``) for the settings the row leaves blank (no column value and
no ``key=value`` note): main-gradient dtype, cross-entropy fusion and its implementation, the bf16 optimizer's fp8
recipe. It then also lists, both ways, every row predicted above its GPU's memory (0% headroom).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import re
import statistics
from pathlib import Path

from cost_model.validate import predict_runs, read_runs

#: The run options the Megatron-Bridge preset sets that change a published row's predicted memory, by CSV column.
STACK_COLUMNS = (
    "grad_reduce_in_fp32", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "optimizer_fp8_recipe",
)


def with_stack_settings(runs: list, path: str) -> list[str]:
    """Give each Megatron-Bridge row the preset's value of every :data:`STACK_COLUMNS` setting it leaves blank (in
    place); returns the ids of the rows changed."""
    from specs import Precision
    from specs.stacks import RunFlags, resolve_run_options

    preset = resolve_run_options(RunFlags(), "megatron-bridge").options
    with open(path, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    changed = []
    for r in runs:
        if r.unrepresentable or r.options is None:
            continue
        row = rows[r.row - 1]
        if "megatron-bridge" not in row.get("framework_version", "").lower():
            continue
        notes = row.get("other_notes", "")
        blank = [c for c in STACK_COLUMNS if not (row.get(c) or "").strip() and not re.search(rf"\b{c}=", notes)]
        if r.workload.precision != Precision.bf16:
            blank = [c for c in blank if c != "optimizer_fp8_recipe"]
        new = dataclasses.replace(r.options, **{c: getattr(preset, c) for c in blank})
        if new != r.options:
            r.options = new
            changed.append(r.run_id)
    return changed


def _over(preds: list) -> list[str]:
    return [p.run.run_id for p in preds if p.peak_gib > p.run.cluster.gpu.hbm_bytes / 2**30]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent / "data" / "published_runs.csv"))
    ap.add_argument(
        "--stack-settings", action="store_true", help="also read Megatron-Bridge rows with the preset's settings"
    )
    a = ap.parse_args()
    runs, _ = read_runs([a.data])
    preds = predict_runs(runs)
    if a.stack_settings:
        before = _over(preds)
        changed = with_stack_settings(runs, a.data)
        preds = predict_runs(runs)
        print(f"row settings only: {len(before)} rows predicted above their GPU's memory: {' '.join(before)}")
        print(
            f"Megatron-Bridge preset for blank settings ({len(changed)} rows changed): {len(_over(preds))} rows: "
            f"{' '.join(_over(preds))}"
        )
    groups: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for p in preds:
        r = p.run
        key = (
            "moe" if r.model.is_moe else "dense",
            str(getattr(r.workload.precision, "value", r.workload.precision)),
            r.cluster.gpu.name,
        )
        groups[key].append(p.peak_gib / (r.cluster.gpu.hbm_bytes / 2**30))
    n_fit = sum(p.fits for p in preds)
    print(
        f"{len(preds)} rows estimated; predicted to fit: {n_fit}; predicted NOT to fit (they ran): {len(preds) - n_fit}"
    )
    print(f"{'kind':6} {'precision':9} {'GPU':6} {'rows':>4} {'fit':>4} {'median peak/HBM':>16}")
    for k in sorted(groups):
        ratios = groups[k]
        fit = sum(
            1
            for p in preds
            if (
                "moe" if p.run.model.is_moe else "dense",
                str(getattr(p.run.workload.precision, "value", p.run.workload.precision)),
                p.run.cluster.gpu.name,
            )
            == k
            and p.fits
        )
        print(f"{k[0]:6} {k[1]:9} {k[2]:6} {len(ratios):>4} {fit:>4} {statistics.median(ratios):>16.2f}")


if __name__ == "__main__":
    main()
