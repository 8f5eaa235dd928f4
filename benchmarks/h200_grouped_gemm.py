"""Expert GEMM speed by shape on one GPU (issue 14: does a routed expert's GEMM run slower when its weight is small?).

    # on the device (torch only)
    PYTHONPATH=. OUT=... python3 benchmarks/h200_grouped_gemm.py
    # on the device: TE's GroupedLinear beside torch's
    PYTHONPATH=. OUT=... IMPL=te python3 benchmarks/h200_grouped_gemm.py
    # here: the efficiency table by model and rows
    PYTHONPATH=. python benchmarks/h200_grouped_gemm.py --compare FILE
    # here: the rows curve the cost model ships
    PYTHONPATH=. python benchmarks/h200_grouped_gemm.py --fit COMPARE.json
    # here: TE / torch and fp8 / bf16 by shape (IMPL=te rows)
    PYTHONPATH=. python benchmarks/h200_grouped_gemm.py --compare-te F.jsonl
    # here: TE's time as GPU time and launch cost, three forms
    PYTHONPATH=. python benchmarks/h200_grouped_gemm.py --fit-te F.jsonl

For the routed experts of each MoE model in ``specs/data/models`` (fc1: ``hidden -> 2 x expert FFN``, SwiGLU's gate and
up fused as Megatron's ``TEGroupedLinear`` holds them; fc2: ``expert FFN -> hidden``), times the three GEMMs of a
training step (forward ``X W``, dgrad ``dY W^T``, wgrad ``X^T dY``) over ``GROUPS`` local experts of ``rows`` tokens
each, in bf16, with ``torch._grouped_mm`` (one grouped kernel, as cuBLAS / CUTLASS grouped GEMMs run) where torch has
it, and with one ``torch.matmul`` per expert otherwise (``impl`` says which). Also the forward in fp8 (e4m3, per-tensor
scales, ``torch._scaled_mm`` per expert), the recipe of the published fp8 rows. Times are CUDA-event medians of 20
after 5 warm-up. Writes ``$OUT/grouped_gemm.jsonl``: one row per (model, gemm, rows, dtype): ``seconds``, ``flops``,
``tflops``.

``IMPL=te`` (twelfth batch, 2026-12-03) times what the harness and production runs call instead: Transformer Engine's
``GroupedLinear`` (the module of Megatron's ``TEGroupedMLP``), forward and forward + backward of fc1 and fc2 over
``groups`` local experts (8 and 32 as the published EP layouts hold them, 256 as the one-GPU MiniMax-M2 slice does), and
``torch._grouped_mm`` at the same groups, rows and shapes, bf16 and fp8 (TE delayed scaling). Writes
``$OUT/grouped_te.jsonl``: one row per (model, gemm, groups, rows, dtype, impl, pass) with ``seconds`` and ``flops``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cuda_timing import cuda_median_seconds

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


def _one_shape(
    torch: Any,
    dev: Any,
    timed: Callable[[Callable[[], object]], float],
    grouped: bool,
    model: str,
    gemm: str,
    w: Any,
    m: int,
) -> list[dict]:
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
        out.append(
            {
                "model": model,
                "gemm": gemm,
                "pass": p,
                "k": k,
                "n": n,
                "rows": m,
                "groups": GROUPS,
                "dtype": "bf16",
                "impl": impl,
                "seconds": s,
                "flops": flops,
                "tflops": flops / s / 1e12,
            }
        )
    try:
        x8 = x.view(GROUPS, m, k).to(torch.float8_e4m3fn)
        w8 = w.transpose(-2, -1).contiguous().to(torch.float8_e4m3fn).transpose(-2, -1)
        one = torch.ones((), device=dev, dtype=torch.float32)

        def fn8() -> list[object]:
            return [
                torch._scaled_mm(x8[g], w8[g], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                for g in range(GROUPS)
            ]

        fn8()
        s = timed(fn8)
        out.append(
            {
                "model": model,
                "gemm": gemm,
                "pass": "fwd",
                "k": k,
                "n": n,
                "rows": m,
                "groups": GROUPS,
                "dtype": "fp8",
                "impl": "torch._scaled_mm per expert",
                "seconds": s,
                "flops": flops,
                "tflops": flops / s / 1e12,
            }
        )
    except Exception as e:  # noqa: BLE001 - fp8 is optional
        out.append({"model": model, "gemm": gemm, "rows": m, "dtype": "fp8", "error": repr(e)[:200]})
    return out


#: (groups, rows) of the TE batch: the published EP layouts' local experts at their rows, and the one-GPU slices'.
TE_CASES = ((8, 256), (8, 1024), (8, 4096), (32, 256), (32, 1024), (32, 4096))
TE_SLICE_CASES = {"MiniMax-M2": ((256, 256), (256, 512), (256, 1024))}


def measure_te() -> int:
    """TE ``GroupedLinear`` against ``torch._grouped_mm`` (module docstring); one JSON line per timing."""
    import torch
    import transformer_engine
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    out = Path(os.environ.get("OUT") or "h200_grouped_gemm_out")
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", 0)
    fh = open(out / "grouped_te.jsonl", "w", encoding="utf-8")  # noqa: SIM115 - written row by row (a cut call keeps its rows)
    fh.write(
        json.dumps(
            {
                "meta": True,
                "torch": torch.__version__,
                "transformer_engine": transformer_engine.__version__,
                "gpu": torch.cuda.get_device_name(0),
            }
        )
        + "\n"
    )

    def emit(**r: Any) -> None:
        fh.write(json.dumps(r) + "\n")
        fh.flush()

    def timed(fn: Callable[[], object]) -> float:
        return cuda_median_seconds(fn, reps=20, warm=5)

    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    for model, (h, f) in expert_shapes().items():
        for groups, m in TE_CASES + TE_SLICE_CASES.get(model, ()):
            for gemm, (k, n) in {"fc1": (h, 2 * f), "fc2": (f, h)}.items():
                base = {
                    "model": model,
                    "gemm": gemm,
                    "k": k,
                    "n": n,
                    "rows": m,
                    "groups": groups,
                    "flops": 2.0 * groups * m * k * n,
                }
                try:
                    for r in _te_case(torch, te, recipe, dev, timed, groups, m, k, n):
                        emit(**base, **r)
                except Exception as e:  # noqa: BLE001 - one shape's failure is recorded, the rest still run
                    emit(**base, error=repr(e)[:300])
                torch.cuda.empty_cache()
            print(model, groups, m, flush=True)
    fh.close()
    return 0


def _te_case(
    torch: Any,
    te: Any,
    recipe: Any,
    dev: Any,
    timed: Callable[[Callable[[], object]], float],
    groups: int,
    m: int,
    k: int,
    n: int,
) -> list[dict]:
    """The timings of one (groups, rows, k, n): TE bf16 and fp8 forward and backward, torch bf16 forward and
    backward."""
    out: list[dict] = []
    lin = te.GroupedLinear(groups, k, n, bias=False, params_dtype=torch.bfloat16, device=dev)
    x = torch.randn(groups * m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(groups * m, n, device=dev, dtype=torch.bfloat16)
    splits = [m] * groups
    for dtype in ("bf16", "fp8"):

        def ctx(dtype: str = dtype) -> Any:
            return te.fp8_autocast(enabled=True, fp8_recipe=recipe) if dtype == "fp8" else torch.enable_grad()

        def fwd(ctx: Callable[[], Any] = ctx) -> object:
            with ctx():
                return lin(x, splits)

        def step(ctx: Callable[[], Any] = ctx) -> None:
            with ctx():
                y = lin(x, splits)
            y.backward(dy)

        tf, ts = timed(fwd), timed(step)
        out.append({"dtype": dtype, "impl": "te.GroupedLinear", "pass": "fwd", "seconds": tf})
        out.append({"dtype": dtype, "impl": "te.GroupedLinear", "pass": "bwd", "seconds": max(ts - tf, 0.0)})
    w = torch.randn(groups, k, n, device=dev, dtype=torch.bfloat16) * 0.02
    xs = torch.randn(groups * m, k, device=dev, dtype=torch.bfloat16)
    dys = torch.randn(groups * m, n, device=dev, dtype=torch.bfloat16)
    offs = torch.arange(m, groups * m + 1, m, device=dev, dtype=torch.int32)
    wt = w.transpose(-2, -1)
    out.append(
        {
            "dtype": "bf16",
            "impl": "torch._grouped_mm",
            "pass": "fwd",
            "seconds": timed(lambda: torch._grouped_mm(xs, w, offs=offs)),
        }
    )
    out.append(
        {
            "dtype": "bf16",
            "impl": "torch._grouped_mm",
            "pass": "bwd",
            "seconds": timed(
                lambda: (torch._grouped_mm(dys, wt, offs=offs), torch._grouped_mm(xs.t(), dys, offs=offs))
            ),
        }
    )
    return out


def compare_te(path: str) -> int:
    """Per (model, groups, rows): fwd + bwd efficiency of TE bf16, torch bf16 and TE fp8 over the H200's peaks, and the
    ratios TE / torch (bf16) and fp8 / bf16 (TE)."""
    from specs import load_gpu

    gpu = load_gpu("H200")
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    acc: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("meta") or "seconds" not in r:
            continue
        t = acc.setdefault((r["model"], r["groups"], r["rows"], r["dtype"], r["impl"]), {"flops": 0.0, "seconds": 0.0})
        t["flops"] += r["flops"] * (2 if r["pass"] == "bwd" else 1)  # dgrad + wgrad: twice the forward's FLOPs
        t["seconds"] += r["seconds"]
    eff = {
        k: v["flops"] / v["seconds"] / (gpu.peak_flops_bf16 if k[3] == "bf16" else gpu.peak_flops("fp8"))
        for k, v in acc.items()
        if v["seconds"] > 0
    }
    out = []
    for model, g, m in sorted({k[:3] for k in eff}):
        te_b, to_b, te_8 = (
            eff.get((model, g, m, d, i))
            for d, i in (("bf16", "te.GroupedLinear"), ("bf16", "torch._grouped_mm"), ("fp8", "te.GroupedLinear"))
        )
        tps = {
            (model, g, m, d, i): acc[(model, g, m, d, i)]["seconds"]
            for d, i in (("bf16", "te.GroupedLinear"), ("fp8", "te.GroupedLinear"))
            if (model, g, m, d, i) in acc
        }
        s16, s8 = tps.get((model, g, m, "bf16", "te.GroupedLinear")), tps.get((model, g, m, "fp8", "te.GroupedLinear"))
        out.append(
            {
                "model": model,
                "groups": g,
                "rows": m,
                "te_bf16": _r(te_b),
                "torch_bf16": _r(to_b),
                "te_fp8": _r(te_8),
                "te_over_torch": _r(te_b / to_b if te_b and to_b else None),
                "fp8_speedup": _r(s16 / s8 if s16 and s8 else None),
            }
        )
    print(json.dumps(out, indent=0))
    return 0


def fit_te(path: str) -> int:
    """How TE's ``GroupedLinear`` time is made (twelfth batch): per (model, groups, rows, dtype), fc1 + fc2 forward +
    backward measured against the shipped model's GPU time of those GEMMs (the rows curve of
    ``cost_model.terms.compute.grouped_gemm_efficiency`` with the shipped calibration; fp8 at the fp8 peak x
    ``fp8_gemm_efficiency_ratio``) and a launch cost of ``4 x per_call + 6 x groups x per_gemm`` (two modules, forward
    and backward; six GEMMs per expert), combined as their ``sum``, their ``max``, or ``soft`` (the root of the sum
    of squares). Least squares on the log error; prints per dtype and form the two constants and the median and max
    |error|."""
    import numpy as np

    from cost_model.calibration import DEFAULT_CALIBRATION as cal
    from specs import load_gpu

    gpu = load_gpu("H200")
    shapes = expert_shapes()
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    t = {
        (r["model"], r["gemm"], r["groups"], r["rows"], r["dtype"], r["impl"], r["pass"]): r["seconds"]
        for r in rows
        if not r.get("meta") and "seconds" in r
    }
    out: dict[str, Any] = {}
    for dtype in ("bf16", "fp8"):
        pts = []
        for model, gemm, groups, m, d, impl, p in t:
            if (impl, p, gemm, d) != ("te.GroupedLinear", "fwd", "fc1", dtype):
                continue
            h, f = shapes[model]
            measured = sum(t[(model, g, groups, m, d, impl, q)] for g in ("fc1", "fc2") for q in ("fwd", "bwd"))
            flops = 3 * (2 * groups * m * h * 2 * f + 2 * groups * m * f * h)
            eff = max(
                cal.grouped_gemm_efficiency
                * m
                / (m + cal.grouped_gemm_half_rows + cal.grouped_gemm_half_rows_work / (h * f)),
                cal.grouped_gemm_efficiency_floor,
            )
            peak = gpu.peak_flops_bf16 if dtype == "bf16" else gpu.peak_flops("fp8") * cal.fp8_gemm_efficiency_ratio
            pts.append((groups, flops / (peak * eff), measured))
        g, gpu_t, y = (np.array([p[i] for p in pts]) for i in range(3))
        for name, r in _fit_forms(g, gpu_t, y).items():
            out[f"{dtype}/{name}"] = {**r, "points": len(pts)}
    print(json.dumps(out, indent=1))
    return 0


def _fit_forms(g: Any, gpu_t: Any, y: Any) -> dict[str, dict[str, float]]:
    """:func:`fit_te`'s three forms fitted to points of ``g`` groups, model GPU time ``gpu_t`` and measured ``y``
    (s)."""
    import numpy as np
    from scipy.optimize import least_squares

    forms = {
        "sum": lambda a, b: gpu_t + 4 * a + 6 * g * b,
        "max": lambda a, b: np.maximum(gpu_t, 4 * a + 6 * g * b),
        "soft": lambda a, b: np.hypot(gpu_t, 4 * a + 6 * g * b),
    }
    out = {}
    for name, fn in forms.items():
        sol = least_squares(
            lambda x, fn=fn: np.log(fn(x[0] * 1e-6, x[1] * 1e-6)) - np.log(y),
            [100.0, 20.0],
            bounds=([0.0, 0.0], [5000.0, 500.0]),
        )
        err = np.exp(sol.fun) - 1
        out[name] = {
            "per_call_us": round(float(sol.x[0]), 1),
            "per_gemm_per_expert_us": round(float(sol.x[1]), 1),
            "median_abs_error": round(float(np.median(np.abs(err))), 4),
            "max_abs_error": round(float(np.max(np.abs(err))), 4),
        }
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def compare(path: str) -> int:
    """Print, per model and rows, the fwd + dgrad + wgrad bf16 efficiency over the H200's dense bf16 peak, and fp8's."""
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
    out = {
        "plateau": round(float(sol.x[0]), 4),
        "grouped_gemm_half_rows": round(float(sol.x[1]), 1),
        "grouped_gemm_half_rows_work": float(f"{sol.x[2] * 1e9:.4g}"),
        "points": len(pts),
        "median_abs_error": round(float(np.median(np.abs(err))), 4),
        "max_abs_error": round(float(np.max(np.abs(err))), 4),
        "errors": [
            {"model": r["model"], "rows": r["rows"], "measured": r["efficiency"], "error": round(float(e), 4)}
            for r, e in zip(pts, err)
        ],
    }
    print(json.dumps(out, indent=0))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", default=None)
    ap.add_argument("--fit", default=None, help="a --compare table (JSON): fit the rows curve")
    ap.add_argument(
        "--compare-te", default=None, help="a grouped_te.jsonl of IMPL=te: TE against torch, fp8 against bf16"
    )
    ap.add_argument(
        "--fit-te", default=None, help="a grouped_te.jsonl of IMPL=te: how its time is made (sum, max, soft)"
    )
    a = ap.parse_args()
    if a.fit_te:
        sys.exit(fit_te(a.fit_te))
    if a.fit:
        sys.exit(fit(a.fit))
    if a.compare_te:
        sys.exit(compare_te(a.compare_te))
    sys.exit(compare(a.compare) if a.compare else measure_te() if os.environ.get("IMPL") == "te" else measure())
