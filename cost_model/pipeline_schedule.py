"""Megatron's pipeline schedules, event by event: the order each pipeline rank runs its forward and backward chunks in,
and a dependency simulation that times them.

The order is Megatron-core's (``megatron/core/pipeline_parallel/schedules.py`` at d98e8a6): 1F1B runs ``pp - rank - 1``
warm-up forwards, then one forward and one backward per step, then the remaining backwards; the interleaved schedule
runs ``(pp - rank - 1) * 2 + (vpp - 1) * group`` warm-up forwards (``group`` = ``microbatch_group_size_per_vp_stage``,
default ``pp``) and maps virtual micro-batches to (micro-batch, chunk) through ``get_schedule_table`` (backward chunks
in reverse). Chunk ``c`` of rank ``r`` is stage ``c * pp + r``.

The simulation is a list schedule: a forward of stage ``s`` waits for the same micro-batch's forward on ``s - 1`` (plus
the p2p transfer), a backward for the backward on ``s + 1``. With equal chunk times it reproduces the bubble of
Narayanan et al. 2021 (§2.2): a step of ``(M + (pp - 1) / vpp) * (t_f + t_b)``.

:func:`pipeline_makespan` needs only the step's end: past :data:`FULL_SIMULATION_MICROBATCHES` it simulates ``a`` and
``2a`` micro-batches (from ``a = 8 x pp``, with m's residue modulo the period) and extrapolates once both grow by the
same time per period, and by at least the slowest rank's busy time; otherwise it simulates all m
(``benchmarks/bench_pipeline_makespan.py``). :func:`simulate_pipeline` times every operation."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from specs.errors import TunerError


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
    """Warm-up chunk forwards of ``rank`` (0 .. pp-1) before its first backward (Megatron ``get_pp_rank_microbatches``):
    1F1B (vpp 1) ``pp - rank - 1``; interleaved ``(pp - rank - 1) * 2 + (vpp - 1) * group`` (``group``:
    ``microbatch_group_size_per_vp_stage``, default pp); both capped at the rank's ``num_microbatches * vpp``."""
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
    """The forward / backward operations of one pipeline rank in Megatron's order: ``2 * num_microbatches * vpp``
    operations, warm-up forwards, then alternating forward and backward (1F1B), then the cool-down backwards.

    Raises TunerError: sizes < 1, a rank outside the pipeline, or an interleaved schedule with fewer micro-batches than
    the pipeline size (Megatron refuses it too)."""
    g = _check_sizes(pp, rank, vpp, num_microbatches, group)
    return [PipelineOp(Pass.backward if b else Pass.forward, mb, c) for b, mb,
            c in _order(pp, rank, vpp, num_microbatches, g)]


def _check_sizes(pp: int, rank: int, vpp: int, num_microbatches: int, group: int | None) -> int:
    """The group size (default pp), once the sizes are checked (see :func:`megatron_order`)."""
    if pp < 1 or vpp < 1 or num_microbatches < 1 or not 0 <= rank < pp:
        raise TunerError(f"pipeline schedule: pp {pp}, vpp {vpp}, rank {rank}, micro-batches {num_microbatches} are "
                         "not a valid pipeline")
    g = pp if group is None else group
    if vpp > 1 and (num_microbatches < pp or g < pp):
        raise TunerError(f"interleaved schedule: {num_microbatches} micro-batches per step with pp {pp}; Megatron "
                         "needs at least pp")
    return g


def _order(pp: int, rank: int, vpp: int, num_microbatches: int, group: int) -> list[tuple[bool, int, int]]:
    """:func:`megatron_order` as (backward?, micro-batch, chunk) tuples (sizes already checked)."""
    table = schedule_table(num_microbatches, vpp, group) if vpp > 1 else [(mb, 0) for mb in range(num_microbatches)]
    total = len(table)
    fwd = [(False, mb, c) for mb, c in table]
    bwd = [(True, mb, vpp - 1 - c) for mb, c in table]
    w = warmup_microbatches(pp, rank, vpp, num_microbatches, group)
    ops = fwd[:w]
    for i in range(total - w):
        ops.append(fwd[w + i])
        ops.append(bwd[i])
    ops.extend(bwd[total - w:])
    return ops


