"""Core attention timed by head dimension on one GPU (issue 14: the model's single ``attention_efficiency``).

    PYTHONPATH=/tmp/site:. OUT=... python3 benchmarks/h200_attention.py            # on the GPU (Transformer Engine)
    PYTHONPATH=. python benchmarks/h200_attention.py --compare FILE                 # here: measured against the model

The seventh batch's kernel profile (``docs/measurements.md``) had cuDNN's fused attention at 0.45 of the bf16 peak on
DeepSeek-V3's MLA (q / k head dim 192, v 128) against 0.60 on MiniMax-M2 (head dim 128), while the model prices every
head dim at one efficiency. This times Transformer Engine's ``DotProductAttention`` alone (bf16, ``sbhd``, causal,
micro-batch 1 unless a case says) on the attention shapes of the models the project validates on (one TP rank's heads),
and a head-dim sweep at fixed heads, forward and forward + backward: ``ITERS`` (default 20) calls queued back to back
after 5 warm-up and timed together with CUDA events (``fwd_s``, ``fwd_bwd_s``), and the GPU kernels' own time per call
from ``torch.profiler`` (``fwd_kernel_s``, ``fwd_bwd_kernel_s``). All cases run in one process per backend: ``fused``
(cuDNN, ``NVTE_FLASH_ATTN=0``) and ``default`` (what TE picks when nothing is set, as the harness runs it). Writes
``$OUT/attention.jsonl`` (and TE's debug log per backend, which names the backend it ran), one row per (case, backend):
the shape, ``fwd_s``, ``fwd_bwd_s``, the torch / TE versions, or ``error``.

``--compare`` reads such a file on a CPU machine and prints, per row, the attention efficiency the time implies in the
model's units (:func:`cost_model.terms.compute.core_attention_flops`: multiply-accumulates, forward + backward priced
as 3 forwards, against the GPU's bf16 peak from :mod:`specs.hardware`) beside the shipped calibration's, and the ratio
to the head-dim-128 case of the same heads and length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: (id, q heads, kv heads, q/k head dim, v head dim, seq_length, window or 0, softmax_type, micro-batch)
CASES: list[tuple[str, int, int, int, int, int, int, str, int]] = [
    *[(f"hd{d}-s{s}", 32, 8, d, d, s, 0, "vanilla", 1) for s in (4096, 8192) for d in (64, 96, 128, 192, 256)],
    ("hd192v128-s4096", 32, 8, 192, 128, 4096, 0, "vanilla", 1),
    ("hd192v128-s8192", 32, 8, 192, 128, 8192, 0, "vanilla", 1),
    ("minimax-m2-s8192", 48, 8, 128, 128, 8192, 0, "vanilla", 1),
    ("minimax-m2-s4096", 48, 8, 128, 128, 4096, 0, "vanilla", 1),
    ("qwen3-30b-s4096", 32, 4, 128, 128, 4096, 0, "vanilla", 1),
    ("qwen3-235b-tp2-s4096", 32, 2, 128, 128, 4096, 0, "vanilla", 1),
    ("llama-405b-tp8-s8192", 16, 1, 128, 128, 8192, 0, "vanilla", 1),
    ("llama-8b-s8192", 32, 8, 128, 128, 8192, 0, "vanilla", 1),
    ("deepseek-v3-s4096", 128, 128, 192, 128, 4096, 0, "vanilla", 1),
    ("deepseek-v3-s8192", 128, 128, 192, 128, 8192, 0, "vanilla", 1),
    ("deepseek-v3-tp8-s4096", 16, 16, 192, 128, 4096, 0, "vanilla", 1),
    ("gpt-oss-s4096", 64, 8, 64, 64, 4096, 0, "vanilla", 1),
    ("gpt-oss-sinks-s4096", 64, 8, 64, 64, 4096, 0, "learnable", 1),
    ("gpt-oss-window-s4096", 64, 8, 64, 64, 4096, 128, "vanilla", 1),
    ("gpt-oss-window-sinks-s4096", 64, 8, 64, 64, 4096, 128, "learnable", 1),
    ("gpt-oss-mbs4-s4096", 64, 8, 64, 64, 4096, 0, "vanilla", 4),
    ("gpt-oss-sinks-mbs4-s4096", 64, 8, 64, 64, 4096, 0, "learnable", 4),
    ("gpt-oss-window-sinks-mbs4-s4096", 64, 8, 64, 64, 4096, 128, "learnable", 4),
    ("gpt-oss-window-mbs4-s4096", 64, 8, 64, 64, 4096, 128, "vanilla", 4),
    ("deepseek-v3-tp2-s4096", 64, 64, 192, 128, 4096, 0, "vanilla", 1),
    # shapes held out of any fit made from the cases above (second batch): other lengths, head counts and windows
    ("judge-hd128-h8-s8192", 8, 8, 128, 128, 8192, 0, "vanilla", 1),
    ("judge-hd128-h64-s2048", 64, 8, 128, 128, 2048, 0, "vanilla", 1),
    ("judge-hd128-h16-s16384", 16, 2, 128, 128, 16384, 0, "vanilla", 1),
    ("judge-hd64-window128-s8192", 64, 8, 64, 64, 8192, 128, "vanilla", 1),
    ("judge-hd64-window1024-s4096", 64, 8, 64, 64, 4096, 1024, "vanilla", 1),
    ("judge-hd128-window4096-s8192", 32, 8, 128, 128, 8192, 4096, "vanilla", 1),
    ("judge-mla-h32-s8192-mbs2", 32, 32, 192, 128, 8192, 0, "vanilla", 2),
    ("hd128-mbs2-s4096", 32, 8, 128, 128, 4096, 0, "vanilla", 2),
]
#: ``default`` (nothing set) ran cuDNN's FusedAttention too in the first batch (no flash-attn on the device), so only
#: ``fused`` is timed unless ``BACKENDS=fused,default``.
ALL_BACKENDS = {"fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1"}, "default": {}}
BACKENDS = {k: ALL_BACKENDS[k] for k in os.environ.get("BACKENDS", "fused").split(",")}
FIELDS = (
    "id", "heads", "kv_heads", "head_dim_qk", "head_dim_v", "seq_length", "window", "softmax_type", "micro_batch_size",
)


def _time_one(spec: dict[str, Any], iters: int) -> dict[str, Any]:
    import torch
    import transformer_engine
    import transformer_engine.pytorch as te

    torch.cuda.set_device(0)
    hq, hkv, dqk, dv, s, w, b = (
        spec[k] for k in ("heads", "kv_heads", "head_dim_qk", "head_dim_v", "seq_length", "window", "micro_batch_size")
    )
    kw: dict[str, Any] = {
        "num_gqa_groups": hkv,
        "attention_dropout": 0.0,
        "qkv_format": "sbhd",
        "attn_mask_type": "causal",
    }
    if w:
        kw["window_size"] = (w - 1, 0)
    if spec["softmax_type"] != "vanilla":
        kw["softmax_type"] = spec["softmax_type"]
    attn = te.DotProductAttention(hq, (dqk, dv) if dqk != dv else dqk, **kw).cuda()
    dt = torch.bfloat16
    q = torch.randn(s, b, hq, dqk, device="cuda", dtype=dt, requires_grad=True)
    k = torch.randn(s, b, hkv, dqk, device="cuda", dtype=dt, requires_grad=True)
    v = torch.randn(s, b, hkv, dv, device="cuda", dtype=dt, requires_grad=True)
    grad = torch.randn(s, b, hq * dv, device="cuda", dtype=dt)

    def timed(fn: Any) -> float:
        # the calls are queued back to back and timed together, so the host's launch time hides behind the GPU's as
        # in a training step (timing each call alone measured the host on the small shapes: first batch, below)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / 1e3 / iters

    def kernel_time(fn: Any) -> float:
        # the GPU kernels' own time per call (torch.profiler), whatever the host does
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()) / 1e6 / iters

    def fwd() -> None:
        attn(q, k, v)

    def fwd_bwd() -> None:
        attn(q, k, v).backward(grad)

    out = {
        "fwd_s": timed(fwd),
        "fwd_bwd_s": timed(fwd_bwd),
        "fwd_kernel_s": kernel_time(fwd),
        "fwd_bwd_kernel_s": kernel_time(fwd_bwd),
        "torch": torch.__version__,
        "transformer_engine": transformer_engine.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    assert tuple(attn(q, k, v).shape) == (s, b, hq * dv)
    return out


def _one_backend(specs: list[dict[str, Any]], iters: int) -> None:
    """Times each case in this process (one backend: the environment is read when TE picks its backend); a case that
    fails is a row with ``error``."""
    for spec in specs:
        try:
            row = {**spec, **_time_one(spec, iters)}
        except Exception as e:  # noqa: BLE001 - a shape a backend refuses is a result, recorded
            row = {**spec, "error": f"{type(e).__name__}: {e}"[:400]}
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()


def run(out: Path, iters: int, only: set[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attention.jsonl"
    specs = [dict(zip(FIELDS, c, strict=True)) for c in CASES]
    specs = [s for s in specs if not only or s["id"] in only]
    for backend, env in BACKENDS.items():
        proc = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(specs), "--iters", str(iters)],
            env={**os.environ, "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "1", **env},
            capture_output=True,
            text=True,
            timeout=400,
        )
        (out / f"attention_{backend}.log").write_text(proc.stderr)  # TE's debug log names the backend it ran
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 and not lines:
            lines = [json.dumps({"id": "all", "error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:400]})]
        with path.open("a") as f:
            for ln in lines:
                f.write(json.dumps({**json.loads(ln), "backend": backend}) + "\n")
        sys.stdout.write(
            f"{backend}: {len(lines)} rows, rc {proc.returncode}\n{proc.stderr[-1500:] if proc.returncode else ''}"
        )
        sys.stdout.flush()
    return 0


def implied_efficiency(row: dict[str, Any], peak_flops: float) -> float:
    """The ``attention_efficiency`` (model units) a measured forward + backward implies: 3 forwards of
    ``b x s x keys x heads x (head_dim_qk + head_dim_v)`` multiply-accumulates (keys per query ``(s + 1) / 2`` under
    the causal mask, ``min(window, ...)`` averaged over the queries on a sliding window) over ``fwd_bwd_s x peak``.

    Raises:
        KeyError: a row without ``fwd_bwd_s`` (an errored case).
    """
    return 3 * _macs(row) / (float(row["fwd_bwd_s"]) * peak_flops)


def _keys(row: dict[str, Any]) -> float:
    s, w = int(row["seq_length"]), int(row["window"])
    return sum(min(i + 1, w) for i in range(s)) / s if w else (s + 1) / 2


def _macs(row: dict[str, Any], keys: float | None = None) -> float:
    k = _keys(row) if keys is None else keys
    return row["micro_batch_size"] * row["seq_length"] * k * row["heads"] * (row["head_dim_qk"] + row["head_dim_v"])


#: The cases :func:`derive` takes its constants from (the ``hd*-s8192`` head-dim cases too, when present).
NAMED_CASES = ("hd128-s4096", "hd128-s8192", "gpt-oss-s4096", "gpt-oss-window-s4096", "gpt-oss-sinks-s4096")


def derive(rows: list[dict[str, Any]], peak_flops: float) -> dict[str, Any]:
    """The constants the cost model takes from the kernel times (``fwd_bwd_kernel_s``) of a second-batch file, each
    from named cases (the ``judge-*`` cases are used by none):

    - ``call_s``: the fixed part of one call, forward + backward, from ``hd128-s4096`` and ``hd128-s8192`` (same heads,
      4x the work): ``t = call_s + macs x rate``;
    - ``efficiency_hd128``: ``3 x macs / (peak x (t - call_s))`` of ``hd128-s8192`` (model units, MACs);
    - ``head_dim_factor[(qk, v)]``: each ``hd*-s8192`` case's efficiency so computed over ``efficiency_hd128``;
    - ``window_extra_keys``: the keys per query beyond the window's own that ``gpt-oss-window-s4096`` costs at
      ``gpt-oss-s4096``'s time per key (its time above ``call_s``); a sliding-window call has no fixed part (its time
      went with its tokens: 3.7x at micro-batch 4, 1.9x at twice the length);
    - ``sink_extra_keys``: the keys per query the learnable softmax (``gpt-oss-sinks-s4096`` against ``gpt-oss-s4096``)
      costs, the same way.

    Raises:
        KeyError: a named case (:data:`NAMED_CASES`) missing or errored.
        ValueError: a case twice (two batches or backends).
    """
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        if "fwd_bwd_kernel_s" in r:
            if r["id"] in by:
                raise ValueError(f"case {r['id']!r} appears twice: derive from one batch and one backend at a time")
            by[r["id"]] = r
    missing = [k for k in NAMED_CASES if k not in by]
    if missing:
        raise KeyError(f"the constants come from named cases; missing or errored: {', '.join(missing)}")
    t = {k: float(r["fwd_bwd_kernel_s"]) for k, r in by.items()}
    m4, m8 = _macs(by["hd128-s4096"]), _macs(by["hd128-s8192"])
    call_s = (m8 / m4 * t["hd128-s4096"] - t["hd128-s8192"]) / (m8 / m4 - 1)

    def eff(case: str) -> float:
        return 3 * _macs(by[case]) / (peak_flops * (t[case] - call_s))

    e128 = eff("hd128-s8192")
    factor = {
        (by[c]["head_dim_qk"], by[c]["head_dim_v"]): eff(c) / e128
        for c in by
        if c.startswith("hd") and c.endswith("-s8192") and "mbs" not in c
    }
    full, kf = by["gpt-oss-s4096"], _keys(by["gpt-oss-s4096"])
    tf = t["gpt-oss-s4096"] - call_s
    window = t["gpt-oss-window-s4096"] / tf * kf - _keys(by["gpt-oss-window-s4096"])
    sink = (t["gpt-oss-sinks-s4096"] - t["gpt-oss-s4096"]) / tf * kf
    if full["head_dim_qk"] != 64 or call_s <= 0 or e128 <= 0 or sink < 0 or window < 0:
        raise ValueError(
            f"the named cases give no physical constants (call_s {call_s * 1e3:.3f} ms, window keys {window:.0f}, "
            f"sink keys {sink:.0f}, GPT-OSS head dim {full['head_dim_qk']}): not the shapes this script writes?"
        )
    return {
        "call_s": call_s,
        "efficiency_hd128": e128,
        "head_dim_factor": factor,
        "window_extra_keys": window,
        "sink_extra_keys": sink,
    }


def predict(row: dict[str, Any], d: dict[str, Any], peak_flops: float) -> float:
    """Forward + backward seconds of one case from :func:`derive`'s constants: ``call_s x micro_batch_size`` (none on a
    sliding window) ``+ 3 x macs' / (peak x efficiency_hd128 x factor)`` with the window's and the sinks' extra keys
    in ``macs'`` (an unmeasured head-dim pair interpolated as the cost model does,
    :func:`cost_model.terms.compute.head_dim_factor`)."""
    keys = (
        _keys(row)
        + (d["window_extra_keys"] if row["window"] else 0.0)
        + (d["sink_extra_keys"] if row["softmax_type"] != "vanilla" else 0.0)
    )
    from cost_model.terms.compute import head_dim_factor

    f = head_dim_factor((row["head_dim_qk"], row["head_dim_v"]), d["head_dim_factor"])
    fixed = 0.0 if row["window"] else d["call_s"] * row["micro_batch_size"]
    return fixed + 3 * _macs(row, keys) / (peak_flops * d["efficiency_hd128"] * f)


def compare(files: list[str]) -> int:
    from cost_model.calibration import load_calibration
    from specs.errors import TunerError
    from specs.hardware import load_gpu

    cal = load_calibration(None)
    peak = load_gpu("H200").peak_flops_bf16
    from tuner.validate_trials import json_lines

    rows: list[dict[str, Any]] = []
    for f in files:
        for _, where, row in json_lines(f, f, "one JSON object per line, as benchmarks/h200_attention.py writes"):
            need = ("id", "backend", *FIELDS[1:])
            if not isinstance(row, dict) or any(k not in row for k in need):
                raise TunerError(f"{where}: not a row of benchmarks/h200_attention.py (needs {', '.join(need)})")
            for k in ("id", "backend", "softmax_type", *(("error",) if "error" in row else ())):
                if not isinstance(row[k], str):
                    raise TunerError(f"{where}: {k} must be a string, got {row[k]!r:.40}")
            for k in ("heads", "kv_heads", "head_dim_qk", "head_dim_v", "seq_length", "micro_batch_size", "window"):
                v = row[k]
                if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "window" else 1):
                    raise TunerError(
                        f"{where}: {k} must be a whole number >= {0 if k == 'window' else 1}, got {v!r:.40}"
                    )
            if ("fwd_s" in row) != ("fwd_bwd_s" in row):
                raise TunerError(f"{where}: a timed row has both fwd_s and fwd_bwd_s")
            for k in ("fwd_s", "fwd_bwd_s", "fwd_kernel_s", "fwd_bwd_kernel_s"):
                if k in row and not (
                    isinstance(row[k], (int, float)) and not isinstance(row[k], bool) and 0 < row[k] < 1e3
                ):
                    raise TunerError(f"{where}: {k} must be a number of seconds in (0, 1000), got {row[k]!r}")
            rows.append(row)
    if not rows:
        raise TunerError(f"{', '.join(files)}: no rows")
    ok = [r for r in rows if "fwd_bwd_s" in r]
    ref = {
        (r["backend"], r["heads"], r["kv_heads"], r["seq_length"]): implied_efficiency(r, peak)
        for r in ok
        if r["head_dim_qk"] == 128 and r["head_dim_v"] == 128 and not r["window"] and r["micro_batch_size"] == 1
    }
    sys.stdout.write(f"shipped attention_efficiency {cal.attention_efficiency:.3f} (model units: MACs, bwd = 2 fwd)\n")
    sys.stdout.write(
        f"{'case':28s} {'backend':8s} {'fwd ms':>8s} {'fwd+bwd ms':>10s} {'eff':>6s} {'of peak':>8s} {'/hd128':>7s} "
        f"{'/shipped':>8s}\n"
    )
    for r in rows:
        if "fwd_bwd_s" not in r:
            sys.stdout.write(f"{r['id']:28s} {r['backend']:8s} error: {r.get('error', '?')[:80]}\n")
            continue
        e = implied_efficiency(r, peak)
        base = ref.get((r["backend"], r["heads"], r["kv_heads"], r["seq_length"]))
        rel = f"{e / base:7.2f}" if base else f"{'':7s}"
        sys.stdout.write(
            f"{r['id']:28s} {r['backend']:8s} {r['fwd_s'] * 1e3:8.2f} {r['fwd_bwd_s'] * 1e3:10.2f} {e:6.3f} "
            f"{2 * e:8.2f} {rel} {e / cal.attention_efficiency:8.2f}\n"
        )
    kern = [r for r in ok if "fwd_bwd_kernel_s" in r]
    if kern:
        try:
            d = derive(kern, peak)
        except (KeyError, ValueError, ZeroDivisionError) as e:
            sys.stdout.write(f"\nconstants not derived: {e.args[0]}\n")
            return 0
        sys.stdout.write("\nfrom the GPU kernels' times (fwd_bwd_kernel_s):\n")
        sys.stdout.write(
            f"  call_s {d['call_s'] * 1e3:.3f} ms, efficiency_hd128 {d['efficiency_hd128']:.4f}, "
            f"window_extra_keys {d['window_extra_keys']:.0f}, sink_extra_keys {d['sink_extra_keys']:.0f}\n"
        )
        sys.stdout.write(
            "  head_dim_factor " + ", ".join(f"{k}: {v:.3f}" for k, v in sorted(d["head_dim_factor"].items())) + "\n"
        )
        sys.stdout.write(f"  {'case':32s} {'kernel ms':>9s} {'predicted':>9s} {'error':>7s}\n")
        for r in kern:
            p = predict(r, d, peak)
            m = float(r["fwd_bwd_kernel_s"])
            sys.stdout.write(f"  {r['id']:32s} {m * 1e3:9.3f} {p * 1e3:9.3f} {p / m - 1:+7.1%}\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", nargs="+", metavar="FILE")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=int(os.environ.get("ITERS", "20")))
    ap.add_argument("--only", default=os.environ.get("ONLY", ""), help="comma-separated case ids")
    a = ap.parse_args()
    if a.compare:
        from specs.errors import TunerError

        try:
            return compare(a.compare)
        except TunerError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
    if a.one:
        _one_backend(json.loads(a.one), a.iters)
        return 0
    return run(
        Path(os.environ.get("OUT") or "h200_attention_out"), a.iters, set(filter(None, a.only.split(","))) or None
    )


if __name__ == "__main__":
    sys.exit(main())
