"""Expert GEMM speed by shape on one GPU (issue 14: does a routed expert's GEMM run slower when its weight is small?).

    OUT=... python3 benchmarks/h200_grouped_gemm.py            # on the device (torch only)
    python benchmarks/h200_grouped_gemm.py --compare FILE       # here: the efficiency table by model and rows
    python benchmarks/h200_grouped_gemm.py --fit COMPARE.json   # here: the rows curve the cost model ships

For the routed experts of each MoE model in ``specs/data/models`` (fc1: ``hidden -> 2 x expert FFN``, SwiGLU's gate and
up fused as Megatron's ``TEGroupedLinear`` holds them; fc2: ``expert FFN -> hidden``), times the three GEMMs of a
training step (forward ``X W``, dgrad ``dY W^T``, wgrad ``X^T dY``) over ``GROUPS`` local experts of ``rows`` tokens
each, in bf16, with ``torch._grouped_mm`` (one grouped kernel, as cuBLAS / CUTLASS grouped GEMMs run) where torch has
it, and with one ``torch.matmul`` per expert otherwise (``impl`` says which). Also the forward in fp8 (e4m3, per-tensor
scales, ``torch._scaled_mm`` per expert), the recipe of the published fp8 rows. Times are CUDA-event medians of 20
after 5 warm-up. Writes ``$OUT/grouped_gemm.jsonl``: one row per (model, gemm, rows, dtype): ``seconds``, ``flops``,
``tflops``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuda_timing import cuda_median_seconds  # benchmarks/cuda_timing.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
ROWS = (256, 512, 1024, 2048, 4096, 8192)
GROUPS = 8


def expert_shapes() -> dict[str, tuple[int, int]]:
    """(hidden, expert FFN) of every MoE model in ``specs/data/models`` (Hugging Face keys)."""
    out = {}
    for f in sorted((ROOT / "specs" / "data" / "models").glob("*.json")):
        d = json.loads(f.read_text())
        experts = d.get("num_experts") or d.get("num_local_experts") or d.get("n_routed_experts")
        if not experts:
            continue
        ffn = d.get("moe_intermediate_size") or d["intermediate_size"]
        out[f.stem] = (int(d["hidden_size"]), int(ffn))
    return out


def measure() -> int:
    import torch

    out = Path(os.environ.get("OUT") or "h200_grouped_gemm_out")
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", 0)
    grouped = hasattr(torch, "_grouped_mm")

    def timed(fn: Callable[[], object]) -> float:
        return cuda_median_seconds(fn, reps=20, warm=5)

    rows_out: list[dict] = []
    for model, (h, f) in expert_shapes().items():
        for gemm, (k, n) in {"fc1": (h, 2 * f), "fc2": (f, h)}.items():
            w = torch.randn(GROUPS, k, n, device=dev, dtype=torch.bfloat16) * 0.02
            for m in ROWS:
                rows_out += _one_shape(torch, dev, timed, grouped, model, gemm, w, m)
                print(model, gemm, m, f"{rows_out[-2].get('tflops', 0):.0f}", flush=True)
    with open(out / "grouped_gemm.jsonl", "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"meta": True, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}) + "\n")
        for r in rows_out:
            fh.write(json.dumps(r) + "\n")
    return 0


def _one_shape(torch: Any, dev: Any, timed: Callable[[Callable[[], object]], float], grouped: bool, model: str,
               gemm: str, w: Any, m: int) -> list[dict]:
    """The bf16 fwd / dgrad / wgrad rows and the fp8 forward row of ``GROUPS`` experts of weight ``w`` at ``m`` rows."""
    k, n = int(w.shape[1]), int(w.shape[2])
    out: list[dict] = []
    x = torch.randn(GROUPS * m, k, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(GROUPS * m, n, device=dev, dtype=torch.bfloat16)
    offs = torch.arange(m, GROUPS * m + 1, m, device=dev, dtype=torch.int32)
    flops = 2.0 * GROUPS * m * k * n
    impl = "torch._grouped_mm"
    try:
        if not grouped:
            raise RuntimeError("no torch._grouped_mm")
        wt = w.transpose(-2, -1)
        fns = {
            "fwd": lambda: torch._grouped_mm(x, w, offs=offs),
            "dgrad": lambda: torch._grouped_mm(dy, wt, offs=offs),
            "wgrad": lambda: torch._grouped_mm(x.t(), dy, offs=offs),
        }
        for fn in fns.values():
            fn()
    except Exception as e:  # noqa: BLE001 - any failure falls back to one GEMM per expert
        impl = f"torch.matmul per expert ({type(e).__name__})"
        xs, dys = x.view(GROUPS, m, k), dy.view(GROUPS, m, n)
        fns = {
            "fwd": lambda: [xs[g] @ w[g] for g in range(GROUPS)],
            "dgrad": lambda: [dys[g] @ w[g].t() for g in range(GROUPS)],
            "wgrad": lambda: [xs[g].t() @ dys[g] for g in range(GROUPS)],
        }
    for p, fn in fns.items():
        s = timed(fn)
        out.append({"model": model, "gemm": gemm, "pass": p, "k": k, "n": n, "rows": m, "groups": GROUPS,
                    "dtype": "bf16", "impl": impl, "seconds": s, "flops": flops, "tflops": flops / s / 1e12})
    try:
        x8 = x.view(GROUPS, m, k).to(torch.float8_e4m3fn)
        w8 = w.transpose(-2, -1).contiguous().to(torch.float8_e4m3fn).transpose(-2, -1)
        one = torch.ones((), device=dev, dtype=torch.float32)

        def fn8() -> list[object]:
            return [torch._scaled_mm(x8[g], w8[g], scale_a=one, scale_b=one, out_dtype=torch.bfloat16) for g in range(GROUPS)]

        fn8()
        s = timed(fn8)
        out.append({"model": model, "gemm": gemm, "pass": "fwd", "k": k, "n": n, "rows": m, "groups": GROUPS,
                    "dtype": "fp8", "impl": "torch._scaled_mm per expert", "seconds": s, "flops": flops,
                    "tflops": flops / s / 1e12})
    except Exception as e:  # noqa: BLE001 - fp8 is optional
        out.append({"model": model, "gemm": gemm, "rows": m, "dtype": "fp8", "error": repr(e)[:200]})
    return out


def compare(path: str) -> int:
    """Print, per model and rows, the fwd + dgrad + wgrad bf16 efficiency over the H200's dense bf16 peak, and fp8's."""
    sys.path.insert(0, str(ROOT))
    from specs import load_gpu

    gpu = load_gpu("H200")
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    rows = [r for r in rows if not r.get("meta") and "seconds" in r]
    table = {}
    for r in rows:
        key = (r["model"], r["rows"], r["dtype"])
        t = table.setdefault(key, {"flops": 0.0, "seconds": 0.0})
        t["flops"] += r["flops"]
        t["seconds"] += r["seconds"]
    out = []
    for (model, m, dt), t in sorted(table.items()):
        peak = gpu.peak_flops_bf16 if dt == "bf16" else gpu.peak_flops("fp8")
        out.append({"model": model, "rows": m, "dtype": dt, "efficiency": round(t["flops"] / t["seconds"] / peak, 4)})
    print(json.dumps(out, indent=0))
    return 0


def fit(path: str) -> int:
    """Fit the cost model's rows curve to a ``--compare`` table's bf16 points: ``efficiency = plateau x rows / (rows +
    half_rows + half_rows_work / (hidden x expert FFN))`` (``cost_model.terms.compute.grouped_gemm_efficiency``), least
    squares on the log error; prints the three constants, the error of every point and their median and max."""
    import numpy as np
    from scipy.optimize import least_squares

    shapes = expert_shapes()
    pts = [r for r in json.loads(Path(path).read_text()) if r["dtype"] == "bf16"]
    rows = np.array([r["rows"] for r in pts], dtype=float)
    eff = np.array([r["efficiency"] for r in pts])
    hf = np.array([float(shapes[r["model"]][0] * shapes[r["model"]][1]) for r in pts])

    def resid(p: Any) -> Any:
        plateau, half, work = p
        return np.log(plateau * rows / (rows + half + work * 1e9 / hf)) - np.log(eff)

    sol = least_squares(resid, [0.7, 50.0, 1.0], bounds=([0.3, 0.0, 0.0], [1.0, 1e3, 10.0]))
    err = np.exp(sol.fun) - 1
    out = {"plateau": round(float(sol.x[0]), 4), "grouped_gemm_half_rows": round(float(sol.x[1]), 1),
           "grouped_gemm_half_rows_work": float(f"{sol.x[2] * 1e9:.4g}"), "points": len(pts),
           "median_abs_error": round(float(np.median(np.abs(err))), 4), "max_abs_error": round(float(np.max(np.abs(err))), 4),
           "errors": [{"model": r["model"], "rows": r["rows"], "measured": r["efficiency"], "error": round(float(e), 4)}
                      for r, e in zip(pts, err)]}
    print(json.dumps(out, indent=0))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", default=None)
    ap.add_argument("--fit", default=None, help="a --compare table (JSON): fit the rows curve")
    a = ap.parse_args()
    sys.exit(fit(a.fit) if a.fit else compare(a.compare) if a.compare else measure())
