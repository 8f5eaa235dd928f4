"""The trial harness: a few training steps of one layout with megatron-core (synthetic tokens or byte-tokenised text).

Started by torchrun, one process per GPU::

    python -m torch.distributed.run --nproc-per-node N -m launch.harness.train --spec SPEC.json --out STEPS.jsonl

It builds the model of the spec (a :class:`ModelSpec`, often a slice of a few
layers at full width) with the spec's :class:`Layout` (``initialize_model_parallel``
with tp, pp, vpp, cp, ep, etp; ``GPTModel`` per virtual stage; ``Float16Module``;
``DistributedDataParallel``; ``get_megatron_optimizer``), runs ``steps`` optimizer
steps through ``get_forward_backward_func`` and appends JSON lines to ``--out``
(format: :mod:`launch.harness.results`).

For ``tune verify`` it can also write its initial weights as a megatron-core
distributed checkpoint (``save_checkpoint``) and load initial weights from one written
by another layout (``load_checkpoint``), train on byte-tokenised text in Megatron's
sample order (``data: corpus``, :mod:`launch.harness.data`) and inject a deliberate
bug (``fault``, :data:`launch.harness.spec.FAULTS`) for negative controls. The step's
loss is the mean over the whole global batch (every micro-batch of every DP rank).

With Transformer Engine importable it uses TE's layer spec. Without it, megatron-core's
local spec, with two modules of this file where the local ones fail
(``../shared/notes/device.md``): :class:`SDPACoreAttention` (``DotProductAttention``
materialises the s x s scores; this calls PyTorch's fused SDPA) and
:class:`HarnessRMSNorm` (``WrappedTorchNorm`` asserts without sequence parallelism;
this tags its weight ``sequence_parallel`` so megatron-core all-reduces its gradient
over the TP group). Experts are then megatron-core's ``SequentialMLP`` (no grouped GEMM).

Exit status: 0 done; 2 bad spec or refused layout (before any GPU work); 3 out of
memory; 1 any other error.
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from launch.harness.results import cv, median_after_warmup
from launch.harness.spec import HarnessEnv, HarnessSpec, fault_reasons, parse_argv, recompute_kwargs, unsupported_reasons

#: What megatron-core ran, field by field, read back from its config objects (recorded in the start and summary lines so
#: that a row can be predicted later exactly as it ran): ``transformer``, ``ddp``, ``optimizer``.
_RAN: dict[str, dict[str, Any]] = {}


def _config_fields(cfg: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """``{name: value}`` of a config dataclass, dtypes and enums as strings, missing fields left out."""
    out: dict[str, Any] = {}
    for n in names:
        if not hasattr(cfg, n):
            continue
        v = getattr(cfg, n)
        out[n] = v if isinstance(v, (bool, int, float, str, type(None))) else (list(v) if isinstance(v, (list, tuple)) else str(v))
    return out


_TRANSFORMER_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size", "num_moe_experts",
    "moe_ffn_hidden_size", "moe_router_topk", "moe_grouped_gemm", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
    "moe_permute_fusion", "moe_router_dtype", "moe_shared_expert_intermediate_size", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
    "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "sequence_parallel", "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules", "fp8", "fp8_recipe",
    "fp8_param", "fp8_amax_history_len", "fp8_amax_compute_algo", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
    "gradient_accumulation_fusion", "apply_rope_fusion", "bias_dropout_fusion", "bf16", "params_dtype",
)
_DDP_FIELDS = ("grad_reduce_in_fp32", "overlap_grad_reduce", "use_distributed_optimizer", "fp8_param_gather", "bucket_size")


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


def _host_rss() -> int | None:
    from launch.harness.hostmem import process_memory

    return process_memory().get("rss_bytes")


def _versions() -> dict[str, str]:
    import torch

    v = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "python": sys.version.split()[0]}
    try:
        from megatron.core import package_info

        v["megatron_core"] = package_info.__version__
    except Exception:  # noqa: BLE001
        v["megatron_core"] = "unknown"
    try:
        import transformer_engine

        v["transformer_engine"] = transformer_engine.__version__
    except Exception:  # noqa: BLE001
        v["transformer_engine"] = "not installed"
    try:
        v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        v["gpu"] = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        pass
    return v


def _local_modules(fault: str | None = None) -> tuple[type, type]:
    """The harness's core attention and norm for megatron-core's local spec (built lazily: they need torch).

    ``fault`` (a key of :data:`launch.harness.spec.FAULTS`) builds them broken on
    purpose, for the negative controls of ``tune verify``.
    """
    causal = fault != "non_causal_attention"
    tag_sp = fault != "sp_norm_grad_unreduced"
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):
        """Causal attention through ``torch.nn.functional.scaled_dot_product_attention`` (flash / efficient kernels).

        Inputs as megatron-core passes them to a core attention: query ``[s, b, heads, d]``,
        key and value ``[s, b, groups, d]`` (GQA: fewer heads). Output ``[s, b, heads * d]``.
        """

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str = "self", softmax_scale: float | None = None, **_: Any) -> None:
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
            s, b, h, d = query.shape
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            gqa = k.shape[1] != h
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=self.softmax_scale, enable_gqa=gqa)
            return out.permute(2, 0, 1, 3).reshape(s, b, h * d)

    class HarnessRMSNorm(torch.nn.RMSNorm):
        """``torch.nn.RMSNorm`` built the way megatron-core builds a norm, usable with sequence parallelism.

        With sequence parallelism each TP rank normalises a different slice of the
        sequence with the same weight, so the weight's gradient must be summed over
        the TP group: megatron-core's ``finalize_model_grads`` does that for parameters
        tagged ``sequence_parallel``.
        """

        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
            super().__init__(normalized_shape=hidden_size, eps=eps, dtype=config.params_dtype)
            self.weight.sequence_parallel = bool(config.sequence_parallel) and tag_sp

    return SDPACoreAttention, HarnessRMSNorm


def _patch_local_block(block: Any, fault: str | None = None) -> Any:
    """A copy of a local-spec block spec with the harness's attention and norms swapped in."""
    from megatron.core.transformer.identity_op import IdentityOp

    sdpa, norm = _local_modules(fault)
    block = copy.copy(block)
    layers = []
    for spec in block.layer_specs:
        spec = copy.copy(spec)
        sub = copy.copy(spec.submodules)
        sub.input_layernorm = norm
        sub.pre_mlp_layernorm = norm
        att = copy.copy(sub.self_attention)
        asub = copy.copy(att.submodules)
        asub.core_attention = sdpa
        if getattr(asub, "q_layernorm", IdentityOp) is not IdentityOp:
            asub.q_layernorm = norm
        if getattr(asub, "k_layernorm", IdentityOp) is not IdentityOp:
            asub.k_layernorm = norm
        att.submodules = asub
        sub.self_attention = att
        spec.submodules = sub
        layers.append(spec)
    block.layer_specs = layers
    block.layer_norm = norm
    return block


