"""What the trial harness measures besides the step time (memory by phase, host memory, forward-only time, census,
profiles, gradient dumps), each when its :class:`HarnessSpec` field asks; torch at call time only."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.harness.build import _RAN, _gpt, _host_rss, _run_options, _versions
from launch.harness.spec import HarnessSpec
from launch.harness.step import _batches, _corpus_for, _forward_backward, _global_loss

if TYPE_CHECKING:
    from launch.harness.train import _Out


def _host_summary(spec: HarnessSpec, chunks: list[Any]) -> dict[str, Any]:
    """This rank's host memory: RSS after the model, after the optimizer, after step 1, the peak; the machine's; and,
    with CPU optimizer offload, the bytes megatron-core's offload should hold
    (:func:`launch.harness.hostmem.offload_host_bytes`)."""
    from launch.harness.hostmem import offload_host_bytes, process_memory, system_memory

    d: dict[str, Any] = dict(_RAN.get("host_memory", {}))
    d.update(process_memory())
    d["system"] = system_memory()
    frac = float(spec.layout["optimizer_offload_fraction"])
    if frac > 0:
        n = sum(p.numel() for c in chunks for p in c.parameters() if p.requires_grad)
        pa = bool((_RAN.get("optimizer") or {}).get("use_precision_aware_optimizer"))
        d["offload"] = {"fraction": frac, "rank_params": n,
                        "predicted_bytes": offload_host_bytes(math.ceil(frac * n)),
                        "precision_aware": pa}
    return d


def _dump_grads(spec: HarnessSpec, chunks: list[Any], cfg: Any, losses: Any, last: bool) -> dict[str, Any]:
    """Gradient parity: write every parameter's full gradient of this step (see :mod:`launch.harness.grads`)."""
    import os as _os

    from launch.harness.gather import GRAD_DUMP_FORMAT, model_fingerprint
    from launch.harness.grads import dump_gradients

    lay = spec.layout_obj()
    meta = {
        "format": GRAD_DUMP_FORMAT, "label": spec.label or lay.label, "layout_label": lay.label, "layout": spec.layout,
        "model": spec.model.get("name"), "model_fingerprint": model_fingerprint(spec.model),
        "checkpoint": _os.path.realpath(spec.load_checkpoint) if spec.load_checkpoint else None,
        "batch": {"data": spec.data, "data_step_offset": spec.data_step_offset,
                  "global_batch_size": spec.global_batch_size, "seq_length": spec.seq_length,
                  "corpus_sha256": spec.corpus_sha256, "seed": spec.seed if spec.data == "synthetic" else None},
        "fault": spec.fault, "precision": spec.precision, "loss": _global_loss(losses, last), "versions": _versions(),
        "run_options": _run_options(spec),
    }
    assert spec.dump_grads is not None  # called only when the spec asks for a dump
    return dump_gradients(chunks, spec.dump_grads, meta,
                          gated_linear_unit=bool(spec.model.get("gated_linear_unit", True)),
                          num_experts=int(spec.model.get("num_experts") or 0))


def _live_tensors() -> dict[str, int]:
    """Bytes of the live tensors Python can reach (``gc.get_objects``), deduplicated by storage, keyed
    ``"<device>/<dtype>[/pinned]"``: whose memory the allocator holds."""
    import gc

    import torch

    seen: set[tuple[str, int]] = set()
    out: dict[str, int] = {}
    for o in gc.get_objects():
        try:
            if not isinstance(o, torch.Tensor) or o.is_meta:
                continue
            st = o.untyped_storage()
            key = (str(o.device), st.data_ptr())
            if key in seen or st.data_ptr() == 0:
                continue
            seen.add(key)
            pinned = "/pinned" if o.device.type == "cpu" and o.is_pinned() else ""
            name = f"{o.device.type}/{str(o.dtype).removeprefix('torch.')}{pinned}"
            out[name] = out.get(name, 0) + st.nbytes()
        except Exception:  # noqa: BLE001 - a tensor subclass that cannot say its storage is skipped
            continue
    return dict(sorted(out.items()))


def _memory_phase(spec: HarnessSpec, out: _Out, rank: int, phase: str, *, tensors: bool = False) -> None:
    """One ``event: memory_phase`` line (``memory_phases``): allocated / reserved / peak bytes, host RSS, optionally the
    live tensors."""
    if not spec.memory_phases:
        return
    import torch

    torch.cuda.synchronize()
    row: dict[str, Any] = {"event": "memory_phase", "rank": rank, "phase": phase,
                           "allocated_bytes": torch.cuda.memory_allocated(),
                           "reserved_bytes": torch.cuda.memory_reserved(),
                           "max_allocated_bytes": torch.cuda.max_memory_allocated(), "host_rss_bytes": _host_rss()}
    if tensors:
        row["live_tensors_bytes"] = _live_tensors()
    if rank == 0:
        out.write(row)


