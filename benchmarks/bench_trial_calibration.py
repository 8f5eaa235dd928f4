"""Benchmark (issue 4 calibration target): calibrate on half of the measured H200 layouts, judge on the other half.

    PYTHONPATH=. python benchmarks/bench_trial_calibration.py [--data tests/fixtures/h200_minimax_slice.jsonl]
        [--reverse] [--out calibration-h200-no-te.yaml] [--json]
    PYTHONPATH=. python benchmarks/bench_trial_calibration.py --fit-data FILE [FILE ...] [--fit-gpus 2xH200 ...]
        --judge-data FILE [FILE ...] [--judge-gpus 4xH200 ...] [--out ...] [--json]

Data: the 12 finished 4 x H200 layouts of a MiniMax-M2 4-layer slice (seq 8,192, global batch 8)
in ``tests/fixtures/h200_minimax_slice.jsonl`` (docs/measurements.md). They ran on megatron-core
WITHOUT Transformer Engine (experts as a per-expert Python loop, no grouped GEMM, unfused
kernels), so the fitted constants describe that stack, not the production one; the shipped
calibration (cost_model/data/calibration.yaml) is neither used as a target nor changed.

Split: the finished 4-GPU layouts sorted by their step time predicted with the shipped
calibration (ties by row number), then alternating: positions 0, 2, 4, ... are the fit half,
1, 3, 5, ... the judge half, so both halves span the predicted range. ``--reverse`` swaps them.

Fit (``cost_model.calibrate.fit_observations``, starting from the shipped calibration): the
step-time constants of ``TRIAL_STEP_NAMES`` to the fit half's median step times, then the memory
constants (allocator overhead fraction, CUDA context, NCCL buffers) to its peak *reserved*
memory (what runs out). A second memory fit to peak *allocated* memory is reported for reference.

Prints, before and after calibration, for the fit half (in-sample) and the judge half
(out-of-sample): median and max |error| of step time, of peak memory against reserved and
against allocated, and Spearman of step time; then whether the issue's targets are met on the
judge half (peak memory vs reserved median <= 5% and max <= 10%, step time median <= 10%,
Spearman >= 0.9). ``--json`` prints the same as one JSON object.

Extrapolation mode (``--fit-data`` with ``--judge-data``, instead of ``--data``): fit on every
finished row of the fit files and judge on every finished row of the judge files, e.g. fit on
the 1- and 2-GPU sweeps of benchmarks/results/h200_x2_2026-11-29/ and judge on the 4-GPU rows
of the fixture (``--judge-gpus 4xH200``: the fixture also holds three 2-GPU rows of an older,
shorter protocol), or the reverse by swapping the two. A row is used when its status is "ok"
and it has a step time (and its GPUs are among ``--fit-gpus`` / ``--judge-gpus`` when given;
rows whose ``versions`` say Transformer Engine was installed are skipped); the output says how
many rows each file gave and why the others were left out. Each row is predicted as the
harness ran it: its slice depth from its ``model`` field (``MiniMax-M2[2 layers]``; ``--layers``
when the field has none), its GPUs from its ``gpus`` field, and its layout through
``launch.harness.spec.harness_layout`` without Transformer Engine (the precision-aware optimizer
off unless the optimizer is offloaded: rows listed with it on were run with fp32 master
weights). The same fits and scores as above are printed for the fit set (in-sample) and the
judge set (out-of-sample), the targets on the judge set, and the judge rows with their signed
errors (labels: GPUs, slice depth, row number, layout, micro-batch size, token dispatcher,
recompute, ``no-distopt``); ``--json`` has the files (rows kept, skipped and why) under
``data``, the rows of each set under ``sets``, the rows the mapping changed under
``harness_layout_changed`` and the targets under ``targets_judge_set``. The default mode predicts its rows the same way
(its 4-GPU rows are 4-layer slices with the precision-aware optimizer already off, so the mapping changes none of them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cost_model.calibrate import Observation, fit_observations, predict_observations
from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.validate import spearman
from launch.harness.spec import HarnessEnv, harness_layout
from search_spaces.rules import check_layout
from specs import Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.layout import Layout
from specs.model import slice_model

ROOT = Path(__file__).resolve().parents[1]


FIXTURE = ROOT / "tests" / "fixtures" / "h200_minimax_slice.jsonl"
STACK_NOTE = (
    "fitted to real trials of megatron-core 0.19.2 WITHOUT Transformer Engine (local spec, SDPA attention, "
    "experts as SequentialMLP: a per-expert loop, no grouped GEMM) on H200; describes that stack, not the TE stack "
    "of the shipped calibration"
)
TARGETS = {"peak_reserved_median": 0.05, "peak_reserved_max": 0.10, "step_median": 0.10, "spearman": 0.9}
NO_TE = HarnessEnv(transformer_engine=False)
"""The environment these trials ran in (STACK_NOTE): what :func:`harness_layout` maps a listed layout through."""
DEFAULT_MODEL = "MiniMax-M2"
_MODEL_FIELD = re.compile(r"^\s*(?P<name>.+?)\s*\[(?P<layers>\d+) layers?\]\s*$")


def read_rows(path: Path, gpus: str = "4xH200") -> list[dict[str, Any]]:
    """Finished rows of ``gpus`` (failed or timed-out layouts have no measurement)."""
    kept, _ = read_data_rows(path, [gpus])
    return [{k: v for k, v in r.items() if k != "_id"} for r in kept]


def row_model(row: dict[str, Any], layers: int) -> tuple[str, int]:
    """(model name, slice depth) of a row: from its ``model`` field (``MiniMax-M2[2 layers]``), else ``layers``."""
    field = str(row.get("model") or "")
    m = _MODEL_FIELD.match(field)
    if m:
        return m["name"], int(m["layers"])
    return field.strip() or DEFAULT_MODEL, layers


def ran_layout(row: dict[str, Any]) -> Layout:
    """The row's layout as the harness ran it (no Transformer Engine: precision-aware optimizer off unless
    offloaded)."""
    return harness_layout(Layout.from_dict(row["layout"]), NO_TE)


def rel(path: str | Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _row_problem(r: Any, layers: int) -> str | None:
    """Why a finished row cannot be predicted (malformed field, a layout that breaks a rule), or None."""
    if not isinstance(r.get("n"), int) or not isinstance(r.get("layout"), dict):
        return "malformed (needs an integer n and a layout object)"
    try:
        name, depth = row_model(r, layers)
        model = slice_model(load_model(name), depth)
        parse_gpus(str(r.get("gpus")))
        w = Workload(seq_length=r.get("seq_length"), global_batch_size=r.get("global_batch_size"))
        lay = Layout.from_dict(r["layout"])
    except (TunerError, KeyError, TypeError, ValueError) as e:
        return f"malformed ({str(e).splitlines()[0][:120]})"
    broken = check_layout(lay, model, w)
    return f"breaks rule {broken[0][0]}" if broken else None


def read_data_rows(
    path: Path, gpus: Sequence[str] | None = None, layers: int = 4
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Finished rows of ``path`` (of ``gpus`` when given), each with ``_id`` (file#n), and why the others were skipped.

    Raises:
        ValueError: a line that is not a JSON object (with its line number).
    """
    kept: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {lineno}: not JSON ({e.msg})") from None
        if not isinstance(r, dict):
            raise ValueError(f"line {lineno}: a {type(r).__name__}, not a JSON object")
        versions = r.get("versions") if isinstance(r.get("versions"), dict) else {}
        te = str(versions.get("transformer_engine", "not installed"))
        if r.get("status") != "ok" or r.get("step_time_s") is None:
            skipped[f"not finished ({r.get('status')})"] += 1
        elif not _positive(r.get("step_time_s")):
            skipped["no valid step time"] += 1
        elif gpus and r.get("gpus") not in gpus:
            skipped[f"other GPUs ({r.get('gpus')})"] += 1
        elif te != "not installed":
            skipped["ran with Transformer Engine"] += 1
        elif not _positive(r.get("peak_reserved_gib")) or not _positive(r.get("peak_allocated_gib")):
            skipped["no peak memory"] += 1
        elif (why := _row_problem(r, layers)) is not None:
            skipped[why] += 1
        else:
            kept.append({**r, "_id": f"{rel(path)}#{r['n']}"})
    return kept, dict(skipped)