def _gpt_oss_kwargs(m: dict[str, Any]) -> dict[str, Any]:
    """GPT-OSS's layer details as megatron-core takes them (Megatron-Bridge ``gpt_oss_bridge.py`` and Megatron-LM's
    ``examples/post_training/modelopt/conf/openai/gpt-oss-120b.sh``): the clamped
    quick-GELU GLU (fused with its bias, ``bias_activation_fusion``), attention sinks (``softmax_type``), the sliding
    window ``(window - 1, 0)`` on the layers ``window_attn_skip_freq`` marks (megatron-core's list: 1 = sliding window,
    the opposite of :class:`specs.ModelSpec`'s). Empty for every other model."""
    kw: dict[str, Any] = {}
    if m.get("activation_func", "silu") == "quick_gelu":
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw.update(activation_func=quick_gelu, glu_linear_offset=float(m.get("glu_linear_offset") or 0.0), bias_activation_fusion=True)
        if m.get("activation_func_clamp_value"):
            kw["activation_func_clamp_value"] = float(m["activation_func_clamp_value"])
    if m.get("softmax_type", "vanilla") != "vanilla":
        kw["softmax_type"] = m["softmax_type"]
    if m.get("window_size"):
        kw["window_size"] = (int(m["window_size"]) - 1, 0)
        skip = list(m.get("window_attn_skip_freq") or ())
        kw["window_attn_skip_freq"] = [1 - int(x) for x in skip] if skip else None
    return kw



def _has_wgrad_fusion_kernel() -> bool:
    """Whether megatron-core's ``gradient_accumulation_fusion`` can run: its non-TE linears (the output layer's
    ``ColumnParallelLinear``) need apex's ``fused_weight_gradient_mlp_cuda`` extension (megatron/core/tensor_parallel/
    layers.py raises without it); NVIDIA's containers have it, a pip install of TE does not."""
    import importlib.util

    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None

