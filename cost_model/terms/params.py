"""Parameters per GPU: the dense (non-expert) weights and the routed experts a pipeline rank holds.

Source: Megatron's ``megatron/training/theoretical_memory_usage.py`` (EP-aware form since a7c9e8c4,
shared/notes/megatron_rules.md §6.1), applied to the real layers of each pipeline rank instead
of ``1/PP`` of the block. Every function returns elements (not bytes), shape ``(n, K)``."""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col

#: Weights of MTP's ``eh_proj`` per MTP layer, in units of h^2: it maps the concatenated
#: [embedding; hidden] (2h) to h (megatron/core/transformer/multi_token_prediction.py).
MTP_PROJECTION_H2 = 2.0


def decoder_layer_params(c: TableContext) -> Array:
    """Dense (non-expert) weights of the rank's decoder layers, per GPU.

    ``layers x (attn / tp + norms) + dense_layers x mlp / tp + moe_layers x (shared / tp + router)``: attention,
    dense-MLP and shared-expert matrices are split by TP; the pre-norms, QK / latent norms and the router are replicated
    (theoretical_memory_usage.py ``tp_sharded_block`` / ``replicated_block``)."""
    m = c.dims
    tp = col(c.tp)
    return (c.layers * (m.attention_params / tp + m.layer_norm_params)
            + c.dense_layers * (m.dense_mlp_params / tp)
            + c.moe_layers * (m.shared_expert_params / tp + m.router_params))


def embedding_params(c: TableContext) -> Array:
    """The input embedding on pipeline rank 0: ``V x h / tp`` (vocab-parallel).

    Returns: Elements, ``(n, K)`` (0 on other ranks)."""
    return c.is_first * c.dims.embedding_params / col(c.tp)


def output_layer_params(c: TableContext) -> Array:
    """The output layer and final norm on the last rank: ``V x h / tp + h``.

    With PP > 1 the last rank holds its own copy of the output weights even when they are tied
    (Megatron keeps the tied copy in sync through the embedding group); with PP = 1 a tied output
    layer is the embedding itself (0 more), an untied one another ``V x h / tp``.

    Returns: Elements, ``(n, K)`` (0 on other ranks)."""
    m = c.dims
    own_copy = np.where(col(c.pp) > 1, 1.0, 1.0 if m.untied_output else 0.0)
    return c.is_last * own_copy * m.embedding_params / col(c.tp) + c.is_last * m.h


def mtp_params(c: TableContext) -> Array:
    """The MTP layers on the last rank, each one decoder layer of the last layer's type (without its
    routed experts, counted by :func:`expert_params`) plus its ``eh_proj`` (2h x h), split by TP.

    Source: theoretical_memory_usage.py (MTP copies the type of the last layer, notes §6.1).

    Returns: Elements, ``(n, K)``; 0 without MTP and on other ranks."""
    m = c.dims
    if not m.mtp:
        return np.zeros_like(c.layers)
    mlp = m.shared_expert_params + m.router_params if m.last_layer_moe else m.dense_mlp_params
    layer = m.attention_params + m.layer_norm_params + MTP_PROJECTION_H2 * m.h * m.h + mlp
    return c.is_last * m.mtp * layer / col(c.tp)


def dense_params(c: TableContext) -> Array:
    """Every non-expert weight the GPU holds: decoder layers, embedding, output layer, MTP.

    Returns: Elements, ``(n, K)``; 0 in padding columns."""
    p = decoder_layer_params(c) + embedding_params(c) + output_layer_params(c) + mtp_params(c)
    return p * c.live


def expert_params(c: TableContext) -> Array:
    """Routed-expert weights per GPU: ``(moe_layers + mtp on the last rank if the last layer is MoE)
    x (E / ep) x expert / etp``.

    Each MoE layer's E experts are split over EP ranks, each expert's matrices over ETP
    (theoretical_memory_usage.py ``expert_block / (ETP x EP)``).

    Returns: Elements, ``(n, K)``; 0 for a dense model and in padding columns."""
    m = c.dims
    if not m.is_moe:
        return np.zeros_like(c.layers)
    layers = c.moe_layers + c.is_last * (m.mtp if m.last_layer_moe else 0.0)
    return layers * (m.experts / col(c.ep)) * (m.expert_params / col(c.etp)) * c.live
