"""Activation memory of one decoder layer for one micro-batch, by part, and what recompute keeps of it.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198, §4 and Table 2), tensor by tensor, with these conventions of ours (see
``tests/cost_model_tests/test_activations_golden.py`` for the term-by-term mapping):

- bf16 activations (2 bytes), no dropout masks (Megatron's LLM recipes train with dropout 0);
- flash attention: the ``5as/h`` score terms are not kept; the softmax statistics are (fp32, one
  per head and token);
- sequence parallelism with every TP > 1 (the search turns it on): every tensor is split by TP,
  so all terms divide by ``tp`` (their ``34 sbh / t`` row);
- GQA / MLA widths (``q_dim``, ``kv_dim``, ``ctx_dim``), QK norm, MoE token copies
  (``top-k x tokens x ETP / TP`` per GPU, x the load imbalance), router and shared experts;
- s is the context-parallel shard: ``tokens = micro_batch x seq / cp``.

Every function returns bytes for one layer and one micro-batch, shape ``(n, 1)`` unless it says
``(n, K)``.
"""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES, FP32_BYTES

__all__ = [
    "attention_bytes",
    "core_attention_bytes",
    "dense_block_bytes",
    "dense_mlp_bytes",
    "expert_activation_fn_bytes",
    "expert_bytes",
    "kept_bytes",
    "layer_input_bytes",
    "moe_block_bytes",
    "norm_bytes",
    "qk_norm_bytes",
    "rank_activation_bytes",
    "recomputed_fraction",
    "router_bytes",
    "routed_token_copies",
    "saved_attention_bytes",
    "saved_dense_bytes",
    "saved_moe_bytes",
    "shared_expert_bytes",
    "stored_layer_bytes",
]

#: Hidden-size bf16 tensors the attention block keeps besides Q, K, V and its output, in units of
#: h per token: the pre-attention norm's input and output (the QKV GEMM's input) and one more
#: hidden-size tensor (Korthikanti's inventory has two: its LN input and QKV input; ours keeps a
#: third, as the first cut of this model did; the golden test states the difference).
ATTENTION_HIDDEN_TENSORS = 3.0

#: Router tensors per token per expert, fp32 (``--moe-router-dtype fp32``): the logits and the
#: probabilities / scores the top-k backward needs (megatron/core/transformer/moe/router.py).
ROUTER_FP32_TENSORS = 2.0

#: Hidden-size bf16 tensors per routed token copy: the permuted tokens (fc1's input) and fc2's
#: output (the unpermute's input) (megatron/core/transformer/moe/experts.py, token_dispatcher.py).
EXPERT_HIDDEN_TENSORS = 2.0


def routed_token_copies(c: TableContext) -> Array:
    """Routed token copies per GPU on the slowest expert rank: ``tokens x topk x etp / tp x imbalance``.

    Each of a TP group's tokens goes to ``topk`` experts; with sequence parallelism a GPU starts
    with ``tokens / tp`` of them, and ETP ranks each process every copy routed to their experts.

    Returns:
        Token copies (a count), ``(n, 1)``.
    """
    m = c.dims
    return c.tokens * m.topk * col(c.etp) / col(c.tp) * c.load_imbalance


def layer_input_bytes(c: TableContext) -> Array:
    """The layer's input (sequence-parallel shard): ``2 x tokens x h / tp``. What full recompute keeps
    per recomputed layer (Korthikanti Table 2, "full recompute: 2sbh").

    Returns:
        Bytes, ``(n, 1)``.
    """
    return BF16_BYTES * c.tokens * c.dims.h / col(c.tp)


def qk_norm_bytes(c: TableContext) -> Array:
    """QK norm's saved inputs (``--qk-layernorm``): the queries and keys, ``2 x tokens x (q_dim + kv_dim / 2) / tp``
    (K is half of ``kv_dim``, which holds K and V).

    Returns:
        Bytes, ``(n, 1)``; 0 without QK norm.
    """
    m = c.dims
    if not m.qk_layernorm:
        return np.zeros_like(c.tokens)
    return BF16_BYTES * c.tokens / col(c.tp) * (m.q_dim + m.kv_dim / 2)


def attention_bytes(c: TableContext) -> Array:
    """The attention block: ``2 x tokens / tp x (3h + q_dim + kv_dim + copies x ctx_dim) + 4 x tokens x heads / tp``
    (+ :func:`qk_norm_bytes`).

    Korthikanti §4.1 "attention block" without the ``5as^2b`` scores and the dropout mask (flash
    attention, dropout 0): :data:`ATTENTION_HIDDEN_TENSORS` hidden-size tensors, Q, K and V, the
    attention output (``copies`` = 1 with Transformer Engine's fused attention, whose output is the
    output projection's input; 2 without TE, where ``scaled_dot_product_attention``'s output is
    permuted into a new tensor, :attr:`specs.RunOptions.te_attention`) and flash attention's fp32
    softmax statistics (logsumexp per head and token).

    Returns:
        Bytes, ``(n, 1)``.
    """
    m = c.dims
    tp = col(c.tp)
    copies = 1.0 if c.options.te_attention else 2.0
    a = BF16_BYTES * c.tokens / tp * (ATTENTION_HIDDEN_TENSORS * m.h + m.q_dim + m.kv_dim + copies * m.ctx_dim) + FP32_BYTES * c.tokens * m.heads / tp
    return a + qk_norm_bytes(c)


