"""Compute time of one decoder layer for one micro-batch on one GPU: GEMMs, attention, memory-bound work.

FLOPs follow Megatron's ``num_floating_point_operations`` (``megatron/training/training.py``,
shared/notes/megatron_rules.md §6.3): 2 FLOPs per multiply-accumulate, backward = 2 x forward for every GEMM (dgrad +
wgrad; Narayanan et al. 2021, arXiv 2104.04473 §5.1), so a layer's forward + backward is :data:`GEMM_PASSES` x its
forward. Efficiencies and HBM bytes are :class:`cost_model.calibration.Calibration` fields. FLOPs are per GPU (split by
TP / ETP), times in seconds; shapes ``(n, 1)`` unless stated."""

from __future__ import annotations

import numpy as np

from cost_model.calibration import Calibration
from cost_model.terms import lora
from cost_model.terms.context import Array, TableContext, col

#: FLOPs per multiply-accumulate.
FLOPS_PER_MAC = 2.0

#: A GEMM's forward + backward over its forward: dgrad and wgrad each cost one forward
#: (Megatron's ``6 = 3 x 2`` FLOPs per parameter and token, training.py).
GEMM_PASSES = 3.0

#: HBM bytes-equivalent per logit element of the loss, forward + backward, of each of megatron-core 0.19's cross-entropy
#: paths (:attr:`specs.RunOptions.cross_entropy_path`): the loss's time on 8,192 x V bf16 logits (V = 128,256 ..
#: 201,088) times the GPU's achieved copy bandwidth, over the elements, the median of five vocabularies. **Measured** on
#: 1 x H200 (``benchmarks/h200_ce.py``, ``benchmarks/results/h200_te_2026-12-01/call20/ce.jsonl``).
CROSS_ENTROPY_BYTES_PER_LOGIT = {"unfused": 64.0, "native": 49.0, "te": 9.5}

#: Core attention's speed by (q / k head dim, v head dim) relative to head dim 128 at the same heads, kv groups and
#: length, above a call's fixed part (:attr:`cost_model.calibration.Calibration.attention_call_macs`); (192, 128) is
#: MLA's. **Measured** on 1 x H200 (cuDNN FusedAttention, bf16, causal; ``benchmarks/h200_attention.py --compare``,
#: ``benchmarks/results/h200_te_2026-12-02/call29``); used on every GPU. Not fitted.
ATTENTION_HEAD_DIM_FACTOR: dict[tuple[int, int], float] = {
    (64, 64): 0.827, (96, 96): 0.777, (128, 128): 1.0, (192, 128): 0.861, (192, 192): 0.680, (256, 256): 0.773}

#: Core attention's forward over its forward + backward (a GEMM's is a third; attention's backward recomputes the
#: scores): the median over 27 full-attention shapes, 0.17-0.26 (same measurement as :data:`ATTENTION_HEAD_DIM_FACTOR`).
#: What core-attention and full recompute re-run. Not fitted.
ATTENTION_FORWARD_SHARE = 0.238

#: GEMMs of the attention projections: QKV and the output projection (their FLOPs are
#: about equal, so each is half of :func:`attention_linear_flops` for the size-efficiency curve).
ATTENTION_PROJECTION_GEMMS = 2.0


def gemm_efficiency(flops: Array, cal: Calibration) -> Array:
    """Achieved fraction of peak of a GEMM of ``flops``: ``gemm_efficiency x F / (F + gemm_half_size_flops)``
    (small GEMMs are latency bound; :attr:`Calibration.gemm_half_size_flops`).

    Args: flops: FLOPs of one GEMM, any shape (floored at 1).

    Returns: A fraction in (0, gemm_efficiency), the shape of ``flops``."""
    f = np.maximum(flops, 1.0)
    return cal.gemm_efficiency * f / (f + cal.gemm_half_size_flops)


def attention_linear_flops(c: TableContext) -> Array:
    """Forward FLOPs of the attention projections: ``2 x tokens x attention_params / tp``."""
    return FLOPS_PER_MAC * c.tokens * c.dims.attention_params / col(c.tp)