def split_halves(rows: list[dict[str, Any]], pred_step: np.ndarray) -> tuple[list[int], list[int]]:
    """Indices of (fit half, judge half): sorted by predicted step time, alternating."""
    order = sorted(range(len(rows)), key=lambda i: (pred_step[i], rows[i]["n"]))
    return order[0::2], order[1::2]


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def long_label(row: dict[str, Any], layers: int) -> str:
    """``4xH200 L4 #3 TP1 PP1 EP4 DP4 mbs1 a2a full``: GPUs, slice depth, row, layout, micro-batch size, then the
    token dispatcher (a2a / allgather / ..., where experts are split), recompute and ``no-distopt`` where they apply."""
    lay = Layout.from_dict(row["layout"])
    parts = [
        row["gpus"],
        f"L{row_model(row, layers)[1]}",
        f"#{row['n']}",
        row.get("label") or lay.label,
        f"mbs{lay.micro_batch_size}",
    ]
    if lay.ep > 1 or lay.etp > 1:
        parts.append({"alltoall": "a2a"}.get(_value(lay.dispatcher), _value(lay.dispatcher)))
    if _value(lay.recompute_granularity) != "none":
        parts.append(_value(lay.recompute_granularity))
    if not lay.use_distributed_optimizer:
        parts.append("no-distopt")
    return " ".join(parts)


