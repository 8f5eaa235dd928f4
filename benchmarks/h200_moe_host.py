"""Host time against GPU time of MoE decoder layers on one GPU (issue 14: the launch-bound MoE regime).

    PYTHONPATH=/tmp/site:. OUT=... BUDGET_S=300 python3 benchmarks/h200_moe_host.py          # on the GPU
    PYTHONPATH=. python benchmarks/h200_moe_host.py --compare FILE.jsonl [FILE ...]          # here: the analysis

Why: the published Qwen3-30B-A3B rows at micro-batch 1 take about 9 ms per MoE layer per micro-batch on 16 H100 and
on 8 B200 alike (``docs/validation.md``, 2026-12-03 fourth session), although the B200 does the GPU work in half the
time: a layer whose time is the host's. The cost model added its fixed per-layer and per-expert costs (fitted on the
published runs) to the GPU time; whether a layer's host time adds to its GPU time or hides under it, and how long it
is, was never measured on a whole layer.

What runs: for each configuration (a model's layer shape, its local-expert count: the experts one EP rank holds, since
with top-k routing one GPU holding ``E / ep`` experts gets the rows per expert of that EP rank), a ``GPTModel`` with
``post_process=False`` (the embedding and the decoder layers) built from the harness's own ``TransformerConfig``
(:func:`launch.harness.build._transformer_config`: TE layer spec, grouped GEMM, alltoall dispatcher, the harness's
fusions), then at each (sequence, micro-batch) point :data:`POINTS` back-to-back training iterations with no
synchronisation between them, each timed three ways:

- ``fwd_s`` / ``bwd_s``: CUDA events around the forward and around ``backward`` (the GPU's time, idle gaps waiting for
  the host included);
- ``host_fwd_s`` / ``host_bwd_s``: the host's time in the forward call and in ``backward`` (``time.perf_counter``; the
  forward waits at the router's device-to-host sync of the tokens per expert, so in a GPU-bound layer it includes the
  wait);
- ``kernels_fwd_s`` / ``kernels_fwd_bwd_s``: the CUDA kernels' total under ``torch.profiler`` over :data:`PROFILE_ITERS`
  forwards (grad enabled, graph dropped) and forward + backward passes (the GPU's work without the gaps).

The first point (128 tokens) leaves the GPU almost nothing to do, so its event time is the host's time per pass; the
others are the published rows' 4,096-token sequences at micro-batch 1, 2 and 4. Configurations with 1 and 2 layers
give the per-layer host time as the difference (the embedding's own host and GPU work cancel). Writes
``$OUT/moe_host.jsonl``: one row per (configuration, point), then an ``event: versions`` row with the CPU's name.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.h200_te_layouts import BASE_LAYOUT

QW, MM = "Qwen3-30B-A3B", "MiniMax-M2"
#: id -> (model, layers, local experts, precision, fp8_recipe, fused). The Qwen3-30B-A3B expert counts are one rank of
#: EP 16, 8, 4 and 1 (the published rows run EP 8 and 16); MiniMax-M2's one rank of EP 32, 8 and 1 (the main job runs
#: EP 8). ``fused``: the production recipes' fusions on top of the harness's configuration (TE's fused token
#: permutation ``moe_permute_fusion``, the fused RoPE, bias-dropout fusion); the others run as harness trials do.
CONFIGS: dict[str, tuple[str, int, int, str, str | None, bool]] = {
    "qw-e16-l1": (QW, 1, 16, "bf16", None, False),
    "qw-e16-l2": (QW, 2, 16, "bf16", None, False),
    "qw-e16-l1-fu": (QW, 1, 16, "bf16", None, True),
    "qw-e16-l2-fu": (QW, 2, 16, "bf16", None, True),
    "qw-e8-l1": (QW, 1, 8, "bf16", None, False),
    "qw-e32-l1": (QW, 1, 32, "bf16", None, False),
    "qw-e128-l1": (QW, 1, 128, "bf16", None, False),
    "qw-e16-l1-fp8": (QW, 1, 16, "fp8", "delayed", False),
    "mm-e32-l1": (MM, 1, 32, "bf16", None, False),
    "mm-e32-l2": (MM, 2, 32, "bf16", None, False),
    "mm-e8-l1": (MM, 1, 8, "bf16", None, False),
    "mm-e256-l1": (MM, 1, 256, "bf16", None, False),
}
#: (seq_length, micro_batch_size): a host-only probe, then the published rows' sequence at micro-batch 1, 2, 4.
POINTS: tuple[tuple[int, int], ...] = ((128, 1), (4096, 1), (4096, 2), (4096, 4))
ITERS = 10
WARMUP = 3
PROFILE_ITERS = 3


def _spec(cid: str, seq: int) -> Any:
    from launch.harness.spec import HarnessEnv, build_spec, override_model
    from specs import Workload, load_model
    from specs.layout import Layout
    from specs.model import slice_model

    name, layers, experts, precision, recipe, fused = CONFIGS[cid]
    model = override_model(slice_model(load_model(name), layers), {"num_experts": experts})
    options: dict[str, Any] = {"fp8_recipe": recipe} if recipe else {}
    if fused:
        options["moe_permute_fusion"] = True
    return build_spec(
        model,
        Layout.from_dict(BASE_LAYOUT),
        Workload(seq_length=seq, global_batch_size=1, precision=precision),
        env=HarnessEnv(transformer_engine=True),
        steps=1,
        warmup_steps=0,
        options=options or None,
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure(out: Path, configs: list[str], budget_s: float) -> int:
    """Run the configurations on the GPU (see the module docstring); returns 1 if any failed."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from benchmarks.one_gpu import decoder_model, init_one_gpu, jsonl_emitter
    from launch.harness.build import _transformer_config, _versions

    t0 = time.monotonic()
    init_one_gpu("29543")
    emit = jsonl_emitter(out / "moe_host.jsonl", lambda row: {k: v for k, v in row.items() if not k.endswith("_all")})

    def kernels_total(fn: Any) -> float:
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILE_ITERS):
                fn()
            torch.cuda.synchronize()
        total = 0.0
        for e in prof.key_averages():
            t_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
            if t_us > 0 and e.count > 0:
                total += t_us / 1e6
        return total / PROFILE_ITERS

    def one_config(cid: str) -> None:
        name, layers, experts, precision, recipe, fused = CONFIGS[cid]
        spec = _spec(cid, POINTS[-1][0])
        cfg = _transformer_config(spec)
        if (
            fused
        ):  # Megatron-LM's defaults that need no main-grad buffer (gradient-accumulation fusion does; no DDP here)
            cfg.apply_rope_fusion = True
            cfg.bias_dropout_fusion = True
        m = spec.model
        tb = time.monotonic()
        model = decoder_model(cfg, m, max(s for s, _ in POINTS))
        build_s = time.monotonic() - tb
        g = torch.Generator(device="cuda").manual_seed(1234)
        for seq, mbs in POINTS:
            if time.monotonic() - t0 > budget_s:
                emit(
                    {
                        "event": "skipped",
                        "config": cid,
                        "seq_length": seq,
                        "micro_batch_size": mbs,
                        "reason": f"budget {budget_s:.0f} s spent",
                    }
                )
                continue
            tokens = torch.randint(0, m["vocab_size"], (mbs, seq), device="cuda", generator=g)
            pos = torch.arange(seq, device="cuda").unsqueeze(0).expand(mbs, seq)
            with torch.no_grad():
                shape = model(tokens, pos, None).shape
            grad_out = (torch.randn(shape, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)

            def fwd_bwd(tokens: Any = tokens, pos: Any = pos, grad_out: Any = grad_out) -> None:
                model(tokens, pos, None).backward(grad_out)

            def fwd(tokens: Any = tokens, pos: Any = pos) -> None:
                model(tokens, pos, None)

            for _ in range(WARMUP):
                fwd_bwd()
            torch.cuda.synchronize()
            ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(ITERS)]
            hf, hb = [], []
            for k in range(ITERS):
                ev[k][0].record()
                a = time.perf_counter()
                y = model(tokens, pos, None)
                b = time.perf_counter()
                ev[k][1].record()
                y.backward(grad_out)
                c = time.perf_counter()
                ev[k][2].record()
                del y
                hf.append(b - a)
                hb.append(c - b)
            torch.cuda.synchronize()
            tf = [e[0].elapsed_time(e[1]) / 1e3 for e in ev]
            tbw = [e[1].elapsed_time(e[2]) / 1e3 for e in ev]
            k_fb = kernels_total(fwd_bwd)
            k_f = kernels_total(fwd)
            emit(
                {
                    "config": cid,
                    "model": name,
                    "layers": layers,
                    "num_experts": experts,
                    "precision": precision,
                    "fp8_recipe": recipe,
                    "fused": fused,
                    "seq_length": seq,
                    "micro_batch_size": mbs,
                    "tokens": seq * mbs,
                    "fwd_s": statistics.median(tf),
                    "bwd_s": statistics.median(tbw),
                    "host_fwd_s": statistics.median(hf),
                    "host_bwd_s": statistics.median(hb),
                    "kernels_fwd_s": k_f,
                    "kernels_fwd_bwd_s": k_fb,
                    "iters": ITERS,
                    "fwd_s_all": tf,
                    "bwd_s_all": tbw,
                    "host_fwd_s_all": hf,
                    "host_bwd_s_all": hb,
                    "build_s": build_s,
                    "elapsed_s": time.monotonic() - t0,
                }
            )

    failures = 0
    for cid in configs:
        if time.monotonic() - t0 > budget_s:
            emit({"event": "skipped", "config": cid, "reason": f"budget {budget_s:.0f} s spent"})
            continue
        try:
            one_config(cid)
        except Exception as e:  # noqa: BLE001 - a configuration that fails is a row, the others still run
            failures += 1
            emit({"event": "error", "config": cid, "error": f"{type(e).__name__}: {str(e)[:400]}"})
        torch.cuda.empty_cache()
    emit(
        {
            "event": "versions",
            **_versions(),
            "gpu": torch.cuda.get_device_name(0),
            "cpu": _cpu_name(),
            "cpus": os.cpu_count(),
            "elapsed_s": time.monotonic() - t0,
        }
    )
    dist.destroy_process_group()
    return 1 if failures else 0


