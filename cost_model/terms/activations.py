"""Activation memory of one decoder layer for one micro-batch, by part, and what recompute keeps of it: bytes, ``(n,
1)`` unless a function says ``(n, K)``.

Source: Korthikanti et al. 2022 (arXiv 2205.05198, §4 and Table 2), tensor by tensor
(``tests/cost_model_tests/test_activations_golden.py`` maps the terms), with bf16 activations and no dropout masks;
flash attention (no ``5as/h`` scores; fp32 softmax statistics per head and token); sequence parallelism with every TP >
1, so every term divides by ``tp``; GQA / MLA widths, QK norm, MoE token copies (``top-k x tokens x ETP / TP`` per GPU,
x the load imbalance), router and shared experts; ``tokens = micro_batch x seq / cp``."""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES, FP32_BYTES

#: Hidden-size bf16 tensors the attention block keeps besides Q, K, V and its output **without** Transformer Engine
#: (megatron-core's local spec), in units of h per token: the norm's input, its output and one more (Korthikanti's
#: inventory has two; three predicted the no-TE H200 trials within 4.6%, docs/measurements.md).
ATTENTION_HIDDEN_TENSORS = 3.0

#: Hidden-size tensors of the attention block under Transformer Engine: the fused norm's input (bf16) and the QKV GEMM's
#: input (bf16, or 1 B in fp8). **Measured** (saved-tensor census of ``decoder.layers.0.self_attention`` on 1 x H200,
#: ``benchmarks/results/h200_te_2026-12-01/call12/census.jsonl``).
TE_ATTENTION_HIDDEN_TENSORS = 2.0

#: Bytes per token per expert the router and the token permutation keep: the fp32 router logits (4 B) and the
#: dispatcher's int64 routing map (8 B). **Measured** (same census, ``decoder.layers.0.mlp``).
ROUTER_BYTES_PER_TOKEN_EXPERT = 12.0

#: Hidden-size tensors per routed token copy: the permuted tokens, fc1's input (the unpermute keeps none: the
#: probabilities are applied inside the activation, megatron-core >= 0.13). **Measured** (census of ``mlp.experts``).
EXPERT_HIDDEN_TENSORS = 1.0

#: Extra expert-width tensors per routed copy when the probability-weighted SwiGLU is **not** fused
#: (``bias_activation_fusion`` False): the SiLU output, the gated product and the weighted product. **Measured** (census
#: of ``mlp.experts``: ``h + 6 f`` elements per copy in bf16); the fused ``WeightedSwiGLUFunction`` saves only its input
#: and the probabilities (megatron/core/fusions/fused_bias_swiglu.py).
UNFUSED_EXPERT_ACTIVATION_TENSORS = 3.0

#: The same for a dense (or shared-expert) gated MLP, which has no probabilities: the SiLU output kept by the
#: gating product ([inferred] from autograd of ``silu(x0) * x1``; not measured).
UNFUSED_DENSE_ACTIVATION_TENSORS = 1.0


def routed_token_copies(c: TableContext) -> Array:
    """Routed token copies per GPU on the slowest expert rank: ``tokens x topk x etp / tp x imbalance``.

    Each of a TP group's tokens goes to ``topk`` experts; with sequence parallelism a GPU starts
    with ``tokens / tp`` of them, and ETP ranks each process every copy routed to their experts.

    Returns: Token copies (a count), ``(n, 1)``."""
    m = c.dims
    return c.tokens * m.topk * col(c.etp) / col(c.tp) * c.load_imbalance


def layer_input_bytes(c: TableContext) -> Array:
    """The layer's input (sequence-parallel shard): ``2 x tokens x h / tp``. What full recompute keeps
    per recomputed layer (Korthikanti Table 2, "full recompute: 2sbh")."""
    return BF16_BYTES * c.tokens * c.dims.h / col(c.tp)


