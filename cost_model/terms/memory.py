"""Dynamic memory per GPU beyond the model states: activations in flight, logits, dispatcher buffers,
framework overhead.

Per-layer activation bytes come from :mod:`cost_model.terms.activations`, in-flight micro-batches
from :mod:`cost_model.terms.schedule`. Results are bytes, ``(n, K)`` (per pipeline-rank class).
"""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES

__all__ = [
    "activation_bytes",
    "dispatcher_buffer_bytes",
    "embedding_activation_bytes",
    "framework_overhead_bytes",
    "logits_bytes",
    "process_groups",
    "working_set_bytes",
]

#: Dispatched-token buffers of the alltoall / allgather dispatchers per routed copy, hidden-size
#: bf16: the permuted tokens sent and the tokens received (token_dispatcher.py).
PERMUTED_TOKEN_BUFFERS = 2.0


def embedding_activation_bytes(c: TableContext, inflight: Array) -> Array:
    """The embedding's output kept on rank 0 for each in-flight micro-batch: ``2 x tokens x h / tp x inflight``.

    Args:
        inflight: :func:`cost_model.terms.schedule.inflight_microbatches`, ``(n, K)``.

    Returns:
        Bytes, ``(n, K)``; 0 on other ranks.
    """
    return c.is_first * BF16_BYTES * c.tokens * c.dims.h / col(c.tp) * inflight


def working_set_bytes(c: TableContext, full_moe: Array, full_dense: Array) -> Array:
    """Temporaries of the layer being run backward, beyond what is stored: under full recompute the
    ``recompute_num_layers`` layers of the group being recomputed, whole; otherwise
    ``backward_working_set_fraction`` of one layer (its activation gradients). The larger of a MoE
    and a dense layer, where the rank has that kind.

    Args:
        full_moe, full_dense: a MoE / dense layer's activations without recompute, ``(n, 1)``.

    Returns:
        Bytes, ``(n, K)``.
    """
    one_layer = np.maximum(full_moe * (c.moe_layers > 0), full_dense * (c.dense_layers > 0))
    return np.where(c.full, c.recompute_num_layers * one_layer, one_layer * c.cal.backward_working_set_fraction)


def activation_bytes(c: TableContext, per_rank: Array, inflight: Array, embedding: Array, working_set: Array) -> Array:
    """Peak activation memory of a rank: one micro-batch through its layers x in-flight micro-batches,
    plus the embedding outputs and the backward working set.

    Args:
        per_rank: :func:`cost_model.terms.activations.rank_activation_bytes`, ``(n, K)``.
        inflight: in-flight micro-batches, ``(n, K)``.
        embedding: :func:`embedding_activation_bytes`, ``(n, K)``.
        working_set: :func:`working_set_bytes`, ``(n, K)``.

    Returns:
        Bytes, ``(n, K)``; 0 in padding columns.
    """
    return (per_rank * inflight + embedding + working_set) * c.live


def logits_bytes(c: TableContext) -> Array:
    """The last rank's logits: ``logits_bytes_per_element x tokens x V / tp x (1 + mtp)`` (the main head
    and each MTP head; megatron/core/tensor_parallel/cross_entropy.py keeps the fp32 softmax).

    Returns:
        Bytes, ``(n, K)``; 0 on other ranks.
    """
    m = c.dims
    return c.is_last * c.cal.logits_bytes_per_element * c.tokens * m.vocab / col(c.tp) * (1 + m.mtp)


def dispatcher_buffer_bytes(c: TableContext, copies: Array) -> Array:
    """Token-dispatcher buffers on a rank with MoE layers: flex (DeepEP / HybridEP) keeps fixed
    communication buffers, ``flex_dispatcher_buffer_bytes``; alltoall / allgather
    :data:`PERMUTED_TOKEN_BUFFERS` x ``2 x copies x h``.

    Args:
        copies: routed token copies per GPU, ``(n, 1)``.

    Returns:
        Bytes, ``(n, K)``; 0 for a dense model, on ranks without MoE layers and in padding.
    """
    if not c.dims.is_moe:
        return np.zeros_like(c.layers)
    buf = np.where(c.flex, c.cal.flex_dispatcher_buffer_bytes, PERMUTED_TOKEN_BUFFERS * BF16_BYTES * copies * c.dims.h)
    return np.where(c.moe_layers > 0, buf, 0.0) * c.live


def process_groups(c: TableContext) -> Array:
    """NCCL communicators a rank holds: one per parallel dimension of size > 1 (tp, pp, cp, dp, ep, edp,
    etp) plus ``base_process_groups`` every rank has (megatron/core/parallel_state.py builds the
    groups; each holds NCCL buffers once used).

    Returns:
        A count, ``(n, 1)``.
    """
    n = (c.tp > 1).astype(float) + (c.pp > 1) + (c.cp > 1) + (c.dp > 1) + (c.ep > 1) + (c.edp > 1) + (c.etp > 1)
    return col(n + c.cal.base_process_groups)


def framework_overhead_bytes(c: TableContext, dynamic: Array) -> Array:
    """CUDA context and workspaces, NCCL buffers per communicator, and the caching allocator's
    fragmentation (``allocator_overhead_fraction`` of the dynamic memory).

    Args:
        dynamic: activations + logits + dispatcher buffers, ``(n, K)``.

    Returns:
        Bytes, ``(n, K)``; 0 in padding columns.
    """
    cal = c.cal
    return (cal.cuda_context_bytes + process_groups(c) * cal.nccl_bytes_per_communicator + cal.allocator_overhead_fraction * dynamic) * c.live