#: What a measured row must carry, each a finite number > 0 (seconds).
TIMES = ("fwd_s", "bwd_s", "host_fwd_s", "host_bwd_s", "kernels_fwd_s", "kernels_fwd_bwd_s")
#: The longest pass a row may report (s): one layer's forward or backward takes milliseconds on the device; an hour is a
#: unit slip, and squares of 1e308 are not numbers.
MAX_PASS_S = 3600.0
#: Times whose per-layer value the analysis uses (the host's own times are reported, not fitted).
USED = ("fwd_s", "bwd_s", "kernels_fwd_s", "kernels_bwd_s")


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_rows(paths: list[str]) -> dict[tuple[str, int, int], dict[str, float]]:
    """``(config, seq_length, micro_batch_size) -> row`` of measured rows (event rows skipped), with ``kernels_bwd_s``.

    Raises:
        ValueError: a file that cannot be read, a line that is not a JSON object, a row of an unknown configuration or
            point, a field that contradicts its configuration (model, layers, experts, precision), a time that is
            missing, not a number, at most 0 or above :data:`MAX_PASS_S`, forward kernels longer than the forward +
            backward ones, a second row of one key, or no measured row (named by file and line).
    """
    from benchmarks.device_rows import finite_number
    from tuner.validate_trials import json_lines

    out: dict[tuple[str, int, int], dict[str, float]] = {}
    for p in paths:
        for _, where, d in json_lines(p, str(p), "expected the rows benchmarks/h200_moe_host.py writes"):
            if not isinstance(d, dict):
                raise ValueError(f"{where}: not a JSON object; expected the rows benchmarks/h200_moe_host.py writes")
            if "event" in d:
                continue
            cid, seq, mbs = d.get("config"), d.get("seq_length"), d.get("micro_batch_size")
            if (
                not isinstance(cid, str)
                or cid not in CONFIGS
                or not _whole(seq)
                or not _whole(mbs)
                or (seq, mbs) not in POINTS
            ):
                raise ValueError(
                    f"{where}: configuration {cid!r:.40} at seq {seq!r:.12} / micro-batch {mbs!r:.12} is not one "
                    f"this benchmark runs ({', '.join(CONFIGS)} at (seq, micro-batch) {POINTS})"
                )
            name, layers, experts, precision, _, _ = CONFIGS[cid]
            said = {"model": name, "layers": layers, "num_experts": experts, "precision": precision}
            off = [f"{k} {d[k]!r:.30} (configuration {cid} has {v!r})" for k, v in said.items() if k in d and d[k] != v]
            if off:
                raise ValueError(f"{where}: {'; '.join(off)}: not a row of configuration {cid}")
            bad = [k for k in TIMES if not finite_number(d.get(k), True) or d[k] > MAX_PASS_S]
            if bad:
                raise ValueError(
                    f"{where}: {', '.join(bad)} must be numbers > 0 and at most {MAX_PASS_S:.0f} (seconds per pass)"
                )
            if d["kernels_fwd_s"] > d["kernels_fwd_bwd_s"]:
                raise ValueError(
                    f"{where}: kernels_fwd_s {d['kernels_fwd_s']:.6g} is above kernels_fwd_bwd_s "
                    f"{d['kernels_fwd_bwd_s']:.6g}: "
                    "a forward's kernels cannot take longer than a forward and a backward"
                )
            key = (cid, seq, mbs)
            if key in out:
                raise ValueError(f"{where}: a second row of {cid} at seq {seq}, micro-batch {mbs}")
            row = {k: float(d[k]) for k in TIMES}
            row["kernels_bwd_s"] = row["kernels_fwd_bwd_s"] - row["kernels_fwd_s"]
            out[key] = row
    if not out:
        raise ValueError(f"{', '.join(paths)}: no measured rows (a row of benchmarks/h200_moe_host.py has fwd_s)")
    return out


