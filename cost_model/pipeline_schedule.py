"""Megatron's pipeline schedules, event by event: the order each pipeline rank runs its forward and
backward chunks in, and a dependency simulation that times them.

The order is Megatron-core's (``megatron/core/pipeline_parallel/schedules.py`` at NVIDIA/Megatron-LM
d98e8a6): ``forward_backward_pipelining_without_interleaving`` runs ``pp - rank - 1`` warm-up
forwards, then one forward and one backward per step (1F1B), then the remaining backwards;
``forward_backward_pipelining_with_interleaving`` runs ``(pp - rank - 1) * 2 + (vpp - 1) * group``
warm-up forwards (``get_pp_rank_microbatches``; ``group`` is ``microbatch_group_size_per_vp_stage``,
default ``pp``), and maps the k-th virtual micro-batch to (micro-batch, model chunk) through
``get_schedule_table`` (backward chunks in reverse: ``vpp - 1 - chunk``). Chunk ``c`` of rank ``r`` is
pipeline stage ``c * pp + r`` (Megatron's VPP-major layer assignment).

The simulation is a list schedule: each rank runs its operations in that order, one at a time; a
forward of stage ``s`` waits for the forward of the same micro-batch on stage ``s - 1`` (plus the
p2p transfer), a backward of stage ``s`` for the backward on stage ``s + 1`` (the last stage: for its
own forward). With the same chunk time on every rank it reproduces the bubble of Narayanan et al.
2021 (arXiv 2104.04473 §2.2): ``(pp - 1) / vpp`` micro-batch times, i.e. a step of
``(M + (pp - 1) / vpp) * (t_f + t_b)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from specs.errors import TunerError

__all__ = ["Pass", "PipelineOp", "ScheduledOp", "megatron_order", "schedule_table", "simulate_pipeline", "stage_of", "warmup_microbatches"]


class Pass(str, Enum):
    """Forward or backward pass of one chunk of one micro-batch."""

    forward = "F"
    backward = "B"


@dataclass(frozen=True, slots=True)
class PipelineOp:
    """One operation in a rank's order."""

    kind: Pass
    microbatch: int
    """Micro-batch index, 0 .. M-1."""
    chunk: int
    """Model chunk (virtual stage) index on this rank, 0 .. vpp-1."""


@dataclass(frozen=True, slots=True)
class ScheduledOp:
    """An operation with its simulated start and end (seconds from the step's start)."""

    rank: int
    op: PipelineOp
    start_s: float
    end_s: float


def warmup_microbatches(pp: int, rank: int, vpp: int, num_microbatches: int, group: int | None = None) -> int:
    """Warm-up forwards of ``rank`` before its first backward (Megatron ``get_pp_rank_microbatches``).

    1F1B (vpp 1): ``pp - rank - 1``; interleaved: ``(pp - rank - 1) * 2 + (vpp - 1) * group``; both capped
    at the rank's ``num_microbatches * vpp`` chunk forwards.

    Args:
        pp: pipeline-parallel size; rank: pipeline rank 0 .. pp-1; vpp: chunks per rank;
        num_microbatches: M per step per DP rank; group: ``microbatch_group_size_per_vp_stage`` (default pp).

    Returns:
        A count of chunk forwards (>= 0).
    """
    total = num_microbatches * vpp
    if pp == 1:
        return 0
    if vpp == 1:
        w = pp - rank - 1
    else:
        w = (pp - rank - 1) * 2 + (vpp - 1) * (group if group is not None else pp)
    return min(w, total)


