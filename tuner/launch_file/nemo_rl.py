"""NeMo-RL YAML: its ``defaults:`` files merged, its Megatron trainer (``policy.megatron_cfg``) read as
Megatron-Bridge's settings."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specs.errors import TunerError
from specs.files import read_user_text
from tuner.launch_file.args import LaunchTask
from tuner.launch_file.bridge import _bridge_args

#: NeMo-RL ``policy.megatron_cfg`` settings without effect on the estimate (RL bookkeeping, conversion, logging).
_NEMO_RL_NO_EFFECT = frozenset({"enabled", "empty_unused_memory_level", "force_reconvert_from_hf", "freeze_moe_router",
                                "moe_router_bias_update_rate", "moe_per_layer_logging", "defer_fp32_logits",
                                "use_gloo_process_groups", "pipeline_dtype", "converter_type", "track_moe_metrics",
                                "moe_router_dtype", "moe_router_load_balancing_type", "moe_shared_expert_overlap",
                                "mtp_loss_scaling_factor", "mtp_use_repeated_layer", "mtp_detach_heads",
                                "cuda_graph_warmup_steps", "fused_linear_logprobs_chunk_size",
                                "use_fused_linear_logprobs", "use_fused_weighted_squared_relu",
                                "gradient_accumulation_fusion", "fine_grained_activation_offloading",
                                "offload_modules", "bias_activation_fusion_checks"})


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _nemo_rl_doc(p: Path, doc: Mapping[str, Any], label: str, depth: int = 0) -> dict[str, Any]:
    """``doc`` with its ``defaults:`` files (relative to ``p``) merged under it, as NeMo-RL's config loader does. Raises
    TunerError: a ``defaults`` file that cannot be read, or a chain deeper than 8."""
    from specs._data import read_user_yaml

    parent = doc.get("defaults")
    if not isinstance(parent, str):
        return dict(doc)
    if depth >= 8:
        raise TunerError(f"{label}: its defaults: chain is deeper than 8 files")
    f = (p.parent / parent).resolve()
    try:
        text = read_user_text(f, f"{label}: its defaults: file {parent!r}", "a NeMo-RL YAML beside the file")
    except TunerError as e:
        raise TunerError(f"{e}; put it beside the file") from None
    base = read_user_yaml(text, f"{label} (defaults {parent})")
    if not isinstance(base, Mapping):
        raise TunerError(f"{label}: its defaults: file {parent!r} is not a mapping")
    return _deep_merge(_nemo_rl_doc(f, base, label, depth + 1), {k: v for k, v in doc.items() if k != "defaults"})


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``doc[key]`` when it is a mapping, else an empty one."""
    v = doc.get(key)
    return v if isinstance(v, Mapping) else {}

def _nemo_rl_args(doc: Mapping[str, Any], label: str) -> tuple[list[str], dict[str, str], str | None, int | None,
                                                               int | None, LaunchTask | None]:
    """A NeMo-RL config's Megatron trainer (``policy.megatron_cfg``) as Megatron-LM arguments: (argv, names, the Hugging
    Face id, nodes, GPUs per node, LoRA task fields or None). Raises TunerError: the config trains with NeMo-RL's
    DTensor path (``policy.megatron_cfg.enabled`` false)."""
    policy = _section(doc, "policy")
    mcfg = _section(policy, "megatron_cfg")
    if not mcfg.get("enabled"):
        raise TunerError(f"{label}: policy.megatron_cfg.enabled is not true: it trains with NeMo-RL's DTensor / "
                         "AutoModel path, which tune --from does not read (its Megatron trainer only)")
    model_keys = {k: v for k, v in mcfg.items() if not isinstance(v, Mapping) and k not in _NEMO_RL_NO_EFFECT}
    if not mcfg.get("activation_checkpointing"):
        for k in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"):
            model_keys.pop(k, None)
    model_keys.pop("activation_checkpointing", None)
    bridge: dict[str, Any] = {
        "model": model_keys, "optimizer": mcfg.get("optimizer") or {},
        "ddp": mcfg.get("distributed_data_parallel_config") or {},
        "train": {k: policy[f"train_{k}"] for k in ("global_batch_size",
                                                    "micro_batch_size") if isinstance(policy.get(f"train_{k}"), int)},
        "dataset": {"seq_length": policy["max_total_sequence_length"]}
        if isinstance(policy.get("max_total_sequence_length"), int) else {},
    }
    fp8 = _section(mcfg, "fp8_cfg")
    if fp8.get("enabled"):
        bridge["mixed_precision"] = {"fp8": fp8.get("fp8") or "hybrid", "fp8_recipe": fp8.get("fp8_recipe"),
                                     "fp8_param_gather": bool(fp8.get("fp8_param"))}
    argv, names = _bridge_args(bridge, label)
    where_of = {"model": "policy.megatron_cfg", "optimizer": "policy.megatron_cfg.optimizer",
                "ddp": "policy.megatron_cfg.distributed_data_parallel_config",
                "mixed_precision": "policy.megatron_cfg.fp8_cfg",
                "train": "policy.train", "dataset": "policy.max_total_sequence_length"}
    for flag, where in list(names.items()):
        sec, _, key = where.partition(".")
        sep = "_" if sec == "train" else "."
        names[flag] = f"{where_of.get(sec, sec)}{sep}{key}" if sec != "dataset" else where_of[sec]

    def put(flag: str, where: str) -> None:
        argv.append(flag)
        names[flag] = where

    for k in mcfg:
        if k in _NEMO_RL_NO_EFFECT or (isinstance(mcfg[k], Mapping) and k in ("scheduler", "env_vars")):
            put(f"--nemo-rl.megatron_cfg.{k}", f"policy.megatron_cfg.{k}")
    if str(policy.get("precision", "bfloat16")).lower() in ("bfloat16", "bf16"):
        put("--bf16", "policy.precision")
    for k in policy:
        if k not in ("megatron_cfg", "model_name", "train_global_batch_size", "train_micro_batch_size",
                     "max_total_sequence_length", "precision"):
            put(f"--nemo-rl.policy.{k}", f"policy.{k}")
    for k in doc:
        if k not in ("policy", "cluster", "defaults"):
            put(f"--nemo-rl.{k}", str(k))
    cluster = _section(doc, "cluster")
    nodes, per_node = cluster.get("num_nodes"), cluster.get("gpus_per_node")
    peft = _section(mcfg, "peft")
    task: LaunchTask | None = None
    # NeMo-RL's peft block is Megatron-Bridge's LoRA (dim, target_modules; empty = Bridge's default)
    if peft.get("enabled"):
        task = {"task": "lora", "lora_rank": int(peft.get("dim") or 32),
                **({"lora_target_modules": ",".join(peft["target_modules"])} if peft.get("target_modules") else {})}
    put("--nemo-rl.megatron_cfg.peft", "policy.megatron_cfg.peft")
    hf = policy.get("model_name")
    return (argv, names, str(hf) if hf else None, nodes if isinstance(nodes, int) else None,
            per_node if isinstance(per_node, int) else None, task)