@dataclass(frozen=True, slots=True)
class _Plan:
    """Every operation of one schedule in an order that respects its dependencies (flat lists, one entry each)."""

    ops: tuple[tuple[bool, int, int], ...]
    """(backward?, micro-batch, chunk) of each operation."""
    rank: tuple[int, ...]
    after: tuple[int, ...]
    """Index of the operation this one waits for on another stage (or its own forward, on the last stage); -1: none."""
    lagged: tuple[bool, ...]
    """The wait crosses a stage boundary (the p2p transfer applies)."""
    by_rank: tuple[tuple[int, ...], ...]
    """Indices of each rank's operations, in its execution order."""
    slot: tuple[int, ...]
    """Where the operation's duration is in the flat list of forward then backward ``[rank][chunk]`` seconds."""


#: Micro-batches per step up to which :func:`pipeline_makespan` simulates every one (the default workloads' steps are
#: below it, so their estimates are the full simulation's to the last digit).
FULL_SIMULATION_MICROBATCHES = 512
#: Operations of a schedule above which its plan is not kept in :func:`_plan`'s cache (a timeline of a large batch).
_CACHED_PLAN_OPS = 1 << 16
#: The first bounded simulation runs this many times pp micro-batches (the warm-up is at most about 2 x pp).
_FIRST_PERIODS = 8
#: Relative tolerance of "the same growth per period" (float rounding of sums of seconds).
_STEADY_RTOL = 1e-9


def _plan(pp: int, vpp: int, num_microbatches: int, group: int | None) -> _Plan:
    """:func:`_build_plan`, kept in a bounded cache for schedules of at most :data:`_CACHED_PLAN_OPS` operations."""
    if 2 * pp * vpp * num_microbatches <= _CACHED_PLAN_OPS:
        return _cached_plan(pp, vpp, num_microbatches, group)
    return _build_plan(pp, vpp, num_microbatches, group)


@lru_cache(maxsize=256)
def _cached_plan(pp: int, vpp: int, num_microbatches: int, group: int | None) -> _Plan:
    return _build_plan(pp, vpp, num_microbatches, group)