def core_attention_bytes(c: TableContext) -> Array:
    """What selective ``core_attn`` recompute frees: the attention output and the softmax statistics,
    ``2 x tokens x ctx_dim / tp + 4 x tokens x heads / tp`` (flash attention keeps no scores, so this
    is all the core attention holds beyond its Q, K, V inputs).

    Returns:
        Bytes, ``(n, 1)``.
    """
    m = c.dims
    tp = col(c.tp)
    return BF16_BYTES * c.tokens * m.ctx_dim / tp + FP32_BYTES * c.tokens * m.heads / tp


def norm_bytes(c: TableContext) -> Array:
    """The inputs of the layer's two norms (pre-attention and pre-MLP), ``2 x 2 x tokens x h / tp``
    (Korthikanti: "layer norms 4sbh"); what selective ``layernorm`` recompute frees.

    Returns:
        Bytes, ``(n, 1)``.
    """
    return 2 * BF16_BYTES * c.tokens * c.dims.h / col(c.tp)


def expert_bytes(c: TableContext, copies: Array) -> Array:
    """Routed experts: per token copy ``2 x (2h + mats x moe_ffn / etp + moe_ffn / etp)``.

    :data:`EXPERT_HIDDEN_TENSORS` hidden-size tensors (permuted input, fc2 output), fc1's output
    and the activation's output (``mats x moe_ffn``: 2 + 1 for SwiGLU) and the probability-weighted
    activation (``moe_ffn``; Megatron core 0.13 moved the probs multiplication into the activation
    of GroupedMLP, moe/README.md).

    Args:
        copies: :func:`routed_token_copies`, ``(n, 1)``.

    Returns:
        Bytes, ``(n, 1)``; 0 for a dense model.
    """
    m = c.dims
    if not m.is_moe:
        return np.zeros_like(c.tokens)
    etp = col(c.etp)
    return BF16_BYTES * copies * (EXPERT_HIDDEN_TENSORS * m.h + m.mlp_matrices * m.moe_ffn / etp + m.moe_ffn / etp)


def expert_activation_fn_bytes(c: TableContext, copies: Array) -> Array:
    """What selective ``moe_act`` recompute frees: the experts' activation output, ``2 x copies x moe_ffn / etp``.

    Returns:
        Bytes, ``(n, 1)``; 0 for a dense model.
    """
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    return BF16_BYTES * copies * c.dims.moe_ffn / col(c.etp)


def router_bytes(c: TableContext) -> Array:
    """The router's fp32 logits and probabilities: ``4 x 2 x tokens x E / tp`` (:data:`ROUTER_FP32_TENSORS`).

    Returns:
        Bytes, ``(n, 1)``; 0 for a dense model.
    """
    m = c.dims
    if not m.is_moe:
        return np.zeros_like(c.tokens)
    return FP32_BYTES * ROUTER_FP32_TENSORS * c.tokens * m.experts / col(c.tp)


def shared_expert_bytes(c: TableContext) -> Array:
    """Shared experts (a dense MLP of width ``shared_ffn`` split by TP): ``2 x tokens x mats x shared_ffn / tp``
    (fc1's output and the activation's output; Korthikanti's MLP ``16sbh`` at f = 4h, non-gated).

    Returns:
        Bytes, ``(n, 1)``; 0 without shared experts.
    """
    m = c.dims
    return BF16_BYTES * c.tokens * m.mlp_matrices * m.shared_ffn / col(c.tp)


def dense_mlp_bytes(c: TableContext) -> Array:
    """A dense MLP's fc1 output and activation output: ``2 x tokens x mats x ffn / tp``
    (Korthikanti §4.1 "MLP": 8sbh + 8sbh at f = 4h with 2 matrices).

    Returns:
        Bytes, ``(n, 1)``.
    """
    m = c.dims
    return BF16_BYTES * c.tokens * m.mlp_matrices * m.ffn / col(c.tp)


def moe_block_bytes(c: TableContext, copies: Array) -> Array:
    """A MoE layer's MLP side: one norm's input, the MLP block's input (:func:`layer_input_bytes`),
    the router, the routed experts and the shared experts.

    Returns:
        Bytes, ``(n, 1)``.
    """
    return norm_bytes(c) / 2 + layer_input_bytes(c) + router_bytes(c) + expert_bytes(c, copies) + shared_expert_bytes(c)


