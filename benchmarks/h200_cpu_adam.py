"""CPU optimizer offload's two primitives timed on the lent machine (issue 14: the offload step time).

    OUT=... python3 benchmarks/h200_cpu_adam.py            # on the device (plain torch; no TE, no megatron-core)
    PYTHONPATH=. python benchmarks/h200_cpu_adam.py --compare FILE    # here: the constants it implies

megatron-core 0.19's ``HybridDeviceOptimizer`` (``optimizer/cpu_offloading/hybrid_optimizer.py``, built in
``optimizer/__init__.py`` with ``fused=True``) steps the offloaded fp32 states with ``torch.optim.AdamW(fused=True)`` on
the host, and copies the gradients down (fp32, pinned) and the updated parameters back. torch's fused CPU AdamW splits
each tensor over the process's intra-op threads (``at::parallel_for``), whose number comes from ``OMP_NUM_THREADS``:
``torchrun`` sets it to 1 for every process when ``--nproc-per-node`` > 1 (``torch/distributed/run.py``, "Setting
OMP_NUM_THREADS environment variable for each process to be 1 in default"), and Ray sets it to the actor's ``num_cpus``
(``ray._private.utils.set_omp_num_threads_if_unset``; slime's train actors ask for 1 CPU each).

Measured here, each in its own process (``multiprocessing`` spawn), on fp32 tensors shaped like a MoE layer's (many
tensors of 3072 x 1536 and a few large ones):

- ``adam``: one process, ``torch.set_num_threads(t)`` for t in 1, 2, 4, 8 and every core: parameters stepped per second;
- ``adam_procs``: P single-thread processes at once (P = 1, 2, 4, 8, 16, up to the cores), each on its own states: the
  node's aggregate rate when every GPU's process steps on one core (the torchrun / Ray default), and where the host's
  memory bandwidth caps it;
- ``copy``: pinned host <-> GPU copies (fp32 GPU -> host, bf16 host -> GPU; 1 GiB), GB/s, when a GPU is there.

Writes ``$OUT/cpu_adam.jsonl`` (one row per measurement, plus a ``host`` row: CPU model, cores, torch's default
threads). ``CPU_ADAM_SHRINK=K`` divides the parameter counts by K (a quick check off the device). Each time is the
median of 3 steps after one warm-up step (which allocates AdamW's moments).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: One MiniMax-M2-like expert weight (hidden 3072 x expert FFN 1536) and the parameters each measurement steps per
#: process.
TENSOR_SHAPE = (3072, 1536)
PARAMS_ONE_PROCESS = 512 * 2**20 // int(os.environ.get("CPU_ADAM_SHRINK", "1"))
PARAMS_PER_CONCURRENT_PROCESS = 96 * 2**20 // int(os.environ.get("CPU_ADAM_SHRINK", "1"))
STEPS, WARMUP = 3, 1


def _adam_rate(threads: int, params: int, fused: bool, q: Any, start: Any = None) -> None:
    """Child process: step ``params`` fp32 parameters with AdamW on ``threads`` threads; put (params/s, median s)."""
    import torch

    torch.set_num_threads(threads)
    per = TENSOR_SHAPE[0] * TENSOR_SHAPE[1]
    n = max(1, params // per)
    ps = [torch.zeros(TENSOR_SHAPE, dtype=torch.float32).normal_() for _ in range(n)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(
        ps, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=fused, foreach=None if fused else True
    )
    opt.step()  # warm-up: allocates the two moments
    if start is not None:
        start.wait()
    ts = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        opt.step()
        ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    q.put({"params": n * per, "step_s": med, "params_per_s": n * per / med, "steps_s": ts})


def _run(rows: list[dict[str, Any]], out: Path, row: dict[str, Any]) -> None:
    rows.append(row)
    with (out / "cpu_adam.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def _host() -> dict[str, Any]:
    import torch

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0]
    except OSError:
        pass
    return {
        "kind": "host",
        "cpu_model": model,
        "os_cpu_count": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)),
        "torch_default_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "meminfo": mem,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }


def _copy_rows() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    rows = []
    n = 2**28  # 1 GiB of fp32
    for name, src_dev, dtype in (("d2h_fp32", "cuda", torch.float32), ("h2d_bf16", "cpu", torch.bfloat16)):
        elems = n if dtype == torch.float32 else 2 * n
        if src_dev == "cuda":
            src = torch.empty(elems, dtype=dtype, device="cuda").normal_()
            dst = torch.empty(elems, dtype=dtype, pin_memory=True)
        else:
            src = torch.empty(elems, dtype=dtype, pin_memory=True).normal_()
            dst = torch.empty(elems, dtype=dtype, device="cuda")
        ts = []
        for k in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            if k:
                ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        rows.append(
            {
                "kind": "copy",
                "name": name,
                "bytes": elems * src.element_size(),
                "s": med,
                "gb_per_s": elems * src.element_size() / med / 1e9,
            }
        )
    return rows


def gather_results(ps: list[Any], q: Any, timeout_s: float = 900.0) -> list[dict[str, Any]] | None:
    """One result from each of the child processes ``ps`` (None, with every child stopped, when one dies or the wait
    passes ``timeout_s``: a child that fails must not leave the call waiting on the queue)."""
    import queue as queue_mod

    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < len(ps):
        try:
            got.append(q.get(timeout=5.0))
        except queue_mod.Empty:
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in ps):
                for p in ps:
                    if p.is_alive():
                        p.terminate()
                    p.join()
                return None
    for p in ps:
        p.join()
    return got


def measure(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    rows: list[dict[str, Any]] = []
    host = _host()
    _run(rows, out, host)
    cores = int(host["sched_affinity"] or 1)
    for threads in sorted({1, 2, 4, 8, cores}):
        if threads > cores:
            continue
        for fused in (True, False) if threads in (1, cores) else (True,):
            q = ctx.Queue()
            p = ctx.Process(target=_adam_rate, args=(threads, PARAMS_ONE_PROCESS, fused, q))
            p.start()
            got = gather_results([p], q)
            if got is None:
                _run(
                    rows,
                    out,
                    {"kind": "error", "case": f"adam threads {threads} fused {fused}", "exitcode": p.exitcode},
                )
                continue
            _run(rows, out, {"kind": "adam", "threads": threads, "processes": 1, "fused": fused, **got[0]})
    for procs in sorted({1, 2, 4, 8, 16, cores}):
        if procs > cores:
            continue
        q = ctx.Queue()
        start = ctx.Barrier(procs)
        ps = [
            ctx.Process(target=_adam_rate, args=(1, PARAMS_PER_CONCURRENT_PROCESS, True, q, start))
            for _ in range(procs)
        ]
        for p in ps:
            p.start()
        got = gather_results(ps, q)
        if got is None:
            _run(rows, out, {"kind": "error", "case": f"adam_procs {procs}", "exitcodes": [p.exitcode for p in ps]})
            continue
        per = [g["params_per_s"] for g in got]
        _run(
            rows,
            out,
            {
                "kind": "adam_procs",
                "threads": 1,
                "processes": procs,
                "fused": True,
                "per_process_params_per_s": per,
                "median_per_process_params_per_s": statistics.median(per),
                "aggregate_params_per_s": sum(per),
            },
        )
    for r in _copy_rows():
        _run(rows, out, r)
    return 0


def read_primitives(path: Path) -> dict[str, Any]:
    """The rows of ``$OUT/cpu_adam.jsonl``, checked: ``{"host": row, "fused": {threads: params/s}, "unfused": {...},
    "procs": {P: {"aggregate": params/s, "median_per_process": params/s}}, "copies": {name: GB/s}}`` (one process's
    rates by thread count; ``procs``: P single-thread processes at once).

    Raises:
        TunerError: the file cannot be read, a line is not a JSON object, a row of a known kind lacks a field or has one
            of the wrong type or out of range (rates and bandwidths finite and > 0, counts whole numbers >= 1), a
            measurement appears twice, or there is no ``host`` row or no fused one-process ``adam`` row; named by file
            and line.
    """
    from benchmarks.device_rows import flag, number, read_rows, text
    from specs.errors import TunerError

    out: dict[str, Any] = {"host": None, "fused": {}, "unfused": {}, "procs": {}, "copies": {}}
    for where, r in read_rows(path, "benchmarks/h200_cpu_adam.py"):
        kind = text(r, "kind", where, ("host", "adam", "adam_procs", "copy"))
        if kind == "host":
            if out["host"] is not None:
                raise TunerError(f"{where}: a second host row")
            for k in ("sched_affinity", "torch_default_threads"):
                if r.get(k) is not None:
                    number(r, k, where, integer=True)
            out["host"] = r
        elif kind == "adam":
            threads = number(r, "threads", where, integer=True)
            if "processes" in r and number(r, "processes", where, integer=True) != 1:
                raise TunerError(f"{where}: an 'adam' row is one process (processes 1)")
            table = out["fused" if flag(r, "fused", where) else "unfused"]
            if threads in table:
                raise TunerError(
                    f"{where}: a second {'fused' if r['fused'] else 'unfused'} 'adam' row at {threads} threads"
                )
            table[threads] = number(r, "params_per_s", where)
        elif kind == "adam_procs":
            procs = number(r, "processes", where, integer=True)
            if procs in out["procs"]:
                raise TunerError(f"{where}: a second 'adam_procs' row of {procs} processes")
            out["procs"][procs] = {
                "aggregate": number(r, "aggregate_params_per_s", where),
                "median_per_process": number(r, "median_per_process_params_per_s", where),
            }
        else:
            name = text(r, "name", where)
            if name in out["copies"]:
                raise TunerError(f"{where}: a second copy row {name!r}")
            out["copies"][name] = number(r, "gb_per_s", where)
    if out["host"] is None or not out["fused"]:
        raise TunerError(
            f"{path}: needs a 'host' row and fused one-process 'adam' rows (written by this script on the device)"
        )
    return out


def compare(path: Path) -> dict[str, Any]:
    """The constants the rows imply: the single-thread fused rate, the every-core rate, the node's aggregate.

    Raises:
        TunerError: as :func:`read_primitives`.
    """
    p = read_primitives(path)
    host, fused = p["host"], p["fused"]
    every = max(fused)
    res: dict[str, Any] = {
        "cpu_model": host.get("cpu_model"),
        "cores": host.get("sched_affinity"),
        "torch_default_threads": host.get("torch_default_threads"),
        "fused_params_per_s_by_threads": {t: round(v / 1e9, 3) for t, v in sorted(fused.items())},
        "unfused_params_per_s_by_threads": {t: round(v / 1e9, 3) for t, v in sorted(p["unfused"].items())},
    }
    if 1 in fused:
        res["single_thread_params_per_s"] = fused[1]
    res["every_core_params_per_s"] = fused[every]
    if p["procs"]:
        res["aggregate_single_thread_processes"] = {
            n: round(v["aggregate"] / 1e9, 3) for n, v in sorted(p["procs"].items())
        }
        res["median_per_process_single_thread"] = {
            n: round(v["median_per_process"] / 1e9, 3) for n, v in sorted(p["procs"].items())
        }
        res["node_aggregate_max_params_per_s"] = max([v["aggregate"] for v in p["procs"].values()] + [fused[every]])
    res["copies_gb_per_s"] = {n: round(v, 2) for n, v in p["copies"].items()}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", type=Path, default=None, help="a cpu_adam.jsonl written on the device")
    a = ap.parse_args(argv)
    if a.compare is not None:
        from specs.errors import TunerError

        try:
            sys.stdout.write(json.dumps(compare(a.compare), indent=1) + "\n")
        except TunerError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
        return 0
    return measure(Path(os.environ.get("OUT") or "h200_cpu_adam_out"))


if __name__ == "__main__":
    raise SystemExit(main())
