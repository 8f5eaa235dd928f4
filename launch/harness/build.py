"""The trial harness's model: megatron-core's config, layers, optimizer and checkpoints for one :class:`HarnessSpec`
(torch and megatron-core imported at call time). :data:`_RAN` records what megatron-core ran."""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from launch.harness.spec import HarnessSpec, parallel_kwargs, recompute_kwargs

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
        out[n] = v if isinstance(v, (bool, int, float, str, type(None))) else (
            list(v) if isinstance(v, (list, tuple)) else str(v))
    return out


_TRANSFORMER_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
    "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_grouped_gemm", "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend", "moe_permute_fusion", "moe_router_dtype", "moe_shared_expert_intermediate_size",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "qk_layernorm", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
    "expert_tensor_parallel_size", "sequence_parallel", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "recompute_modules", "fp8", "fp8_recipe",
    "fp8_param", "fp8_amax_history_len", "fp8_amax_compute_algo", "cross_entropy_loss_fusion",
    "cross_entropy_fusion_impl", "gradient_accumulation_fusion", "apply_rope_fusion", "bias_dropout_fusion", "bf16",
    "params_dtype",
)
_DDP_FIELDS = ("grad_reduce_in_fp32", "overlap_grad_reduce", "use_distributed_optimizer", "fp8_param_gather",
               "bucket_size")


def seed_all(seed: int) -> None:
    """Python's, NumPy's, torch's (CPU-side initialisation too, so one seed gives one set of weights) and megatron's
    CUDA RNG trackers."""
    import random

    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def _host_rss() -> int | None:
    from launch.harness.hostmem import process_memory

    return process_memory().get("rss_bytes")


def _versions() -> dict[str, str]:
    import torch

    v = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "python": sys.version.split()[0]}
    for key, module, missing in (("megatron_core", "megatron.core.package_info", "unknown"),
                                 ("transformer_engine", "transformer_engine", "not installed")):
        try:
            v[key] = importlib.import_module(module).__version__
        except Exception:  # noqa: BLE001
            v[key] = missing
    with contextlib.suppress(Exception):
        v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        v["gpu"] = torch.cuda.get_device_name()
    return v


def _local_modules(fault: str | None = None) -> tuple[type, type]:
    """The harness's core attention and norm for megatron-core's local spec; ``fault`` (a key of
    :data:`launch.harness.spec.FAULTS`) builds them broken on purpose."""
    causal = fault != "non_causal_attention"
    tag_sp = fault != "sp_norm_grad_unreduced"
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):  # type: ignore[misc]  # megatron-core is untyped
        """Causal attention through ``scaled_dot_product_attention``: query ``[s, b, heads, d]``, key and value ``[s,
        b, groups, d]``; output ``[s, b, heads * d]``."""

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str = "self",
                     softmax_scale: float | None = None, **_: Any) -> None:
            super().__init__(config=config)
            self.softmax_scale = softmax_scale

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, attn_mask_type: Any = None,
                    attention_bias: Any = None, packed_seq_params: Any = None) -> Any:
            s, b, h, d = query.shape
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            gqa = k.shape[1] != h
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=self.softmax_scale, enable_gqa=gqa)
            return out.permute(2, 0, 1, 3).reshape(s, b, h * d)

    class HarnessRMSNorm(torch.nn.RMSNorm):  # type: ignore[misc]  # torch is not installed where mypy runs
        """``torch.nn.RMSNorm`` as megatron-core builds a norm; its weight is tagged ``sequence_parallel`` so
        ``finalize_model_grads`` sums its gradient over TP."""

        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
            super().__init__(normalized_shape=hidden_size, eps=eps, dtype=config.params_dtype)
            self.weight.sequence_parallel = bool(config.sequence_parallel) and tag_sp

    return SDPACoreAttention, HarnessRMSNorm


def _patch_layers(block: Any, edit: Any) -> Any:
    """A copy of a block spec whose layers' ``submodules`` and ``self_attention`` are copies that ``edit(submodules,
    self_attention)`` changes."""
    block = copy.copy(block)
    layers = []
    for spec in block.layer_specs:
        spec = copy.copy(spec)
        spec.submodules = copy.copy(spec.submodules)
        spec.submodules.self_attention = copy.copy(spec.submodules.self_attention)
        edit(spec.submodules, spec.submodules.self_attention)
        layers.append(spec)
    block.layer_specs = layers
    return block


