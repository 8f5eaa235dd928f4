"""The GPU side of gradient parity (:func:`dump_gradients`), the ``norm_grad_scaled`` fault (:func:`scale_norm_grad`)
and the saved-tensor census (:class:`SavedTensorCensus`); the plan is :mod:`launch.harness.gather`'s."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from launch.harness.gather import ParamShard, assemble, gather_plan, strip_wrappers

__all__ = ["SavedTensorCensus", "dump_gradients", "pick_norm_param", "scale_norm_grad", "unshard_dp_grads"]


def _gpt(chunk: Any) -> Any:
    m = chunk
    while hasattr(m, "module"):
        m = m.module
    return m


def unshard_dp_grads(chunks: list[Any]) -> int:
    """All-gather each gradient bucket over its distributed-optimizer group (a reduce-scatter left only this rank's
    shard reduced). Returns the buckets gathered.

    Source: megatron-core 0.19 ``distributed/param_and_grad_buffer.py`` (``start_grad_sync``); one optimizer instance
    only."""
    import torch
    import torch.distributed as dist

    n = 0
    for c in chunks:
        ddp_cfg = c.ddp_config
        if not ddp_cfg.use_distributed_optimizer:
            continue
        if getattr(ddp_cfg, "num_distributed_optimizer_instances", 1) != 1:
            raise RuntimeError("gradient parity supports one distributed-optimizer instance")
        for bg in list(c.bucket_groups) + list(c.expert_parallel_bucket_groups):
            size = bg.intra_distributed_optimizer_instance_size
            if size == 1:
                continue
            rank = bg.intra_distributed_optimizer_instance_rank
            for b in bg.buckets:
                shard = b.grad_data.numel() // size
                mine = b.grad_data[rank * shard:(rank + 1) * shard].clone()
                dist.all_gather_into_tensor(b.grad_data, mine, group=bg.intra_distributed_optimizer_instance_group)
                n += 1
    torch.cuda.synchronize()
    return n


def pick_norm_param(model: Any) -> tuple[str, Any] | None:
    """The norm weight the ``norm_grad_scaled`` fault scales: the first layer's ``q_layernorm`` weight, else the first
    parameter of the first layer whose name says norm. None on a pipeline stage without the model's first layer."""
    named = [(strip_wrappers(n), p) for n, p in model.named_parameters()]
    return next(((n, p) for n, p in named if n == "decoder.layers.0.self_attention.q_layernorm.weight"), None) or next(
        ((n, p) for n, p in named if n.startswith("decoder.layers.0.") and ("layernorm" in n or "layer_norm" in n)),
        None)


def _grad(p: Any) -> Any:
    """A parameter's gradient: megatron-core's ``main_grad``, else ``grad`` (None when neither)."""
    grad = getattr(p, "main_grad", None)
    return p.grad if grad is None else grad


def scale_norm_grad(chunks: list[Any], factor: float = 2.0) -> str | None:
    """Multiply one norm weight's reduced gradient by ``factor`` (the fault) on the model chunk that holds the model's
    first layer; returns the weight's name, or None on a rank without that layer."""
    for c in chunks:
        g = _gpt(c)
        layers = getattr(getattr(g, "decoder", None), "layers", None)
        if not layers or int(layers[0].layer_number) != 1:
            continue
        hit = pick_norm_param(g)
        if hit is None:
            continue
        name, p = hit
        if (grad := _grad(p)) is not None:
            grad.mul_(factor)
            return name
    return None


def _groups() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    return {"tp": ps.get_tensor_model_parallel_group(), "etp": ps.get_expert_tensor_parallel_group(),
            "tp_rank": ps.get_tensor_model_parallel_rank(), "etp_rank": ps.get_expert_tensor_parallel_rank(),
            "tp_size": ps.get_tensor_model_parallel_world_size(),
            "etp_size": ps.get_expert_tensor_parallel_world_size(), "ep_rank": ps.get_expert_model_parallel_rank(),
            "ep_size": ps.get_expert_model_parallel_world_size(),
            "dp_rank": ps.get_data_parallel_rank(with_context_parallel=True),
            "edp_rank": ps.get_expert_data_parallel_rank(), "pp_rank": ps.get_pipeline_model_parallel_rank()}