def _transformer_config(spec: HarnessSpec) -> Any:
    """The ``TransformerConfig`` (``MLATransformerConfig`` for a model with low-rank attention) of the spec."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    m, lay, te = spec.model, spec.layout, spec.use_transformer_engine
    moe = m["num_experts"] > 0
    mla = bool(m.get("q_lora_rank") or m.get("kv_lora_rank"))
    kw: dict[str, Any] = dict(
        num_layers=m["num_layers"],
        hidden_size=m["hidden_size"],
        num_attention_heads=m["num_attention_heads"],
        num_query_groups=m["num_query_groups"],
        kv_channels=m["kv_channels"],
        ffn_hidden_size=m["ffn_hidden_size"] or m["moe_ffn_hidden_size"],
        normalization="RMSNorm",
        layernorm_epsilon=m["norm_epsilon"],
        gated_linear_unit=m["gated_linear_unit"],
        activation_func=F.silu,
        add_bias_linear=bool(m.get("add_bias_linear", False)),
        add_qkv_bias=bool(m.get("add_qkv_bias", False)),
        qk_layernorm=m["qk_layernorm"],
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=lay["tp"],
        pipeline_model_parallel_size=lay["pp"],
        virtual_pipeline_model_parallel_size=lay["vpp"] if lay["vpp"] > 1 else None,
        context_parallel_size=lay["cp"],
        expert_model_parallel_size=lay["ep"],
        expert_tensor_parallel_size=lay["etp"],
        sequence_parallel=bool(lay["sequence_parallel"]) and lay["tp"] > 1,
        # HarnessSpec.megatron_fusions: Megatron-LM's defaults (TE only); masked_softmax_fusion stays off (TE's fused
        # attention does not use it)
        gradient_accumulation_fusion=bool(spec.megatron_fusions) and te and _has_wgrad_fusion_kernel(),
        bias_dropout_fusion=bool(spec.megatron_fusions) and te,
        masked_softmax_fusion=False,
        apply_rope_fusion=bool(spec.megatron_fusions) and te,
        cross_entropy_loss_fusion=bool(spec.cross_entropy_fusion),
        **recompute_kwargs(lay),
    )
    if spec.cross_entropy_fusion:
        kw["cross_entropy_fusion_impl"] = "te"
    kw.update(_gpt_oss_kwargs(m))
    if spec.fp8_recipe is not None:
        # Megatron-Bridge's fp8 mixed-precision presets: hybrid format (e4m3 forward, e5m2 backward); delayed
        # scaling with a 1024-step amax history and max (bf16_with_fp8_delayed_scaling_mixed)
        kw.update(fp8="hybrid", fp8_recipe=spec.fp8_recipe, fp8_param=bool(spec.fp8_param_gather))
        if spec.fp8_recipe == "delayed":
            kw.update(fp8_amax_history_len=1024, fp8_amax_compute_algo="max")
    if mla:
        kw.pop("kv_channels", None)
        kw.update(
            q_lora_rank=m["q_lora_rank"] or None,
            kv_lora_rank=m["kv_lora_rank"],
            qk_head_dim=m["qk_head_dim"],
            qk_pos_emb_head_dim=m["qk_pos_emb_head_dim"],
            v_head_dim=m["v_head_dim"],
            rope_type="yarn" if m.get("rope_scaling_type") == "yarn" else "rope",
            rotary_base=float(m["rotary_base"]),
            rotary_scaling_factor=float(m.get("rope_scaling_factor") or 1.0),
            mscale=float(m.get("rope_scaling_mscale") or 1.0),
            mscale_all_dim=float(m.get("rope_scaling_mscale_all_dim") or 0.0),
        )
    if lay["num_layers_in_first_pipeline_stage"]:
        kw["num_layers_in_first_pipeline_stage"] = lay["num_layers_in_first_pipeline_stage"]
    if lay["num_layers_in_last_pipeline_stage"]:
        kw["num_layers_in_last_pipeline_stage"] = lay["num_layers_in_last_pipeline_stage"]
    if moe:
        from specs.layout import Dispatcher

        disp = Dispatcher(lay["dispatcher"])
        kw.update(
            num_moe_experts=m["num_experts"],
            moe_ffn_hidden_size=m["moe_ffn_hidden_size"],
            moe_router_topk=m["moe_router_topk"],
            moe_layer_freq=list(m["moe_layer_freq"]),
            moe_grouped_gemm=te,
            moe_token_dispatcher_type=disp.moe_token_dispatcher_type,
            moe_router_score_function=m["moe_router_score_function"],
            moe_router_enable_expert_bias=m["moe_router_enable_expert_bias"],
            moe_router_load_balancing_type="none",
            moe_aux_loss_coeff=0.0,
            moe_router_dtype="fp32",
            moe_permute_fusion=bool(spec.moe_permute_fusion),
        )
        if disp.moe_flex_dispatcher_backend:
            kw["moe_flex_dispatcher_backend"] = disp.moe_flex_dispatcher_backend
        if m["moe_shared_expert_intermediate_size"]:
            kw["moe_shared_expert_intermediate_size"] = m["moe_shared_expert_intermediate_size"]
        if m["moe_router_topk_scaling_factor"]:
            kw["moe_router_topk_scaling_factor"] = m["moe_router_topk_scaling_factor"]
        if m["moe_router_num_groups"]:
            kw["moe_router_num_groups"] = m["moe_router_num_groups"]
            kw["moe_router_group_topk"] = m["moe_router_group_topk"]
    return (MLATransformerConfig if mla else TransformerConfig)(**kw)


def _patch_te_block(block: Any, fault: str | None) -> Any:
    """The TE block spec with the faults that act on the spec: ``non_causal_attention`` builds self-attention with
    ``AttnMaskType.no_mask`` (TE's attention then sees every token)."""
    if fault != "non_causal_attention":
        return block
    from megatron.core.transformer.enums import AttnMaskType

    block = copy.copy(block)
    layers = []
    for spec in block.layer_specs:
        spec = copy.copy(spec)
        sub = copy.copy(spec.submodules)
        att = copy.copy(sub.self_attention)
        att.params = {**(att.params or {}), "attn_mask_type": AttnMaskType.no_mask}
        sub.self_attention = att
        spec.submodules = sub
        layers.append(spec)
    block.layer_specs = layers
    return block


def _apply_te_param_faults(spec: HarnessSpec, models: list[Any]) -> list[str]:
    """``sp_norm_grad_unreduced`` under TE: TE tags its norm weights ``sequence_parallel`` itself; the fault clears the tag
    on every norm weight except the q/k norms (which megatron-core sums over TP by name), so
    ``finalize_model_grads`` leaves their gradients unreduced. Returns the parameters changed."""
    if spec.fault != "sp_norm_grad_unreduced" or not spec.use_transformer_engine:
        return []
    changed = []
    for mdl in models:
        for name, p in mdl.named_parameters():
            norm = ("layernorm" in name or "layer_norm" in name) and "q_layernorm" not in name and "k_layernorm" not in name
            if norm and getattr(p, "sequence_parallel", False):
                p.sequence_parallel = False
                changed.append(name)
    return changed


def _build_chunks(spec: HarnessSpec, cfg: Any) -> list[Any]:
    """The model chunks of this rank (``Float16Module(GPTModel)`` per virtual stage, on the GPU), before DDP."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.module import Float16Module

    m, lay, te = spec.model, spec.layout, spec.use_transformer_engine
    vpp = lay["vpp"]
    chunks = []
    for i in range(vpp):
        vp = i if vpp > 1 else None
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=te, normalization="RMSNorm", vp_stage=vp)
        block = _patch_te_block(block, spec.fault) if te else _patch_local_block(block, spec.fault)
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=block,
            vocab_size=m["vocab_size"],
            max_sequence_length=spec.seq_length,
            pre_process=pre,
            post_process=post,
            share_embeddings_and_output_weights=not m["untie_embeddings_and_output_weights"],
            position_embedding_type="rope",
            rotary_percent=m["rotary_percent"],
            rotary_base=int(m["rotary_base"]),
            vp_stage=vp,
        )
        model.cuda(torch.cuda.current_device())
        chunks.append(Float16Module(cfg, model))
    return chunks


def _build(spec: HarnessSpec, cfg: Any) -> tuple[list[Any], Any]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    lay = spec.layout
    chunks = _build_chunks(spec, cfg)
    if spec.save_checkpoint and not spec.pretrain_steps:
        _save_weights([c.module for c in chunks], spec.save_checkpoint, spec.model)
    if spec.load_checkpoint and not spec.pretrain_steps:
        _load_weights([c.module for c in chunks], spec.load_checkpoint)
        _apply_load_fault(spec, [c.module for c in chunks])
    _apply_te_param_faults(spec, [c.module for c in chunks])
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=bool(spec.grad_reduce_in_fp32),
        overlap_grad_reduce=True,
        use_distributed_optimizer=bool(lay["use_distributed_optimizer"]),
        fp8_param_gather=bool(spec.fp8_param_gather),
    )
    chunks = [DistributedDataParallel(cfg, ddp_cfg, c, disable_bucketing=i > 0) for i, c in enumerate(chunks)]
    _RAN["transformer"] = _config_fields(cfg, _TRANSFORMER_FIELDS)
    _RAN["ddp"] = _config_fields(ddp_cfg, _DDP_FIELDS)
    _RAN.setdefault("host_memory", {})["after_model_bytes"] = _host_rss()
    opt = _optimizer(spec, cfg, chunks)
    _RAN["host_memory"]["after_optimizer_bytes"] = _host_rss()
    return chunks, opt


def _optimizer(spec: HarnessSpec, cfg: Any, chunks: list[Any]) -> Any:
    """A fresh megatron-core optimizer over ``chunks`` (main fp32 params copied from the model's current weights)."""
    import torch
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    lay, te = spec.layout, spec.use_transformer_engine
    frac = float(lay["optimizer_offload_fraction"])
    pa = bool(lay["use_precision_aware_optimizer"]) and bool(lay["use_distributed_optimizer"]) and (te or frac > 0)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}
    ocfg = OptimizerConfig(
        optimizer="adam",
        lr=float(spec.lr),
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        clip_grad=1.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=bool(lay["use_distributed_optimizer"]),
        use_precision_aware_optimizer=pa,
        exp_avg_dtype=dt[lay["exp_avg_dtype"]] if pa else torch.float32,
        exp_avg_sq_dtype=dt[lay["exp_avg_sq_dtype"]] if pa else torch.float32,
        optimizer_cpu_offload=frac > 0,
        optimizer_offload_fraction=frac if frac > 0 else 1.0,
        overlap_cpu_optimizer_d2h_h2d=bool(lay["overlap_cpu_optimizer_d2h_h2d"]) and frac > 0,
        fp8_recipe=spec.fp8_recipe,
    )
    opt = get_megatron_optimizer(ocfg, chunks)
    if spec.fault == "norm_grad_scaled":
        from launch.harness.grads import scale_norm_grad

        def finalize_with_fault(*args: Any, **kwargs: Any) -> Any:
            r = finalize_model_grads(*args, **kwargs)
            _RAN.setdefault("fault", {})["scaled"] = scale_norm_grad(chunks, 2.0)
            return r
    _RAN["optimizer"] = _config_fields(ocfg, ("optimizer", "lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad", "bf16",
                                              "use_distributed_optimizer", "use_precision_aware_optimizer", "store_param_remainders",
                                              "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                                              "optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
                                              "pin_cpu_grads", "pin_cpu_params", "fp8_recipe"))
    cfg.grad_scale_func = opt.scale_loss
    cfg.finalize_model_grads_func = finalize_with_fault if spec.fault == "norm_grad_scaled" else finalize_model_grads
    cfg.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    cfg.grad_sync_func = [c.start_grad_sync for c in chunks] if len(chunks) > 1 else chunks[0].start_grad_sync
    return opt


def _gpt(chunk: Any) -> Any:
    """The GPTModel inside DDP(Float16Module(GPTModel))."""
    return chunk.module.module


def _apply_load_fault(spec: HarnessSpec, models: list[Any]) -> None:
    """The ``embedding_shard_misplaced`` fault: after loading, each TP rank holds the next TP rank's vocabulary shard."""
    if spec.fault != "embedding_shard_misplaced":
        return
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    r = parallel_state.get_tensor_model_parallel_rank()
    for m in models:
        emb = getattr(m, "embedding", None)
        if emb is None:
            continue
        w = emb.word_embeddings.weight
        parts = [torch.empty_like(w) for _ in range(tp)]
        dist.all_gather(parts, w.data.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        with torch.no_grad():
            w.copy_(parts[(r + 1) % tp])


def _sharded_weights(models: list[Any]) -> dict[str, Any]:
    """One sharded state dict for the model chunks of this rank (global keys: layer numbers, experts and
    vocabulary shards are placed by megatron-core, so any TP/PP/VPP/EP can read what another wrote)."""
    return {f"model{i}": m.sharded_state_dict() for i, m in enumerate(models)}


def _save_weights(models: list[Any], path: str, model_dict: dict[str, Any] | None = None) -> None:
    """Write the weights as a megatron-core distributed checkpoint at ``path``, and beside them ``model.json`` (the model
    and its fingerprint, :func:`tuner.numerics.model_fingerprint`) so that a check can refuse a checkpoint of another model
    before spending GPU time on it."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        Path(path).mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_weights(models), path)
    if dist.get_rank() == 0 and model_dict is not None:
        from launch.harness.gather import model_fingerprint

        (Path(path) / "model.json").write_text(json.dumps({"model": model_dict, "fingerprint": model_fingerprint(model_dict)}, indent=1, default=str))
    dist.barrier()


def _load_weights(models: list[Any], path: str) -> None:
    """Load the weights of the distributed checkpoint at ``path`` into this rank's model chunks.

    Raises:
        RuntimeError: the checkpoint lacks a weight this model has (other model, other slice).
    """
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load(_sharded_weights(models), path)
    for i, m in enumerate(models):
        res = m.load_state_dict(loaded[f"model{i}"], strict=False)
        missing = [k for k in res.missing_keys if not k.endswith("_extra_state")]
        if missing:
            raise RuntimeError(f"checkpoint {path} lacks {len(missing)} weights of this model, e.g. {missing[:3]}")


def _batches(spec: HarnessSpec, corpus: Any = None, first_step: int = 0) -> Any:
    """An endless iterator of micro-batches for this rank.

    ``synthetic``: one random micro-batch, repeated (the same on every rank, so TP ranks agree).
    ``corpus``: byte-tokenised text, micro-batch after micro-batch in Megatron's sample order
    for this rank's data-parallel index (:mod:`launch.harness.data`), so every layout trains
    on the same rows in each optimizer step.
    """
    import torch
    from megatron.core import parallel_state

    b, s, v = spec.layout["micro_batch_size"], spec.seq_length, spec.model["vocab_size"]
    pos = torch.arange(s, device="cuda").unsqueeze(0).expand(b, s).contiguous()
    mask = torch.ones(b, s, device="cuda", dtype=torch.float32)

    def finish(tokens: Any) -> dict[str, Any]:
        batch = {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous(), "loss_mask": mask, "position_ids": pos}
        if parallel_state.get_context_parallel_world_size() > 1:
            from megatron.core.utils import get_batch_on_this_cp_rank

            batch = get_batch_on_this_cp_rank(batch)
        return batch

    if spec.data == "synthetic":
        g = torch.Generator(device="cuda").manual_seed(spec.seed)
        batch = finish(torch.randint(0, v, (b, s + 1), device="cuda", generator=g))
        while True:
            yield batch
    from launch.harness.data import sample_index, sample_tokens

    dp = parallel_state.get_data_parallel_world_size()
    r = parallel_state.get_data_parallel_rank()
    m = spec.global_batch_size // (b * dp)
    step = first_step
    while True:
        for i in range(m):
            rows = [sample_tokens(corpus, sample_index(step, i, r, j, micro_batch_size=b, dp=dp, global_batch_size=spec.global_batch_size), s) for j in range(b)]
            yield finish(torch.tensor(rows, dtype=torch.long, device="cuda"))
        step += 1


def _global_loss(losses: Any, last: bool) -> float:
    """The step's loss: mean over every micro-batch of every data-parallel rank (the global batch),
    from one tensor-parallel rank of each last-stage group (TP ranks agree). A collective: every rank calls it."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    t = torch.zeros(2, device="cuda", dtype=torch.float64)
    if last and losses and parallel_state.get_tensor_model_parallel_rank() == 0:
        t[0] = torch.stack([x["lm loss"].double() for x in losses]).sum()
        t[1] = len(losses)
    dist.all_reduce(t)
    return float((t[0] / t[1].clamp(min=1)).item())


def _loss_func(loss_mask: Any, output: Any) -> Any:
    loss = (output.float() * loss_mask).sum() / loss_mask.sum()
    # a copy: megatron-core divides the returned loss by the number of micro-batches in place
    return loss, {"lm loss": loss.detach().clone()}


def _forward_step(data_iterator: Any, model: Any) -> Any:
    batch = next(data_iterator)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, partial(_loss_func, batch["loss_mask"])


def _run_options(spec: HarnessSpec) -> dict[str, Any]:
    """What megatron-core ran (config fields read back from its objects) and the harness options of the spec."""
    return {
        **{k: v for k, v in _RAN.items() if k in ("transformer", "ddp", "optimizer")},
        "harness": {"fp8_recipe": spec.fp8_recipe, "fp8_param_gather": spec.fp8_param_gather, "grad_reduce_in_fp32": spec.grad_reduce_in_fp32,
                    "cross_entropy_fusion": spec.cross_entropy_fusion, "moe_permute_fusion": spec.moe_permute_fusion,
                    "megatron_fusions": spec.megatron_fusions,
                    "use_transformer_engine": spec.use_transformer_engine, "seq_length": spec.seq_length, "global_batch_size": spec.global_batch_size},
    }


def _host_summary(spec: HarnessSpec, chunks: list[Any]) -> dict[str, Any]:
    """This rank's host memory: RSS after the model, after the optimizer, after step 1, the peak; the machine's; and,
    with CPU optimizer offload, the bytes megatron-core's offload should hold (:func:`launch.harness.hostmem.offload_host_bytes`)."""
    from launch.harness.hostmem import offload_host_bytes, process_memory, system_memory

    d: dict[str, Any] = dict(_RAN.get("host_memory", {}))
    d.update(process_memory())
    d["system"] = system_memory()
    frac = float(spec.layout["optimizer_offload_fraction"])
    if frac > 0:
        n = sum(p.numel() for c in chunks for p in c.parameters() if p.requires_grad)
        pa = bool((_RAN.get("optimizer") or {}).get("use_precision_aware_optimizer"))
        d["offload"] = {"fraction": frac, "rank_params": n, "predicted_bytes": offload_host_bytes(math.ceil(frac * n), precision_aware=pa),
                        "precision_aware": pa}
    return d


def _dump_grads(spec: HarnessSpec, chunks: list[Any], cfg: Any, losses: Any, last: bool) -> dict[str, Any]:
    """Gradient parity: write every parameter's full gradient of this step (see :mod:`launch.harness.grads`)."""
    import os as _os

    from launch.harness.gather import GRAD_DUMP_FORMAT, model_fingerprint
    from launch.harness.grads import dump_gradients

    lay = spec.layout_obj()
    meta = {
        "format": GRAD_DUMP_FORMAT,
        "label": spec.label or lay.label,
        "layout_label": lay.label,
        "layout": spec.layout,
        "model": spec.model.get("name"),
        "model_fingerprint": model_fingerprint(spec.model),
        "checkpoint": _os.path.realpath(spec.load_checkpoint) if spec.load_checkpoint else None,
        "batch": {"data": spec.data, "data_step_offset": spec.data_step_offset, "global_batch_size": spec.global_batch_size,
                  "seq_length": spec.seq_length, "corpus_sha256": spec.corpus_sha256, "seed": spec.seed if spec.data == "synthetic" else None},
        "fault": spec.fault,
        "precision": spec.precision,
        "loss": _global_loss(losses, last),
        "versions": _versions(),
        "run_options": _run_options(spec),
    }
    return dump_gradients(chunks, spec.dump_grads, meta, gated_linear_unit=bool(spec.model.get("gated_linear_unit", True)),
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
            name = f"{o.device.type}/{str(o.dtype).removeprefix('torch.')}" + ("/pinned" if o.device.type == "cpu" and o.is_pinned() else "")
            out[name] = out.get(name, 0) + st.nbytes()
        except Exception:  # noqa: BLE001 - a tensor subclass that cannot say its storage is skipped
            continue
    return dict(sorted(out.items()))


def _memory_phase(spec: HarnessSpec, out: _Out, rank: int, phase: str, *, tensors: bool = False) -> None:
    """One ``event: memory_phase`` line (``memory_phases``): allocated / reserved / peak bytes, host RSS, optionally the live tensors."""
    if not spec.memory_phases:
        return
    import torch

    torch.cuda.synchronize()
    row: dict[str, Any] = {"event": "memory_phase", "rank": rank, "phase": phase, "allocated_bytes": torch.cuda.memory_allocated(),
                           "reserved_bytes": torch.cuda.memory_reserved(), "max_allocated_bytes": torch.cuda.max_memory_allocated(),
                           "host_rss_bytes": _host_rss()}
    if tensors:
        row["live_tensors_bytes"] = _live_tensors()
    if rank == 0:
        out.write(row)


def _forward_only(spec: HarnessSpec, chunks: list[Any], iters: list[Any], out: _Out, rank: int) -> None:
    """``forward_only_steps`` forward-only passes over a step's micro-batches, timed; an ``event: forward_only`` line."""
    import torch
    import torch.distributed as dist
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fb = get_forward_backward_func()
    lay = spec.layout
    times: list[float] = []
    for _ in range(spec.forward_only_steps):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        with torch.no_grad():  # the losses would keep every micro-batch's graph alive; training mode stays (router, dropout)
            fb(forward_step_func=_forward_step, data_iterator=iters if len(iters) > 1 else iters[0], model=chunks if len(chunks) > 1 else chunks[0],
               num_microbatches=spec.num_microbatches, seq_length=spec.seq_length, micro_batch_size=lay["micro_batch_size"],
               decoder_seq_length=spec.seq_length, forward_only=True)
        torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    warm = min(1, len(times) - 1)
    if rank == 0:
        out.write({"event": "forward_only", "steps": len(times), "step_times_s": times,
                   "median_step_time_s": statistics.median(times[warm:]) if times else None})


def _census(spec: HarnessSpec, chunks: list[Any], out: _Out, rank: int) -> None:
    """One more forward and backward of one micro-batch with :class:`launch.harness.grads.SavedTensorCensus` on the first
    layer's attention and MLP / MoE blocks (and the MoE layer's experts and router); one ``event: census`` line per module."""
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
        get_forward_backward_func()(forward_step_func=_forward_step, data_iterator=it if len(it) > 1 else it[0],
                                    model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=1, seq_length=spec.seq_length,
                                    micro_batch_size=spec.layout["micro_batch_size"], decoder_seq_length=spec.seq_length, forward_only=False)
    for c in chunks:
        c.zero_grad_buffer()
    if rank != 0:
        return
    m = spec.model
    tp = spec.layout["tp"]
    sp = bool(spec.layout["sequence_parallel"]) and tp > 1
    tokens = spec.layout["micro_batch_size"] * spec.seq_length // (spec.layout["cp"] * (tp if sp else 1))
    for r in census.report():
        out.write({"event": "census", "label": spec.label, "layout": spec.layout, "tokens": tokens, "hidden_size": m["hidden_size"],
                   "moe_ffn_hidden_size": m.get("moe_ffn_hidden_size"), "moe_router_topk": m.get("moe_router_topk"),
                   "precision": spec.precision, "fp8_recipe": spec.fp8_recipe,
                   "recompute": {k: spec.layout.get(k) for k in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")},
                   "tp_rank_only": parallel_state.get_tensor_model_parallel_rank() == 0, **r})


def _corpus_for(spec: HarnessSpec) -> Any:
    from launch.harness.data import load_corpus

    return load_corpus(spec.corpus_path)


def _profiles_here() -> bool:
    """This rank writes a profile: the first rank of its tensor-, context- and data-parallel groups (one per pipeline stage)."""
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0


def _profiler(spec: HarnessSpec, step: int) -> Any:
    """A ``torch.profiler.profile`` (CPU and CUDA activities, shapes off) for the step ``spec.profile_step`` on a rank that
    writes its trace (:func:`_profiles_here`), else None."""
    if step != spec.profile_step or not _profiles_here():
        return None
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    return torch.profiler.profile(activities=acts, record_shapes=False, with_stack=False)


def profile_file_name(step: int, pp_rank: int) -> str:
    """``profile_step<N>_pp<r>.json``: the trace of step ``step`` on pipeline rank ``pp_rank`` (what ``tune timeline`` looks for)."""
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


def _run(spec: HarnessSpec, out: _Out, rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    lay = spec.layout
    t_build = time.perf_counter()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=lay["tp"],
        pipeline_model_parallel_size=lay["pp"],
        virtual_pipeline_model_parallel_size=lay["vpp"] if lay["vpp"] > 1 else None,
        context_parallel_size=lay["cp"],
        expert_model_parallel_size=lay["ep"],
        expert_tensor_parallel_size=lay["etp"],
    )
    import random

    import numpy as np

    random.seed(spec.seed)
    np.random.seed(spec.seed)
    torch.manual_seed(spec.seed)  # CPU-side initialisation too, so one seed gives one set of weights
    model_parallel_cuda_manual_seed(spec.seed)
    cfg = _transformer_config(spec)
    chunks, opt = _build(spec, cfg)
    build_s = time.perf_counter() - t_build
    _memory_phase(spec, out, rank, "after_build", tensors=True)
    if spec.gc_after_build:
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        _memory_phase(spec, out, rank, "after_gc_collect", tensors=True)
    if rank == 0:
        out.write({"event": "start", "world_size": world, "layout": lay, "versions": _versions(), "notes": list(spec.notes), "build_s": build_s,
                   "data": spec.data, "lr": spec.lr, "fault": spec.fault, "loaded_checkpoint": spec.load_checkpoint, "saved_checkpoint": spec.save_checkpoint,
                   "label": spec.label, "precision": spec.precision, "run_options": _run_options(spec)})
    corpus = None
    if spec.data == "corpus":
        from launch.harness.data import load_corpus

        corpus = load_corpus(spec.corpus_path)
        if spec.corpus_sha256 and corpus.sha256 != spec.corpus_sha256:
            raise RuntimeError(f"corpus {corpus.source} has SHA-256 {corpus.sha256[:16]}..., expected {spec.corpus_sha256[:16]}...")
    if rank == 0 and corpus is not None:
        out.write({"event": "data", "corpus": corpus.source, "corpus_bytes": len(corpus), "corpus_sha256": corpus.sha256, "tokenizer": "bytes"})
    fb = get_forward_backward_func()
    m = spec.num_microbatches
    tokens_per_step = spec.global_batch_size * spec.seq_length
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)

    def set_lr(k: int) -> None:
        """Linear warm-up over ``lr_warmup_steps`` (k counts from 1), then constant; each group's weight decay as
        megatron's ``OptimizerParamScheduler`` sets it (``0.1 x wd_mult``: biases and 1-D weights undecayed)."""
        w = spec.lr_warmup_steps
        lr = spec.lr * (min(1.0, k / w) if w > 0 else 1.0)
        for g in opt.param_groups:
            g["lr"] = lr * float(g.get("lr_mult", 1.0))
            g["weight_decay"] = 0.1 * float(g.get("wd_mult", 1.0))

    if spec.pretrain_steps:
        # Warm start: train the seed's weights a little (data steps 0 .. pretrain-1), write them as the
        # check's starting checkpoint, load them back, and start the measured steps with a fresh optimizer.
        it0 = [_batches(spec, corpus, 0) for _ in chunks]
        for k in range(1, spec.pretrain_steps + 1):
            for c in chunks:
                c.zero_grad_buffer()
            opt.zero_grad()
            set_lr(k)
            pl = fb(forward_step_func=_forward_step, data_iterator=it0 if len(it0) > 1 else it0[0], model=chunks if len(chunks) > 1 else chunks[0],
                    num_microbatches=m, seq_length=spec.seq_length, micro_batch_size=lay["micro_batch_size"], decoder_seq_length=spec.seq_length, forward_only=False)
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
        opt = _optimizer(spec, cfg, chunks)
    iters = [_batches(spec, corpus, spec.data_step_offset) for _ in chunks]
    times: list[float] = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(1, spec.steps + 1):
        prof = _profiler(spec, step)
        torch.cuda.synchronize()
        dist.barrier()
        if prof is not None:
            prof.start()
        t0 = time.perf_counter()
        for c in chunks:
            c.zero_grad_buffer()
        opt.zero_grad()
        set_lr(step)
        losses = fb(
            forward_step_func=_forward_step,
            data_iterator=iters if len(iters) > 1 else iters[0],
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=m,
            seq_length=spec.seq_length,
            micro_batch_size=lay["micro_batch_size"],
            decoder_seq_length=spec.seq_length,
            forward_only=False,
        )
        if step == 1 and spec.dump_grads:
            torch.cuda.synchronize()
            t_dump = time.perf_counter()
            idx = _dump_grads(spec, chunks, cfg, losses, last)
            t0 += time.perf_counter() - t_dump  # the dump is not part of the step's time
            if rank == 0:
                out.write({"event": "grads", "dir": spec.dump_grads, "tensors": len(idx.get("tensors", {})), "seconds": idx.get("seconds"),
                           "replicas_max_abs_diff": max(idx.get("replicas", {}).values(), default=0.0), "fault": _RAN.get("fault")})
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
            out.write({
                "event": "step",
                "step": step,
                "step_time_s": dt,
                "tokens_per_s_per_gpu": tokens_per_step / dt / world,
                "loss": loss_v,
                "grad_norm": float(grad_norm) if grad_norm is not None else None,
                "update_successful": bool(ok),
                **({"profiled": True} if step == spec.profile_step else {}),
            })
    mem = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), _host_summary(spec, chunks)]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mem)
    if rank == 0:
        med = median_after_warmup(times, spec.warmup_steps)
        out.write({
            "event": "summary",
            "steps": len(times),
            "warmup_steps": spec.warmup_steps,
            "median_step_time_s": med,
            "step_time_cv": cv(times[spec.warmup_steps:]),
            "tokens_per_s_per_gpu": tokens_per_step / med / world if med and math.isfinite(med) else None,
            "peak_allocated_bytes": [g[0] for g in gathered],
            "peak_reserved_bytes": [g[1] for g in gathered],
            "build_s": build_s,
            "layout": lay,
            "versions": _versions(),
            "notes": list(spec.notes),
            "num_microbatches": m,
            "label": spec.label,
            "precision": spec.precision,
            "run_options": _run_options(spec),
            "host_memory_per_rank": [g[2] for g in gathered],
            "peak_host_rss_bytes": max((g[2].get("peak_rss_bytes") or 0) for g in gathered),
        })
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
    reasons = unsupported_reasons(lay, spec.model_spec(), Workload(seq_length=spec.seq_length, global_batch_size=spec.global_batch_size, precision=spec.precision), env)
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
        out.write({
            "event": "oom",
            "rank": rank,
            "message": str(e).splitlines()[0][:500],
            "allocated_bytes": torch.cuda.memory_allocated(),
            "reserved_bytes": torch.cuda.memory_reserved(),
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        })
        print(f"harness rank {rank}: out of memory: {e}", file=sys.stderr, flush=True)
        os._exit(3)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a JSON line and an exit status
        out.write({"event": "error", "rank": rank, "type": type(e).__name__, "message": str(e)[:2000]})
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