def _patch_local_block(block: Any, fault: str | None = None) -> Any:
    """A copy of a local-spec block spec with the harness's attention and norms swapped in."""
    from megatron.core.transformer.identity_op import IdentityOp

    sdpa, norm = _local_modules(fault)

    def edit(sub: Any, att: Any) -> None:
        sub.input_layernorm = sub.pre_mlp_layernorm = norm
        att.submodules = asub = copy.copy(att.submodules)
        asub.core_attention = sdpa
        for k in ("q_layernorm", "k_layernorm"):
            if getattr(asub, k, IdentityOp) is not IdentityOp:
                setattr(asub, k, norm)

    block = _patch_layers(block, edit)
    block.layer_norm = norm
    return block


def _gpt_oss_kwargs(m: dict[str, Any]) -> dict[str, Any]:
    """GPT-OSS's layer details as megatron-core takes them (Megatron-Bridge ``gpt_oss_bridge.py``): the clamped
    quick-GELU GLU, attention sinks, the sliding window ``(window - 1, 0)`` on the layers megatron-core's list
    marks (1 = sliding, the opposite of :class:`specs.ModelSpec`'s). Empty for other models."""
    kw: dict[str, Any] = {}
    if m.get("activation_func", "silu") == "quick_gelu":
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw.update(activation_func=quick_gelu, glu_linear_offset=float(m.get("glu_linear_offset") or 0.0),
                  bias_activation_fusion=True)
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
    """Whether ``gradient_accumulation_fusion`` can run: the non-TE output layer needs apex's
    ``fused_weight_gradient_mlp_cuda`` (megatron/core/tensor_parallel/layers.py); a pip install of TE lacks it."""
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
        num_layers=m["num_layers"], hidden_size=m["hidden_size"], num_attention_heads=m["num_attention_heads"],
        num_query_groups=m["num_query_groups"], kv_channels=m["kv_channels"],
        ffn_hidden_size=m["ffn_hidden_size"] or m["moe_ffn_hidden_size"], normalization="RMSNorm",
        layernorm_epsilon=m["norm_epsilon"], gated_linear_unit=m["gated_linear_unit"], activation_func=F.silu,
        add_bias_linear=bool(m.get("add_bias_linear", False)), add_qkv_bias=bool(m.get("add_qkv_bias", False)),
        qk_layernorm=m["qk_layernorm"], hidden_dropout=0.0, attention_dropout=0.0, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, **parallel_kwargs(lay),
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
        kw.update(q_lora_rank=m["q_lora_rank"] or None, kv_lora_rank=m["kv_lora_rank"], qk_head_dim=m["qk_head_dim"],
                  qk_pos_emb_head_dim=m["qk_pos_emb_head_dim"], v_head_dim=m["v_head_dim"],
                  rope_type="yarn" if m.get("rope_scaling_type") == "yarn" else "rope",
                  rotary_base=float(m["rotary_base"]), rotary_scaling_factor=float(m.get("rope_scaling_factor") or 1.0),
                  mscale=float(m.get("rope_scaling_mscale") or 1.0),
                  mscale_all_dim=float(m.get("rope_scaling_mscale_all_dim") or 0.0))
    for k in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        if lay[k]:
            kw[k] = lay[k]
    if moe:
        from specs.layout import Dispatcher

        disp = Dispatcher(lay["dispatcher"])
        kw.update(num_moe_experts=m["num_experts"], moe_ffn_hidden_size=m["moe_ffn_hidden_size"],
                  moe_router_topk=m["moe_router_topk"], moe_layer_freq=list(m["moe_layer_freq"]), moe_grouped_gemm=te,
                  moe_token_dispatcher_type=disp.moe_token_dispatcher_type,
                  moe_router_score_function=m["moe_router_score_function"],
                  moe_router_enable_expert_bias=m["moe_router_enable_expert_bias"],
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_router_dtype="fp32",
                  moe_permute_fusion=bool(spec.moe_permute_fusion))
        if disp.moe_flex_dispatcher_backend:
            kw["moe_flex_dispatcher_backend"] = disp.moe_flex_dispatcher_backend
        for k in ("moe_shared_expert_intermediate_size", "moe_router_topk_scaling_factor"):
            if m[k]:
                kw[k] = m[k]
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

    def edit(sub: Any, att: Any) -> None:
        att.params = {**(att.params or {}), "attn_mask_type": AttnMaskType.no_mask}

    return _patch_layers(block, edit)