def _forward_only(spec: HarnessSpec, chunks: list[Any], iters: list[Any], out: _Out, rank: int) -> None:
    """``forward_only_steps`` forward-only passes over a step's micro-batches, timed; an ``event: forward_only`` line.
    """
    import torch
    import torch.distributed as dist
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fb = get_forward_backward_func()
    times: list[float] = []
    for _ in range(spec.forward_only_steps):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        with torch.no_grad():  # else every micro-batch's graph stays alive; training mode stays (router, dropout)
            _forward_backward(fb, spec, chunks, iters, forward_only=True)
        torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    warm = min(1, len(times) - 1)
    if rank == 0:
        out.write({"event": "forward_only", "steps": len(times), "step_times_s": times,
                   "median_step_time_s": statistics.median(times[warm:]) if times else None})


_RECOMPUTE_KEYS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")


def _census(spec: HarnessSpec, chunks: list[Any], out: _Out, rank: int) -> None:
    """One more forward and backward of one micro-batch with :class:`launch.harness.grads.SavedTensorCensus` on the
    first layer's attention and MLP / MoE blocks (and the MoE layer's experts and router); one ``event: census`` line
    per module."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from launch.harness.grads import SavedTensorCensus

    model = _gpt(chunks[0])
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    mods: dict[str, Any] = {}
    if layers is not None and len(layers):
        L = layers[0]
        pfx = f"decoder.layers.{int(L.layer_number) - 1}"
        mods[f"{pfx}.self_attention"] = L.self_attention
        mods[f"{pfx}.mlp"] = L.mlp
        for sub in ("experts", "router", "shared_experts"):
            if hasattr(L.mlp, sub) and isinstance(getattr(L.mlp, sub), torch.nn.Module):
                mods[f"{pfx}.mlp.{sub}"] = getattr(L.mlp, sub)
    params = {p.untyped_storage().data_ptr() for c in chunks for p in c.parameters()}
    for c in chunks:
        c.zero_grad_buffer()
    it = [_batches(spec, None if spec.data == "synthetic" else _corpus_for(spec), 0) for _ in chunks]
    census = SavedTensorCensus(mods, params)
    with census:
        _forward_backward(get_forward_backward_func(), spec, chunks, it, num_microbatches=1)
    for c in chunks:
        c.zero_grad_buffer()
    if rank != 0:
        return
    m = spec.model
    tp = spec.layout["tp"]
    sp = bool(spec.layout["sequence_parallel"]) and tp > 1
    tokens = spec.layout["micro_batch_size"] * spec.seq_length // (spec.layout["cp"] * (tp if sp else 1))
    for r in census.report():
        out.write({"event": "census", "label": spec.label, "layout": spec.layout, "tokens": tokens,
                   "hidden_size": m["hidden_size"], "moe_ffn_hidden_size": m.get("moe_ffn_hidden_size"),
                   "moe_router_topk": m.get("moe_router_topk"), "precision": spec.precision,
                   "fp8_recipe": spec.fp8_recipe, "recompute": {k: spec.layout.get(k) for k in _RECOMPUTE_KEYS},
                   "tp_rank_only": parallel_state.get_tensor_model_parallel_rank() == 0, **r})


def _profiles_here() -> bool:
    """This rank writes a profile: the first rank of its tensor-, context- and data-parallel groups (one per pipeline
    stage)."""
    from megatron.core import parallel_state as ps

    ranks = (ps.get_tensor_model_parallel_rank(), ps.get_context_parallel_rank(), ps.get_data_parallel_rank())
    return ranks == (0, 0, 0)


def _profiler(spec: HarnessSpec, step: int) -> Any:
    """A ``torch.profiler.profile`` (CPU and CUDA activities, shapes off) for the step ``spec.profile_step`` on a rank
    that writes its trace (:func:`_profiles_here`), else None."""
    if step != spec.profile_step or not _profiles_here():
        return None
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    return torch.profiler.profile(activities=acts, record_shapes=False, with_stack=False)


def profile_file_name(step: int, pp_rank: int) -> str:
    """``profile_step<N>_pp<r>.json``: the trace of step ``step`` on pipeline rank ``pp_rank`` (what ``tune timeline``
    looks for)."""
    return f"profile_step{step}_pp{pp_rank}.json"


def _export_profile(spec: HarnessSpec, prof: Any, out: _Out, rank: int, world: int, step: int) -> None:
    """Stop the step's profiler, write its Chrome trace beside ``--out`` and (rank 0) the ``profile`` line naming every
    rank's file (a collective: every rank calls it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    path = None
    if prof is not None:
        prof.stop()
        path = str(Path(out.path).parent / profile_file_name(step, ps.get_pipeline_model_parallel_rank()))
        prof.export_chrome_trace(path)
    files: list[Any] = [None] * world
    dist.all_gather_object(files, path)
    if rank == 0:
        out.write({"event": "profile", "step": step, "files": sorted(f for f in files if f)})