def schedule_table(num_microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch, in order (Megatron ``get_schedule_table``):
    micro-batches go in groups of ``group``; within a group every chunk runs the group's micro-batches
    before the next chunk; the last group takes what is left."""
    table: list[tuple[int, int]] = []
    for lo in range(0, num_microbatches, group):
        hi = num_microbatches if lo + group >= num_microbatches else lo + group
        table.extend((mb, c) for c in range(vpp) for mb in range(lo, hi))
    return table


def megatron_order(pp: int, rank: int, vpp: int, num_microbatches: int, group: int | None = None) -> list[PipelineOp]:
    """The forward / backward operations of one pipeline rank in Megatron's order.

    Returns:
        ``2 * num_microbatches * vpp`` operations: warm-up forwards, then alternating forward and
        backward (1F1B), then the cool-down backwards.

    Raises:
        TunerError: sizes < 1, a rank outside the pipeline, or an interleaved schedule with fewer
            micro-batches than the pipeline size (Megatron refuses it too).
    """
    if pp < 1 or vpp < 1 or num_microbatches < 1 or not 0 <= rank < pp:
        raise TunerError(f"pipeline schedule: pp {pp}, vpp {vpp}, rank {rank}, micro-batches {num_microbatches} are not a valid pipeline")
    g = pp if group is None else group
    if vpp > 1 and (num_microbatches < pp or g < pp):
        raise TunerError(f"interleaved schedule: {num_microbatches} micro-batches per step with pp {pp}; Megatron needs at least pp")
    table = schedule_table(num_microbatches, vpp, g) if vpp > 1 else [(mb, 0) for mb in range(num_microbatches)]
    total = len(table)

    def fwd(k: int) -> PipelineOp:
        mb, c = table[k]
        return PipelineOp(Pass.forward, mb, c)

    def bwd(k: int) -> PipelineOp:
        mb, c = table[k]
        return PipelineOp(Pass.backward, mb, vpp - 1 - c)

    w = warmup_microbatches(pp, rank, vpp, num_microbatches, g)
    ops = [fwd(k) for k in range(w)]
    for i in range(total - w):
        ops.append(fwd(w + i))
        ops.append(bwd(i))
    ops.extend(bwd(k) for k in range(total - w, total))
    return ops


def stage_of(op: PipelineOp, rank: int, pp: int) -> int:
    """Pipeline stage of ``op`` on ``rank``: chunk * pp + rank (VPP-major)."""
    return op.chunk * pp + rank


def simulate_pipeline(
    pp: int,
    vpp: int,
    num_microbatches: int,
    forward_s: list[list[float]],
    backward_s: list[list[float]],
    *,
    p2p_s: float = 0.0,
    group: int | None = None,
) -> list[ScheduledOp]:
    """Time every rank's operations in Megatron's order.

    Args:
        pp, vpp, num_microbatches: the schedule.
        forward_s: ``forward_s[rank][chunk]``, seconds of one micro-batch's forward of that chunk.
        backward_s: the same for the backward (recompute included).
        p2p_s: seconds from the end of an operation to the start of the dependent one on the next
            (forward) or previous (backward) stage: the activation / gradient transfer (0: overlapped).
        group: ``microbatch_group_size_per_vp_stage`` (default pp).

    Returns:
        Every operation with its start and end (seconds), rank by rank in execution order.

    Raises:
        TunerError: bad sizes (see :func:`megatron_order`) or duration tables of the wrong shape.
    """
    if len(forward_s) != pp or len(backward_s) != pp or any(len(x) != vpp for x in (*forward_s, *backward_s)):
        raise TunerError(f"pipeline simulation: durations must be pp x vpp = {pp} x {vpp} tables")
    orders = [megatron_order(pp, r, vpp, num_microbatches, group) for r in range(pp)]
    n_stages = pp * vpp
    done_f: dict[tuple[int, int], float] = {}  # (micro-batch, stage) -> end of its forward
    done_b: dict[tuple[int, int], float] = {}
    nxt = [0] * pp
    free = [0.0] * pp
    out: list[list[ScheduledOp]] = [[] for _ in range(pp)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while nxt[r] < len(orders[r]):
                op = orders[r][nxt[r]]
                s = stage_of(op, r, pp)
                if op.kind is Pass.forward:
                    dep = done_f.get((op.microbatch, s - 1)) if s > 0 else 0.0
                    lag = p2p_s if s > 0 else 0.0
                    dur = forward_s[r][op.chunk]
                else:
                    if s == n_stages - 1:
                        dep, lag = done_f.get((op.microbatch, s)), 0.0
                    else:
                        dep, lag = done_b.get((op.microbatch, s + 1)), p2p_s
                    dur = backward_s[r][op.chunk]
                if dep is None:
                    break  # waits for another rank
                start = max(free[r], dep + lag)
                end = start + dur
                (done_f if op.kind is Pass.forward else done_b)[(op.microbatch, s)] = end
                free[r] = end
                out[r].append(ScheduledOp(rank=r, op=op, start_s=start, end_s=end))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # a Megatron order never deadlocks; guard against a bad table
            raise TunerError(f"pipeline simulation: the schedule deadlocked (pp {pp}, vpp {vpp}, M {num_microbatches})")
    return [op for rank_ops in out for op in rank_ops]
