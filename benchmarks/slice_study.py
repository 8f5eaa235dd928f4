"""Measure every layout of the one-GPU slice study (``benchmarks/slice_study_layouts.py``) twice, budget-aware
and resumable across device calls.

Every layout runs once, then every layout again in the reverse order, so the reference per layout is a mean of
runs that were apart in time. Each run is one trial of ``launch.harness.sweep`` (its ``main`` with a one-line
layouts file and a trials folder of its own), so each row is the sweep's row: the layout, its label, the
analytical model's prediction (step time, tokens/s/GPU, peak), the measured step times, tokens/s/GPU (median of
the steps after the warm-up), peak allocated and reserved memory, or the failure kind; ``wall_s`` is the whole
trial (torchrun start, model build, the steps and the exit), i.e. the GPU-seconds one run costs on one GPU.
The driver adds ``run_id`` (``p<pass>-<case>``), ``pass``, ``case``, ``card`` (nvidia-smi's name) and
``started_utc``.

    # on the GPU machine, megatron-core and torch importable
    PYTHONPATH=. BUDGET_S=540 python3 benchmarks/slice_study.py

Before a run starts, its planned time (the case's ``est_s``, or the wall of its earlier run plus 5 s) is checked
against what is left of ``BUDGET_S`` (seconds since this program started); a run that does not fit is left for
the next call. A sweep that stops before its trial (torch or megatron-core missing, no GPU) stops the driver. Done runs
are read back from ``$WORK/runs.jsonl`` (``WORK`` default ``/tmp/slice_study``, which lasts while the machine stays
warm) and from ``PREV`` (an earlier call's ``runs.jsonl``, for a fresh machine). Writes ``$OUT/runs.jsonl`` (every run
so far, after each run) and ``$OUT/driver.log``.

    python3 benchmarks/slice_study.py --table runs.jsonl   # no GPU: the per-layout table in Markdown

The table: per layout, the mean of its runs' tokens/s/GPU (median of each run's timed steps), the spread
(max - min over the mean, in %), the analytical model's prediction, the peak reserved memory, the mean wall
seconds of one run; ranked by the mean, and the GPU-seconds of all runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.monotonic()
OUT = Path(os.environ.get("OUT") or "slice_study_out")
WORK = Path(os.environ.get("WORK") or "/tmp/slice_study")
BUDGET = float(os.environ.get("BUDGET_S") or 540)
for k, v in {
    "PYTHONUNBUFFERED": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
}.items():
    os.environ.setdefault(k, v)


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:6.0f}s] {msg}"
    print(line, flush=True)
    with open(OUT / "driver.log", "a") as f:
        f.write(line + "\n")


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def card() -> str:
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def run_case(c: dict[str, Any], rid: str, name: str, gpus: str, left: float) -> dict[str, Any] | None:
    """One run of case ``c`` (a :data:`slice_study_layouts.CASES` entry) as ``launch.harness.sweep``'s trial, with
    ``left`` seconds of budget: its row with ``run_id``, ``case``, ``card``, ``started_utc`` and ``driver_wall_s``
    added, or None when the sweep refused before any trial (the environment, not the layout; its message above)."""
    from benchmarks.slice_study_layouts import GLOBAL_BATCH, LAYERS, MODEL, SEQ_LEN, STEPS, WARMUP
    from launch.harness import sweep

    lay_file, out_file = WORK / f"{rid}.layout.jsonl", WORK / f"{rid}.row.jsonl"
    lay_file.write_text(json.dumps(c["layout"]) + "\n")
    out_file.unlink(missing_ok=True)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t = time.monotonic()
    rc = sweep.main(
        [
            "--model", MODEL, "--layers", str(LAYERS), "--gpus", gpus, "--seq-len", str(SEQ_LEN), "--global-batch",
            str(GLOBAL_BATCH), "--layouts", str(lay_file), "--out", str(out_file), "--steps", str(STEPS), "--warmup",
            str(WARMUP), "--timeout", f"{max(60.0, min(240.0, left - 10)):.0f}", "--trials-dir",
            str(WORK / "trials" / rid),
        ]
    )
    got = read_rows(out_file)
    shutil.rmtree(WORK / "trials" / rid / "0" / "ckpt", ignore_errors=True)
    if not got:
        log(f"{rid}: launch.harness.sweep exited {rc} with no row: stopping")
        return None
    row = got[0]
    row.update(run_id=rid, case=c["id"], card=name, started_utc=started, driver_wall_s=time.monotonic() - t)
    log(
        f"{rid}: {row.get('status')} tokens/s/GPU {row.get('tokens_per_s_per_gpu') or 0:.0f} (predicted "
        f"{row.get('pred_tokens_per_s_per_gpu') or 0:.0f}), reserved {row.get('peak_reserved_gib') or 0:.1f} GiB, "
        f"wall {row.get('wall_s') or 0:.0f} s"
    )
    return row


def main() -> int:
    from benchmarks.slice_study_layouts import CASES

    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    runs = WORK / "runs.jsonl"
    rows = read_rows(runs)
    have = {r["run_id"] for r in rows}
    for r in read_rows(Path(os.environ["PREV"])) if os.environ.get("PREV") else []:
        if r["run_id"] not in have:
            rows.append(r)
            have.add(r["run_id"])
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = card()
    gpus = "1xH200" if "H200" in name else "1xH100"
    order = [(1, c) for c in CASES] + [(2, c) for c in reversed(CASES)]
    log(f"card {name} ({gpus}), budget {BUDGET:.0f} s, {len(order)} runs, {len(have)} done before")
    for p, c in order:
        rid = f"p{p}-{c['id']}"
        if rid in have:
            continue
        earlier = [r["wall_s"] for r in rows if r["case"] == c["id"] and isinstance(r.get("wall_s"), (int, float))]
        est = earlier[-1] + 5 if earlier else float(c["est_s"])
        left = BUDGET - (time.monotonic() - T0)
        if est > left:
            log(f"{rid}: left for the next call (planned {est:.0f} s, {left:.0f} s left)")
            continue
        row = run_case(c, rid, name, gpus, left)
        if row is None:
            return 2
        row["pass"] = p
        rows.append(row)
        have.add(rid)
        with runs.open("a") as f:
            f.write(json.dumps(row) + "\n")
        shutil.copyfile(runs, OUT / "runs.jsonl")
    shutil.copyfile(runs, OUT / "runs.jsonl")
    left_ids = [f"p{p}-{c['id']}" for p, c in order if f"p{p}-{c['id']}" not in have]
    log(f"end: {len(order) - len(left_ids)} of {len(order)} runs done; left: {left_ids}")
    return 0


def table(path: Path) -> str:
    """The Markdown table of ``path`` (a ``runs.jsonl``): one line per layout, best mean first; failed layouts last."""
    from statistics import mean

    rows = read_rows(path)
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["case"], []).append(r)

    def key(c: str) -> float:
        ok = [r["tokens_per_s_per_gpu"] for r in by[c] if r.get("status") == "ok"]
        return -mean(ok) if ok else 0.0

    lines = [
        "| rank | layout | runs | mean tok/s/GPU | spread % | runs' tok/s/GPU | predicted | pred err % | reserved GiB "
        "| pred peak GiB | wall s/run |",
        "|" + "---|" * 11,
    ]
    for i, c in enumerate(sorted(by, key=key), 1):
        rs = by[c]
        ok = [r["tokens_per_s_per_gpu"] for r in rs if r.get("status") == "ok"]
        pred = rs[0].get("pred_tokens_per_s_per_gpu")
        m = mean(ok) if ok else None
        res = [r["peak_reserved_gib"] for r in rs if r.get("peak_reserved_gib") is not None]
        lines.append(
            f"| {i} | {c} | {len(rs)} | {f'{m:,.0f}' if m else ', '.join(sorted({str(r.get('status')) for r in rs}))} "
            f"| {f'{100 * (max(ok) - min(ok)) / m:.1f}' if len(ok) > 1 else '-'} | "
            f"{', '.join(f'{x:,.0f}' for x in ok) or '-'} "
            f"| {f'{pred:,.0f}' if pred else '-'} | {f'{100 * (pred - m) / m:+.0f}' if pred and m else '-'} "
            f"| {f'{max(res):.1f}' if res else '-'} | {rs[0].get('pred_peak_gib') or 0:.1f} | "
            f"{mean(r.get('wall_s') or 0 for r in rs):.0f} |"
        )
    gs = sum(r.get("wall_s") or 0 for r in rows)
    lines.append(f"\n{len(by)} layouts, {len(rows)} runs, {gs:,.0f} GPU-seconds of trials (wall_s summed).")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"] and len(sys.argv) == 3:
        print(table(Path(sys.argv[2])))
        sys.exit(0)
    sys.exit(main())