#: Pairs of 1- and 2-layer configurations: their difference is one layer without the embedding.
LAYER_PAIRS = {
    "qw-e16": ("qw-e16-l1", "qw-e16-l2"),
    "qw-e16-fu": ("qw-e16-l1-fu", "qw-e16-l2-fu"),
    "mm-e32": ("mm-e32-l1", "mm-e32-l2"),
}
PROBE = POINTS[0]


def per_layer(
    rows: dict[tuple[str, int, int], dict[str, float]],
) -> tuple[dict[tuple[str, int, int], dict[str, float]], list[str]]:
    """One MoE layer's times per (configuration, point), and the rows left out with why.

    For :data:`LAYER_PAIRS` measured at a point, the 2-layer row less the 1-layer row (keyed by the pair's name); for
    a 1-layer configuration (a pair's 1-layer row without its partner too) its row less its model's embedding share (the
    plain pair's 1-layer row less its layer at the same point; nothing taken off where that pair was not measured). A
    2-layer row without its 1-layer partner is left out.

    Raises:
        ValueError: a per-layer time (events or kernels, forward or backward) at or below 0: the 2-layer row is not
            slower than the 1-layer row, or the embedding's share is the whole row (named by configuration and point).
    """
    out: dict[tuple[str, int, int], dict[str, float]] = {}
    emb: dict[tuple[str, int, int], dict[str, float]] = {}
    left_out: list[str] = []
    keys = (*TIMES, "kernels_bwd_s")
    paired: set[tuple[str, int, int]] = set()

    def check(name: str, seq: int, mbs: int, layer: dict[str, float], how: str) -> dict[str, float]:
        low = [k for k in USED if layer[k] <= 0]
        if low:
            raise ValueError(
                f"{name} at seq {seq}, micro-batch {mbs}: one layer's {', '.join(low)} is at or below 0 ({how}); "
                "the rows cannot be one layer's times"
            )
        return layer

    for name, (one, two) in LAYER_PAIRS.items():
        for seq, mbs in POINTS:
            a, b = rows.get((one, seq, mbs)), rows.get((two, seq, mbs))
            if a and b:
                layer = check(name, seq, mbs, {k: b[k] - a[k] for k in keys}, f"{two} less {one}")
                out[(name, seq, mbs)] = layer
                paired |= {(one, seq, mbs), (two, seq, mbs)}
                if not CONFIGS[one][5]:  # the plain pair's embedding share stands for the plain configurations
                    emb[(CONFIGS[one][0], seq, mbs)] = {k: a[k] - layer[k] for k in keys}
            elif b:
                left_out.append(
                    f"{two} at seq {seq}, micro-batch {mbs}: no {one} row at that point to take its embedding off"
                )
    for (cid, seq, mbs), r in sorted(rows.items()):
        model, layers, _, _, _, fused = CONFIGS[cid]
        if layers != 1 or (cid, seq, mbs) in paired:
            continue
        e = emb.get((model, seq, mbs)) if not fused else None
        how = f"{cid} less the embedding share of {model}'s pair" if e else cid
        out[(cid, seq, mbs)] = check(cid, seq, mbs, {k: r[k] - (e or {}).get(k, 0.0) for k in keys}, how)
    return out, left_out