def core_attention_flops(c: TableContext) -> Array:
    """Forward work of causal core attention (QK^T and PV) in multiply-accumulates, ``(n, 1)``: ``tokens x s x (q_dim +
    ctx_dim) / 2 / tp`` x (mean keys per query / the full-causal mean). ``attention_efficiency`` is against this count
    (half the FLOPs), so it is half the achieved fraction of peak; what the kernel costs beyond it is
    :func:`core_attention_work`. A query attends to ``(s + 1) / 2`` keys under the causal mask, fewer on sliding-window
    layers (:meth:`specs.ModelSpec.attended_keys_per_query`); Megatron counts ``s / 2`` (notes §6.3)."""
    keys_full, keys_win, win_share = _attended_keys(c)
    keys = (1 - win_share) * keys_full + win_share * keys_win
    return _macs_per_key(c) * keys


def _attended_keys(c: TableContext) -> tuple[float, float, float]:
    """Mean keys per query of a full and of a windowed layer, and the windowed layers' share (0 when the window
    does not limit a query at this length: :meth:`specs.ModelSpec.attended_keys_per_query`)."""
    model, s = c.model, c.workload.seq_length
    share = model.num_window_layers / model.num_layers if model.window_size and model.window_size + 1 < s else 0.0
    return model.attended_keys_per_query(s, windowed=False), model.attended_keys_per_query(s, windowed=True), share


def _macs_per_key(c: TableContext) -> Array:
    """Forward multiply-accumulates of core attention per mean key per query, ``(n, 1)``: Megatron's ``s / 2`` keys
    of the causal count spread over the ``(s + 1) / 2`` a query attends to."""
    m = c.dims
    return c.tokens * c.seq * (m.q_dim
                               + m.ctx_dim) / 2 / col(c.tp) / c.model.attended_keys_per_query(c.workload.seq_length,
                                                                                              windowed=False)


def expert_flops(c: TableContext) -> Array:
    """Forward FLOPs of the routed experts of one MoE layer per GPU, before the load imbalance:
    ``2 x tokens x topk x mats x h x moe_ffn / tp`` (each copy through ``mats`` matrices; ETP and EP
    split the work so that per GPU it is this)."""
    m = c.dims
    return FLOPS_PER_MAC * c.tokens * m.topk * m.mlp_matrices * m.h * m.moe_ffn / col(c.tp)


def router_flops(c: TableContext) -> Array:
    """Forward FLOPs of the router GEMM: ``2 x tokens x h x E / tp``.

    Returns: FLOPs, ``(n, 1)``; 0 for a dense model."""
    m = c.dims
    if not m.is_moe:
        return np.zeros_like(c.tokens)
    return FLOPS_PER_MAC * c.tokens * m.h * m.experts / col(c.tp)


def shared_expert_flops(c: TableContext) -> Array:
    """Forward FLOPs of the shared experts: ``2 x tokens x mats x h x shared_ffn / tp``.

    Returns: FLOPs, ``(n, 1)``; 0 without shared experts."""
    m = c.dims
    return FLOPS_PER_MAC * c.tokens * m.mlp_matrices * m.h * m.shared_ffn / col(c.tp)


def dense_mlp_flops(c: TableContext) -> Array:
    """Forward FLOPs of a dense MLP: ``2 x tokens x mats x h x ffn / tp``."""
    m = c.dims
    return FLOPS_PER_MAC * c.tokens * m.mlp_matrices * m.h * m.ffn / col(c.tp)


def logits_flops(c: TableContext) -> Array:
    """Forward FLOPs of the output layer and each MTP head: ``2 x tokens x h x V / tp x (1 + mtp)``
    (Megatron's ``6 h V (mtp + 1)`` per token, notes §6.3, is 3 x this)."""
    m = c.dims
    return FLOPS_PER_MAC * c.tokens * m.h * m.vocab / col(c.tp) * (1 + m.mtp)


