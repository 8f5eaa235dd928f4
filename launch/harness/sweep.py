"""Measure a list of layouts with the local backend and write measured-vs-predicted JSON lines::

    python -m launch.harness.sweep --model MiniMax-M2 --layers 4 --gpus 4xH200 --seq-len 8192 \\
        --global-batch 8 --layouts layouts.jsonl --out sweep.jsonl [--steps 20] [--warmup 10] [--timeout 240]

``layouts.jsonl``: one :class:`Layout` dict a line (``world_size`` defaults to the GPU count)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from cost_model.estimate import estimate
from launch.base import TrialFailed
from launch.harness.spec import harness_layout
from launch.local_backend import LocalBackend
from search_spaces.rules import check_layout
from specs import HARNESS_RUN_OPTIONS, HARNESS_TE_RUN_OPTIONS, Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model
from specs.units import GIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="MiniMax-M2")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--gpus", default="4xH200")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--layouts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials-dir", default="results/sweep/trials")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=None,
                    help="leading steps left out of the median (default: half of --steps)")
    ap.add_argument("--timeout", type=float, default=240.0)
    a = ap.parse_args(argv)
    try:
        model = slice_model(load_model(a.model), a.layers)
        cluster = parse_gpus(a.gpus)
        wl = Workload(seq_length=a.seq_len, global_batch_size=a.global_batch)
        warmup = a.steps // 2 if a.warmup is None else a.warmup
        backend = LocalBackend(trials_dir=a.trials_dir, num_gpus=cluster.num_gpus, steps=a.steps, warmup_steps=warmup,
                               timeout_s=a.timeout)
        layouts = []
        for i, line in enumerate(Path(a.layouts).read_text().splitlines()):
            if line.strip():
                try:
                    d = json.loads(line)
                    d.setdefault("world_size", cluster.num_gpus)
                    d.setdefault("sequence_parallel", d.get("tp", 1) > 1)
                    layouts.append((i, Layout.from_dict(d)))
                except (ValueError, TypeError, AttributeError, TunerError) as e:
                    raise TunerError(f"{a.layouts} line {i + 1}: not a layout ({e})") from None
        from launch.local_backend import check_harness_dependencies, check_local_gpus

        check_harness_dependencies("launch.harness.sweep")
        check_local_gpus(cluster, "launch.harness.sweep")
    except (TunerError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = HARNESS_TE_RUN_OPTIONS if backend.env.transformer_engine else HARNESS_RUN_OPTIONS
    out = Path(a.out)
    for i, lay in layouts:
        row: dict[str, Any] = {"n": i, "label": lay.label, "layout": lay.to_dict(), "model": model.name,
                               "gpus": cluster.label, "seq_length": wl.seq_length,
                               "global_batch_size": wl.global_batch_size}
        broken = check_layout(lay, model, wl)
        if broken:
            row["rules_broken"] = [f"[{r}] {m}" for r, m in broken]
        try:
            est = estimate(model, cluster, wl, harness_layout(lay, backend.env), options=options)
            row.update(pred_step_time_s=est.step_time_s, pred_tokens_per_s_per_gpu=est.tokens_per_s_per_gpu,
                       pred_peak_gib=est.peak_bytes / GIB)
        except Exception as ex:  # noqa: BLE001 - record, keep measuring
            row["pred_error"] = str(ex)
        t0 = time.monotonic()
        try:
            if broken:  # Megatron would refuse it at start-up: no GPU time on it
                raise InfeasibleLayout(broken[0][0], "breaks Megatron's rules: " + "; ".join(row["rules_broken"]))
            m = backend.run(lay, model=model, cluster=cluster, workload=wl, trial_number=i)
            s = m.extra["summary"]
            row.update(status="ok", step_time_s=s["median_step_time_s"], step_time_cv=s["step_time_cv"],
                       tokens_per_s_per_gpu=m.tokens_per_s_per_gpu, peak_reserved_gib=m.peak_bytes / GIB,
                       peak_allocated_gib=m.extra["peak_allocated_bytes"] / GIB,
                       peak_reserved_gib_per_rank=[x / GIB for x in s["peak_reserved_bytes"]],
                       peak_allocated_gib_per_rank=[x / GIB for x in s["peak_allocated_bytes"]],
                       step_times_s=[float(x) for x in m.step_times_s], losses=[float(x) for x in m.losses],
                       grad_norms=[float(x) if x is not None else None for x in m.grad_norms],
                       build_s=s.get("build_s"), versions=s.get("versions"), notes=s.get("notes"))
        except TunerError as ex:  # InfeasibleLayout (rules, environment) or a batch the layout cannot split
            row.update(status="refused", message=str(ex))
        except TrialFailed as ex:
            row.update(status=ex.kind.value, message=str(ex))
            if math.isfinite(ex.memory_reached_bytes):
                row["memory_reached_gib"] = ex.memory_reached_bytes / GIB
            log = Path(ex.log_path) / "log.txt"
            if log.exists():
                row["log_tail"] = log.read_text(errors="replace")[-3000:]
        row["wall_s"] = time.monotonic() - t0
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        keys = ("n", "label", "status", "step_time_s", "pred_step_time_s", "peak_reserved_gib", "pred_peak_gib",
                "message", "wall_s")
        print(json.dumps({k: row.get(k) for k in keys}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