def qk_norm_bytes(c: TableContext) -> Array:
    """QK norm's saved inputs (``--qk-layernorm``): the queries and keys, ``2 x tokens x (q_dim + kv_dim / 2) / tp``
    (K is half of ``kv_dim``, which holds K and V). Measured under TE: ``[tokens x heads, d]`` and
    ``[tokens x groups, d]`` bf16 in the attention census.

    Returns: Bytes, ``(n, 1)``; 0 without QK norm."""
    m = c.dims
    if not m.qk_layernorm:
        return np.zeros_like(c.tokens)
    return BF16_BYTES * c.tokens / col(c.tp) * (m.q_dim + m.kv_dim / 2)


def attention_bytes(c: TableContext) -> Array:
    """The attention block, bytes per micro-batch: ``tokens / tp x (hidden + 2 (q_dim + saved_kv_dim) + output + (2 + g)
    latent_dim) + 4 x tokens x heads / tp`` (+ :func:`qk_norm_bytes`), g the saved GEMM-input bytes (Korthikanti §4.1
    without the scores and the dropout mask).

    Under Transformer Engine (measured on H200): hidden is the norm's input in bf16 and the QKV GEMM's input at g
    (:data:`TE_ATTENTION_HIDDEN_TENSORS`); Q, K, V and the output in bf16 (in fp8 the projection keeps one more
    quantised copy, ``+ g x ctx_dim``); the fp32 logsumexp per head and token. Without TE:
    :data:`ATTENTION_HIDDEN_TENSORS` bf16 tensors and two copies of the output. MLA: the expanded keys and values
    (``saved_kv_dim``) and the two latents, each as an up-projection's input (bf16) and its norm's output (g)."""
    m = c.dims
    tp = col(c.tp)
    g = c.saved_gemm_input_bytes
    if c.options.te_attention:
        hidden = (TE_ATTENTION_HIDDEN_TENSORS - 1) * BF16_BYTES * m.h + g * m.h  # the norm's input; the QKV input at g
        out = BF16_BYTES * m.ctx_dim + (g * m.ctx_dim if c.quantized else 0.0)
    else:
        hidden = ATTENTION_HIDDEN_TENSORS * BF16_BYTES * m.h
        out = 2 * BF16_BYTES * m.ctx_dim
    qkv = BF16_BYTES * (m.q_dim + m.saved_kv_dim) + (BF16_BYTES + g) * m.latent_dim
    a = c.tokens / tp * (hidden + qkv + out) + FP32_BYTES * c.tokens * m.heads / tp
    return a + qk_norm_bytes(c)


def core_attention_bytes(c: TableContext) -> Array:
    """What selective ``core_attn`` recompute frees: the core attention's own saved tensors beyond its inputs
    (Q, K, V stay saved as the checkpoint's inputs): the fp32 softmax statistics, ``4 x tokens x heads / tp``, and
    the attention output where no later GEMM keeps it: under TE in bf16 the output projection saves that very
    tensor as its input (nothing more freed); in fp8 the projection keeps its own quantised copy, so the bf16 output
    goes (``+ 2 x tokens x ctx_dim / tp``); without TE one of the two output copies goes (the same). Megatron-core
    ``Attention._checkpointed_attention_forward`` (``tensor_parallel.checkpoint`` of the core attention)."""
    m = c.dims
    tp = col(c.tp)
    frees_output = c.quantized or not c.options.te_attention
    return (BF16_BYTES * m.ctx_dim if frees_output else 0.0) * c.tokens / tp + FP32_BYTES * c.tokens * m.heads / tp


def norm_bytes(c: TableContext) -> Array:
    """One norm's output (or input), ``2 x tokens x h / tp``: the unit of what selective ``layernorm`` recompute
    frees (Korthikanti: "layer norms 4sbh" for the two)."""
    return BF16_BYTES * c.tokens * c.dims.h / col(c.tp)


