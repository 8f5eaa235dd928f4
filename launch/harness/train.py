"""The trial harness: a few training steps of one layout with megatron-core::

    python -m torch.distributed.run --nproc-per-node N -m launch.harness.train --spec SPEC.json --out STEPS.jsonl

Builds the spec's model with its layout (``initialize_model_parallel``, ``GPTModel`` per virtual stage, DDP,
``get_megatron_optimizer``), runs ``steps`` optimizer steps through ``get_forward_backward_func`` and appends JSON lines
(:mod:`launch.harness.results`). For ``tune verify`` it also saves or loads a distributed checkpoint, trains on
byte-tokenised text (:mod:`launch.harness.data`) and injects faults (:data:`launch.harness.spec.FAULTS`); the loss is
the mean over the global batch. Without Transformer Engine, megatron-core's local spec with the harness's
:class:`SDPACoreAttention` and :class:`HarnessRMSNorm` (``../shared/notes/device.md``) and ``SequentialMLP`` experts.

Exit status: 0 done; 2 bad spec or refused layout (before any GPU work); 3 out of memory; 1 any other error."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from launch.harness.build import (
    _RAN,
    _build,
    _gpt,
    _host_rss,
    _load_weights,
    _optimizer,
    _run_options,
    _save_weights,
    _transformer_config,
    _versions,
    seed_all,
)
from launch.harness.measure import (
    _census,
    _dump_grads,
    _export_profile,
    _forward_only,
    _host_summary,
    _memory_phase,
    _profiler,
)
from launch.harness.results import cv, median_after_warmup
from launch.harness.spec import HarnessEnv, HarnessSpec, fault_reasons, parallel_kwargs, parse_argv, unsupported_reasons
from launch.harness.step import _batches, _forward_backward, _global_loss
from specs.precision import Precision


class _Out:
    """Appends JSON lines; each line is one ``write`` on an O_APPEND file, so ranks do not interleave."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, obj: dict[str, Any]) -> None:
        line = (json.dumps(obj, default=float) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _setup(spec: HarnessSpec, out: _Out, rank: int) -> tuple[Any, list[Any], Any, float]:
    """Model-parallel groups, seeds, the model and its optimizer: (config, model chunks, optimizer, seconds)."""
    import torch
    from megatron.core import parallel_state

    lay = spec.layout
    t_build = time.perf_counter()
    parallel_state.initialize_model_parallel(**parallel_kwargs(lay))
    seed_all(spec.seed)
    cfg = _transformer_config(spec)
    chunks, opt = _build(spec, cfg)
    build_s = time.perf_counter() - t_build
    _memory_phase(spec, out, rank, "after_build", tensors=True)
    if spec.gc_after_build:
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        _memory_phase(spec, out, rank, "after_gc_collect", tensors=True)
    return cfg, chunks, opt, build_s


def _corpus(spec: HarnessSpec, out: _Out, rank: int) -> Any:
    """The spec's corpus (``data: corpus``; its SHA-256 checked) and its ``data`` line, or None for synthetic tokens."""
    if spec.data != "corpus":
        return None
    from launch.harness.data import load_corpus

    corpus = load_corpus(spec.corpus_path)
    if spec.corpus_sha256 and corpus.sha256 != spec.corpus_sha256:
        raise RuntimeError(f"corpus {corpus.source} has SHA-256 {corpus.sha256[:16]}..., expected "
                           f"{spec.corpus_sha256[:16]}...")
    if rank == 0:
        out.write({"event": "data", "corpus": corpus.source, "corpus_bytes": len(corpus),
                   "corpus_sha256": corpus.sha256, "tokenizer": "bytes"})
    return corpus


def _set_lr(spec: HarnessSpec, opt: Any, k: int) -> None:
    """Linear warm-up over ``lr_warmup_steps`` (k counts from 1), then constant; each group's weight decay as
    megatron's ``OptimizerParamScheduler`` sets it (``0.1 x wd_mult``: biases and 1-D weights undecayed)."""
    w = spec.lr_warmup_steps
    lr = spec.lr * (min(1.0, k / w) if w > 0 else 1.0)
    for g in opt.param_groups:
        g["lr"] = lr * float(g.get("lr_mult", 1.0))
        g["weight_decay"] = 0.1 * float(g.get("wd_mult", 1.0))


def _zero_and_run(fb: Any, spec: HarnessSpec, chunks: list[Any], opt: Any, iters: list[Any], k: int) -> Any:
    """Step ``k``'s gradients zeroed, its learning rate set, its forward and backward run; the micro-batches' losses."""
    for c in chunks:
        c.zero_grad_buffer()
    opt.zero_grad()
    _set_lr(spec, opt, k)
    return _forward_backward(fb, spec, chunks, iters)


def _warm_start(fb: Any, spec: HarnessSpec, cfg: Any, chunks: list[Any], opt: Any, corpus: Any, out: _Out, rank: int,
                last: bool) -> Any:
    """Train the seed's weights ``pretrain_steps`` steps (data steps 0 .. pretrain-1), write them as the check's
    starting checkpoint, load them back; returns a fresh optimizer for the measured steps."""
    it0 = [_batches(spec, corpus, 0) for _ in chunks]
    for k in range(1, spec.pretrain_steps + 1):
        pl = _zero_and_run(fb, spec, chunks, opt, it0, k)
        opt.step()
        pre = _global_loss(pl, last)
        if rank == 0:
            out.write({"event": "pretrain", "step": k, "loss": pre})
    if spec.save_checkpoint:
        _save_weights([_gpt(c) for c in chunks], spec.save_checkpoint, spec.model)
    if spec.load_checkpoint:
        _load_weights([_gpt(c) for c in chunks], spec.load_checkpoint)
    for c in chunks:
        c.zero_grad_buffer()
    return _optimizer(spec, cfg, chunks)


def _steps(fb: Any, spec: HarnessSpec, cfg: Any, chunks: list[Any], opt: Any, iters: list[Any], out: _Out, rank: int,
           world: int, last: bool) -> list[float]:
    """The measured steps, one ``step`` line each (with the step-1 gradient dump, memory phases and profile the spec
    asks for); returns the step times in seconds."""
    import torch
    import torch.distributed as dist

    tokens_per_step = spec.global_batch_size * spec.seq_length
    times: list[float] = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(1, spec.steps + 1):
        prof = _profiler(spec, step)
        torch.cuda.synchronize()
        dist.barrier()
        if prof is not None:
            prof.start()
        t0 = time.perf_counter()
        losses = _zero_and_run(fb, spec, chunks, opt, iters, step)
        if step == 1 and spec.dump_grads:
            torch.cuda.synchronize()
            t_dump = time.perf_counter()
            idx = _dump_grads(spec, chunks, cfg, losses, last)
            t0 += time.perf_counter() - t_dump  # the dump is not part of the step's time
            if rank == 0:
                out.write({"event": "grads", "dir": spec.dump_grads, "tensors": len(idx.get("tensors", {})),
                           "seconds": idx.get("seconds"),
                           "replicas_max_abs_diff": max(idx.get("replicas", {}).values(), default=0.0),
                           "fault": _RAN.get("fault")})
        if step == 1:
            _memory_phase(spec, out, rank, "step1_after_forward_backward")
        ok, grad_norm, _ = opt.step()
        torch.cuda.synchronize()
        dist.barrier()
        dt = time.perf_counter() - t0
        if step == 1:
            _memory_phase(spec, out, rank, "step1_after_optimizer_step", tensors=True)
        if step == spec.profile_step:
            _export_profile(spec, prof, out, rank, world, step)
        if step == 1:
            _RAN.setdefault("host_memory", {})["after_step1_bytes"] = _host_rss()
        times.append(dt)
        loss_v = _global_loss(losses, last)
        if rank == 0:
            out.write({"event": "step", "step": step, "step_time_s": dt,
                       "tokens_per_s_per_gpu": tokens_per_step / dt / world, "loss": loss_v,
                       "grad_norm": float(grad_norm) if grad_norm is not None else None,
                       "update_successful": bool(ok), **({"profiled": True} if step == spec.profile_step else {})})
    return times


def _summary(spec: HarnessSpec, chunks: list[Any], times: list[float], build_s: float, out: _Out, rank: int,
             world: int) -> None:
    """The ``summary`` line: the median step time after warm-up, every rank's peak GPU and host memory (a collective).
    """
    import torch
    import torch.distributed as dist

    mem = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), _host_summary(spec, chunks)]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mem)
    if rank != 0:
        return
    med = median_after_warmup(times, spec.warmup_steps)
    out.write({
        "event": "summary", "steps": len(times), "warmup_steps": spec.warmup_steps, "median_step_time_s": med,
        "step_time_cv": cv(times[spec.warmup_steps:]),
        "tokens_per_s_per_gpu": spec.global_batch_size * spec.seq_length / med / world if med and math.isfinite(med)
        else None,
        "peak_allocated_bytes": [g[0] for g in gathered], "peak_reserved_bytes": [g[1] for g in gathered],
        "build_s": build_s, "layout": spec.layout, "versions": _versions(), "notes": list(spec.notes),
        "num_microbatches": spec.num_microbatches, "label": spec.label, "precision": spec.precision,
        "run_options": _run_options(spec), "host_memory_per_rank": [g[2] for g in gathered],
        "peak_host_rss_bytes": max((g[2].get("peak_rss_bytes") or 0) for g in gathered),
    })


