"""megatron-core's CPU optimizer offload step timed alone on the lent machine (issue 14: the offload step time).

    PYTHONPATH=/tmp/site:. OUT=... python3 benchmarks/h200_offload.py  # on the device: torch + the megatron-core wheel
    PYTHONPATH=. python benchmarks/h200_offload.py --compare OFFLOAD.jsonl --primitives CPU_ADAM.jsonl \
        [--steps SWEEP.jsonl ...]

Builds megatron-core 0.19's ``HybridDeviceOptimizer`` (``optimizer/cpu_offloading/hybrid_optimizer.py``) the way
``optimizer/__init__.py`` does for ``--optimizer-cpu-offload`` (torch ``AdamW`` on the CPU with ``fused=True``,
``param_update_in_fp32=True``, pinned gradients and parameters, ``--overlap-cpu-optimizer-d2h-h2d``) over GPU tensors
shaped like half of a MiniMax-M2 layer and its embeddings (two 200,064 x 3,072 and 256 of 3,072 x 1,536: 2.44 G
parameters), and times ``step()`` between two ``torch.cuda.synchronize()``. Two parameter kinds, as the distributed
optimizer hands them over (``distrib_optimizer.py``, ``_copy_model_grads_to_main_grads``):

- ``bf16``: the precision-aware optimizer (``--use-precision-aware-optimizer``): bf16 shard parameters with an fp32
  ``decoupled_grad``. The optimizer's CPU copy is ``.cpu().pin_memory()`` and then ``.float()``: an fp32 master in
  **pageable** host memory, copied back to the bf16 GPU parameter after each tensor's step;
- ``fp32``: without it: fp32 main parameters and gradients; the CPU copy stays pinned (what pinned masters cost:
  Megatron-LM's ``validate_args`` refuses offload without the precision-aware optimizer, so its runs take the path
  above).

Each at the process's default threads (every core) and at one thread (what ``torchrun --nproc-per-node`` > 1 and slime's
Ray actors leave a process), offload fraction 1.0, and 0.5 for ``bf16``. Also times the copies alone (1 GiB): pinned and
pageable fp32 host -> GPU (fp32 and bf16 destinations, ``non_blocking=True``), and GPU fp32 -> pinned host.

Writes ``$OUT/offload.jsonl``: one row per case (``step_s`` median of 4 after 2 warm-up steps, the first allocating
AdamW's moments) and per copy (``gb_per_s``, and ``host_blocked_s``: how long ``copy_`` held the calling thread).

``--compare`` (here, no GPU) prices each case from the two primitives alone, measured in other processes:
``offloaded x (1 / fused AdamW rate at the case's threads + 4 B / pageable host -> GPU bandwidth if bf16)``, the rate
from ``benchmarks/h200_cpu_adam.py``'s rows and the bandwidth from this file's ``h2d_pageable_fp32_to_bf16`` row, and
prints it against the measured step. With ``--steps``, it does the same for whole harness steps with offload (16
threads: the harness's single process keeps torch's default), judged on their extra time over a row of the same file and
machine that differs only in having no offload (and the precision-aware optimizer on or off).
``seed_reference_what_if``: the seed's reference port (64 H200, TP 2 PP 2 EP 8, offload 1.0, precision-aware; 557.8
tokens/s/GPU measured) with its offload priced from these primitives instead of the model's per-node rate, each of its
node's 8 processes on one thread (slime's Ray actors) at the measured per-process rate of 8 concurrent single-thread
processes.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BIG = (200064, 3072)
EXPERT = (3072, 1536)
N_EXPERT = 256
STEPS, WARMUP = 4, 2


def _case(kind: str, fraction: float, threads: int | None, q: Any) -> None:
    import torch
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    if threads:
        torch.set_num_threads(threads)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    shapes = [BIG, BIG] + [EXPERT] * N_EXPERT
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.empty(s, dtype=dtype, device="cuda").normal_(0, 0.02))
        g = torch.empty(s, dtype=torch.float32, device="cuda").normal_(0, 1e-3)
        if kind == "bf16":
            p.decoupled_grad = g
        else:
            p.grad = g
        params.append(p)
    t0 = time.perf_counter()
    opt = HybridDeviceOptimizer(
        [{"params": params}],
        offload_fraction=fraction,
        cpu_optimizer_cls=torch.optim.AdamW,
        gpu_optimizer_cls=torch.optim.AdamW,
        overlap_cpu_optimizer_d2h_h2d=True,
        pin_cpu_grads=True,
        pin_cpu_params=True,
        param_update_in_fp32=True,
        lr=1e-4,
        weight_decay=0.1,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True,
    )
    build_s = time.perf_counter() - t0
    gc.collect()
    ts = []
    for k in range(WARMUP + STEPS):
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        if k >= WARMUP:
            ts.append(time.perf_counter() - t1)
    n = sum(p.numel() for p in params)
    q.put(
        {
            "kind": "hdo",
            "params": kind,
            "offload_fraction": fraction,
            "threads": torch.get_num_threads(),
            "total_params": n,
            "offloaded_params": int(round(n * fraction)),
            "cpu_optimizers": len(opt.cpu_optimizers),
            "build_s": build_s,
            "step_s": statistics.median(ts),
            "steps_s": ts,
        }
    )


def _copies(q: Any) -> None:
    import torch

    n = 2**28
    rows = []
    gpu32 = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    gpu16 = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    pin32 = torch.empty(n, dtype=torch.float32, pin_memory=True).normal_()
    page32 = torch.empty(n, dtype=torch.float32).normal_()
    for name, dst, src in (
        ("h2d_pinned_fp32_to_fp32", gpu32, pin32), ("h2d_pinned_fp32_to_bf16", gpu16, pin32),
        ("h2d_pageable_fp32_to_fp32", gpu32, page32), ("h2d_pageable_fp32_to_bf16", gpu16, page32),
        ("d2h_fp32_to_pinned", pin32, gpu32),
    ):
        ts, blocked = [], []
        for k in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            if k:
                ts.append(time.perf_counter() - t0)
                blocked.append(t1 - t0)
        med = statistics.median(ts)
        rows.append(
            {
                "kind": "copy",
                "name": name,
                "host_bytes": n * 4,
                "s": med,
                "gb_per_s": n * 4 / med / 1e9,
                "host_blocked_s": statistics.median(blocked),
            }
        )
    q.put(rows)


_STEP_KEYS_IGNORED = ("optimizer_offload_fraction", "use_precision_aware_optimizer")


def compare(offload: Path, primitives: Path, steps: list[Path]) -> dict[str, Any]:
    """The primitives' sum against each measured case (see the module's docstring). Returns the printed object.

    Raises:
        TunerError: a file cannot be read, a line is not a JSON object, a row lacks a field or has one of the wrong
            type or out of range (named by file and line), a case or copy appears twice, a ``--steps`` file is given
            twice or has no offload row, an offload row has several same-machine base rows, or the rows named above
            are missing.
    """
    from benchmarks.device_rows import flag, number, read_rows, text
    from benchmarks.h200_cpu_adam import read_primitives
    from specs.errors import TunerError

    prim = read_primitives(primitives)
    rate = prim["fused"]
    hdo: list[tuple[str, dict[str, Any]]] = []
    page: float | None = None
    seen: set[str] = set()
    for where, r in read_rows(offload, "benchmarks/h200_offload.py"):
        kind = text(r, "kind", where, ("copy", "hdo"))
        key = f"{kind} {text(r, 'name' if kind == 'copy' else 'case', where)}"
        if key in seen:
            raise TunerError(f"{where}: a second row of {key}")
        seen.add(key)
        if kind == "copy":
            bw = number(r, "gb_per_s", where)
            if r["name"] == "h2d_pageable_fp32_to_bf16":
                page = bw * 1e9
        elif text(r, "status", where) == "ok":
            hdo.append((where, r))
    if page is None:
        raise TunerError(f"{offload}: no 'h2d_pageable_fp32_to_bf16' copy row (written on the device by this script)")
    every = max(rate)

    def price(params: float, threads: int, pageable: bool, where: str) -> float:
        if threads not in rate:
            raise TunerError(f"{where}: no fused AdamW rate at {threads} threads in {primitives} (has {sorted(rate)})")
        return params * (1 / rate[threads] + (4.0 / page if pageable else 0.0))

    out: dict[str, Any] = {
        "fused_adamw_params_per_s": rate,
        "pageable_h2d_bytes_per_s": page,
        "optimizer_alone": [],
        "whole_steps": [],
    }
    for where, r in hdo:
        kind = text(r, "params", where, ("bf16", "fp32"))
        step = number(r, "step_s", where)
        pred = price(
            number(r, "offloaded_params", where), number(r, "threads", where, integer=True), kind == "bf16", where
        )
        out["optimizer_alone"].append(
            {
                "case": r["case"],
                "measured_s": round(step, 3),
                "primitives_s": round(pred, 3),
                "ratio": round(step / pred, 3),
            }
        )
    if len(set(map(str, steps))) < len(steps):
        raise TunerError("--steps: a file is given twice")
    for path in steps:
        sweep = [
            (w, r)
            for w, r in read_rows(path, "launch.harness.sweep (sweep.jsonl)")
            if r.get("status") == "ok" and isinstance(r.get("layout"), dict)
        ]
        found = 0
        for where, r in sweep:
            lay = r["layout"]
            frac = (
                number(lay, "optimizer_offload_fraction", where, positive=False, at_most=1.0)
                if "optimizer_offload_fraction" in lay
                else 0.0
            )
            if frac <= 0:
                continue
            found += 1
            pa = flag(lay, "use_precision_aware_optimizer", where, default=True)
            key = {k: v for k, v in lay.items() if k not in _STEP_KEYS_IGNORED}
            base = [
                (bw, b)
                for bw, b in sweep
                if b is not r
                and not b["layout"].get("optimizer_offload_fraction")
                and b.get("model") == r.get("model")
                and b.get("precision") == r.get("precision")
                and (b.get("options") or {}) == (r.get("options") or {})
                and {k: v for k, v in b["layout"].items() if k not in _STEP_KEYS_IGNORED} == key
            ]
            hm = r.get("host_memory_per_rank")
            off = (hm[0].get("offload") if isinstance(hm, list) and hm and isinstance(hm[0], dict) else None) or {}
            case = r.get("id", where)
            if not isinstance(off, dict) or "rank_params" not in off:
                out["whole_steps"].append(
                    {"case": case, "file": f"{path.parent.name}/{path.name}", "skipped": "no rank_params"}
                )
                continue
            pred = price(number(off, "rank_params", where) * frac, every, pa, where)
            if not base:
                out["whole_steps"].append(
                    {
                        "case": case,
                        "file": f"{path.parent.name}/{path.name}",
                        "skipped": "no same-machine base row",
                        "measured_step_s": round(number(r, "step_time_s", where), 3),
                        "primitives_s": round(pred, 3),
                    }
                )
                continue
            if len(base) > 1:
                raise TunerError(
                    f"{where}: {len(base)} rows of {path} could be its base "
                    f"({', '.join(str(b.get('id')) for _, b in base)})"
                )
            bwhere, b = base[0]
            extra = number(r, "step_time_s", where) - number(b, "step_time_s", bwhere)
            out["whole_steps"].append(
                {
                    "case": case,
                    "base": b.get("id"),
                    "file": f"{path.parent.name}/{path.name}",
                    "measured_extra_s": round(extra, 3),
                    "primitives_s": round(pred, 3),
                    "ratio": round(extra / pred, 3),
                }
            )
        if not found:
            raise TunerError(f"--steps {path}: no finished harness row with optimizer offload")
    if 8 in prim["procs"]:
        out["seed_reference_what_if"] = _seed_reference(prim["procs"][8]["median_per_process"], page)
    return out


def _seed_reference(per_process_rate: float, pageable: float) -> dict[str, float]:
    """The seed's reference port (its row of ``cost_model/data/seed_runs.csv``, as ``tune validate`` reads it) with its
    offload time replaced by ``offloaded x (1 / per_process_rate + 4 / pageable)``; the offloaded parameters of its
    slowest rank are what the model's offload term gives at a unit CPU Adam rate with the copies hidden
    (``offload_overlap`` 1)."""
    import dataclasses

    from cost_model.calibration import DEFAULT_CALIBRATION
    from cost_model.estimate import estimate
    from cost_model.validate import read_runs

    runs, _ = read_runs([str(Path(__file__).resolve().parents[1] / "cost_model" / "data" / "seed_runs.csv")])
    run = next(r for r in runs if r.run_id == "seed-reference")
    assert run.model and run.cluster and run.workload and run.published_tokens, "the seed's reference row is estimable"
    model, cluster, work, lay = run.model, run.cluster, run.workload, run.layout
    base = estimate(model, cluster, work, lay, options=run.options)
    gpus_per_node = min(cluster.gpus_per_node, cluster.num_gpus)
    unit = dataclasses.replace(
        DEFAULT_CALIBRATION, cpu_adam_params_per_s_per_node=float(gpus_per_node), offload_overlap=1.0
    )
    offloaded = estimate(model, cluster, work, lay, calibration=unit, options=run.options).time["offload"]
    new = offloaded * (1 / per_process_rate + 4.0 / pageable)
    step = base.step_time_s - base.time["offload"] + new
    tokens = work.global_batch_size * work.seq_length / cluster.num_gpus / step
    return {
        "offloaded_params_per_gpu": round(offloaded),
        "model_offload_s": round(base.time["offload"], 2),
        "primitives_offload_s": round(new, 2),
        "model_tokens_per_s_per_gpu": round(base.tokens_per_s_per_gpu, 1),
        "primitives_tokens_per_s_per_gpu": round(tokens, 1),
        "measured": run.published_tokens,
        "primitives_error": round(tokens / run.published_tokens - 1, 3),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", type=Path, default=None, help="an offload.jsonl written on the device")
    ap.add_argument("--primitives", type=Path, default=None, help="the cpu_adam.jsonl of benchmarks/h200_cpu_adam.py")
    ap.add_argument("--steps", type=Path, nargs="*", default=[], help="harness sweep.jsonl files with offload rows")
    a = ap.parse_args(argv)
    if a.compare is None and (a.primitives is not None or a.steps):
        sys.stderr.write("error: --primitives and --steps go with --compare OFFLOAD.jsonl\n")
        return 2
    if a.compare is not None:
        from specs.errors import TunerError

        try:
            if a.primitives is None:
                raise TunerError("--compare needs --primitives CPU_ADAM.jsonl")
            sys.stdout.write(json.dumps(compare(a.compare, a.primitives, a.steps), indent=1) + "\n")
        except TunerError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
        return 0
    return measure()


def measure() -> int:
    out = Path(os.environ.get("OUT") or "h200_offload_out")
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")

    def emit(row: dict[str, Any]) -> None:
        with (out / "offload.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()

    from benchmarks.h200_cpu_adam import gather_results

    q = ctx.Queue()
    p = ctx.Process(target=_copies, args=(q,))
    p.start()
    got = gather_results([p], q)
    for r in got[0] if got else [{"kind": "error", "case": "copies", "exitcode": p.exitcode}]:
        emit(r)
    only = set(filter(None, os.environ.get("OFFLOAD_ONLY", "").split(",")))
    for kind, fraction, threads in (
        ("bf16", 1.0, None), ("fp32", 1.0, None), ("bf16", 0.5, None), ("bf16", 1.0, 1), ("fp32", 1.0, 1),
    ):
        tag = f"{kind}-{fraction}-{threads or 'default'}"
        if only and tag not in only:
            continue
        q = ctx.Queue()
        p = ctx.Process(target=_case, args=(kind, fraction, threads, q))
        p.start()
        res = gather_results([p], q)
        if res is None:
            emit({"kind": "hdo", "case": tag, "status": f"exit {p.exitcode}"})
            continue
        emit({"case": tag, "status": "ok", **res[0]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