def input_norm_separate(c: TableContext) -> bool:
    """The attention's input norm is a module of its own, which selective ``layernorm`` recompute can discard
    (megatron-core ``TransformerLayer.__init__``: only a norm that is not an ``IdentityOp``): without TE (the local
    spec builds it); under TE only for MLA (a ``TENorm`` before the plain down-projections); GQA under TE fuses it
    into the QKV GEMM (``TELayerNormColumnParallelLinear``, ``get_gpt_layer_with_transformer_engine_spec``)."""
    return not c.options.te_attention or c.dims.is_mla


def pre_mlp_norm_separate(c: TableContext, moe_layer: bool) -> bool:
    """The pre-MLP norm is a module of its own: without TE always; under TE in MoE layers (``TENorm``), while dense
    layers fuse it into fc1 (``TELayerNormColumnParallelLinear``)."""
    return not c.options.te_attention or moe_layer


def expert_bytes(c: TableContext, copies: Array) -> Array:
    """Routed experts, bytes ``(n, 1)`` (0 for a dense model): per token copy (``copies``) ``g x h + 2 x (mats - 1) x f
    + g x f (+ 2 x 3 x f unfused)``, f = ``moe_ffn / etp``, g the saved GEMM-input bytes: fc1's input
    (:data:`EXPERT_HIDDEN_TENSORS`), fc1's output in bf16, fc2's input and, with ``bias_activation_fusion`` off,
    :data:`UNFUSED_EXPERT_ACTIVATION_TENSORS` more (megatron-core ``TEGroupedMLP.forward``; **measured** on H200 with
    TE)."""
    m = c.dims
    if not m.is_moe:
        return np.zeros_like(c.tokens)
    f = m.moe_ffn / col(c.etp)
    g = c.saved_gemm_input_bytes
    per_copy = EXPERT_HIDDEN_TENSORS * g * m.h + BF16_BYTES * (m.mlp_matrices - 1) * f + g * f
    return copies * (per_copy + expert_activation_internals(c) * f)


def expert_activation_internals(c: TableContext) -> float:
    """Bytes per element of expert width that the unfused probability-weighted activation keeps:
    ``2 x`` :data:`UNFUSED_EXPERT_ACTIVATION_TENSORS` (gated) or ``2 x 1`` (non-gated: the weighted product) with
    ``bias_activation_fusion`` off; 0 fused (GPT-OSS's quick-GEGLU always is: ``ModelDims.fused_activation``).

    Returns: Bytes per element (a scalar)."""
    if c.options.bias_activation_fusion or c.dims.fused_activation:
        return 0.0
    return BF16_BYTES * (UNFUSED_EXPERT_ACTIVATION_TENSORS if c.dims.gated else 1.0)


def expert_activation_fn_bytes(c: TableContext, copies: Array) -> Array:
    """What selective ``moe_act`` recompute frees: the activation's output, fc2's input (``g x f`` per copy; in fp8
    fc2 then saves its original input, which is discarded, ``set_save_original_input``) and the unfused
    activation's own tensors (the activation runs under ``CheckpointWithoutOutput``, megatron-core
    ``TEGroupedMLP``): ``copies x f x (g + internals)``.

    Returns: Bytes, ``(n, 1)``; 0 for a dense model."""
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    f = c.dims.moe_ffn / col(c.etp)
    return copies * f * (c.saved_gemm_input_bytes + expert_activation_internals(c))


def router_bytes(c: TableContext) -> Array:
    """The router's logits and the permutation's routing map: ``tokens x E / tp x``
    :data:`ROUTER_BYTES_PER_TOKEN_EXPERT` (measured).

    Returns: Bytes, ``(n, 1)``; 0 for a dense model."""
    m = c.dims
    if not m.is_moe:
        return np.zeros_like(c.tokens)
    return ROUTER_BYTES_PER_TOKEN_EXPERT * c.tokens * m.experts / col(c.tp)