def _run(spec: HarnessSpec, out: _Out, rank: int, world: int) -> None:
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    cfg, chunks, opt, build_s = _setup(spec, out, rank)
    if rank == 0:
        out.write({"event": "start", "world_size": world, "layout": spec.layout, "versions": _versions(),
                   "notes": list(spec.notes), "build_s": build_s, "data": spec.data, "lr": spec.lr, "fault": spec.fault,
                   "loaded_checkpoint": spec.load_checkpoint,
                   "saved_checkpoint": spec.save_checkpoint, "label": spec.label, "precision": spec.precision,
                   "run_options": _run_options(spec)})
    corpus = _corpus(spec, out, rank)
    fb = get_forward_backward_func()
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    if spec.pretrain_steps:
        opt = _warm_start(fb, spec, cfg, chunks, opt, corpus, out, rank, last)
    iters = [_batches(spec, corpus, spec.data_step_offset) for _ in chunks]
    times = _steps(fb, spec, cfg, chunks, opt, iters, out, rank, world, last)
    _summary(spec, chunks, times, build_s, out, rank, world)
    if spec.forward_only_steps:
        _forward_only(spec, chunks, iters, out, rank)
    if spec.saved_tensor_census:
        _census(spec, chunks, out, rank)


def main(argv: list[str] | None = None) -> int:
    """Run the harness; see the module docstring for the exit status."""
    from specs import Workload
    from specs.errors import TunerError

    try:
        spec_path, out_path = parse_argv(sys.argv[1:] if argv is None else argv)
        spec = HarnessSpec.from_json(Path(spec_path).read_text())
    except (TunerError, OSError) as e:
        print(f"harness: {e}", file=sys.stderr)
        return 2
    out = _Out(out_path)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    env = HarnessEnv.detect()
    lay = spec.layout_obj()
    reasons = unsupported_reasons(lay, spec.model_spec(),
                                  Workload(seq_length=spec.seq_length, global_batch_size=spec.global_batch_size,
                                           precision=Precision(spec.precision)), env)
    reasons += fault_reasons(spec.fault, lay, env)
    if spec.use_transformer_engine and not env.transformer_engine:
        reasons.append("the spec asks for Transformer Engine, which is not importable here")
    if lay.world_size != world:
        reasons.append(f"the layout is for {lay.world_size} GPUs but torchrun started {world} processes")
    if reasons:
        if rank == 0:
            out.write({"event": "refused", "reasons": reasons})
        print("harness: refused: " + "; ".join(reasons), file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        _run(spec, out, rank, world)
    except torch.OutOfMemoryError as e:
        out.write({"event": "oom", "rank": rank, "message": str(e).splitlines()[0][:500],
                   "allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved(),
                   "max_allocated_bytes": torch.cuda.max_memory_allocated()})
        print(f"harness rank {rank}: out of memory: {e}", file=sys.stderr, flush=True)
        os._exit(3)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a JSON line and an exit status
        out.write({"event": "error", "rank": rank, "type": type(e).__name__, "message": str(e)[:2000]})
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    with contextlib.suppress(Exception):
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