def _apply_te_param_faults(spec: HarnessSpec, models: list[Any]) -> list[str]:
    """``sp_norm_grad_unreduced`` under TE: clear the ``sequence_parallel`` tag of every norm weight but the q/k
    norms (summed over TP by name). Returns the parameters changed."""
    if spec.fault != "sp_norm_grad_unreduced" or not spec.use_transformer_engine:
        return []
    changed = []
    for mdl in models:
        for name, p in mdl.named_parameters():
            qk = "q_layernorm" in name or "k_layernorm" in name
            norm = ("layernorm" in name or "layer_norm" in name) and not qk
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
        model = GPTModel(config=cfg, transformer_layer_spec=block, vocab_size=m["vocab_size"],
                         max_sequence_length=spec.seq_length, pre_process=pre, post_process=post,
                         share_embeddings_and_output_weights=not m["untie_embeddings_and_output_weights"],
                         position_embedding_type="rope", rotary_percent=m["rotary_percent"],
                         rotary_base=int(m["rotary_base"]), vp_stage=vp)
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
        grad_reduce_in_fp32=bool(spec.grad_reduce_in_fp32), overlap_grad_reduce=True,
        use_distributed_optimizer=bool(lay["use_distributed_optimizer"]), fp8_param_gather=bool(spec.fp8_param_gather))
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
        optimizer="adam", lr=float(spec.lr), weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, clip_grad=1.0,
        bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=bool(lay["use_distributed_optimizer"]),
        use_precision_aware_optimizer=pa, exp_avg_dtype=dt[lay["exp_avg_dtype"]] if pa else torch.float32,
        exp_avg_sq_dtype=dt[lay["exp_avg_sq_dtype"]] if pa else torch.float32, optimizer_cpu_offload=frac > 0,
        optimizer_offload_fraction=frac if frac > 0 else 1.0,
        overlap_cpu_optimizer_d2h_h2d=bool(lay["overlap_cpu_optimizer_d2h_h2d"]) and frac > 0,
        fp8_recipe=spec.fp8_recipe)
    opt = get_megatron_optimizer(ocfg, chunks)
    if spec.fault == "norm_grad_scaled":
        from launch.harness.grads import scale_norm_grad

        def finalize_with_fault(*args: Any, **kwargs: Any) -> Any:
            r = finalize_model_grads(*args, **kwargs)
            _RAN.setdefault("fault", {})["scaled"] = scale_norm_grad(chunks, 2.0)
            return r
    _RAN["optimizer"] = _config_fields(ocfg, (
        "optimizer", "lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad", "bf16",
        "use_distributed_optimizer", "use_precision_aware_optimizer", "store_param_remainders", "main_grads_dtype",
        "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "optimizer_cpu_offload", "optimizer_offload_fraction",
        "overlap_cpu_optimizer_d2h_h2d", "pin_cpu_grads", "pin_cpu_params", "fp8_recipe"))
    cfg.grad_scale_func = opt.scale_loss
    cfg.finalize_model_grads_func = finalize_with_fault if spec.fault == "norm_grad_scaled" else finalize_model_grads
    cfg.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    cfg.grad_sync_func = [c.start_grad_sync for c in chunks] if len(chunks) > 1 else chunks[0].start_grad_sync
    return opt


def _gpt(chunk: Any) -> Any:
    """The GPTModel inside DDP(Float16Module(GPTModel))."""
    return chunk.module.module


def _apply_load_fault(spec: HarnessSpec, models: list[Any]) -> None:
    """The ``embedding_shard_misplaced`` fault: after loading, each TP rank holds the next TP rank's vocabulary shard.
    """
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
    """Write the weights as a megatron-core distributed checkpoint at ``path``, with ``model.json`` (the model and
    its fingerprint) so that a check can refuse another model's checkpoint before any GPU time."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        Path(path).mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_weights(models), path)
    if dist.get_rank() == 0 and model_dict is not None:
        from launch.harness.gather import model_fingerprint

        doc = {"model": model_dict, "fingerprint": model_fingerprint(model_dict)}
        (Path(path) / "model.json").write_text(json.dumps(doc, indent=1, default=str))
    dist.barrier()


def _load_weights(models: list[Any], path: str) -> None:
    """Load the distributed checkpoint at ``path`` into this rank's model chunks.

    Raises:
        RuntimeError: the checkpoint lacks a weight this model has.
    """
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load(_sharded_weights(models), path)
    for i, m in enumerate(models):
        res = m.load_state_dict(loaded[f"model{i}"], strict=False)
        missing = [k for k in res.missing_keys if not k.endswith("_extra_state")]
        if missing:
            raise RuntimeError(f"checkpoint {path} lacks {len(missing)} weights of this model, e.g. {missing[:3]}")


def _run_options(spec: HarnessSpec) -> dict[str, Any]:
    """What megatron-core ran (config fields read back from its objects) and the harness options of the spec."""
    return {
        **{k: v for k, v in _RAN.items() if k in ("transformer", "ddp", "optimizer")},
        "harness": {k: getattr(spec, k) for k in (
            "fp8_recipe", "fp8_param_gather", "grad_reduce_in_fp32", "cross_entropy_fusion", "moe_permute_fusion",
            "megatron_fusions", "use_transformer_engine", "seq_length", "global_batch_size")},
    }