def _mlp_bytes_per_token(c: TableContext, width: Array | float) -> Array | float:
    """A dense-style MLP of ``width`` (already split by TP) per token: fc1's output in bf16 (``(mats - 1) x width``),
    fc2's input at the saved GEMM-input bytes and, unfused and gated, :data:`UNFUSED_DENSE_ACTIVATION_TENSORS`."""
    m = c.dims
    unfused = 0.0 if (c.options.bias_activation_fusion or m.fused_activation
                      or not m.gated) else UNFUSED_DENSE_ACTIVATION_TENSORS
    return (BF16_BYTES * (m.mlp_matrices - 1 + unfused) + c.saved_gemm_input_bytes) * width


def shared_expert_bytes(c: TableContext) -> Array:
    """Shared experts (a dense MLP of width ``shared_ffn`` split by TP), bytes: fc1's output (``(mats - 1) x
    shared_ffn`` bf16), fc2's input (g) and, in a quantised run, fc1's own quantised copy of its input (the norm's
    output, kept in bf16 by the router): ``tokens / tp x (2 (mats - 1) sf + g sf [+ g h])`` (Korthikanti's MLP
    ``16sbh`` at f = 4h, non-gated, bf16).

    Returns: Bytes, ``(n, 1)``; 0 without shared experts."""
    m = c.dims
    if not m.shared_ffn:
        return np.zeros_like(c.tokens)
    own_input = c.saved_gemm_input_bytes * m.h if c.quantized else 0.0
    return c.tokens / col(c.tp) * (_mlp_bytes_per_token(c, m.shared_ffn) + own_input)


def dense_mlp_bytes(c: TableContext) -> Array:
    """A dense MLP's fc1 output (bf16) and fc2 input (g): ``tokens / tp x (2 (mats - 1) + g) x ffn`` (Korthikanti §4.1
    "MLP": 8sbh + 8sbh at f = 4h with 2 matrices in bf16), plus the unfused SwiGLU's SiLU output."""
    m = c.dims
    return c.tokens / col(c.tp) * _mlp_bytes_per_token(c, m.ffn)


def moe_block_bytes(c: TableContext, copies: Array) -> Array:
    """A MoE layer's MLP side: the pre-MLP norm's input and output (the output, in bf16, is the router's input:
    measured), the router, the routed experts and the shared experts."""
    return norm_bytes(c) + layer_input_bytes(c) + router_bytes(c) + expert_bytes(c, copies) + shared_expert_bytes(c)


def dense_block_bytes(c: TableContext) -> Array:
    """A dense layer's MLP side: the norm's input (bf16), its output (fc1's input: bf16, quantised in fp8 under TE)
    and the MLP (Korthikanti's "MLP 19sbh" less its dropout mask, with half of "layer norms 4sbh")."""
    g = c.saved_gemm_input_bytes
    return norm_bytes(c) + g / BF16_BYTES * layer_input_bytes(c) + dense_mlp_bytes(c)


def saved_attention_bytes(c: TableContext) -> Array:
    """Bytes selective recompute frees in the attention side of every layer: :func:`core_attention_bytes` with
    ``core_attn``; the input norm's output with ``layernorm`` where the norm is a module of its own
    (:func:`input_norm_separate`); the expanded Q, K, V with ``mla_up_proj`` (``expanded_qkv_dim`` in bf16;
    megatron-core multi_latent_attention.py ``recompute_up_proj``)."""
    norm = norm_bytes(c) if input_norm_separate(c) else np.zeros_like(c.tokens)
    up = BF16_BYTES * c.tokens * c.dims.expanded_qkv_dim / col(c.tp)
    return (np.where(c.recomputes("core_attn"), core_attention_bytes(c), 0)
            + np.where(c.recomputes("layernorm"), norm, 0)
            + np.where(c.recomputes("mla_up_proj"), up, 0))


