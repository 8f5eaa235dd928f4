"""Per-module recompute cost and saving on the decoder alone, on one GPU (issue 14, item 5: recompute priced from
measurements).

    # on the GPU
    PYTHONPATH=/tmp/site:. OUT=... SLICES=mm,qw,ds ROUNDS=2 BUDGET_S=500 python3 benchmarks/h200_recompute.py
    # with megatron-core's fused RoPE, as production recipes run it
    ... ROPE_FUSION=1 ...
    # base variants only, each with a torch.profiler kernel census
    ... PROFILE=1 ...
    # every variant timed and profiled
    ... PROFILE=all ...
    # here: against the model
    PYTHONPATH=. python benchmarks/h200_recompute.py --compare FILE.jsonl [FILE ...]
    # by the GPU kernels' time
    PYTHONPATH=. python benchmarks/h200_recompute.py --compare FILE.jsonl --kernels profile.jsonl

Why a benchmark of its own: the harness trials' recompute extra was the difference of two whole steps, each with a
1-5% CV, on slices where the output layer and the loss are half of the step, so the same case differed 2x between
machines (``docs/measurements.md``, fifth batch). Here each variant is a ``GPTModel`` with ``post_process=False`` (the
embedding and the decoder layers, no output layer, no loss) built from the harness's own ``TransformerConfig``
(:func:`launch.harness.build._transformer_config`, TE layer spec, grouped GEMM, the precision and recompute fields of a
harness trial), and timed by CUDA events over back-to-back iterations of one micro-batch (no synchronisation between
them): ``fwd_bwd_s`` forward + backward (the backward fed a fixed random output gradient; the weights' gradients
accumulate as they do between micro-batches), ``fwd_s`` the training forward alone (grad enabled, graph dropped) and
``fwd_nograd_s`` the forward under ``torch.no_grad()``. Memory: ``saved_bytes`` what the forward leaves allocated for
the backward (the saved activations recompute trades for time), ``peak_extra_bytes`` the allocated peak of a forward +
backward above what was allocated before it. The variants of a slice are built one at a time and run in rounds, the
order reversed every other round, so drift on the machine falls on all of them alike; every build starts from the
same seed, so every variant has the same weights and (natural routing) the same tokens per expert.

Variants per slice: ``base`` (no recompute), ``full`` (uniform, 1 layer), and selective recompute of each module the
slice's layers have (``core_attn``, ``layernorm``, ``moe_act``, ``moe`` on MoE layers; ``mla_up_proj``, ``mlp`` on the
dense MLA layer). Writes ``$OUT/recompute.jsonl``: one row per (slice, variant, round), then an ``event: versions`` row.
``PROFILE=1`` runs the ``base`` variants alone and adds, per slice, an ``event: profile`` row to ``$OUT/profile.jsonl``:
the CUDA kernels of :data:`PROFILE_ITERS` forward + backward passes under ``torch.profiler`` (per pass: each kernel's
time in seconds and calls, the 60 longest by name; the kernels' total, and the CUDA-event time of the same passes, so
that the difference is time the GPU waited for the host). ``PROFILE=all`` does that for every variant in every round
(the profile rows then carry ``round``).

``--compare`` reads those rows (on any machine, no torch), takes each variant's median over rounds and prints, for each,
the measured extra time and saving against its slice's ``base`` next to the cost model's prediction of the same
difference: :func:`cost_model.estimate.estimate` of the slice with one micro-batch (``global_batch_size`` 1, so the
difference of two predicted steps is one micro-batch's recompute), the harness's TE run options and the shipped
calibration, exactly as ``tune validate --trials`` predicts a harness row (with ``apply_rope_fusion`` as the rows ran).
Two savings: ``stash_saved_gib`` (per layer, what the forward no longer leaves for the backward) against the model's
per-layer stash (what :data:`STASH_LAYERS` more layers add to the predicted peak, over that count), and
``peak_saved_gib`` (the slice's forward + backward peak) against the predicted peaks' difference. ``slices``: each
slice's measured ``base`` forward + backward against the model's time for its layers (the same :data:`STASH_LAYERS`
difference of predicted steps, less the optimizer's part).

``--kernels PROFILE.jsonl`` (rows of ``PROFILE=all``) judges the time by the GPU kernels' total of each variant's passes
instead of their CUDA-event time: the one-GPU MoE slices are host-bound (the GPU was busy 57% of a MiniMax-M2 pass), so
a recompute's extra kernels partly fill time the GPU spent waiting, and the event time's difference moved by up to 30 ms
between rounds; the kernels' total is the GPU work the model prices, which is what a GPU-bound production step pays.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.h200_te_layouts import BASE_LAYOUT

MM, QW, DS = "MiniMax-M2", "Qwen3-30B-A3B", "DeepSeek-V3"
MOE_MODULES = ("core_attn", "layernorm", "moe_act", "moe")
#: slice id -> (model, layers, selective modules its layers have, model_overrides)
SLICES: dict[str, tuple[str, int, tuple[str, ...], dict[str, Any]]] = {
    "mm": (MM, 1, MOE_MODULES, {}),
    "qw": (QW, 2, MOE_MODULES, {}),
    "ds": (DS, 1, ("core_attn", "layernorm", "mla_up_proj", "mlp"), {}),
}
SEQ = 8192
GIB = 2**30
#: Layers added to a slice to read the model's per-layer stash (every slice's next layers are of its own kind:
#: MiniMax-M2 and Qwen3 are all MoE, DeepSeek-V3's first three are dense).
STASH_LAYERS = 2
#: Forward + backward passes under the profiler (``PROFILE=1``).
PROFILE_ITERS = 4


def variants(modules: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """``(name, recompute fields)`` of a slice, ``base`` first."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("base", {}),
        ("full", {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}),
    ]
    out += [(f"sel-{m}", {"recompute_granularity": "selective", "recompute_modules": (m,)}) for m in modules]
    return out


