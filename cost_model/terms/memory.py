"""Dynamic memory per GPU beyond the model states: activations in flight, logits, dispatcher buffers,
framework overhead.

Per-layer activation bytes come from :mod:`cost_model.terms.activations`, in-flight micro-batches
from :mod:`cost_model.terms.schedule`. Results are bytes, ``(n, K)`` (per pipeline-rank class)."""

from __future__ import annotations

import numpy as np

from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES

#: Dispatched-token buffers of the alltoall / allgather dispatchers per routed copy, hidden-size
#: bf16: the permuted tokens sent and the tokens received (token_dispatcher.py).
PERMUTED_TOKEN_BUFFERS = 2.0

#: Bytes per logit element with Transformer Engine's fused cross-entropy up to TE 2.17: the gradient is written in
#: place into the bf16 logits, which are kept (TE ``triton/cross_entropy.py`` returns ``loss, _input``;
#: ``cross_entropy.py`` ``ctx.save_for_backward(_input)``).
TE_CE_INPLACE_BYTES = 2.0

#: The same from TE 2.18 (commit 01bbe3ee), **measured** on 1 x H200 with TE 2.20.2: the bf16 logits and one bf16
#: logits-sized buffer, 4 B (the step's allocated peak fell by 2.0 B per logit against the native path's 6 B,
#: ``benchmarks/results/h200_te_2026-12-01/call15`` ``mm-base`` -> ``mm-ce-fusion``; the loss alone kept nothing more,
#: ``call20/ce.jsonl``).
TE_CE_BYTES_SINCE_2_18 = 2.0 + 2.0

#: TE version from which the fused cross-entropy no longer writes its gradient in place (TE 2.18, commit 01bbe3ee).
TE_CE_BYTES_CHANGED_IN = (2, 18)


def embedding_activation_bytes(c: TableContext, inflight: Array) -> Array:
    """The embedding's output kept on rank 0 for each in-flight micro-batch: ``2 x tokens x h / tp x inflight``.

    Args: inflight: :func:`cost_model.terms.schedule.inflight_microbatches`, ``(n, K)``.

    Returns: Bytes, ``(n, K)``; 0 on other ranks."""
    return c.is_first * BF16_BYTES * c.tokens * c.dims.h / col(c.tp) * inflight


def working_set_bytes(c: TableContext, full_moe: Array, full_dense: Array) -> Array:
    """Temporaries of the layer being run backward beyond what is stored, ``(n, K)``: under full uniform recompute the
    group of ``recompute_num_layers`` layers being recomputed, whole; under full block recompute one layer, whole (each
    is its own checkpoint, transformer_block.py ``_checkpointed_forward``); otherwise ``backward_working_set_fraction``
    of one layer. The larger of ``full_moe`` and ``full_dense`` (a layer's activations without recompute) where the rank
    has that kind."""
    one_layer = np.maximum(full_moe * (c.moe_layers > 0), full_dense * (c.dense_layers > 0))
    group = np.where(c.uniform, c.recompute_num_layers, 1.0)
    return np.where(c.full, group * one_layer, one_layer * c.cal.backward_working_set_fraction)


def offloaded_layers(c: TableContext) -> Array:
    """Layers of a rank whose saved activations ``--cpu-offloading-num-layers`` moves to host memory:
    ``min(N, layers)`` (megatron-core ``TransformerBlock`` offloads the first N layers of its block through
    ``get_cpu_offload_context``; Megatron-Bridge sets it with ``cpu_offloading_weights=False``).

    Returns: Layers, ``(n, K)``."""
    return np.minimum(float(c.options.cpu_offloading_num_layers), c.layers)


def offload_kept_bytes(c: TableContext, per_rank: Array) -> Array:
    """One micro-batch's activations a rank keeps on the GPU with activation offload: the layers not offloaded,
    ``per_rank x (1 - offloaded / layers)``, plus one offloaded layer's worth in transit (the copy to or from the
    host overlaps the next layer; its buffer is on the GPU). Without offload, ``per_rank``.

    Args: per_rank: :func:`cost_model.terms.activations.rank_activation_bytes`, ``(n, K)``."""
    off = offloaded_layers(c)
    per_layer = per_rank / np.maximum(c.layers, 1.0)
    return np.where(off > 0, per_rank - off * per_layer + per_layer, per_rank)


#: The Transformer Engine release from which megatron-core captures per-layer graphs with
#: ``make_graphed_callables(_reuse_graph_input_output_buffers=True)`` (NVIDIA/Megatron-LM ``d98e8a64``
#: ``megatron/core/transformer/cuda_graphs.py`` l.2683-2686, ``is_te_min_version("2.7.0")``).
TE_GRAPH_BUFFER_REUSE_SINCE = (2, 7)