def fit_host(layers: dict[tuple[str, int, int], dict[str, float]]) -> dict[str, Any]:
    """The host's time of one MoE layer per pass from the :data:`PROBE` points (128 tokens: the GPU waits for the
    host), fitted as ``layer + gemms x local experts x per_gemm`` (``gemms`` 2 forward, 4 backward: fc1 and fc2, their
    dgrad and wgrad) by least squares over the plain bf16 configurations, forward and backward separately and with one
    ``per_gemm`` for both."""
    import numpy as np

    xs, ys, names = [], [], []
    for (cid, seq, mbs), r in sorted(layers.items()):
        if (seq, mbs) != PROBE:
            continue
        base = LAYER_PAIRS.get(cid, (cid,))[0]
        _, _, experts, precision, _, fused = CONFIGS[base]
        if precision != "bf16" or fused:
            continue
        xs += [[1, 0, 2 * experts], [0, 1, 4 * experts]]
        ys += [r["fwd_s"], r["bwd_s"]]
        names.append(cid)
    counts = {CONFIGS[LAYER_PAIRS.get(c, (c,))[0]][2] for c in names}
    if len(ys) < 6 or len(counts) < 2:
        raise ValueError(
            "fewer than three plain bf16 configurations, of at least two local-expert counts, measured at the "
            f"128-token point ({', '.join(names) or 'none'}): nothing to fit the per-expert cost with"
        )
    sol, *_ = np.linalg.lstsq(np.array(xs, float), np.array(ys, float), rcond=None)
    pred = np.array(xs, float) @ sol
    err = pred / np.array(ys) - 1
    return {
        "layer_forward_s": float(sol[0]),
        "layer_backward_s": float(sol[1]),
        "per_expert_gemm_s": float(sol[2]),
        "configurations": names,
        "median_abs_error": float(np.median(np.abs(err))),
        "max_abs_error": float(np.max(np.abs(err))),
    }