def _build_plan(pp: int, vpp: int, num_microbatches: int, group: int | None) -> _Plan:
    """The dependency structure of a schedule: a list schedule (each rank runs its operations in Megatron's order,
    one at a time, each once its dependency has run) visited rank by rank until every operation is placed; the
    visit order does not depend on the durations, so it is computed once per schedule.

    Raises TunerError: bad sizes (see :func:`megatron_order`), or an order that deadlocks (never for Megatron's)."""
    g = _check_sizes(pp, 0, vpp, num_microbatches, group)
    orders = [_order(pp, r, vpp, num_microbatches, g) for r in range(pp)]
    n_stages = pp * vpp
    last = n_stages - 1
    unplaced = -2
    placed_f = [unplaced] * (num_microbatches * n_stages)  # micro-batch * n_stages + stage -> index of its forward
    placed_b = [unplaced] * (num_microbatches * n_stages)
    nxt = [0] * pp
    ops: list[tuple[bool, int, int]] = []
    rank: list[int] = []
    after: list[int] = []
    lagged: list[bool] = []
    slot: list[int] = []
    by_rank: list[list[int]] = [[] for _ in range(pp)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            order, k, mine = orders[r], nxt[r], by_rank[r]
            while k < len(order):
                op = order[k]
                b, mb, c = op
                s = c * pp + r
                at = mb * n_stages + s
                if not b:
                    dep, lag = (placed_f[at - 1], True) if s > 0 else (-1, False)
                elif s == last:
                    dep, lag = placed_f[at], False
                else:
                    dep, lag = placed_b[at + 1], True
                if dep == unplaced:
                    break  # waits for another rank
                i = len(ops)
                (placed_b if b else placed_f)[at] = i
                ops.append(op)
                rank.append(r)
                after.append(dep)
                lagged.append(lag)
                slot.append((n_stages if b else 0) + r * vpp + c)
                mine.append(i)
                k += 1
            if k != nxt[r]:
                remaining -= k - nxt[r]
                nxt[r] = k
                progressed = True
        if not progressed:  # a Megatron order never deadlocks; guard against a bad table
            raise TunerError(f"pipeline simulation: the schedule deadlocked (pp {pp}, vpp {vpp}, M {num_microbatches})")
    return _Plan(ops=tuple(ops), rank=tuple(rank), after=tuple(after), lagged=tuple(lagged),
                 by_rank=tuple(tuple(x) for x in by_rank),
                 slot=tuple(slot))


def _times(plan: _Plan, forward_s: list[list[float]], backward_s: list[list[float]],
           p2p_s: float) -> tuple[list[float], list[float]]:
    """(start, end) seconds of every operation of ``plan``: an operation starts when its rank is free and its
    dependency has ended (plus ``p2p_s`` across a stage boundary)."""
    n = len(plan.ops)
    start = [0.0] * n
    end = [0.0] * n
    free = [0.0] * len(forward_s)
    dur = [x for row in forward_s for x in row] + [x for row in backward_s for x in row]
    for i, (r, dep, lag, k) in enumerate(zip(plan.rank, plan.after, plan.lagged, plan.slot)):
        t = free[r]
        if dep >= 0:
            ready = end[dep] + p2p_s if lag else end[dep]
            if ready > t:
                t = ready
        start[i] = t
        end[i] = free[r] = t + dur[k]
    return start, end


def simulate_pipeline(pp: int, vpp: int, num_microbatches: int, forward_s: list[list[float]],
                      backward_s: list[list[float]], *, p2p_s: float = 0.0,
                      group: int | None = None) -> list[ScheduledOp]:
    """Time every rank's operations in Megatron's order: every operation with its start and end (seconds), rank by rank
    in execution order. ``forward_s[rank][chunk]`` and ``backward_s`` (recompute included) are seconds of one
    micro-batch; ``p2p_s`` is the transfer from an operation to the dependent one on the next (forward) or previous
    (backward) stage (0: overlapped); ``group`` is ``microbatch_group_size_per_vp_stage`` (default pp).

    Raises TunerError: bad sizes (see :func:`megatron_order`)."""
    plan = _plan(pp, vpp, num_microbatches, group)
    start, end = _times(plan, forward_s, backward_s, p2p_s)
    kinds = (Pass.forward, Pass.backward)
    return [ScheduledOp(rank=r, op=PipelineOp(kinds[plan.ops[i][0]], plan.ops[i][1], plan.ops[i][2]), start_s=start[i],
                        end_s=end[i])
            for r, idx in enumerate(plan.by_rank) for i in idx]


def pipeline_makespan(pp: int, vpp: int, num_microbatches: int, forward_s: list[list[float]],
                      backward_s: list[list[float]], *, p2p_s: float = 0.0, group: int | None = None) -> float:
    """The end of the last operation of :func:`simulate_pipeline` (seconds from the step's start), without
    building its operation list; above :data:`FULL_SIMULATION_MICROBATCHES` micro-batches extrapolated from a
    bounded simulation once it is in its steady state (see the module's docstring).

    Raises TunerError: as :func:`simulate_pipeline`."""
    m = num_microbatches
    if m > FULL_SIMULATION_MICROBATCHES and pp > 1:
        period = 1 if vpp == 1 else (pp if group is None else group)
        # the slowest rank's busy time per period: a cycle of the schedule, so a lower bound of its growth
        slowest = period * max(sum(f) + sum(b) for f, b in zip(forward_s, backward_s))

        def at(k: int) -> tuple[int, float, float]:
            """k moved up to m's residue (the same last group), its makespan and the next period's growth."""
            k += (m - k) % period
            t = _makespan(pp, vpp, k, forward_s, backward_s, p2p_s, group)
            return k, t, _makespan(pp, vpp, k + period, forward_s, backward_s, p2p_s, group) - t

        a, ta, da = at(_FIRST_PERIODS * pp)
        while 2 * a + period <= m // 2:
            b, tb, db = at(2 * a)
            tol = _STEADY_RTOL * tb
            if db >= slowest - tol and abs(db - da) <= tol and abs((tb - ta) / ((b - a) // period) - db) <= tol:
                return tb + (m - b) // period * db
            a, ta, da = b, tb, db
    return _makespan(pp, vpp, m, forward_s, backward_s, p2p_s, group)


def _makespan(pp: int, vpp: int, m: int, forward_s: list[list[float]], backward_s: list[list[float]], p2p_s: float,
              group: int | None) -> float:
    _, end = _times(_plan(pp, vpp, m, group), forward_s, backward_s, p2p_s)
    return max(end)