def attention_linear_time(c: TableContext) -> Array:
    """Forward time of the attention projections at the GEMM peak, each projection's efficiency from
    its size (:func:`gemm_efficiency` of half the FLOPs, :data:`ATTENTION_PROJECTION_GEMMS`)."""
    f = attention_linear_flops(c)
    return f / (c.gemm_peak_flops * gemm_efficiency(f / ATTENTION_PROJECTION_GEMMS, c.cal))


def mla_up_projection_time(c: TableContext) -> Array:
    """Forward time of MLA's up-projections (what selective ``mla_up_proj`` recompute re-runs in backward,
    megatron-core multi_latent_attention.py ``recompute_up_proj``): ``2 x tokens x up_projection_params / tp`` FLOPs
    at the GEMM peak, each of the two GEMMs' efficiency from its size.

    Returns: Seconds, ``(n, 1)``; 0 for GQA."""
    f = FLOPS_PER_MAC * c.tokens * c.dims.up_projection_params / col(c.tp)
    return np.where(f > 0, f / (c.gemm_peak_flops * gemm_efficiency(np.maximum(f, 1.0) / ATTENTION_PROJECTION_GEMMS,
                                                                    c.cal)), 0.0)


def mla_unfused_rope_time(c: TableContext) -> Array:
    """MLA's RoPE and q / k assembly unfused, forward + backward (``apply_rope_fusion`` off):
    ``unfused_mla_rope_bytes_per_element x tokens x q_dim / tp`` bytes at the achieved HBM bandwidth (measured on
    1 x H200: :attr:`cost_model.calibration.Calibration.unfused_mla_rope_bytes_per_element`). The fused path
    (megatron-core ``fused_apply_mla_rope_for_q`` / ``_for_kv``) is in the attention side's memory-bound work.

    Returns: Seconds, ``(n, 1)``; 0 for GQA or with RoPE fused."""
    if c.options.apply_rope_fusion or not c.model.is_mla:
        return np.zeros_like(c.tokens)
    return c.cal.unfused_mla_rope_bytes_per_element * c.tokens * c.dims.q_dim / col(c.tp) / c.hbm_bytes_per_s


def attention_head_dim_factor(c: TableContext) -> float:
    """:data:`ATTENTION_HEAD_DIM_FACTOR` of the model's head dims (MLA: ``qk_head_dim + qk_pos_emb_head_dim`` and
    ``v_head_dim``; else ``kv_channels`` for both). A pair not measured is interpolated linearly in ``qk + v`` between
    the measured pairs (:func:`head_dim_factor`), and held at the nearer end outside them: an assumption, not a
    measurement."""
    model = c.model
    if c.dims.is_mla:
        pair = (model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim)
    else:
        pair = (model.kv_channels, model.kv_channels)
    return head_dim_factor(pair, ATTENTION_HEAD_DIM_FACTOR)


def head_dim_factor(pair: tuple[int, int], table: dict[tuple[int, int], float]) -> float:
    """``table[pair]``, or interpolated linearly in ``qk + v`` between the table's pairs (held at the nearer end
    outside them; MLA's (192, 128) is the point at 320, so its neighbours run on from it); also what
    ``benchmarks/h200_attention.py --compare`` predicts with."""
    if pair in table:
        return table[pair]
    points = sorted((qk + v, f) for (qk, v), f in table.items())
    return float(np.interp(sum(pair), [d for d, _ in points], [f for _, f in points]))


