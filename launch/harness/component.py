"""The optimizer component test on one GPU: precision-aware Adam as megatron-core runs it with TE, against an FP64 Adam.

``python -m launch.harness.component --spec component.json --out component.jsonl`` (world size 1, EP 1; the verdict is
:func:`tuner.verify.component.decide_component_test`'s, from the JSON lines):

1. builds one transformer layer with a MoE block of the seed's shape (hidden 4,096, top-10, expert FFN 1,024; as many of
its 512 experts as fit, :func:`experts_that_fit`) in bf16 with TE's layer spec and grouped GEMM; 2. records the
gradients of ``len(steps)`` forward and backward passes at the initial weights, scaled so that the first step's global
norm is ``grad_norm`` (2.0: clipping at 1.0 acts); 3. for each arm (:data:`COMPONENT_ARMS`) rebuilds the layer from the
same seed (bitwise the recorded weights), builds the arm's optimizer with ``get_megatron_optimizer`` over
megatron-core's DDP, replays the gradients and compares every FP32 master's update with an FP64 Adam fed the same
gradients and clip coefficients; 4. compares the rebuilt masters of arm ``gpu`` with arm ``explicit_masters``'s bit for
bit.

Exit status: 0 done (whatever the verdict); 2 bad arguments or no Transformer Engine; 1 an error."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specs.errors import TunerError
from specs.units import GIB

__all__ = ["COMPONENT_ARMS", "SEED_HYPER", "AdamHyper", "ComponentArm", "ComponentSpec", "clip_coefficient",
           "component_model", "experts_that_fit", "main"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AdamHyper:
    """Adam's hyperparameters as megatron-core passes them (``OptimizerConfig``: ``lr``, ``adam_beta1/2``,
    ``adam_eps``, ``weight_decay``, ``clip_grad``; decoupled weight decay, bias correction on)."""

    lr: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_grad: float = 1.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


#: The seed's hyperparameters (``../shared/seeds/001_*``: ``--lr 1e-5 --weight-decay 0.1 --adam-beta1 0.9
#: --adam-beta2 0.98``; megatron-core's defaults ``adam_eps 1e-8`` and ``clip_grad 1.0``), at the peak learning rate.
SEED_HYPER = AdamHyper()


def clip_coefficient(total_norm: float, max_norm: float) -> float:
    """megatron-core's gradient scale: ``max_norm / (total_norm + 1e-6)`` capped at 1; 1 when ``max_norm <= 0``
    (``megatron/core/optimizer/clip_grads.py``, ``clip_grad_by_total_norm_fp32``)."""
    if max_norm <= 0:
        return 1.0
    c = max_norm / (total_norm + 1e-6)
    return c if c < 1.0 else 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentArm:
    """One optimizer configuration of the component test (:data:`COMPONENT_ARMS`)."""

    name: str
    kind: str
    """``baseline`` (the default GPU optimizer: sets the bound), ``test`` (must be within the bound),
    ``bitwise`` (the explicit-master arm the test arm is compared with bit for bit), ``control`` (must fail)."""
    description: str
    precision_aware: bool = True
    store_param_remainders: bool = True
    moments: str = "fp32"  # ``fp32`` or ``bf16`` (``exp_avg_dtype`` and ``exp_avg_sq_dtype``)
    offload_fraction: float = 0.0
    """``optimizer_offload_fraction`` with ``optimizer_cpu_offload`` and ``overlap_cpu_optimizer_d2h_h2d`` on (0 = GPU).
    """
    eps: float | None = None  # an epsilon other than the reference's (a control)
    beta2: float | None = None  # A beta2 other than the reference's (a control)
    mutation: str | None = None
    """``zero_remainders`` (after each step, the remainders are zeroed: masters rebuilt from the bf16 weights
    alone) or ``bf16_masters`` (TE's FusedAdam without master weights: the bf16 weights are the masters)."""
    bitwise_with: str | None = None  # the arm whose masters this arm's must equal bit for bit
    detects: str = ""
    """For a control: the class of bug it stands for (``remainders``, ``hyperparameter``, ``masters``). The test
    must catch every class: at least one control of each class must fail (a wrong epsilon or beta among them)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


#: The arms the component program runs, in order (the bitwise arm before the arm compared with it).
COMPONENT_ARMS: tuple[ComponentArm, ...] = (
    ComponentArm(name="default", kind="baseline",
                 description="megatron-core's default GPU optimizer: distributed optimizer, fp32 main "
                 "weights and fp32 moments (TE FusedAdam), precision-aware off", precision_aware=False,
                 store_param_remainders=False),
    ComponentArm(name="explicit_masters", kind="bitwise", description="precision-aware Adam with explicit FP32 masters "
                 "(store_param_remainders off)", store_param_remainders=False),
    ComponentArm(name="gpu", kind="test",
                 description="precision-aware Adam on the GPU: bf16 weights, FP32 masters rebuilt from "
                 "16-bit remainders, fp32 moments", bitwise_with="explicit_masters"),
    ComponentArm(name="gpu_bf16_moments", kind="test",
                 description="precision-aware Adam on the GPU with bf16 exp_avg and exp_avg_sq", moments="bf16"),
    ComponentArm(name="offload", kind="test",
                 description="precision-aware Adam with CPU optimizer offload, fraction 1.0, "
                 "overlapped D2H/H2D copies (HybridDeviceOptimizer, torch AdamW on the CPU)", offload_fraction=1.0),
    ComponentArm(name="control_remainders_dropped", kind="control",
                 description="remainders dropped: zeroed after every step, so the "
                 "masters are rebuilt from the bf16 weights alone", mutation="zero_remainders", detects="remainders"),
    ComponentArm(name="control_wrong_eps", kind="control", description="epsilon 1e-6 instead of 1e-8", eps=1e-6,
                 detects="hyperparameter"),
    ComponentArm(name="control_wrong_beta2", kind="control", description="beta2 0.95 instead of 0.98", beta2=0.95,
                 detects="hyperparameter"),
    ComponentArm(name="control_bf16_masters", kind="control",
                 description="masters kept in bf16 (TE FusedAdam with master_weights off)",
                 store_param_remainders=False, mutation="bf16_masters", detects="masters"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentSpec:
    """The component program's input (JSON); shapes of the seed's component test (``../shared/seeds/001_*``: one
    Qwen3.5-397B-A17B MoE layer)."""

    hidden_size: int = 4096
    moe_ffn_hidden_size: int = 1024
    num_experts: int = 512  # the run uses ``min(this, max_experts, what fits)``
    max_experts: int = 512
    experts: int | None = None  # run exactly this many experts (None: as many as fit, up to ``max_experts``)
    moe_router_topk: int = 10
    num_attention_heads: int = 32
    num_query_groups: int = 4
    kv_channels: int = 128
    vocab_size: int = 2048
    tokens: int = 4096  # tokens per step (one row): the seed's "4,096 tokens per rank"
    steps: tuple[int, ...] = (1, 3)  # after which steps the update is measured (the last is the number of steps)
    hyper: AdamHyper = field(default_factory=lambda: SEED_HYPER)
    grad_norm: float = 2.0  # the first step's gradients are scaled to this global L2 norm
    arms: tuple[str, ...] = tuple(a.name for a in COMPONENT_ARMS)
    seed: int = 1234

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["steps"], d["arms"] = list(self.steps), list(self.arms)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ComponentSpec:
        d = json.loads(text)
        if "hyper" in d:
            d["hyper"] = AdamHyper(**d["hyper"])
        for k in ("steps", "arms"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    @property
    def params_per_expert(self) -> int:
        """Gated expert: fc1 ``2 f x h`` plus fc2 ``h x f``."""
        return 3 * self.hidden_size * self.moe_ffn_hidden_size

    def shape_text(self, experts: int) -> str:
        return (f"one MoE layer of the seed's shape (Qwen3.5-397B-A17B): hidden {self.hidden_size}, {experts} of its "
                f"{self.num_experts} experts (as many as fit on one GPU with EP 1), top-{self.moe_router_topk}, expert "
                f"FFN {self.moe_ffn_hidden_size}, {self.tokens:,} tokens per step; attention ("
                f"{self.num_attention_heads} heads) and a {self.vocab_size}-token vocabulary around it")


#: Bytes per parameter while an arm runs on the GPU: bf16 weight 2 + fp32 gradient buffer 4 + optimizer state
#: up to 12 (fp32 master or main weight 4, exp_avg and exp_avg_sq 8), plus the explicit-master arm's masters
#: after two measured steps kept for the bitwise comparison (8).
GPU_BYTES_PER_PARAM = 26


def experts_that_fit(spec: ComponentSpec, gpu_free_bytes: int, host_available_bytes: int, *, steps: int = 3,
                     reserve_gpu: int = 10 * GIB, reserve_host: int = 16 * GIB, other_params: int = 0) -> int:
    """Experts of ``spec``'s shape that fit this GPU and host (a multiple of 8, from top-k to ``num_experts``):
    :data:`GPU_BYTES_PER_PARAM` on the GPU; on the host the recorded gradients (4 bytes per step), the initial bf16
    weights (2) and the offloaded arm's CPU optimizer (18: :mod:`cost_model.terms.optimizer` has 16 plus about 4
    pinned); ``other_params`` outside the experts, ``reserve_*`` for activations, context and process."""
    host_per = 4 * steps + 2 + 18
    n_gpu = (gpu_free_bytes - reserve_gpu) // GPU_BYTES_PER_PARAM - other_params
    n_host = (host_available_bytes - reserve_host) // host_per - other_params
    e = min(n_gpu, n_host) // spec.params_per_expert
    e = int(e) // 8 * 8
    return max(spec.moe_router_topk, min(spec.num_experts, e))


def component_model(spec: ComponentSpec, experts: int) -> dict[str, Any]:
    """The :class:`specs.ModelSpec` fields (as a dict) of the component layer with ``experts`` experts."""
    return {
        "name": f"component MoE layer ({experts} experts)", "num_layers": 1, "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads, "num_query_groups": spec.num_query_groups,
        "kv_channels": spec.kv_channels, "ffn_hidden_size": spec.moe_ffn_hidden_size, "vocab_size": spec.vocab_size,
        "num_experts": experts, "moe_router_topk": spec.moe_router_topk,
        "moe_ffn_hidden_size": spec.moe_ffn_hidden_size, "moe_shared_expert_intermediate_size": 0,
        "moe_layer_freq": [1], "gated_linear_unit": True, "untie_embeddings_and_output_weights": True,
        "qk_layernorm": True, "qk_layernorm_full_dim": False,
        "mtp_num_layers": 0, "q_lora_rank": 0, "kv_lora_rank": 0, "qk_head_dim": 0, "qk_pos_emb_head_dim": 0,
        "v_head_dim": 0, "max_position_embeddings": spec.tokens, "window_size": 0, "window_attn_skip_freq": [],
        "norm_epsilon": 1e-6, "rotary_base": 10000.0,
        "rotary_percent": 1.0, "rope_scaling_type": "", "rope_scaling_factor": 1.0, "rope_scaling_mscale": 1.0,
        "rope_scaling_mscale_all_dim": 0.0, "moe_router_score_function": "softmax",
        "moe_router_enable_expert_bias": False, "moe_router_topk_scaling_factor": 0.0,
        "moe_router_num_groups": 0, "moe_router_group_topk": 0, "extra_megatron_args": [],
        "source": "component test shape",
    }


# ----------------------------------------------------------------------------------------------------------------
# the GPU program


class _Out:
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, obj: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(obj, default=str) + "\n")


def _harness_spec(spec: ComponentSpec, experts: int) -> Any:
    from launch.harness.spec import HarnessSpec
    from specs.layout import Layout

    return HarnessSpec(model=component_model(spec, experts), layout=Layout(world_size=1).to_dict(),
                       seq_length=spec.tokens, global_batch_size=1, steps=1, warmup_steps=0, seed=spec.seed,
                       use_transformer_engine=True)


def _build_ddp(hspec: Any, seed: int) -> tuple[Any, Any]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from launch.harness import build

    build.seed_all(seed)
    cfg = build._transformer_config(hspec)
    chunks = build._build_chunks(hspec, cfg)
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=True)
    ddp = DistributedDataParallel(cfg, ddp_cfg, chunks[0])
    return cfg, ddp


def _named(ddp: Any) -> list[tuple[str, Any]]:
    from launch.harness.gather import strip_wrappers

    return [(strip_wrappers(n), p) for n, p in ddp.named_parameters() if p.requires_grad]


def _optimizer_config(arm: ComponentArm, hyper: AdamHyper) -> Any:
    import torch
    from megatron.core.optimizer import OptimizerConfig

    pa = arm.precision_aware
    dt = torch.bfloat16 if arm.moments == "bf16" else torch.float32
    return OptimizerConfig(
        optimizer="adam", lr=hyper.lr, min_lr=hyper.lr, weight_decay=hyper.weight_decay, adam_beta1=hyper.beta1,
        adam_beta2=arm.beta2 if arm.beta2 is not None else hyper.beta2,
        adam_eps=arm.eps if arm.eps is not None else hyper.eps, clip_grad=hyper.clip_grad, bf16=True,
        params_dtype=torch.bfloat16, use_distributed_optimizer=True, use_precision_aware_optimizer=pa,
        store_param_remainders=arm.store_param_remainders if pa else True, exp_avg_dtype=dt if pa else torch.float32,
        exp_avg_sq_dtype=dt if pa else torch.float32, optimizer_cpu_offload=arm.offload_fraction > 0,
        optimizer_offload_fraction=arm.offload_fraction if arm.offload_fraction > 0 else 1.0,
        overlap_cpu_optimizer_d2h_h2d=arm.offload_fraction > 0,
    )


def _apply_schedule(opt: Any, hyper: AdamHyper) -> None:
    """What megatron's ``OptimizerParamScheduler`` sets on every group before a step: ``lr x lr_mult``,
    ``weight_decay x wd_mult`` (0 for biases and 1-D parameters)."""
    for d in _dist_opts(opt):
        for g in d.optimizer.param_groups:
            g["lr"] = hyper.lr * float(g.get("lr_mult", 1.0))
            g["weight_decay"] = hyper.weight_decay * float(g.get("wd_mult", 1.0))


def _dist_opts(opt: Any) -> list[Any]:
    return list(getattr(opt, "chained_optimizers", [opt]))


def _locate(opt: Any, p: Any) -> tuple[Any, dict[str, Any], Any]:
    """(the DistributedOptimizer holding ``p``, its param group, the optimizer's own parameter for ``p``)."""
    for d in _dist_opts(opt):
        m = getattr(d, "model_param_group_index_map", {})
        if p in m:
            gi, go = m[p]
            group = d.optimizer.param_groups[gi]
            return d, group, group["params"][go]
    raise RuntimeError("parameter not found in the optimizer")


def _inner_te(d: Any) -> Any:
    """TE's FusedAdam inside a DistributedOptimizer (None for the CPU offload's HybridDeviceOptimizer)."""
    inner = d.optimizer
    return inner if type(inner).__name__ == "FusedAdam" else None


def _rebuild_master(bf16: Any, remainder: Any) -> Any:
    """FP32 masters from bf16 weights and int16 remainders, as TE's ``AdamFunctorMasterParamRemainder``
    (:func:`tuner.verify.component.reconstruct_fp32`)."""
    import torch

    hi = bf16.contiguous().view(torch.int16).reshape(-1)
    rem = remainder.contiguous().reshape(-1)
    hi = hi - (rem < 0).to(torch.int16)
    return torch.stack([rem, hi], dim=-1).contiguous().view(torch.float32).reshape(-1)


def _master(opt: Any, p: Any, arm: ComponentArm) -> Any:
    """The FP32 master of ``p`` as this arm's optimizer holds it (flat, on the GPU)."""
    import torch

    d, group, sp = _locate(opt, p)
    if not arm.precision_aware:
        return sp.detach().reshape(-1).float()
    inner = _inner_te(d)
    if inner is None:  # HybridDeviceOptimizer: the fp32 CPU copy is the master
        m = d.optimizer.state.get(sp, {}).get("master_param")
        if m is None:
            raise RuntimeError("the offloaded optimizer has no master_param for a parameter")
        return m.detach().reshape(-1).to("cuda", torch.float32)
    m = inner.state.get(sp, {}).get("master_param")
    if m is None:  # master_weights off: the bf16 weight is the master
        return sp.detach().reshape(-1).float()
    if m.dtype == torch.int16:
        return _rebuild_master(sp.detach(), m.detach())
    return m.detach().reshape(-1).float()


def _reference_update(p0: Any, grads: list[Any], k: int, hyper: AdamHyper, wd: float, coeffs: list[float]) -> Any:
    """FP64 Adam for ``k`` steps on the GPU; returns the update ``p_k - p_0``."""
    import torch

    p00 = p0.to("cuda", torch.float64).reshape(-1)
    p, m, v = p00.clone(), torch.zeros_like(p00), torch.zeros_like(p00)
    b1, b2 = hyper.beta1, hyper.beta2
    for t in range(1, k + 1):
        g = grads[t - 1].to("cuda", torch.float64).reshape(-1) * coeffs[t - 1]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        den = (v / (1 - b2**t)).sqrt_().add_(hyper.eps)
        p = p - hyper.lr * ((m / (1 - b1**t)) / den + wd * p)
    return p - p00


def _run(spec: ComponentSpec, out: _Out) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from launch.harness.build import _versions
    from launch.harness.hostmem import process_memory, system_memory

    parallel_state.initialize_model_parallel(1, 1)
    free, total = torch.cuda.mem_get_info()
    host_avail = system_memory().get("available_bytes", 0)
    other = 4 * spec.hidden_size * spec.num_attention_heads * spec.kv_channels + 2 * spec.vocab_size * spec.hidden_size
    fit = experts_that_fit(spec, free, host_avail, steps=max(spec.steps), other_params=other)
    experts = spec.experts if spec.experts is not None else min(fit, spec.max_experts)
    hspec = _harness_spec(spec, experts)
    nsteps = max(spec.steps)
    out.write({"event": "start", "versions": _versions(), "spec": json.loads(spec.to_json()), "experts": experts,
               "experts_fit": fit, "shape": spec.shape_text(experts), "gpu_free_bytes": free, "gpu_total_bytes": total,
               "host_available_bytes": host_avail,
               "arms": [a.to_dict() for a in COMPONENT_ARMS if a.name in spec.arms], "hyper": spec.hyper.to_dict()})

    # 1. the gradients, at the initial weights
    t0 = time.perf_counter()
    cfg, ddp = _build_ddp(hspec, spec.seed)
    named = _named(ddp)
    p0 = {n: p.detach().to("cpu", copy=True) for n, p in named}
    grads: dict[str, list[Any]] = {n: [] for n, _ in named}
    pos = torch.arange(spec.tokens, device="cuda").unsqueeze(0)
    raw_norms = []
    for k in range(nsteps):
        ddp.zero_grad_buffer()
        g = torch.Generator(device="cuda").manual_seed(spec.seed + 1 + k)
        tok = torch.randint(0, spec.vocab_size, (1, spec.tokens + 1), device="cuda", generator=g)
        loss = ddp(tok[:, :-1], pos, None, labels=tok[:, 1:]).float().mean()
        loss.backward()
        torch.cuda.synchronize()
        sq = 0.0
        for n, p in named:
            gr = p.main_grad.detach().float()
            sq += float(gr.double().pow(2).sum())
            grads[n].append(gr.to("cpu").pin_memory())
        raw_norms.append(math.sqrt(sq))
    scale = spec.grad_norm / raw_norms[0] if raw_norms[0] > 0 else 1.0
    norms = []
    for n in grads:
        for k in range(nsteps):
            grads[n][k].mul_(scale)
    for k in range(nsteps):
        norms.append(math.sqrt(sum(float(grads[n][k].double().pow(2).sum()) for n in grads)))
    coeffs = [clip_coefficient(x, spec.hyper.clip_grad) for x in norms]
    numel = sum(p.numel() for _, p in named)
    absg = torch.cat([grads[n][0].reshape(-1)[:: max(1, grads[n][0].numel() // 4096)].abs() for n in grads])
    out.write({"event": "grads", "steps": nsteps, "raw_global_norms": raw_norms, "scale": scale, "global_norms": norms,
               "clip_coeffs": coeffs, "params": numel, "tensors": len(named),
               "median_abs_grad_step1": float(absg.median()), "seconds": time.perf_counter() - t0,
               "host": process_memory()})
    del ddp, cfg, named
    gc.collect()
    torch.cuda.empty_cache()

    # 2. the arms
    explicit: dict[int, dict[str, Any]] = {}
    for arm in (a for a in COMPONENT_ARMS if a.name in spec.arms):
        ta = time.perf_counter()
        try:
            _run_arm(spec, hspec, arm, p0, grads, coeffs, explicit, out)
        except torch.OutOfMemoryError as e:
            out.write({"event": "arm_error", "arm": arm.name, "kind": arm.kind,
                       "message": f"out of memory: {str(e)[:300]}"})
        except Exception as e:  # noqa: BLE001 - an arm that breaks is a finding; the others still run
            out.write({"event": "arm_error", "arm": arm.name, "kind": arm.kind,
                       "message": f"{type(e).__name__}: {str(e)[:1500]}", "traceback": traceback.format_exc()[-3000:]})
        gc.collect()
        torch.cuda.empty_cache()
        out.write({"event": "arm_done", "arm": arm.name, "seconds": time.perf_counter() - ta, "host": process_memory(),
                   "gpu_peak_allocated_bytes": torch.cuda.max_memory_allocated()})
        torch.cuda.reset_peak_memory_stats()
        if arm.name == "gpu":
            explicit.clear()  # the bitwise comparison is done
    out.write({"event": "summary", "experts": experts, "seconds": time.perf_counter() - t0})
    dist.barrier()


def _run_arm(spec: ComponentSpec, hspec: Any, arm: ComponentArm, p0: dict[str, Any], grads: dict[str, list[Any]],
             coeffs: list[float], explicit: dict[int, dict[str, Any]], out: _Out) -> None:
    import torch
    from megatron.core.optimizer import get_megatron_optimizer

    t0 = time.perf_counter()
    cfg, ddp = _build_ddp(hspec, spec.seed)
    named = _named(ddp)
    init_same = all(torch.equal(p.detach(), p0[n].to(p.device)) for n, p in named)
    ocfg = _optimizer_config(arm, spec.hyper)
    opt = get_megatron_optimizer(ocfg, [ddp])
    _apply_schedule(opt, spec.hyper)
    if arm.mutation == "bf16_masters":
        for d in _dist_opts(opt):
            inner = _inner_te(d)
            if inner is None:
                raise RuntimeError("bf16_masters needs TE FusedAdam")
            inner.master_weights = False
    build_s = time.perf_counter() - t0
    hyper = spec.hyper
    for k in range(1, max(spec.steps) + 1):
        ddp.zero_grad_buffer()
        for n, p in named:
            p.main_grad.copy_(grads[n][k - 1].reshape(p.main_grad.shape), non_blocking=True)
        torch.cuda.synchronize()
        ts = time.perf_counter()
        ok, gnorm, _ = opt.step()
        torch.cuda.synchronize()
        step_s = time.perf_counter() - ts
        if arm.mutation == "zero_remainders":
            for d in _dist_opts(opt):
                inner = _inner_te(d)
                for st in (inner.state.values() if inner is not None else []):
                    mp = st.get("master_param")
                    if mp is not None and mp.dtype == torch.int16:
                        mp.zero_()
        if k not in spec.steps:
            continue
        worst, worst_name, per = -1.0, "", {}
        mism = elems = 0
        bf16_mism = 0
        for n, p in named:
            _, group, _ = _locate(opt, p)
            master = _master(opt, p, arm)
            upd = master.double() - p0[n].to("cuda").double().reshape(-1)
            ref = _reference_update(p0[n], grads[n], k, hyper, float(group["weight_decay"]), coeffs)
            den = float(ref.norm())
            num = float((upd - ref).norm())
            rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
            per[n] = rel
            if not rel <= worst:
                worst, worst_name = rel, n
            if arm.kind == "bitwise":
                explicit.setdefault(k, {})[n] = master.clone()
            if arm.bitwise_with and k in explicit and n in explicit[k]:
                e = explicit[k][n]
                mism += int((master.view(torch.int32) != e.view(torch.int32)).sum())
                elems += master.numel()
            if arm.name == "gpu":
                bf16_mism += int((p.detach().reshape(-1) != master.to(torch.bfloat16)).sum())
            del master, upd, ref
        top = sorted(per.items(), key=lambda kv: -kv[1] if kv[1] == kv[1] else 0)[:5]
        out.write({"event": "arm", "arm": arm.name, "kind": arm.kind, "step": k, "worst_rel_l2": worst,
                   "worst_tensor": worst_name, "top_tensors": top, "tensors": len(per), "init_identical": init_same,
                   "update_successful": bool(ok), "grad_norm_reported": float(gnorm) if gnorm is not None else None,
                   "step_s": step_s, "build_s": build_s,
                   "optimizer": {
                       "precision_aware": arm.precision_aware, "store_param_remainders": ocfg.store_param_remainders,
                       "exp_avg_dtype": str(ocfg.exp_avg_dtype), "exp_avg_sq_dtype": str(ocfg.exp_avg_sq_dtype),
                       "offload_fraction": arm.offload_fraction if arm.offload_fraction > 0 else 0.0,
                       "overlap_cpu_optimizer_d2h_h2d": ocfg.overlap_cpu_optimizer_d2h_h2d, "adam_eps": ocfg.adam_eps,
                       "adam_beta1": ocfg.adam_beta1, "adam_beta2": ocfg.adam_beta2, "mutation": arm.mutation,
                       "inner": sorted({type(d.optimizer).__name__ for d in _dist_opts(opt)})},
                   **({"bf16_weight_not_rounded_master": bf16_mism} if arm.name == "gpu" else {})})
        if arm.bitwise_with:
            out.write({"event": "bitwise", "arm": arm.name, "against": arm.bitwise_with, "step": k,
                       "identical": elems > 0 and mism == 0, "mismatched": mism, "elements": elems})
    del opt, ddp, cfg, named


def main(argv: list[str] | None = None) -> int:
    """Run the component test; exit status in the module docstring."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 4 or args[0] != "--spec" or args[2] != "--out":
            raise TunerError("usage: python -m launch.harness.component --spec SPEC.json --out OUT.jsonl")
        spec = ComponentSpec.from_json(Path(args[1]).read_text())
    except (TunerError, OSError) as e:
        print(f"component: {e}", file=sys.stderr)
        return 2
    out = _Out(args[3])
    from launch.harness.spec import HarnessEnv

    if not HarnessEnv.detect().transformer_engine:
        out.write({"event": "refused",
                   "reasons": ["the component test needs Transformer Engine (precision-aware Adam is TE's FusedAdam)"]})
        print("component: refused: needs Transformer Engine", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(29400 + os.getpid() % 500)), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    torch.cuda.set_device(0)
    try:
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        _run(spec, out)
    except BaseException as e:  # noqa: BLE001
        out.write({"event": "error", "type": type(e).__name__, "message": str(e)[:2000],
                   "traceback": traceback.format_exc()[-4000:]})
        traceback.print_exc()
        return 1
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
