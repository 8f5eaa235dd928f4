"""Recompute time: the extra forward of what each recompute choice re-runs in backward, with its communication.

Selective recompute re-runs the listed ``--recompute-modules``; full recompute re-runs whole layers (every layer with
``uniform``, the first ``recompute_num_layers`` of each chunk with ``block``; megatron-core transformer_block.py /
transformer_layer.py). A forward is ``1 / (1 + elementwise_backward_ratio)`` of a layer's memory-bound time and half of
its TP collectives (:data:`cost_model.terms.comm.SP_COLLECTIVES_PER_BLOCK` are two forward, two backward). Arguments are
the per-layer times of :mod:`cost_model.terms.compute` and :mod:`cost_model.terms.comm`, ``(n, 1)``; results are seconds
per layer per micro-batch."""

from __future__ import annotations

import numpy as np

from cost_model.terms import compute
from cost_model.terms.context import Array, TableContext

#: The forward's share of a block's TP collectives (all-gather + reduce-scatter of the four).
FORWARD_TP_SHARE = 0.5


def _forward_share(c: TableContext) -> float:
    """``1 + elementwise_backward_ratio``: a memory-bound time over its forward part."""
    return 1.0 + c.cal.elementwise_backward_ratio


def attention_forward_time(c: TableContext, linear: Array, core: Array, elementwise: Array, tp: Array,
                           unfused_rope: Array | float = 0.0) -> Array:
    """One forward of a layer's attention side: projections + core attention's forward
    (:func:`cost_model.terms.compute.attention_forward_time`, its measured share) + the forward share of its
    memory-bound work + its forward TP collectives + the forward share of MLA's unfused RoPE.

    Args: unfused_rope: :func:`cost_model.terms.compute.mla_unfused_rope_time` (forward + backward), ``(n, 1)``; its
    ``unfused_mla_rope_forward_share`` is the forward's.

    Returns: Seconds, ``(n, 1)``."""
    return (linear + compute.attention_forward_time(core) + elementwise / _forward_share(c) + tp * FORWARD_TP_SHARE
            + unfused_rope * c.cal.unfused_mla_rope_forward_share)


def moe_forward_time(c: TableContext, experts: Array, router: Array, shared: Array, elementwise: Array, tp: Array,
                     ep_forward: Array) -> Array:
    """One forward of a MoE layer's MLP side: experts + router + shared experts + the forward share of the
    MoE memory-bound work + forward TP collectives + the forward EP time (all-to-alls and fixed costs).

    Returns: Seconds, ``(n, 1)``."""
    return experts + router + shared + elementwise / _forward_share(c) + tp * FORWARD_TP_SHARE + ep_forward


def dense_forward_time(c: TableContext, mlp: Array, attention_elementwise: Array, tp: Array) -> Array:
    """One forward of a dense layer's MLP side: the MLP + the forward share of its memory-bound work
    (``dense_mlp_elementwise_share`` of the attention side's) + forward TP collectives.

    Returns: Seconds, ``(n, 1)``."""
    return mlp + attention_elementwise * c.cal.dense_mlp_elementwise_share / _forward_share(c) + tp * FORWARD_TP_SHARE


def selective_attention_time(c: TableContext, core: Array, attention_elementwise: Array, up_projection: Array,
                             unfused_rope: Array | float = 0.0) -> Array:
    """Selective recompute in the attention side: core attention's forward (``core_attn``,
    :func:`cost_model.terms.compute.attention_forward_time`), the norms' (``layernorm``: ``norm_elementwise_share`` of
    the attention side's memory-bound forward) and MLA's ``up_projection`` (``mla_up_proj``) with the forward share of
    the ``unfused_rope`` (megatron-core checkpoints them together: multi_latent_attention.py
    ``qkv_up_proj_and_rope_apply``)."""
    norms = attention_elementwise * c.cal.norm_elementwise_share / _forward_share(c)
    return (np.where(c.recomputes("core_attn"), compute.attention_forward_time(core), 0)
            + np.where(c.recomputes("layernorm"), norms, 0)
            + np.where(c.recomputes("mla_up_proj"), up_projection + unfused_rope * c.cal.unfused_mla_rope_forward_share,
                       0))


def selective_moe_time(c: TableContext, moe_forward: Array, moe_elementwise: Array, shared: Array) -> Array:
    """Selective recompute in a MoE layer's MLP side: the whole forward with ``moe``; else with ``moe_act``
    the activation's forward (``moe_act_elementwise_share`` of the MoE memory-bound forward); plus with
    ``shared_experts`` (and not ``moe``) the shared experts.

    Returns: Seconds, ``(n, 1)``."""
    act = moe_elementwise * c.cal.moe_act_elementwise_share / _forward_share(c)
    t = np.where(c.recomputes("moe"), moe_forward, np.where(c.recomputes("moe_act"), act, 0))
    return t + np.where(c.recomputes("shared_experts") & ~c.recomputes("moe"), shared, 0)


def selective_dense_time(c: TableContext, dense_forward: Array) -> Array:
    """Selective ``mlp`` recompute in a dense layer: the MLP side's forward.

    Returns: Seconds, ``(n, 1)``."""
    return np.where(c.recomputes("mlp"), dense_forward, 0)


def full_recompute_share(c: TableContext, fraction: Array) -> Array:
    """Share of a rank's layers re-run by full recompute: all with ``uniform``, ``fraction`` with ``block``
    (:func:`cost_model.terms.activations.recomputed_fraction`).

    Returns: A fraction, ``(n, K)``."""
    return np.where(c.uniform, 1.0, fraction)


def recompute_moe_time(c: TableContext, share: Array, attention_forward: Array, moe_forward: Array,
                       selective: Array) -> Array:
    """Recompute per MoE layer: ``share x (attention + MoE forward)`` under full recompute, else the
    selective time (attention side + MLP side).

    Returns: Seconds, ``(n, K)``."""
    return np.where(c.full, share * (attention_forward + moe_forward), selective)


def recompute_dense_time(c: TableContext, share: Array, attention_forward: Array, dense_forward: Array,
                         selective: Array) -> Array:
    """Recompute per dense layer, as :func:`recompute_moe_time` with the dense MLP side.

    Returns: Seconds, ``(n, K)``."""
    return np.where(c.full, share * (attention_forward + dense_forward), selective)