def _spec(slice_id: str, rec: dict[str, Any], extra_layers: int = 0) -> Any:
    from launch.harness.spec import HarnessEnv, build_spec, override_model
    from specs import Workload, load_model
    from specs.layout import Layout
    from specs.model import slice_model

    name, layers, _, ov = SLICES[slice_id]
    model = override_model(slice_model(load_model(name), layers + extra_layers), ov)
    lay = Layout.from_dict({**BASE_LAYOUT, **rec})
    return build_spec(
        model,
        lay,
        Workload(seq_length=SEQ, global_batch_size=1, precision="bf16"),
        env=HarnessEnv(transformer_engine=True),
        steps=1,
        warmup_steps=0,
    )


def measure(
    out: Path,
    slices: list[str],
    rounds: int,
    budget_s: float,
    iters: int,
    rope_fusion: bool = False,
    profile: bool | str = False,
) -> int:
    """Run the variants on the GPU (see the module docstring); ``profile``: False, True (``base`` variants only, with a
    kernel census) or ``"all"`` (every variant timed and profiled)."""
    import torch
    import torch.distributed as dist

    from benchmarks.one_gpu import decoder_model, init_one_gpu, jsonl_emitter
    from launch.harness.build import _transformer_config, _versions

    t0 = time.monotonic()
    init_one_gpu("29541")
    emit = jsonl_emitter(out / "recompute.jsonl")

    def events_between(fn: Any, n: int) -> list[float]:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        ev[0].record()
        for k in range(n):
            fn()
            ev[k + 1].record()
        torch.cuda.synchronize()
        return [ev[k].elapsed_time(ev[k + 1]) / 1e3 for k in range(n)]

    def one(slice_id: str, vname: str, rec: dict[str, Any], rnd: int) -> dict[str, Any]:
        spec = _spec(slice_id, rec)
        cfg = _transformer_config(spec)
        if (
            rope_fusion
        ):  # production recipes' fused RoPE (MLA: fused_apply_mla_rope_for_q / _for_kv); the harness runs it unfused
            cfg.apply_rope_fusion = True
        m = spec.model
        # the same weights for every variant and round, so the router sends the same tokens to the same experts
        tb = time.monotonic()
        model = decoder_model(cfg, m, SEQ)
        build_s = time.monotonic() - tb
        g = torch.Generator(device="cuda").manual_seed(1234)
        tokens = torch.randint(0, m["vocab_size"], (1, SEQ), device="cuda", generator=g)
        pos = torch.arange(SEQ, device="cuda").unsqueeze(0)
        with torch.no_grad():
            shape = model(tokens, pos, None).shape
        grad_out = (torch.randn(shape, device="cuda", generator=g) * 1e-2).to(torch.bfloat16)

        def fwd_bwd() -> None:
            model(tokens, pos, None).backward(grad_out)

        def fwd() -> None:
            model(tokens, pos, None)

        def fwd_nograd() -> None:
            with torch.no_grad():
                model(tokens, pos, None)

        for _ in range(3):
            fwd_bwd()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        peak_extra = torch.cuda.max_memory_allocated() - before
        y = model(tokens, pos, None)
        torch.cuda.synchronize()
        saved = torch.cuda.memory_allocated() - before
        y.backward(grad_out)
        del y
        t_fb = events_between(fwd_bwd, iters)
        t_f = events_between(fwd, max(4, iters // 2))
        t_n = events_between(fwd_nograd, max(4, iters // 2))
        params = sum(p.numel() for p in model.parameters())
        if profile:
            _profile_row(slice_id, vname, fwd_bwd, rnd)
        row = {
            "slice": slice_id,
            "model": f"{SLICES[slice_id][0]}[{SLICES[slice_id][1]} layers]"
            if SLICES[slice_id][1]
            else SLICES[slice_id][0],
            "variant": vname,
            "round": rnd,
            "recompute": {k: list(v) if isinstance(v, tuple) else v for k, v in rec.items()},
            "layout": spec.layout,
            "model_overrides": SLICES[slice_id][3],
            "seq_length": SEQ,
            "micro_batch_size": 1,
            "precision": "bf16",
            "apply_rope_fusion": bool(rope_fusion),
            "fwd_bwd_s": statistics.median(t_fb),
            "fwd_bwd_min_s": min(t_fb),
            "fwd_bwd_times_s": t_fb,
            "fwd_s": statistics.median(t_f),
            "fwd_nograd_s": statistics.median(t_n),
            "saved_bytes": saved,
            "peak_extra_bytes": peak_extra,
            "params": params,
            "build_s": build_s,
            "elapsed_s": time.monotonic() - t0,
        }
        return row  # the model and its tensors go with this frame; the caller empties the cache

    def _profile_row(slice_id: str, vname: str, fwd_bwd: Any, rnd: int) -> None:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record()
            for _ in range(PROFILE_ITERS):
                fwd_bwd()
            ev[1].record()
            torch.cuda.synchronize()
        kernels = []
        for e in prof.key_averages():
            t_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
            if t_us > 0 and e.count > 0:  # only CUDA activity is recorded: kernels, memcpy and memset
                kernels.append(
                    {"name": e.key[:240], "time_s": t_us / 1e6 / PROFILE_ITERS, "calls": e.count / PROFILE_ITERS}
                )
        kernels.sort(key=lambda k: -k["time_s"])
        row = {
            "event": "profile",
            "slice": slice_id,
            "variant": vname,
            "round": rnd,
            "apply_rope_fusion": bool(rope_fusion),
            "iters": PROFILE_ITERS,
            "events_fwd_bwd_s": ev[0].elapsed_time(ev[1]) / 1e3 / PROFILE_ITERS,
            "kernels_total_s": sum(k["time_s"] for k in kernels),
            "kernels_count": len(kernels),
            "kernels": kernels[:60],
        }
        with open(out / "profile.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)

    failures = 0
    for rnd in range(rounds):
        for sid in slices:
            vs = variants(SLICES[sid][2])[:1] if profile is True else variants(SLICES[sid][2])
            for vname, rec in vs if rnd % 2 == 0 else vs[::-1]:
                if time.monotonic() - t0 > budget_s:
                    emit(
                        {
                            "event": "skipped",
                            "slice": sid,
                            "variant": vname,
                            "round": rnd,
                            "reason": f"budget {budget_s:.0f} s spent",
                        }
                    )
                    continue
                try:
                    emit(one(sid, vname, rec, rnd))
                except Exception as e:  # noqa: BLE001 - a variant that fails is a row, the others still run
                    failures += 1
                    emit(
                        {
                            "event": "error",
                            "slice": sid,
                            "variant": vname,
                            "round": rnd,
                            "error": f"{type(e).__name__}: {str(e)[:400]}",
                        }
                    )
                torch.cuda.empty_cache()
    emit({"event": "versions", **_versions(), "gpu": torch.cuda.get_device_name(0), "elapsed_s": time.monotonic() - t0})
    dist.destroy_process_group()
    return 1 if failures else 0


def _finite(v: Any, positive: bool) -> bool:
    from benchmarks.device_rows import (
        finite_number,
    )  # the one check of the device comparisons (benchmarks/device_rows.py)

    return finite_number(v, positive)


def _read_row(d: dict[str, Any], where: str) -> tuple[str, str]:
    """``(slice, variant)`` of one measured row, checked: a known slice, a variant of it whose recompute fields are the
    row's, finite positive timings, finite bytes (differences of the allocator's counts: a checkpointed forward can
    leave less allocated than before it), a round number and a boolean ``apply_rope_fusion``.

    Raises:
        ValueError: anything else, naming ``where``.
    """
    sid, variant, rec = d.get("slice"), d.get("variant"), d.get("recompute")
    if not isinstance(sid, str) or sid not in SLICES:
        raise ValueError(
            f"{where}: slice {sid!r:.40} is not one of {sorted(SLICES)}; not a row of benchmarks/h200_recompute.py"
        )
    known = dict(variants(SLICES[sid][2]))
    if not isinstance(variant, str) or variant not in known:
        raise ValueError(f"{where}: variant {variant!r:.40} is not one of slice {sid}'s ({', '.join(known)})")
    want = {k: list(v) if isinstance(v, tuple) else v for k, v in known[variant].items()}
    if rec != want:
        raise ValueError(f"{where}: variant {variant} of slice {sid} has recompute {want}, the row says {rec!r:.80}")
    bad = [k for k in ("fwd_bwd_s", "fwd_s", "fwd_nograd_s") if not _finite(d.get(k), True)]
    bad += [k for k in ("saved_bytes", "peak_extra_bytes") if not _finite(d.get(k), False)]
    if bad:
        raise ValueError(
            f"{where}: {', '.join(bad)} must be finite numbers (timings > 0 s; bytes are differences of the "
            "allocator's "
            "counts and may be negative)"
        )
    # what the model is asked to predict is this benchmark's workload: a row of another one would be compared silently
    name, layers = SLICES[sid][0], SLICES[sid][1]
    want_fields = {
        "model": f"{name}[{layers} layers]",
        "seq_length": SEQ,
        "micro_batch_size": 1,
        "precision": "bf16",
        "model_overrides": SLICES[sid][3],
    }
    off = [f"{k} {d.get(k)!r:.40} (expected {v!r})" for k, v in want_fields.items() if k in d and d[k] != v]
    if off:
        raise ValueError(f"{where}: {'; '.join(off)}: not slice {sid} as benchmarks/h200_recompute.py runs it")
    rnd = d.get("round")
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        raise ValueError(f"{where}: round must be a whole number >= 0, got {rnd!r:.20}")
    if "apply_rope_fusion" in d and not isinstance(d["apply_rope_fusion"], bool):
        raise ValueError(f"{where}: apply_rope_fusion must be true or false, got {d['apply_rope_fusion']!r:.20}")
    return sid, variant


def _kernel_times(paths: list[str]) -> dict[tuple[str, str, int], tuple[float, bool, float | None]]:
    """``(slice, variant, round) -> (kernels_total_s, apply_rope_fusion, events_fwd_bwd_s)`` from ``PROFILE=all`` rows
    (the last: the CUDA-event time of the same profiled passes, None when absent or not a finite positive number).

    Raises:
        ValueError: a file that cannot be read, a row that is not a profile row with a known slice and variant, a round
            and a finite positive ``kernels_total_s``, or a second row of one key (named by file and line).
    """
    from tuner.validate_trials import json_lines

    out: dict[tuple[str, str, int], tuple[float, bool, float | None]] = {}
    for p in paths:
        for _, where, d in json_lines(
            p, str(p), "expected the profile rows benchmarks/h200_recompute.py writes with PROFILE=all"
        ):
            if not isinstance(d, dict) or d.get("event") != "profile":
                raise ValueError(
                    f"{where}: not a profile row (event 'profile'); --kernels takes the profile.jsonl of PROFILE=all"
                )
            sid, variant, rnd = d.get("slice"), d.get("variant"), d.get("round")
            if (
                not isinstance(sid, str)
                or sid not in SLICES
                or not isinstance(variant, str)
                or variant not in dict(variants(SLICES[sid][2]))
            ):
                raise ValueError(f"{where}: slice {sid!r:.40} / variant {variant!r:.40} is not one this benchmark runs")
            if "round" not in d:
                raise ValueError(
                    f"{where}: no round (a profile row of PROFILE=1, base only, has none; run PROFILE=all)"
                )
            if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
                raise ValueError(f"{where}: round must be a whole number >= 0, got {rnd!r:.20}")
            if "apply_rope_fusion" in d and not isinstance(d["apply_rope_fusion"], bool):
                raise ValueError(
                    f"{where}: apply_rope_fusion must be true or false, got {d['apply_rope_fusion']!r:.20}"
                )
            if not _finite(d.get("kernels_total_s"), True):
                raise ValueError(f"{where}: kernels_total_s must be a finite number > 0")
            rope = bool(d.get("apply_rope_fusion"))
            key = (sid, variant, rnd)
            if key in out:
                if out[key][1] != rope:
                    raise ValueError(
                        f"{where}: the profile rows mix runs with and without ROPE_FUSION=1; compare one setting at a "
                        "time"
                    )
                raise ValueError(f"{where}: a second profile row of {sid} {variant} round {rnd}")
            ev = d.get("events_fwd_bwd_s")
            out[key] = (float(d["kernels_total_s"]), rope, float(ev) if _finite(ev, True) else None)
    return out


def compare(paths: list[str], kernels: list[str] | None = None) -> dict[str, Any]:
    """Measured extra time / saving per variant against its slice's base, beside the model's prediction (see the
    module docstring). With ``kernels`` (``PROFILE=all`` profile files) each row's time is its passes' kernel total
    (:func:`_kernel_times`) instead of the CUDA-event time. Returns ``{"slices": {...}, "rows": [...], "summary":
    {...}}``, and ``"timing": "kernels"`` with ``kernels``.

    Raises:
        ValueError: a file that cannot be read, a line that is not a JSON object, a row that is not this benchmark's
            (:func:`_read_row`) or a second row of one slice, variant and round (named by file and line), or rows of
            both RoPE settings, no measured row at all, a slice without its ``base`` row, or a row whose model,
            ``seq_length``, ``micro_batch_size``, precision or overrides are not this benchmark's; with ``kernels``, a
            measured row without its profile row or with the other RoPE setting.
    """
    from cost_model.estimate import estimate
    from launch.harness.spec import HarnessEnv, harness_layout
    from specs import HARNESS_TE_RUN_OPTIONS, Workload, parse_gpus
    from tuner.validate_trials import json_lines

    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    seen: set[tuple[str, str, Any, bool]] = set()
    for p in paths:
        for _, where, d in json_lines(p, str(p), "expected the rows benchmarks/h200_recompute.py writes"):
            if not isinstance(d, dict):
                raise ValueError(f"{where}: not a JSON object; expected the rows benchmarks/h200_recompute.py writes")
            if "fwd_bwd_s" not in d and "event" in d:
                continue  # versions, skipped, error
            got.setdefault(_read_row(d, where), []).append(d)
            key = (d["slice"], d["variant"], d["round"], bool(d.get("apply_rope_fusion")))
            if key in seen:
                raise ValueError(f"{where}: a second row of {d['slice']} {d['variant']} round {d['round']}")
            if (*key[:3], not key[3]) in seen:
                raise ValueError(
                    f"{where}: the rows mix runs with and without ROPE_FUSION=1; compare one setting at a time"
                )
            seen.add(key)
    if not got:
        raise ValueError(
            f"{', '.join(paths)}: no measured rows (a row of benchmarks/h200_recompute.py has fwd_bwd_s; "
            "PROFILE=1's kernel census in profile.jsonl is not compared)"
        )
    if len({bool(r.get("apply_rope_fusion")) for rs in got.values() for r in rs}) > 1:
        raise ValueError("the rows mix runs with and without ROPE_FUSION=1; compare one setting at a time")
    if kernels:
        kt = _kernel_times(kernels)
        for rs in got.values():
            for i, r in enumerate(rs):
                key = (r["slice"], r["variant"], r["round"])
                if key not in kt:
                    raise ValueError(
                        f"{', '.join(kernels)}: no profile row of {key[0]} {key[1]} round {key[2]}; "
                        "--kernels needs the profile.jsonl written with the same PROFILE=all run"
                    )
                if kt[key][1] != bool(r.get("apply_rope_fusion")):
                    raise ValueError(
                        f"{key[0]} {key[1]} round {key[2]}: the profile row and the measured row differ in ROPE_FUSION"
                    )
                rs[i] = {**r, "fwd_bwd_s": kt[key][0], "fwd_bwd_event_s": r["fwd_bwd_s"]}

    def med(rs: list[dict[str, Any]], k: str) -> float:
        return statistics.median(r[k] for r in rs)

    fused = any(bool(r.get("apply_rope_fusion")) for rs in got.values() for r in rs)
    options = dataclasses.replace(HARNESS_TE_RUN_OPTIONS, apply_rope_fusion=fused)  # the RoPE path the rows ran

    def predict(sid: str, rec: dict[str, Any], extra_layers: int = 0) -> Any:
        """The model's estimate of slice ``sid`` (plus ``extra_layers``) with ``rec``'s recompute, one micro-batch."""
        spec = _spec(sid, {k: tuple(v) if isinstance(v, list) else v for k, v in rec.items()}, extra_layers)
        lay = harness_layout(spec.layout_obj(), HarnessEnv(transformer_engine=True))
        return estimate(
            spec.model_spec(),
            parse_gpus("1xH200"),
            Workload(seq_length=SEQ, global_batch_size=1, precision="bf16"),
            lay,
            options=options,
        )

    no_base = sorted({sid for sid, _ in got} - {sid for sid, v in got if v == "base"})
    if no_base:
        raise ValueError(
            f"{', '.join(paths)}: slice {', '.join(no_base)} has no base row; every variant is measured against its "
            "slice's base"
        )
    profiled: dict[str, dict[str, list[float]]] = {}
    if kernels:
        for (sid, vname, _), (k_s, _, ev_s) in kt.items():
            if vname == "base" and sid in {s for s, _ in got}:
                p = profiled.setdefault(sid, {"kernels_s": [], "events_s": []})
                p["kernels_s"].append(k_s)
                if ev_s is not None:
                    p["events_s"].append(ev_s)
    rows = []
    for (sid, vname), rs in sorted(got.items()):
        base = got[(sid, "base")]
        if vname == "base":
            continue
        v, b = predict(sid, rs[0]["recompute"]), predict(sid, {})
        pt, pm, bt, bm = v.step_time_s, v.peak_bytes, b.step_time_s, b.peak_bytes
        # what one more layer adds to the predicted peak: the stash of a layer that waits for its backward
        stash_v = (predict(sid, rs[0]["recompute"], STASH_LAYERS).peak_bytes - pm) / STASH_LAYERS
        stash_b = (predict(sid, {}, STASH_LAYERS).peak_bytes - bm) / STASH_LAYERS
        extra = med(rs, "fwd_bwd_s") - med(base, "fwd_bwd_s")
        rows.append(
            {
                "slice": sid,
                "variant": vname,
                "rounds": len(rs),
                "base_fwd_bwd_s": round(med(base, "fwd_bwd_s"), 5),
                "base_fwd_s": round(med(base, "fwd_s"), 5),
                "base_fwd_nograd_s": round(med(base, "fwd_nograd_s"), 5),
                "extra_s": round(extra, 5),
                "extra_spread_s": round(max(r["fwd_bwd_s"] for r in rs) - min(r["fwd_bwd_s"] for r in rs), 5),
                "predicted_extra_s": round(pt - bt, 5),
                "extra_measured_over_predicted": round(extra / (pt - bt), 3) if pt - bt > 1e-6 else None,
                "extra_over_base_forward": round(extra / med(base, "fwd_s"), 3),
                "stash_saved_gib": round((med(base, "saved_bytes") - med(rs, "saved_bytes")) / GIB / SLICES[sid][1], 3),
                "predicted_stash_saved_gib": round((stash_b - stash_v) / GIB, 3),
                "peak_saved_gib": round((med(base, "peak_extra_bytes") - med(rs, "peak_extra_bytes")) / GIB, 3),
                "predicted_peak_saved_gib": round((bm - pm) / GIB, 3),
            }
        )
    slices = {}
    for sid in sorted({k[0] for k in got}):
        base = got.get((sid, "base"))
        if not base:
            continue
        # the model's forward + backward of the slice's layers for one micro-batch: what STASH_LAYERS more layers add
        # to the predicted step, less the optimizer's part, per layer, times the slice's layers
        a, b = predict(sid, {}).time, predict(sid, {}, STASH_LAYERS).time
        per_layer = sum(b[k] - a[k] for k in a if k != "optimizer") / STASH_LAYERS
        layers = SLICES[sid][1]
        slices[sid] = {
            "layers": layers,
            "fwd_bwd_s": round(med(base, "fwd_bwd_s"), 5),
            "predicted_layers_fwd_bwd_s": round(per_layer * layers, 5),
            "error": round(per_layer * layers / med(base, "fwd_bwd_s") - 1, 4),
        }
        if sid in profiled:  # the base's profiled passes, one per round: their kernels' total and their event time
            slices[sid]["base_profiled_kernels_s"] = [
                round(min(profiled[sid]["kernels_s"]), 5),
                round(max(profiled[sid]["kernels_s"]), 5),
            ]
            if profiled[sid]["events_s"]:
                slices[sid]["base_profiled_events_s"] = [
                    round(min(profiled[sid]["events_s"]), 5),
                    round(max(profiled[sid]["events_s"]), 5),
                ]
    ratios = [
        r["extra_measured_over_predicted"]
        for r in rows
        if r["extra_measured_over_predicted"] is not None and r["predicted_extra_s"] > 0.002
    ]
    res: dict[str, Any] = {
        "slices": slices,
        "rows": rows,
        "summary": {
            "variants": len(rows),
            "extra_ratio_median": statistics.median(ratios) if ratios else None,
            "within_20pct": sum(1 for x in ratios if abs(x - 1) <= 0.2),
            "of": len(ratios),
        },
    }
    if kernels:
        res["timing"] = "kernels"
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--compare", nargs="+", default=None, help="recompute.jsonl files to compare with the cost model (no GPU)"
    )
    ap.add_argument(
        "--kernels", nargs="+", default=None, help="with --compare: PROFILE=all profile.jsonl files (time by kernels)"
    )
    a = ap.parse_args()
    if a.kernels and not a.compare:
        print("error: --kernels goes with --compare RECOMPUTE.jsonl", file=sys.stderr)
        return 2
    if a.compare:
        try:
            print(json.dumps(compare(a.compare, a.kernels), indent=1))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    out = Path(os.environ.get("OUT") or "h200_recompute_out")
    out.mkdir(parents=True, exist_ok=True)
    slices = [s for s in (os.environ.get("SLICES") or "mm,qw,ds").split(",") if s]
    bad = [s for s in slices if s not in SLICES]
    if bad:
        print(f"SLICES: unknown {bad}; known: {sorted(SLICES)}", file=sys.stderr)
        return 2
    return measure(
        out,
        slices,
        int(os.environ.get("ROUNDS") or 2),
        float(os.environ.get("BUDGET_S") or 500),
        int(os.environ.get("ITERS") or 12),
        rope_fusion=os.environ.get("ROPE_FUSION") == "1",
        profile="all" if os.environ.get("PROFILE") == "all" else os.environ.get("PROFILE") == "1",
    )


if __name__ == "__main__":
    sys.exit(main())