def combine(layers: dict[tuple[str, int, int], dict[str, float]]) -> dict[str, Any]:
    """At each measured point above the probe: the layer's measured time per pass (events) against its host time (the
    probe's event time of the same configuration) and its kernels' time combined three ways: the sum, the larger, and
    the root of the sum of squares. Returns every row and the median |error| of each form, forward and backward."""
    import numpy as np

    rows, errs = [], {f: {"fwd": [], "bwd": []} for f in ("sum", "max", "rss")}
    for (cid, seq, mbs), r in sorted(layers.items()):
        probe = layers.get((cid, *PROBE))
        if (seq, mbs) == PROBE or probe is None:
            continue
        row: dict[str, Any] = {"config": cid, "tokens": seq * mbs}
        for d, k in (("fwd", "kernels_fwd_s"), ("bwd", "kernels_bwd_s")):
            h, g, m = probe[f"{d}_s"], r[k], r[f"{d}_s"]
            forms = {"sum": h + g, "max": max(h, g), "rss": float(np.hypot(h, g))}
            row.update(
                {
                    f"{d}_measured_ms": round(m * 1e3, 2),
                    f"{d}_host_ms": round(h * 1e3, 2),
                    f"{d}_kernels_ms": round(g * 1e3, 2),
                }
            )
            for f, v in forms.items():
                row[f"{d}_{f}_error"] = round(v / m - 1, 3)
                errs[f][d].append(abs(v / m - 1))
        rows.append(row)
    summary = {f: {d: round(float(np.median(v)), 3) if v else None for d, v in e.items()} for f, e in errs.items()}
    return {"rows": rows, "median_abs_error": summary}