def _all_gather(t: Any, group: Any, size: int) -> list[Any]:
    import torch
    import torch.distributed as dist

    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t, group=group)
    return parts


def dump_gradients(chunks: list[Any], out_dir: str | Path, meta: dict[str, Any], *, gated_linear_unit: bool,
                   num_experts: int) -> dict[str, Any]:
    """Write every parameter's full fp32 gradient under ``out_dir`` (a collective); rank 0 writes ``index.json`` with
    ``meta``, ``tensors``, ``replicas`` (the largest difference between TP ranks of each replicated gradient) and
    ``seconds``. Returns the index (``tensors`` complete on rank 0)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    out = Path(out_dir)
    rank = dist.get_rank()
    if rank == 0:
        (out / "tensors").mkdir(parents=True, exist_ok=True)
    dist.barrier()
    unshard_dp_grads(chunks)
    g = _groups()
    nle = num_experts // g["ep_size"] if num_experts else 0
    mine: dict[str, Any] = {}
    replicas: dict[str, float] = {}
    for c in chunks:
        model = _gpt(c)
        layers = getattr(getattr(model, "decoder", None), "layers", None)
        offset = int(layers[0].layer_number) - 1 if layers is not None and len(layers) else 0
        pre = bool(getattr(model, "pre_process", True))
        for lname, p in model.named_parameters():
            if not p.requires_grad:
                continue
            grad = _grad(p)
            grad = torch.zeros_like(p, dtype=torch.float32) if grad is None else grad.detach().float()
            shard = ParamShard(
                name=lname, shape=tuple(p.shape),
                tensor_model_parallel=bool(getattr(p, "tensor_model_parallel", False)),
                partition_dim=int(getattr(p, "partition_dim", -1)),
                partition_stride=int(getattr(p, "partition_stride", 1)),
                is_expert=not bool(getattr(p, "allreduce", True)),
                shared_embedding=bool(getattr(p, "shared_embedding", False)), pre_process=pre,
            )
            plan = gather_plan(shard, tp=g["tp_size"], etp=g["etp_size"], layer_offset=offset,
                               ep_rank=g["ep_rank"] if shard.is_expert else 0, num_local_experts=nle,
                               gated_linear_unit=gated_linear_unit)
            if plan.skip:
                continue
            grp = "etp" if shard.is_expert else "tp"
            size, grank = g[f"{grp}_size"], g[f"{grp}_rank"]
            if plan.group is not None:
                parts = _all_gather(grad, g[grp], size)
                full = assemble(parts, plan, lambda xs, d: torch.cat(xs, dim=d),
                                lambda x, n, d: list(torch.chunk(x, n, dim=d)))
            else:
                full = grad
                if size > 1:  # replicated: its copies must agree
                    parts = _all_gather(grad, g[grp], size)
                    replicas[plan.name] = max(float((x - parts[0]).abs().max()) for x in parts)
            owner = grank == 0 and (g["edp_rank"] == 0 if shard.is_expert else g["dp_rank"] == 0)
            if owner:
                fname = f"tensors/{plan.name}.npy"
                np.save(out / fname, full.contiguous().cpu().numpy())
                mine[plan.name] = {"file": fname, "shape": list(full.shape), "dtype": "float32",
                                   "local_name": strip_wrappers(lname), "owner_rank": rank}
    frags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(frags, {"tensors": mine, "replicas": replicas})
    index: dict[str, Any] = dict(meta)
    if rank == 0:
        tensors: dict[str, Any] = {}
        reps: dict[str, float] = {}
        dup = []
        for f in frags:
            for k, v in f["tensors"].items():
                if k in tensors:
                    dup.append(k)
                tensors[k] = v
            for k, v in f["replicas"].items():
                reps[k] = max(reps.get(k, 0.0), v)
        index.update(tensors=tensors, replicas=reps, duplicate_owners=sorted(set(dup)),
                     seconds=time.perf_counter() - t0, world_size=dist.get_world_size())
        tmp = out / "index.json.tmp"
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True, default=str))
        os.replace(tmp, out / "index.json")
    dist.barrier()
    return index


class SavedTensorCensus:
    """What autograd saves for backward during one forward of chosen modules.

    Every tensor packed while a watched module's forward runs (``saved_tensors_hooks``, returned unchanged) is
    recorded: shape, dtype, bytes, whether it is a parameter's, deduplicated by storage. Tensors stashed outside
    ``save_for_backward`` and recomputed forwards are not seen; the allocator's growth over the forward is the check."""

    def __init__(self, modules: dict[str, Any], param_storages: set[int]) -> None:
        self.modules = modules
        self.param_storages = param_storages
        self.records: dict[str, dict[str, Any]] = {n: {"saved": {}, "alloc_before": 0, "alloc_after": 0, "inputs": []}
                                                   for n in modules}
        self._stack: list[str] = []
        self._done: set[str] = set()
        self._handles: list[Any] = []

    def _pack(self, t: Any) -> Any:
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
            nbytes = st.nbytes()
        except Exception:  # noqa: BLE001 - a tensor without storage (a subclass): record by its own size
            key, nbytes = id(t), t.numel() * t.element_size()
        for name in self._stack:
            saved = self.records[name]["saved"]
            if key not in saved:
                saved[key] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "bytes": int(nbytes),
                              "parameter": key in self.param_storages, "type": type(t).__name__}
        return t

    @staticmethod
    def _unpack(t: Any) -> Any:
        return t

    def __enter__(self) -> SavedTensorCensus:
        import torch

        cuda = torch.cuda.is_available()

        def pre(name: str) -> Any:
            def f(mod: Any, args: Any) -> None:
                if name in self._done:  # a recomputation during backward: not what the forward saved
                    return
                if cuda:
                    torch.cuda.synchronize()
                self.records[name]["alloc_before"] = torch.cuda.memory_allocated() if cuda else 0
                self.records[name]["inputs"] = [list(a.shape) for a in args if hasattr(a, "shape")]
                self._stack.append(name)
            return f

        def post(name: str) -> Any:
            def f(mod: Any, args: Any, output: Any) -> None:
                if name in self._done:
                    return
                self._done.add(name)
                if cuda:
                    torch.cuda.synchronize()
                self.records[name]["alloc_after"] = torch.cuda.memory_allocated() if cuda else 0
                if name in self._stack:  # pushed once: a module's forward does not run inside itself
                    self._stack.remove(name)
            return f

        for name, mod in self.modules.items():
            self._handles.append(mod.register_forward_pre_hook(pre(name)))
            self._handles.append(mod.register_forward_hook(post(name)))
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def report(self) -> list[dict[str, Any]]:
        """One dict per watched module: ``saved`` (largest first), ``saved_bytes`` (activations only, parameters
        left out), ``parameter_bytes``, ``alloc_delta_bytes``, ``inputs`` (shapes)."""
        out = []
        for name, r in self.records.items():
            saved = sorted(r["saved"].values(), key=lambda x: -x["bytes"])
            out.append({"module": name, "inputs": r["inputs"], "saved": saved, "saved_tensors": len(saved),
                        "saved_bytes": sum(x["bytes"] for x in saved if not x["parameter"]),
                        "parameter_bytes": sum(x["bytes"] for x in saved if x["parameter"]),
                        "alloc_delta_bytes": int(r["alloc_after"] - r["alloc_before"])})
        return out
