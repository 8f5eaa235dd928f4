"""The pipeline schedule: in-flight micro-batches per rank, the step's pipeline time and bubble, and p2p.

Sources: Megatron's ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving`` / ``..._with_interleaving``: warm-up counts) and Narayanan et al.
2021 (arXiv 2104.04473 §2.2: the interleaved bubble is ``(pp - 1) / vpp`` micro-batch times)."""

from __future__ import annotations

import numpy as np

from cost_model.terms import comm
from cost_model.terms.context import Array, TableContext, col
from specs.units import BF16_BYTES

#: Guard against 0 / 0 when a row's mean time per micro-batch is 0 (seconds).
_TINY_SECONDS = 1e-30

#: Pipeline p2p transfers per micro-batch per chunk boundary: the activation forward and its
#: gradient backward (p2p_communication.py ``send_forward`` / ``send_backward``).
P2P_TRANSFERS_PER_BOUNDARY = 2.0


def inflight_1f1b(c: TableContext) -> Array:
    """Micro-batches whose activations rank r holds at its peak under 1F1B: ``min(pp - r, M)``.

    schedules.py ``forward_backward_pipelining_without_interleaving``: ``num_warmup_microbatches =
    min(pp - r - 1, M)`` forwards, then one more forward before the first backward.

    Returns: Micro-batches, ``(n, K)``."""
    return np.minimum(col(c.pp) - c.rank, col(c.micro_batches))


def inflight_interleaved(c: TableContext) -> Array:
    """Micro-batches' worth of activations rank r holds at its peak under the interleaved schedule, ``(n, K)``:
    ``min((pp - r - 1) x 2 + (vpp - 1) x pp + 1, M x vpp) / vpp`` (schedules.py
    ``forward_backward_pipelining_with_interleaving``'s warm-up plus one forward, each virtual micro-batch one chunk).
    Not modelled: with ``M == pp`` Megatron runs every forward first, and the extra warm-up of
    ``--overlap-moe-expert-parallel-comm``."""
    pp, vpp = col(c.pp), col(c.vpp)
    return np.minimum((pp - c.rank - 1) * 2 + (vpp - 1) * pp + 1, col(c.micro_batches) * vpp) / vpp


def inflight_microbatches(c: TableContext) -> Array:
    """:func:`inflight_interleaved` with VPP > 1, else :func:`inflight_1f1b`.

    Returns: Micro-batches, ``(n, K)``."""
    return np.where(col(c.vpp) > 1, inflight_interleaved(c), inflight_1f1b(c))


def slowest_rank_time(per_microbatch: Array) -> Array:
    """The slowest rank class's time per micro-batch (which paces the steady state).

    Args: per_microbatch: seconds per micro-batch per rank class (0 in padding), ``(n, K)``.

    Returns: Seconds, ``(n,)``."""
    out: Array = per_microbatch.max(axis=1)
    return out


def mean_rank_time(c: TableContext, per_microbatch: Array) -> Array:
    """Mean time per micro-batch over the pp ranks: ``sum_k count_k x t_k / pp``.

    Returns: Seconds, ``(n,)``."""
    total: Array = (per_microbatch * c.rank_count).sum(axis=1)
    return total / c.pp


def busy_time(c: TableContext, part: Array, mean: Array) -> Array:
    """Step time of one part of the per-micro-batch work (compute, recompute, TP / CP / EP
    communication): its share of the ranks' busy time ``M x mean``,
    ``M x mean x (sum_k count_k x part_k / pp) / mean``. The parts' busy times add up to ``M x mean``.

    Args: part: seconds per micro-batch per rank class, ``(n, K)``; mean: :func:`mean_rank_time` of all the parts
    together, ``(n,)``.

    Returns: Seconds per step, ``(n,)``."""
    ranks: Array = (part * c.live * c.rank_count).sum(axis=1)
    return (c.micro_batches * mean) * (ranks / c.pp / np.maximum(mean, _TINY_SECONDS))


def fill_drain_microbatches(c: TableContext) -> Array:
    """Micro-batch times spent filling and draining the pipeline: ``(pp - 1) / vpp`` (Narayanan et al.
    2021 §2.2: bubble fraction ``(pp - 1) / (m x vpp)``).

    Returns: Micro-batches, ``(n,)``."""
    return (c.pp - 1) / c.vpp


def bubble_time(c: TableContext, slowest: Array, mean: Array) -> Array:
    """Pipeline time not spent computing: ``M x slowest + fill/drain x mean - M x mean`` (the step runs M micro-batches
    at the slowest rank's pace plus the fill and drain; ``M x mean`` is each rank's busy time).

    Returns: Seconds per step, ``(n,)``."""
    m = c.micro_batches
    return m * slowest + fill_drain_microbatches(c) * mean - m * mean


def pp_p2p_bytes(c: TableContext) -> Array:
    """One pipeline send: the sequence-parallel shard of a micro-batch's activation, ``2 x mbs x s / cp x h / tp``.

    Returns: Bytes, ``(n,)``."""
    return BF16_BYTES * (c.mbs * c.seq / c.cp) * c.dims.h / c.tp


def pp_p2p_time(c: TableContext) -> Array:
    """Exposed pipeline p2p per step: :data:`P2P_TRANSFERS_PER_BOUNDARY` x M x vpp sends of :func:`pp_p2p_bytes`, over
    the network when a pipeline stage's ranks (``world / pp`` apart) leave the NVLink domain; ``1 - pp_p2p_overlap`` of
    it exposed with VPP (``overlap_p2p_comm``, on by default with interleaving), all of it without.

    Returns: Seconds per step, ``(n,)``; 0 without PP."""
    bw = comm.collective_bandwidth(c, (c.world / c.pp) >= c.nvlink_size)
    exposed = np.where(c.vpp > 1, 1 - c.cal.pp_p2p_overlap, 1.0)
    t = P2P_TRANSFERS_PER_BOUNDARY * c.micro_batches * c.vpp * pp_p2p_bytes(c) / bw * exposed
    return np.where(c.pp > 1, t, 0.0)