def dense_block_bytes(c: TableContext) -> Array:
    """A dense layer's MLP side: one norm's input, the MLP block's input and the MLP
    (Korthikanti's "MLP 19sbh" less its dropout mask, with half of "layer norms 4sbh").

    Returns:
        Bytes, ``(n, 1)``.
    """
    return norm_bytes(c) / 2 + layer_input_bytes(c) + dense_mlp_bytes(c)


# --------------------------------------------------------------------------- selective recompute


def saved_attention_bytes(c: TableContext) -> Array:
    """Bytes selective recompute frees in the attention side of every layer: :func:`core_attention_bytes`
    with ``core_attn``, :func:`norm_bytes` with ``layernorm`` (megatron-core transformer_layer.py
    checkpoints those submodules).

    Returns:
        Bytes, ``(n, 1)``.
    """
    return np.where(c.recomputes("core_attn"), core_attention_bytes(c), 0) + np.where(c.recomputes("layernorm"), norm_bytes(c), 0)


def saved_moe_bytes(c: TableContext, moe_block: Array, copies: Array) -> Array:
    """Bytes selective recompute frees in a MoE layer's MLP side: with ``moe`` the whole block but its
    input; else with ``moe_act`` the activation output; plus with ``shared_experts`` (and not ``moe``,
    which already covers them) the shared experts.

    Args:
        moe_block: :func:`moe_block_bytes`, ``(n, 1)``.
        copies: :func:`routed_token_copies`, ``(n, 1)``.

    Returns:
        Bytes, ``(n, 1)``.
    """
    whole = moe_block - layer_input_bytes(c)
    saved = np.where(c.recomputes("moe"), whole, np.where(c.recomputes("moe_act"), expert_activation_fn_bytes(c, copies), 0))
    return saved + np.where(c.recomputes("shared_experts") & ~c.recomputes("moe"), shared_expert_bytes(c), 0)


def saved_dense_bytes(c: TableContext, dense_block: Array) -> Array:
    """Bytes selective ``mlp`` recompute frees in a dense layer: the block but its input.

    Args:
        dense_block: :func:`dense_block_bytes`, ``(n, 1)``.

    Returns:
        Bytes, ``(n, 1)``.
    """
    return np.where(c.recomputes("mlp"), dense_block - layer_input_bytes(c), 0)


def kept_bytes(full_layer: Array, saved_attention: Array, saved_mlp: Array) -> Array:
    """A layer's activations under selective recompute (or none): ``full layer - saved attention - saved MLP side``.

    Args:
        full_layer: the layer without recompute (attention + MLP side), ``(n, 1)``.
        saved_attention: :func:`saved_attention_bytes`, ``(n, 1)``.
        saved_mlp: :func:`saved_moe_bytes` or :func:`saved_dense_bytes`, ``(n, 1)``.

    Returns:
        Bytes, ``(n, 1)``.
    """
    return full_layer - saved_attention - saved_mlp


# --------------------------------------------------------------------------- full recompute


def recomputed_fraction(c: TableContext) -> Array:
    """Share of a rank's layers that block recompute recomputes: ``block layers / layers`` (the first
    ``recompute_num_layers`` of every chunk, :attr:`RankArrays.block_layers`).

    Returns:
        A fraction in [0, 1], ``(n, K)``.
    """
    return np.where(c.layers > 0, c.block_layers / np.maximum(c.layers, 1), 0.0)


def stored_layer_bytes(c: TableContext, layer_input: Array, kept: Array, fraction: Array) -> Array:
    """Activations a layer keeps between its forward and backward, per recompute choice.

    - full uniform: the input of each group of ``recompute_num_layers`` layers, i.e.
      ``layer input / recompute_num_layers`` per layer (Korthikanti: 2sbh per checkpoint);
    - full block: recomputed layers keep their input, the others everything:
      ``fraction x input + (1 - fraction) x kept``;
    - selective or none: ``kept`` (:func:`kept_bytes`).

    Args:
        layer_input: :func:`layer_input_bytes`, ``(n, 1)``.
        kept: the layer's bytes under selective / no recompute, ``(n, 1)``.
        fraction: :func:`recomputed_fraction`, ``(n, K)``.

    Returns:
        Bytes per layer, ``(n, K)``.
    """
    block = fraction * layer_input + (1 - fraction) * kept
    return np.where(c.full, np.where(c.uniform, layer_input / c.recompute_num_layers, block), kept)


def rank_activation_bytes(c: TableContext, stored_moe: Array, stored_dense: Array) -> Array:
    """One micro-batch through all of a rank's layers: ``moe_layers x stored_moe + dense_layers x stored_dense``.

    Returns:
        Bytes, ``(n, K)``.
    """
    return c.moe_layers * stored_moe + c.dense_layers * stored_dense