def cuda_graph_buffer_bytes(c: TableContext, inflight: Array) -> Array:
    """Static buffers of per-layer CUDA graphs (``--cuda-graph-impl transformer_engine`` with a scope other than the
    whole iteration), bytes ``(n, K)``: ``cuda_graph_static_buffers x layer input x layers x inflight`` (TE
    ``make_graphed_callables`` keeps static inputs and outputs per callable and micro-batch). [inferred from TE's API;
    not measured]. From :data:`TE_GRAPH_BUFFER_REUSE_SINCE` on, a micro-batch's static inputs pass to the next forward
    once its backward is done (megatron-core ``_get_sample_arguments``; TE ``graph.py`` at ``d0067d0d`` l.303-371,
    880-887): the live inputs are the saved layer inputs the activations count, one buffer fewer. A whole-iteration
    graph replays in its own pool: 0, as without graphs."""
    opt = c.options
    if not opt.cuda_graph_scope or opt.cuda_graph_full:
        return np.zeros_like(c.layers)
    layer_input = BF16_BYTES * c.tokens * c.dims.h / col(c.tp)
    buffers = c.cal.cuda_graph_static_buffers
    if opt.te_version_tuple >= TE_GRAPH_BUFFER_REUSE_SINCE:
        buffers = max(buffers - 1.0, 0.0)
    return buffers * layer_input * c.layers * inflight * c.live


def a2a_overlap_extra_bytes(c: TableContext, full_moe: Array) -> Array:
    """What EP all-to-all overlap (``overlap_moe_expert_parallel_comm``) keeps on top of the schedule's activations,
    bytes ``(n, K)``: its combined 1F1B runs one micro-batch's forward layer with another's backward layer
    (``combined_1f1b.py``), the backward freeing a layer as the forward adds one, so the peak holds about one MoE layer
    more: ``full_moe`` (a MoE layer's activations without recompute) on ranks with MoE layers, else 0. [inferred from
    the schedule]"""
    if not c.options.overlap_moe_expert_parallel_comm or not c.dims.is_moe:
        return np.zeros_like(c.layers)
    return np.where(c.moe_layers > 0, full_moe, 0.0) * c.live


def activation_bytes(c: TableContext, per_rank: Array, inflight: Array, embedding: Array, working_set: Array) -> Array:
    """Peak activation memory of a rank, bytes ``(n, K)`` (0 in padding columns): ``per_rank`` (one micro-batch through
    its layers) x ``inflight`` micro-batches, plus the ``embedding`` outputs and the backward ``working_set``."""
    return (per_rank * inflight + embedding + working_set) * c.live


def logits_bytes_per_element(c: TableContext) -> float:
    """Bytes per logit element held on the last stage: Megatron's native cross-entropy keeps the fp32 softmax and
    the bf16 logits (``logits_bytes_per_element``, megatron/core/tensor_parallel/cross_entropy.py); TE's fused
    cross-entropy (``cross_entropy_fusion_impl te``) :data:`TE_CE_INPLACE_BYTES` up to TE 2.17 and
    :data:`TE_CE_BYTES_SINCE_2_18` (measured on TE 2.20.2) from TE 2.18 (:attr:`specs.RunOptions.te_version`).

    Returns: Bytes per element (a scalar)."""
    opt = c.options
    if not opt.te_cross_entropy:
        return c.cal.logits_bytes_per_element
    return TE_CE_BYTES_SINCE_2_18 if opt.te_version_tuple >= TE_CE_BYTES_CHANGED_IN else TE_CE_INPLACE_BYTES


def logits_bytes(c: TableContext) -> Array:
    """The last rank's logits: :func:`logits_bytes_per_element` ``x tokens x V / tp x (1 + mtp)`` (the main head
    and each MTP head).

    Returns: Bytes, ``(n, K)``; 0 on other ranks."""
    m = c.dims
    return c.is_last * logits_bytes_per_element(c) * c.tokens * m.vocab / col(c.tp) * (1 + m.mtp)


def dispatcher_buffer_bytes(c: TableContext, copies: Array) -> Array:
    """Token-dispatcher buffers on a rank with MoE layers: flex (DeepEP / HybridEP) keeps fixed communication buffers,
    ``flex_dispatcher_buffer_bytes``; alltoall / allgather :data:`PERMUTED_TOKEN_BUFFERS` x ``2 x copies x h``.

    Args: copies: routed token copies per GPU, ``(n, 1)``.

    Returns: Bytes, ``(n, K)``; 0 for a dense model, on ranks without MoE layers and in padding."""
    if not c.dims.is_moe:
        return np.zeros_like(c.layers)
    buf = np.where(c.flex, c.cal.flex_dispatcher_buffer_bytes, PERMUTED_TOKEN_BUFFERS * BF16_BYTES * copies * c.dims.h)
    return np.where(c.moe_layers > 0, buf, 0.0) * c.live


def process_groups(c: TableContext) -> Array:
    """NCCL communicators a rank holds: one per parallel dimension of size > 1 (tp, pp, cp, dp, ep, edp,
    etp) plus ``base_process_groups`` every rank has (megatron/core/parallel_state.py builds the
    groups; each holds NCCL buffers once used).

    Returns: A count, ``(n, 1)``."""
    n = (c.tp > 1).astype(float) + (c.pp > 1) + (c.cp > 1) + (c.dp > 1) + (c.ep > 1) + (c.edp > 1) + (c.etp > 1)
    return col(n + c.cal.base_process_groups)


def framework_overhead_bytes(c: TableContext, dynamic: Array) -> Array:
    """CUDA context and workspaces, NCCL buffers per communicator, and the caching allocator's
    fragmentation (``allocator_overhead_fraction`` of the dynamic memory).

    Args: dynamic: activations + logits + dispatcher buffers, ``(n, K)``.

    Returns: Bytes, ``(n, K)``; 0 in padding columns."""
    cal = c.cal
    return (cal.cuda_context_bytes + process_groups(c) * cal.nccl_bytes_per_communicator
            + cal.allocator_overhead_fraction * dynamic) * c.live