def observations(rows: list[dict[str, Any]], layers: int, peak: str, long_labels: bool = False) -> list[Observation]:
    """One observation per row: the row's model slice and GPUs, its layout as the harness ran it."""
    out = []
    for r in rows:
        name, depth = row_model(r, layers)
        model = slice_model(load_model(name), depth)
        cluster = parse_gpus(r["gpus"])
        w = Workload(seq_length=r["seq_length"], global_batch_size=r["global_batch_size"])
        label = long_label(r, layers) if long_labels else f"#{r['n']} {r['label']}"
        out.append(
            Observation(
                model=model, cluster=cluster, workload=w, layout=ran_layout(r), step_time_s=float(r["step_time_s"]),
                peak_gib=float(r[peak]), label=label,
            )
        )
    return out


def _err(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)


def scores(obs: list[Observation], rows: list[dict[str, Any]], cal: Calibration) -> dict[str, Any]:
    step, peak = predict_observations(obs, cal)
    ms = np.array([r["step_time_s"] for r in rows])
    res = np.array([r["peak_reserved_gib"] for r in rows])
    alloc = np.array([r["peak_allocated_gib"] for r in rows])
    es, er, ea = _err(step, ms), _err(peak, res), _err(peak, alloc)
    return {
        "step_median": float(np.median(es)),
        "step_max": float(es.max()),
        "spearman": spearman(step, ms),
        "peak_reserved_median": float(np.median(er)),
        "peak_reserved_max": float(er.max()),
        "peak_allocated_median": float(np.median(ea)),
        "peak_allocated_max": float(ea.max()),
        "rows": [
            {
                "row": r.get("_id", r["n"]),
                "label": o.label,
                "pred_step_s": round(float(s), 3),
                "step_s": round(float(m), 3),
                "pred_peak_gib": round(float(p), 1),
                "reserved_gib": round(float(v), 1),
                "allocated_gib": round(float(a), 1),
            }
            for r, o, s, m, p, v, a in zip(rows, obs, step, ms, peak, res, alloc)
        ],
    }


def targets(s: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {"value": round(s[k], 4), "target": v, "met": bool(s[k] >= v if k == "spearman" else s[k] <= v)}
        for k, v in TARGETS.items()
    }


def write_calibration(out: str, data: Any, fit_rows: list[Any], result: dict[str, Any]) -> None:
    import yaml

    doc = {
        "provenance": {
            "stack": STACK_NOTE,
            "data": data,
            "fit_rows": fit_rows,
            "command": "python benchmarks/bench_trial_calibration.py " + " ".join(sys.argv[1:]),
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, Python {platform.python_version()}",
            "memory_target": "peak reserved memory (torch.cuda.max_memory_reserved, max over ranks)",
        },
        "constants": {**result["fitted_step"], **result["fitted_memory_reserved"]},
    }
    Path(out).write_text(yaml.safe_dump(doc, sort_keys=False))