def saved_moe_bytes(c: TableContext, moe_block: Array, copies: Array) -> Array:
    """Bytes selective recompute frees in a MoE layer's MLP side: with ``moe`` everything inside the MoE layer
    (router, experts, shared experts; its input, the norm's output, stays as the checkpoint's input,
    megatron-core moe_layer.py); else with ``moe_act`` :func:`expert_activation_fn_bytes`, plus with
    ``shared_experts`` the shared experts; with ``layernorm`` the pre-MLP norm's output (a ``TENorm`` in MoE layers).

    Args: moe_block: :func:`moe_block_bytes`, ``(n, 1)``; copies: :func:`routed_token_copies`, ``(n, 1)``."""
    whole = moe_block - layer_input_bytes(c) - norm_bytes(c)
    saved = np.where(c.recomputes("moe"), whole, np.where(c.recomputes("moe_act"),
                                                          expert_activation_fn_bytes(c, copies), 0))
    saved = saved + np.where(c.recomputes("shared_experts") & ~c.recomputes("moe"), shared_expert_bytes(c), 0)
    norm = norm_bytes(c) if pre_mlp_norm_separate(c, True) else np.zeros_like(c.tokens)
    return saved + np.where(c.recomputes("layernorm"), norm, 0)


def saved_dense_bytes(c: TableContext, dense_block: Array) -> Array:
    """Bytes selective recompute frees in a dense layer's MLP side: with ``mlp`` the block but its input (under TE
    the checkpointed MLP includes its fused norm, so only the norm's input, the residual, stays; without TE the
    norm's output stays too); with ``layernorm`` (and not ``mlp``) the norm's output where the norm is a module
    (:func:`pre_mlp_norm_separate`). ``mlp`` does nothing in MoE layers (``TransformerLayer.__init__``).

    Args: dense_block: :func:`dense_block_bytes`, ``(n, 1)``."""
    separate = pre_mlp_norm_separate(c, False)
    kept = norm_bytes(c) + (layer_input_bytes(c) if separate else np.zeros_like(c.tokens))
    norm = norm_bytes(c) if separate else np.zeros_like(c.tokens)
    return np.where(c.recomputes("mlp"), dense_block - kept, np.where(c.recomputes("layernorm"), norm, 0))


def kept_bytes(full_layer: Array, saved_attention: Array, saved_mlp: Array) -> Array:
    """A layer's activations under selective recompute (or none): ``full layer - saved attention - saved MLP side``.

    Args: full_layer: the layer without recompute (attention + MLP side), ``(n, 1)``; saved_attention:
    :func:`saved_attention_bytes`, ``(n, 1)``; saved_mlp: :func:`saved_moe_bytes` or :func:`saved_dense_bytes`, ``(n,
    1)``."""
    return full_layer - saved_attention - saved_mlp


def recomputed_fraction(c: TableContext) -> Array:
    """Share of a rank's layers that block recompute recomputes: ``block layers / layers`` (the first
    ``recompute_num_layers`` of every chunk, :attr:`RankArrays.block_layers`).

    Returns: A fraction in [0, 1], ``(n, K)``."""
    return np.where(c.layers > 0, c.block_layers / np.maximum(c.layers, 1), 0.0)


def stored_layer_bytes(c: TableContext, layer_input: Array, kept: Array, fraction: Array) -> Array:
    """Activations a layer keeps between its forward and backward, bytes per layer ``(n, K)``, from ``layer_input``
    (:func:`layer_input_bytes`), ``kept`` (the bytes under selective / no recompute) and ``fraction``
    (:func:`recomputed_fraction`): full uniform keeps ``layer input / recompute_num_layers`` per layer (Korthikanti:
    2sbh per checkpoint); full block ``fraction x input + (1 - fraction) x kept``; selective or none ``kept``."""
    block = fraction * layer_input + (1 - fraction) * kept
    return np.where(c.full, np.where(c.uniform, layer_input / c.recompute_num_layers, block), kept)


def rank_activation_bytes(c: TableContext, stored_moe: Array, stored_dense: Array) -> Array:
    """One micro-batch through all of a rank's layers: ``moe_layers x stored_moe + dense_layers x stored_dense``.

    Returns: Bytes, ``(n, K)``."""
    return c.moe_layers * stored_moe + c.dense_layers * stored_dense