def compare(paths: list[str]) -> dict[str, Any]:
    """The analysis of ``moe_host.jsonl`` files (see the module docstring): per-layer times, the host fit, the forms,
    and the rows left out.

    Raises:
        ValueError: a row :func:`read_rows` refuses, a per-layer time :func:`per_layer` refuses, or too few
            configurations at the probe point to fit (naming the files).
    """
    layers, left_out = per_layer(read_rows(paths))
    table = [
        {"config": cid, "seq_length": seq, "micro_batch_size": mbs, **{k: round(v * 1e3, 3) for k, v in r.items()}}
        for (cid, seq, mbs), r in sorted(layers.items())
    ]
    try:
        fit = fit_host(layers)
    except ValueError as e:
        raise ValueError(f"{', '.join(paths)}: {e}") from None
    return {"per_layer_ms": table, "host_fit": fit, "forms": combine(layers), "left_out": left_out}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", nargs="+", default=None, help="moe_host.jsonl files to analyse (no GPU)")
    a = ap.parse_args()
    if a.compare:
        try:
            print(json.dumps(compare(a.compare), indent=1))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        configs, budget = _run_settings()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or "h200_moe_host_out")
    if out.exists() and not out.is_dir():
        print(f"error: OUT {str(out)!r:.80} is a file; OUT is the folder the rows go to", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    return measure(out, configs, budget)


def _run_settings() -> tuple[list[str], float]:
    """``CONFIGS`` (default every configuration, in :data:`CONFIGS` order) and ``BUDGET_S`` (default 300) from the
    environment, checked before anything is created or imported.

    Raises:
        ValueError: no configuration, an unknown or repeated one, or a budget that is not a number of seconds > 0.
    """
    import math
    import reprlib

    raw = os.environ.get("CONFIGS")
    configs = [c.strip() for c in (raw if raw is not None else ",".join(CONFIGS)).split(",") if c.strip()]
    if not configs:
        raise ValueError(f"CONFIGS {reprlib.repr(raw)}: no configuration; known: {', '.join(CONFIGS)}")
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        raise ValueError(f"CONFIGS: unknown {reprlib.repr(bad)}; known: {', '.join(CONFIGS)}")
    twice = sorted({c for c in configs if configs.count(c) > 1})
    if twice:
        raise ValueError(f"CONFIGS: {', '.join(twice)} given twice (its rows would have one key)")
    try:
        budget = float(os.environ.get("BUDGET_S") or 300)
    except ValueError:
        budget = float("nan")
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"BUDGET_S {reprlib.repr(os.environ.get('BUDGET_S'))}: a number of seconds > 0")
    return configs, budget


if __name__ == "__main__":
    sys.exit(main())