def print_fit(result: dict[str, Any], judge_name: str) -> None:
    """The fitted constants, the before/after table of both sets and the targets on the judge set."""
    print("fitted (step time): " + ", ".join(f"{k}={v:.4g}" for k, v in result["fitted_step"].items()))
    print(
        "fitted (reserved peak): "
        + ", ".join(
            f"{k}={v / 2**30 if k.endswith('bytes') or k.endswith('communicator') else v:.4g}"
            f"{' GiB' if 'bytes' in k else ''}"
            for k, v in result["fitted_memory_reserved"].items()
        )
    )
    hdr = (
        f"{'half':<6} {'calibration':<24} {'step med':>8} {'step max':>8} {'Spearman':>8} {'res med':>8} "
        f"{'res max':>8} {'alloc med':>9} {'alloc max':>9}"
    )
    print(hdr)
    for h in ("fit", "judge"):
        for k, name in (("before", "shipped"), ("after", "fitted (reserved)")):
            s = result["scores"][h][k]
            print(
                f"{h:<6} {name:<24} {s['step_median']:>8.1%} {s['step_max']:>8.1%} {s['spearman']:>8.3f} "
                f"{s['peak_reserved_median']:>8.1%} "
                f"{s['peak_reserved_max']:>8.1%} {s['peak_allocated_median']:>9.1%} {s['peak_allocated_max']:>9.1%}"
            )
        s = result["scores"][h]["after_allocated_fit"]
        print(
            f"{h:<6} {'memory fit to allocated':<24} {'':>8} {'':>8} {'':>8} {'':>8} {'':>8} "
            f"{s['peak_allocated_median']:>9.1%} {s['peak_allocated_max']:>9.1%}"
        )
    print(f"{judge_name} (out-of-sample) after calibration, against the issue's targets:")
    for k, t in result["targets_" + judge_name.replace(" ", "_")].items():
        print(
            f"  {k}: {t['value']:.3f} (target {'>=' if k == 'spearman' else '<='} {t['target']}) "
            f"{'met' if t['met'] else 'MISSED'}"
        )