def core_attention_work(c: TableContext) -> Array:
    """What the attention kernel costs, forward, in multiply-accumulates at the head-dim-128 speed per layer,
    micro-batch and GPU, ``(n, 1)``: :func:`core_attention_flops` plus the extra keys of a sliding window
    (``attention_window_extra_keys`` per query, windowed layers) and of a learnable softmax
    (``attention_sink_extra_keys``), plus ``attention_call_macs`` per sequence on the full-attention layers, over
    :func:`attention_head_dim_factor`. Measured with cuDNN's fused attention on 1 x H200
    (``benchmarks/h200_attention.py``, ``benchmarks/results/h200_te_2026-12-02/call29``)."""
    cal = c.cal
    keys_full, keys_win, win_share = _attended_keys(c)
    sinks = cal.attention_sink_extra_keys if c.model.softmax_type != "vanilla" else 0.0
    per_key = _macs_per_key(c)
    call = cal.attention_call_macs * col(c.mbs)
    full_layer = per_key * (keys_full + sinks) + call
    # a windowed layer costs its keys and the window's extra ones, no fixed part, and never more than a full layer
    # (a window that limits little is not dearer than none). Known edge: a window cutting only a few keys at a large
    # micro-batch prices up to the full layer's fixed part (about 1%) below no window, since the measured windowed
    # kernels showed no fixed part (at 128-4,096 keys of 4,096-8,192)
    win_layer = np.minimum(per_key * (keys_win + cal.attention_window_extra_keys + sinks),
                           full_layer)
    return ((1 - win_share) * full_layer + win_share * win_layer) / attention_head_dim_factor(c)


def attention_forward_time(core: Array) -> Array:
    """Core attention's forward alone from :func:`core_attention_time` (a third of its forward + backward by the GEMM
    convention): ``GEMM_PASSES x core x ATTENTION_FORWARD_SHARE``.

    Returns: Seconds, the shape of ``core``."""
    return GEMM_PASSES * core * ATTENTION_FORWARD_SHARE


def core_attention_time(c: TableContext) -> Array:
    """Forward time of the attention kernel: :func:`core_attention_work` at ``attention_efficiency`` of the bf16 peak
    (the efficiency is the forward + backward average against a backward of 2 forwards; the fit's start from
    FlashAttention-2, Dao 2023; measured 0.239 at head dim 128 on 1 x H200
    (``benchmarks/results/h200_te_2026-12-02/call29``); the shipped fit on published runs, which did not see that
    measurement, 0.2375)."""
    return core_attention_work(c) / (c.bf16_peak_flops * c.cal.attention_efficiency)


def grouped_gemm_efficiency(c: TableContext) -> Array:
    """Grouped-GEMM efficiency at this many rows per local expert:
    ``grouped_gemm_efficiency x rows / (rows + half)``, floored at ``grouped_gemm_efficiency_floor``, with
    ``rows = tokens x topk x etp x ep / (tp x E)`` and the half-point measured by expert shape,
    ``half = grouped_gemm_half_rows + grouped_gemm_half_rows_work / (hidden x moe_ffn / etp)`` (1 x H200,
    ``benchmarks/results/h200_te_2026-12-02/call33``: a small expert needs more rows to fill the GPU).

    Returns: A fraction, ``(n, 1)``."""
    m, cal = c.dims, c.cal
    etp = col(c.etp)
    rows = c.tokens * m.topk * etp * col(c.ep) / (col(c.tp) * m.experts)
    half = cal.grouped_gemm_half_rows + cal.grouped_gemm_half_rows_work * etp / (m.h * m.moe_ffn)
    eff = cal.grouped_gemm_efficiency * rows / (rows + half)
    return np.maximum(eff, cal.grouped_gemm_efficiency_floor)


def expert_time(c: TableContext) -> Array:
    """Forward time of the routed experts on the slowest expert rank:
    ``expert FLOPs x imbalance / (GEMM peak x grouped-GEMM efficiency)``.

    Returns: Seconds, ``(n, 1)``; 0 for a dense model."""
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    return expert_flops(c) * c.load_imbalance / (c.gemm_peak_flops * grouped_gemm_efficiency(c))


def router_time(c: TableContext) -> Array:
    """Forward time of the router GEMM (bf16: ``--moe-router-dtype`` keeps it out of fp8).

    Returns: Seconds, ``(n, 1)``; 0 for a dense model."""
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    f = router_flops(c)
    return f / (c.bf16_peak_flops * gemm_efficiency(f, c.cal))


def _mlp_time(c: TableContext, flops: Array) -> Array:
    """Forward time of an MLP of ``flops``, each of its ``mats`` GEMMs' efficiency from its size."""
    m = c.dims.mlp_matrices
    return np.where(flops > 0, flops / (c.gemm_peak_flops * gemm_efficiency(np.maximum(flops, 1.0) / m, c.cal)), 0.0)


