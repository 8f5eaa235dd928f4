"""FLOPs accounting: Megatron's model FLOPs and the seed's MFU convention."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from specs import ModelSpec

_Rate = TypeVar("_Rate", float, np.ndarray)


def megatron_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Model FLOPs per token of one training step (forward + backward) as Megatron counts them, ``total FLOPs /
    (global_batch * seq_length)``.

    Mirrors ``num_floating_point_operations`` in ``megatron/training/training.py`` (shared/notes/megatron_rules.md §6.3)
    for fixed-length rows: GQA or MLA projections, causal core attention (half the s x s scores; sliding-window layers
    the keys in the window), dense / routed / shared-expert MLPs, MTP layers (of the last layer's type) and their
    projections, and the logits of the main and each MTP head. The router is not counted (nor by Megatron)."""
    h, n, g, d = model.hidden_size, model.num_attention_heads, model.num_query_groups, model.kv_channels
    mats = model.mlp_matrices
    mtp = model.mtp_num_layers
    last_is_moe = bool(model.moe_layer_freq and model.moe_layer_freq[-1])
    n_moe = model.num_moe_layers + (mtp if last_is_moe else 0)
    n_dense = model.num_dense_layers + (0 if last_is_moe else mtp)
    layers = model.num_layers + mtp
    mlp = 6 * h * (model.ffn_hidden_size * mats * n_dense
                   + model.moe_ffn_hidden_size * model.moe_router_topk * mats * n_moe
                   + model.moe_shared_expert_intermediate_size * mats * n_moe)
    if model.is_mla:
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank:
            q_term = model.q_lora_rank * (h + n * qk + 1)
        else:
            q_term = h * n * qk
        attn_lin = 6 * (q_term
                        + model.kv_lora_rank * (h + n * (model.qk_head_dim + model.v_head_dim) + 1)
                        + h * model.qk_pos_emb_head_dim
                        + n * model.v_head_dim * h)
        attn_core_per_s = 6 * (n * qk / 2 + n * model.v_head_dim / 2)
    else:
        q, kv = d * n, d * g
        attn_lin = 6 * (h * (q + 2 * kv) + q * h)
        attn_core_per_s = 6 * q  # 6 * q/2 * 2: causal half, QK^T and PV
    total: float = mlp + attn_lin * layers + 6 * mtp * (3 * h + 2 * h * h) + 6 * h * model.vocab_size * (mtp + 1)
    # Core attention: Megatron counts s/2 keys per query (causal half) on full-attention layers;
    # on sliding-window layers a query sees at most window_size + 1 keys (Megatron-Bridge
    # flop_utils counts the window's context the same way).
    n_win = model.num_window_layers
    keys_win = model.attended_keys_per_query(seq_length, windowed=True)
    total += seq_length * attn_core_per_s * (layers - n_win)
    total += 2 * keys_win * attn_core_per_s * n_win
    return float(total)


def mfu(model: ModelSpec, tokens_per_s_per_gpu: _Rate, peak_flops_bf16: float, task: str = "pretrain") -> _Rate:
    """Model FLOP utilisation by the seed's convention: ``6 * N_active * tokens/s / peak``; ``4 * N_active`` for
    ``task`` ``lora``, whose frozen weights skip the weight-gradient GEMM (forward and input gradient only: the
    count the time terms use, ``docs/stacks.md#tasks``; the adapters' FLOPs are negligible).

    ``N_active`` is :meth:`ModelSpec.active_params`; ``peak`` is the GPU's dense bf16 peak (FLOP/s), the datasheet's,
    not the fitted one; ``tokens_per_s_per_gpu`` a number or an array. At 2,034.42 tokens/s/GPU on H200 (989.4 TFLOP/s)
    MiniMax-M2 gives 0.1285 (seeds/001 ``result.mfu``). Attention's s^2 term is not counted."""
    return (4.0 if task == "lora" else 6.0) * model.active_params() * tokens_per_s_per_gpu / peak_flops_bf16


def usd_per_million_tokens(usd_per_gpu_hour: float, tokens_per_s_per_gpu: float) -> float:
    """Dollars per million trained tokens: ``price per GPU-hour / (tokens/s/GPU * 3600) * 1e6``."""
    if tokens_per_s_per_gpu <= 0:
        return float("inf")
    return usd_per_gpu_hour / (tokens_per_s_per_gpu * 3600.0) * 1e6