def fit_and_score(
    sets: dict[str, tuple[list[Observation], list[dict[str, Any]]]], fit_alloc_obs: list[Observation], max_nfev: int
) -> dict[str, Any]:
    """Fit on ``sets["fit"]`` (step time, then peak reserved; a second memory fit to ``fit_alloc_obs``, the same rows
    against peak allocated) from the shipped calibration; score every set before and after."""
    base = DEFAULT_CALIBRATION
    fit = fit_observations(sets["fit"][0], start=base, max_nfev=max_nfev)
    fit_alloc = fit_observations(fit_alloc_obs, start=fit.calibration, step_names=None, max_nfev=max_nfev)
    out: dict[str, Any] = {
        "fitted_step": {k: getattr(fit.calibration, k) for k in (fit.step.fitted if fit.step else ())},
        "fitted_memory_reserved": {k: getattr(fit.calibration, k) for k in fit.memory_fitted},
        "fitted_memory_allocated": {k: getattr(fit_alloc.calibration, k) for k in fit_alloc.memory_fitted},
        "scores": {},
    }
    for name, (o, r) in sets.items():
        after_alloc = scores(o, r, fit_alloc.calibration)
        out["scores"][name] = {
            "before": scores(o, r, base),
            "after": scores(o, r, fit.calibration),
            "after_allocated_fit": {k: after_alloc[k] for k in ("peak_allocated_median", "peak_allocated_max")},
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", default=None, help=f"default mode: the measurements to split in halves (default {rel(FIXTURE)})"
    )
    ap.add_argument("--layers", type=int, default=4, help="slice depth of rows whose model field gives none")
    ap.add_argument("--reverse", action="store_true", help="fit on the judge half and judge on the fit half")
    ap.add_argument(
        "--fit-data", nargs="+", metavar="FILE", default=None,
        help="extrapolation mode: fit on the finished rows of these files (with --judge-data)",
    )
    ap.add_argument(
        "--judge-data", nargs="+", metavar="FILE", default=None,
        help="extrapolation mode: judge on the finished rows of these files",
    )
    ap.add_argument(
        "--fit-gpus", nargs="+", metavar="GPUS", default=None,
        help="only rows of --fit-data with these gpus fields (e.g. 2xH200)",
    )
    ap.add_argument(
        "--judge-gpus", nargs="+", metavar="GPUS", default=None,
        help="only rows of --judge-data with these gpus fields (e.g. 4xH200)",
    )
    ap.add_argument("--max-nfev", type=int, default=200)
    ap.add_argument(
        "--out", default=None, help="write the calibration fitted to the fit half (step time + reserved memory) here"
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.max_nfev < 1:
        ap.error(f"--max-nfev {a.max_nfev}: give at least 1 (the fit's evaluation budget)")
    if a.out and not Path(a.out).resolve().parent.is_dir():
        ap.error(f"--out {a.out!r}: its folder does not exist")
    if (a.fit_data is None) != (a.judge_data is None):
        ap.error("--fit-data and --judge-data go together")
    if a.fit_data is not None:
        if a.data is not None:
            ap.error(
                "--data (halves of one file) and --fit-data/--judge-data (fit on some files, judge on others) are "
                "different modes"
            )
        if a.reverse:
            ap.error(
                "--reverse splits halves of --data; to reverse the extrapolation, swap --fit-data and --judge-data"
            )
        return extrapolate(a)
    if a.fit_gpus or a.judge_gpus:
        ap.error("--fit-gpus and --judge-gpus go with --fit-data and --judge-data")
    a.data = a.data or str(FIXTURE)
    t0 = time.perf_counter()
    try:
        rows = read_rows(Path(a.data))
    except (OSError, ValueError) as e:
        print(f"error: {a.data}: {e}", file=sys.stderr)
        return 2
    if len(rows) < 4:
        print(f"error: {a.data}: {len(rows)} finished 4xH200 rows; two halves need at least 4", file=sys.stderr)
        return 2
    obs = observations(rows, a.layers, "peak_reserved_gib")
    base = DEFAULT_CALIBRATION
    pred0, _ = predict_observations(obs, base)
    fit_i, judge_i = split_halves(rows, pred0)
    if a.reverse:
        fit_i, judge_i = judge_i, fit_i
    halves = {"fit": fit_i, "judge": judge_i}
    fitted = fit_and_score(
        {h: ([obs[i] for i in idx], [rows[i] for i in idx]) for h, idx in halves.items()},
        observations([rows[i] for i in fit_i], a.layers, "peak_allocated_gib"),
        a.max_nfev,
    )
    result: dict[str, Any] = {
        "data": str(Path(a.data).resolve().relative_to(ROOT))
        if Path(a.data).resolve().is_relative_to(ROOT)
        else a.data,
        "stack": STACK_NOTE,
        "split": "finished 4xH200 layouts sorted by step time predicted with the shipped calibration; alternating "
        "positions "
        + ("1,3,5,... fit, 0,2,4,... judge (--reverse)" if a.reverse else "0,2,4,... fit, 1,3,5,... judge"),
        "halves": {h: [rows[i]["n"] for i in idx] for h, idx in halves.items()},
        **fitted,
    }
    result["targets_judge_half"] = targets(result["scores"]["judge"]["after"])
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if a.out:
        write_calibration(a.out, result["data"], result["halves"]["fit"], result)
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"data: {result['data']} ({len(rows)} finished 4xH200 layouts); {STACK_NOTE}")
    print(f"split: {result['split']}; fit rows {result['halves']['fit']}, judge rows {result['halves']['judge']}")
    print_fit(result, "judge half")
    print("per row (judge half, after):")
    for r in result["scores"]["judge"]["after"]["rows"]:
        print(
            f"  {r['label']:<28} step {r['pred_step_s']:.3f} vs {r['step_s']:.3f} s; peak {r['pred_peak_gib']:.1f} vs "
            f"reserved {r['reserved_gib']:.1f} / allocated {r['allocated_gib']:.1f} GiB"
        )
    print(f"({result['seconds']} s)")
    return 0


def _describe(rows: list[dict[str, Any]], layers: int) -> str:
    kinds = Counter((r["gpus"], row_model(r, layers)[1]) for r in rows)
    return ", ".join(f"{n} {g} {d}-layer" for (g, d), n in sorted(kinds.items(), key=lambda kv: (kv[0][1], kv[0][0])))