def shared_expert_time(c: TableContext) -> Array:
    """Forward time of the shared experts.

    Returns: Seconds, ``(n, 1)``; 0 without shared experts."""
    return _mlp_time(c, shared_expert_flops(c))


def dense_mlp_time(c: TableContext) -> Array:
    """Forward time of a dense MLP."""
    return _mlp_time(c, dense_mlp_flops(c))


def attention_elementwise_time(c: TableContext) -> Array:
    """Memory-bound work around attention (norms, RoPE, residual adds, casts), forward + backward:
    ``elementwise_bytes_per_token_attn x h x tokens / tp`` bytes at the achieved HBM bandwidth."""
    return c.cal.elementwise_bytes_per_token_attn * c.dims.h * c.tokens / col(c.tp) / c.hbm_bytes_per_s


def moe_elementwise_time(c: TableContext, copies: Array) -> Array:
    """Memory-bound MoE work (permute, unpermute, probability scaling, SwiGLU), forward + backward:
    ``elementwise_bytes_per_copy_moe x h x copies`` bytes at the achieved HBM bandwidth, plus
    ``expert_bias_bytes_per_copy_moe x h x copies`` when the experts have biases (GPT-OSS; measured on
    1 x H200 with TE 2.20, docs/measurements.md "GPT-OSS-120B's layer features").

    Args: copies: :func:`cost_model.terms.activations.routed_token_copies`, ``(n, 1)``.

    Returns: Seconds, ``(n, 1)``; 0 for a dense model."""
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    per_copy = c.cal.elementwise_bytes_per_copy_moe + (c.cal.expert_bias_bytes_per_copy_moe if c.dims.expert_bias
                                                       else 0.0)
    return per_copy * c.dims.h * copies / c.hbm_bytes_per_s


def attention_compute_time(c: TableContext, linear: Array, core: Array, elementwise: Array) -> Array:
    """The attention side of a layer, forward + backward: ``3 x (projections + core) + elementwise``."""
    return lora.gemm_passes(c, GEMM_PASSES) * linear + GEMM_PASSES * core + elementwise


def moe_compute_time(c: TableContext, experts: Array, router: Array, shared: Array, elementwise: Array) -> Array:
    """A MoE layer's MLP side, forward + backward: ``3 x (experts + router + shared) + elementwise``."""
    return lora.gemm_passes(c, GEMM_PASSES) * (experts + router + shared) + elementwise


def dense_compute_time(c: TableContext, mlp: Array, attention_elementwise: Array) -> Array:
    """A dense layer's MLP side, forward + backward: ``3 x mlp + dense_mlp_elementwise_share x``
    the attention side's memory-bound time."""
    return lora.gemm_passes(c, GEMM_PASSES) * mlp + attention_elementwise * c.cal.dense_mlp_elementwise_share


def loss_time(c: TableContext) -> Array:
    """The last rank's loss, forward + backward: :data:`CROSS_ENTROPY_BYTES_PER_LOGIT` of the run's path
    (:attr:`specs.RunOptions.cross_entropy_path`) ``x tokens x V / tp x (1 + mtp)`` bytes at the achieved HBM bandwidth
    (the main head and each MTP head).

    Returns: Seconds, ``(n, 1)`` (every rank; :func:`logits_time` keeps the last one's)."""
    m = c.dims
    per_logit = CROSS_ENTROPY_BYTES_PER_LOGIT[c.options.cross_entropy_path]
    out: Array = per_logit * c.tokens * m.vocab / col(c.tp) * (1 + m.mtp) / c.hbm_bytes_per_s
    return out


def logits_time(c: TableContext) -> Array:
    """The last rank's output layer and loss, forward + backward: the logits GEMMs (bf16) plus :func:`loss_time`.

    Returns: Seconds, ``(n, K)``; 0 on other ranks."""
    f = logits_flops(c)
    gemms = lora.gemm_passes(c, GEMM_PASSES) * f / (c.bf16_peak_flops * gemm_efficiency(f, c.cal))
    return c.is_last * (gemms + loss_time(c))