def extrapolate(a: argparse.Namespace) -> int:
    """Extrapolation mode: fit on every finished row of --fit-data, judge on every finished row of --judge-data."""
    t0 = time.perf_counter()
    rows: dict[str, list[dict[str, Any]]] = {"fit": [], "judge": []}
    files: dict[str, list[dict[str, Any]]] = {"fit": [], "judge": []}
    for side, paths, gpus in (("fit", a.fit_data, a.fit_gpus), ("judge", a.judge_data, a.judge_gpus)):
        for p in paths:
            try:
                kept, skipped = read_data_rows(Path(p), gpus, a.layers)
            except (OSError, ValueError) as e:
                print(f"error: {p}: {e}", file=sys.stderr)
                return 2
            files[side].append(
                {"file": rel(p), "rows": len(kept), "kinds": _describe(kept, a.layers), "skipped": skipped}
            )
            rows[side].extend(kept)
    for side in ("fit", "judge"):
        if len(rows[side]) < 3:
            print(
                f"error: {len(rows[side])} usable {side} rows in {', '.join(getattr(a, side + '_data'))}; "
                "a fit and a Spearman need at least 3",
                file=sys.stderr,
            )
            return 2
    both = sorted({r["_id"] for r in rows["fit"]} & {r["_id"] for r in rows["judge"]})
    if both:
        print(
            f"error: {len(both)} rows are in both the fit and the judge set (e.g. {both[0]}): the judge set would not "
            "be "
            "out-of-sample; give disjoint files or --fit-gpus / --judge-gpus that split them",
            file=sys.stderr,
        )
        return 2
    obs = {side: observations(rows[side], a.layers, "peak_reserved_gib", long_labels=True) for side in rows}
    mapped = {
        side: [long_label(r, a.layers) for r in rows[side] if ran_layout(r) != Layout.from_dict(r["layout"])]
        for side in rows
    }
    fitted = fit_and_score(
        {side: (obs[side], rows[side]) for side in ("fit", "judge")},
        observations(rows["fit"], a.layers, "peak_allocated_gib", long_labels=True),
        a.max_nfev,
    )
    result: dict[str, Any] = {
        "data": files,
        "stack": STACK_NOTE,
        "split": "extrapolation: fit on every finished row of the fit files, judge on every finished row of the judge "
        "files",
        "sets": {side: [r["_id"] for r in rows[side]] for side in rows},
        "harness_layout_changed": mapped,
        **fitted,
    }
    result["targets_judge_set"] = targets(result["scores"]["judge"]["after"])
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if a.out:
        write_calibration(
            a.out, {side: [f["file"] for f in files[side]] for side in files}, result["sets"]["fit"], result
        )
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    for side in ("fit", "judge"):
        print(f"{side} set: {len(rows[side])} rows ({_describe(rows[side], a.layers)})")
        for f in files[side]:
            skip = "; skipped " + ", ".join(f"{n} {why}" for why, n in f["skipped"].items()) if f["skipped"] else ""
            print(f"  {f['file']}: {f['rows']} rows ({f['kinds'] or 'none'}){skip}")
    print(f"stack: {STACK_NOTE}")
    print(f"split: {result['split']}")
    print(
        "layouts as the harness ran them (no TE: precision-aware optimizer off unless offloaded): changed "
        + "; ".join(f"{len(mapped[side])} of {len(rows[side])} {side} rows" for side in ("fit", "judge"))
    )
    print_fit(result, "judge set")
    print("per row (judge set, after; error = predicted / measured - 1):")
    w = max(len(r["label"]) for r in result["scores"]["judge"]["after"]["rows"])
    for r in result["scores"]["judge"]["after"]["rows"]:
        print(
            f"  {r['label']:<{w}} step {r['pred_step_s']:.3f} vs {r['step_s']:.3f} s "
            f"({r['pred_step_s'] / r['step_s'] - 1:+.1%}); "
            f"peak {r['pred_peak_gib']:.1f} vs reserved {r['reserved_gib']:.1f} "
            f"({r['pred_peak_gib'] / r['reserved_gib'] - 1:+.1%}) "
            f"/ allocated {r['allocated_gib']:.1f} GiB"
        )
    print(f"({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
