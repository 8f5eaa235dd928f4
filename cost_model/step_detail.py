"""One layout's step in detail: forward and backward time per pipeline rank and virtual chunk, each split into its
parts, and the simulated pipeline that :func:`cost_model.estimate.estimate` and :mod:`cost_model.timeline` use.

The table (:func:`cost_model.estimate.estimate_table`) times the pipeline in closed form (``M x slowest + (pp - 1) / vpp
x mean``, Narayanan et al. 2021 §2.2). Here, per chunk, the estimate's composition (``per_microbatch``) is evaluated on
a context whose rank-class axis holds every (rank, chunk) (:func:`chunk_context`), scaled to add up to the rank's time
in the table; a chunk's forward is one forward pass of its layers (:mod:`cost_model.terms.recompute`'s forward
functions) plus the output layer's on the last stage, the backward the rest; and
:func:`cost_model.pipeline_schedule.simulate_pipeline` runs the chunks in Megatron's order, whose makespan equals the
closed form with equal chunks and is dependency-exact otherwise.

What the overlaps hide is the difference between the terms with the overlap constants at 0 and at their values
(:func:`no_overlap`). Units: seconds; ``[rank][chunk]`` tables are tuples of ``pp`` tuples of ``vpp`` floats."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cost_model.pipeline_schedule import ScheduledOp, pipeline_makespan, simulate_pipeline
from cost_model.terms import comm, compute, recompute
from cost_model.terms.context import Array, TableContext
from cost_model.types import Estimate
from search_spaces.pipeline import stage_layer_counts
from specs import ModelSpec
from specs.layout import Layout

#: The parts of a chunk's time (the estimate's per-micro-batch parts), in the order the timeline draws them.
CHUNK_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm")
#: Communication parts an overlap flag can hide behind compute.
HIDDEN_PARTS = ("tp_comm", "cp_comm", "ep_comm")
#: The parts of the step after the pipeline (the estimate's per-step parts), in time order.
TAIL_PARTS = ("pp_p2p", "dp_comm", "optimizer", "offload")

#: ``per_microbatch(context, routed_token_copies)``: seconds per micro-batch per rank class ``(n, K)`` of each
#: of :data:`CHUNK_PARTS` (the estimate's own composition, ``cost_model.estimate._time_per_microbatch``).
PerMicrobatch = Callable[[TableContext, Array], Mapping[str, Array]]

Table = tuple[tuple[float, ...], ...]


def chunk_layers(model: ModelSpec, layout: Layout) -> tuple[Table, Table]:
    """Decoder layers and MoE layers of every (pipeline rank, virtual chunk).

    Layers go to stages in execution order, stage ``v * pp + r`` (Megatron's VPP-major assignment, as
    :func:`cost_model.terms.ranks.rank_classes`), so a model's first (dense) layers land on rank 0's first chunk.

    Returns: ``(layers[rank][chunk], moe_layers[rank][chunk])``, counts.

    Raises InfeasibleLayout: (``pipeline_split``) the layers do not split as the layout asks."""
    return _chunk_layers(model.moe_layer_freq, layout.pp, layout.vpp, layout.num_layers_in_first_pipeline_stage,
                         layout.num_layers_in_last_pipeline_stage)


@lru_cache(maxsize=1024)
def _chunk_layers(moe_layer_freq: tuple[int, ...], pp: int, vpp: int, first: int, last: int) -> tuple[Table, Table]:
    counts = stage_layer_counts(len(moe_layer_freq), pp, vpp, first, last)
    moe = [[0] * vpp for _ in range(pp)]
    pos = 0
    for v in range(vpp):
        for r in range(pp):
            n = counts[r][v]
            moe[r][v] = int(sum(moe_layer_freq[pos : pos + n]))
            pos += n
    return tuple(tuple(float(x) for x in row) for row in counts), tuple(tuple(float(x) for x in row) for row in moe)


def rank_class_of(model: ModelSpec, layout: Layout, representatives: list[int]) -> tuple[int, ...]:
    """The rank class (column of the estimate's ``(n, K)`` arrays) of every pipeline rank.

    A class is the ranks with the same first / last role, decoder layers, MoE layers and chunk sizes
    (:func:`cost_model.terms.ranks.rank_classes`); ``representatives`` are the classes' lowest ranks in column
    order (the context's ``rank`` row).

    Returns: ``pp`` class indices.

    Raises AssertionError: a rank whose class has no representative (the class definition changed)."""
    layers, moe = chunk_layers(model, layout)
    pp = layout.pp

    def key(r: int) -> tuple[object, ...]:
        return (r == 0, r == pp - 1, sum(layers[r]), sum(moe[r]), layers[r])

    column = {key(rep): k for k, rep in enumerate(representatives)}
    out = tuple(column.get(key(r), -1) for r in range(pp))
    assert all(k >= 0 for k in out), f"pipeline ranks without a rank class: {out} (representatives {representatives})"
    return out


def chunk_context(c: TableContext, layers: Table, moe: Table, recompute_num_layers: int) -> TableContext:
    """``c`` (one layout) with one rank-class column per (pipeline rank, virtual chunk), ``pp x vpp`` columns in
    rank-major order: each column holds that chunk's layers (``layers``, ``moe``), counts once, and is the first (last)
    rank only for the model's first (last) stage, so the output layer's time lands on the last stage. Block recompute
    re-runs the first ``recompute_num_layers`` layers of each chunk (transformer_block.py ``_checkpointed_forward``).

    Raises AssertionError: ``c`` holds more than one layout."""
    assert c.n == 1, "chunk_context takes the context of one layout"
    pp, vpp = len(layers), len(layers[0])
    flat = np.array([x for row in layers for x in row], dtype=np.float64)[None, :]
    flat_moe = np.array([x for row in moe for x in row], dtype=np.float64)[None, :]
    rank = np.repeat(np.arange(pp, dtype=np.float64), vpp)[None, :]
    chunk = np.tile(np.arange(vpp, dtype=np.float64), pp)[None, :]
    return dataclasses.replace(
        c, rank=rank, live=np.ones_like(flat, dtype=np.bool_), rank_count=np.ones_like(flat),
        is_first=(rank == 0) & (chunk == 0), is_last=(rank == pp - 1) & (chunk == vpp - 1), layers=flat,
        moe_layers=flat_moe, dense_layers=flat - flat_moe, block_layers=np.minimum(flat, max(recompute_num_layers, 1)))


def no_overlap(c: TableContext) -> TableContext:
    """``c`` with nothing overlapped: the overlap constants at 0 (``tp_comm_overlap_fraction``, ``cp_p2p_overlap``,
    ``ep_a2a_overlap``, ``dp_overlap``, ``pp_p2p_overlap``, ``offload_overlap``). The terms evaluated on it give the
    whole communication; less the exposed part, what the overlaps hide."""
    cal = c.cal.replace(tp_comm_overlap_fraction=0.0, cp_p2p_overlap=0.0, ep_a2a_overlap=0.0, dp_overlap=0.0,
                        pp_p2p_overlap=0.0, offload_overlap=0.0)
    return dataclasses.replace(c, cal=cal)


def _logits_forward_time(c: TableContext) -> Array:
    """The output layer's forward on the last stage: one of :data:`compute.GEMM_PASSES` passes of its GEMMs and the
    forward ``1 / (1 + elementwise_backward_ratio)`` of the loss (:func:`cost_model.terms.compute.loss_time`; the
    measured cost is of forward + backward together, split here like the other memory-bound work).

    Returns: Seconds, ``(n, K)``."""
    f = compute.logits_flops(c)
    gemm = f / (c.bf16_peak_flops * compute.gemm_efficiency(f, c.cal))
    loss = compute.loss_time(c) / (1.0 + c.cal.elementwise_backward_ratio)
    out: Array = c.is_last * (gemm + loss)
    return out


def forward_parts(c: TableContext, copies: Array) -> dict[str, Array]:
    """One micro-batch's forward pass per rank class, by part: seconds ``(n, K)`` for each of :data:`CHUNK_PARTS`
    (recompute 0: it runs in backward). Per MoE layer :func:`recompute.attention_forward_time` +
    :func:`recompute.moe_forward_time`, their :data:`recompute.FORWARD_TP_SHARE` as ``tp_comm`` and
    :func:`comm.ep_forward_time` as ``ep_comm``; per dense layer :func:`recompute.dense_forward_time`; ``cp_comm`` one
    of :data:`comm.CP_PASSES`; plus :func:`_logits_forward_time`."""
    linear = compute.attention_linear_time(c)
    core = compute.core_attention_time(c)
    elem_attn = compute.attention_elementwise_time(c)
    elem_moe = compute.moe_elementwise_time(c, copies)
    collective = comm.tp_collective_time(c)
    tp_attn = comm.tp_attention_comm(c, collective)
    tp_dense = comm.tp_dense_mlp_comm(c, collective)
    tp_moe = comm.tp_moe_comm(c, collective, copies)
    a2a = comm.ep_all_to_all_time(c) if c.dims.is_moe else np.zeros_like(c.tokens)
    ep_fwd = comm.ep_forward_time(c, a2a)
    share = recompute.FORWARD_TP_SHARE
    attn = recompute.attention_forward_time(c, linear, core, elem_attn, tp_attn,
                                            compute.mla_unfused_rope_time(c)) - share * tp_attn
    moe = recompute.moe_forward_time(c, compute.expert_time(c), compute.router_time(c), compute.shared_expert_time(c),
                                     elem_moe, tp_moe,
                                     ep_fwd) - share * tp_moe - ep_fwd
    dense = recompute.dense_forward_time(c, compute.dense_mlp_time(c), elem_attn, tp_dense) - share * tp_dense
    nm, nd = c.moe_layers, c.dense_layers
    return {
        "compute": np.maximum(nm * (attn + moe) + nd * (attn + dense), 0.0) + _logits_forward_time(c),
        "recompute": np.zeros_like(c.layers), "tp_comm": share * (nm * (tp_attn + tp_moe) + nd * (tp_attn + tp_dense)),
        "cp_comm": c.layers * comm.cp_comm_time(c) / comm.CP_PASSES, "ep_comm": nm * ep_fwd}


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkTimes:
    """One layout's forward and backward time of every (pipeline rank, virtual chunk), by part (seconds)."""

    forward: dict[str, Table]
    """Per part (:data:`CHUNK_PARTS`): ``[rank][chunk]`` seconds of one micro-batch's forward."""
    backward: dict[str, Table]
    """The same for the backward (recompute included)."""
    hidden_forward: dict[str, Table]
    """Per part of :data:`HIDDEN_PARTS`: communication the overlaps hide in the forward (0 when nothing overlaps)."""
    hidden_backward: dict[str, Table]

    @property
    def forward_s(self) -> Table:
        """Seconds of each chunk's forward, all parts."""
        return _sum_tables([self.forward[p] for p in CHUNK_PARTS])

    @property
    def backward_s(self) -> Table:
        """Seconds of each chunk's backward, all parts."""
        return _sum_tables([self.backward[p] for p in CHUNK_PARTS])


def _sum_tables(tables: list[Table]) -> Table:
    return tuple(tuple(sum(t[r][v] for t in tables) for v in range(len(tables[0][r]))) for r in range(len(tables[0])))


def chunk_times(c: TableContext, per_rank: dict[str, Array], per_microbatch: PerMicrobatch, copies: Array,
                model: ModelSpec, layout: Layout, *, hidden: bool = False) -> ChunkTimes:
    """Forward and backward seconds of every (pipeline rank, virtual chunk) of ``layout``, by part, as a
    :class:`ChunkTimes`; with ``hidden`` also what the overlaps hide.

    Each part of a rank's chunks adds up to the part's time per micro-batch of the rank's class in ``per_rank``
    (``per_microbatch(c, copies)``: ``c`` the one-layout context, ``copies`` its routed token copies, ``(1, 1)``); the
    chunks share it as that composition evaluated per chunk (:func:`chunk_context`) does, their forward as
    :func:`forward_parts` says.

    Raises InfeasibleLayout: (``pipeline_split``) the layers do not split as the layout asks."""
    pp, vpp = layout.pp, layout.vpp
    layers, moe = chunk_layers(model, layout)
    cls = list(rank_class_of(model, layout, [int(x) for x in c.rank[0]]))
    cc = chunk_context(c, layers, moe, layout.recompute_num_layers)
    totals = per_microbatch(cc, copies)
    fwd = forward_parts(cc, copies)
    lay = np.array(layers)
    share_by_layers = np.where(lay.sum(axis=1, keepdims=True) > 0,
                               lay / np.maximum(lay.sum(axis=1, keepdims=True), 1.0), 1.0 / vpp)
    forward: dict[str, Table] = {}
    backward: dict[str, Table] = {}
    scales: dict[str, Array] = {}
    for p in CHUNK_PARTS:
        tot = totals[p][0].reshape(pp, vpp)
        target = per_rank[p][0, cls][:, None]  # each rank's time in the table, (pp, 1)
        have = tot.sum(axis=1, keepdims=True)
        s = np.where(have > 0, target / np.where(have > 0, have, 1.0), 0.0)
        # where the composition gives a rank's chunks nothing although its class has time, share it by layers
        t = np.where(have > 0, tot * s, target * share_by_layers)
        f = np.minimum(fwd[p][0].reshape(pp, vpp) * s, t)
        forward[p], backward[p], scales[p] = _table(f), _table(np.maximum(t - f, 0.0)), s
    zero = _table(np.zeros((pp, vpp)))
    hidden_f = {p: zero for p in HIDDEN_PARTS}
    hidden_b = {p: zero for p in HIDDEN_PARTS}
    if hidden:
        c0 = no_overlap(cc)
        tot0, fwd0 = per_microbatch(c0, copies), forward_parts(c0, copies)
        for p in HIDDEN_PARTS:
            t_all = (tot0[p][0] - totals[p][0]).reshape(pp, vpp)
            f_all = (fwd0[p][0] - fwd[p][0]).reshape(pp, vpp)
            hidden_f[p] = _table(np.maximum(f_all * scales[p], 0.0))
            hidden_b[p] = _table(np.maximum((t_all - f_all) * scales[p], 0.0))
    return ChunkTimes(forward=forward, backward=backward, hidden_forward=hidden_f, hidden_backward=hidden_b)


def _table(a: Array) -> Table:
    """A ``(pp, vpp)`` array as a ``[rank][chunk]`` table of floats."""
    return tuple(tuple(float(x) for x in row) for row in a.tolist())


def pipeline_time(times: ChunkTimes, layout: Layout, num_microbatches: int) -> float:
    """The pipeline's time of one step: the makespan of :func:`cost_model.pipeline_schedule.pipeline_makespan` over
    ``times`` (p2p left out: the estimate adds its exposed part to the step, ``pp_p2p``).

    Returns: Seconds.

    Raises TunerError: an interleaved schedule with fewer micro-batches than pipeline ranks."""
    return pipeline_makespan(layout.pp, layout.vpp, num_microbatches, [list(r) for r in times.forward_s],
                             [list(r) for r in times.backward_s])


@dataclass(frozen=True, kw_only=True, slots=True)
class StepDetails:
    """Everything the step timeline and the breakdown charts show about one layout
    (:func:`cost_model.estimate.estimate_details`).

    Units: seconds and bytes; ``[rank]`` tuples have ``pp`` entries, ``[rank][chunk]`` tables ``pp x vpp``."""

    estimate: Estimate
    """The single-layout estimate (its ``pp_bubble`` from :attr:`schedule`)."""
    num_microbatches: int
    """M, micro-batches per step per DP rank."""
    rank_class: tuple[int, ...]
    """Each pipeline rank's class (column of the table's ``(n, K)`` arrays)."""
    layers: Table
    """Decoder layers per ``[rank][chunk]``."""
    moe_layers: Table
    times: ChunkTimes
    """Forward / backward seconds per chunk and micro-batch, by part."""
    schedule: tuple[ScheduledOp, ...]
    """Every forward and backward of the step in Megatron's order, simulated (seconds from the step's start)."""
    pipeline_s: float
    """The end of the last of :attr:`schedule`: the pipeline's time."""
    closed_form_pipeline_s: float
    """The table's pipeline time, ``M x slowest + (pp - 1) / vpp x mean`` (Narayanan et al. 2021), for comparison."""
    tail: dict[str, tuple[float, ...]]
    """Per part of :data:`TAIL_PARTS`, each rank's exposed seconds after the pipeline (the estimate's step part is the
    slowest rank's; ``pp_p2p`` is the estimate's exposed p2p, the same on every rank)."""
    tail_hidden: dict[str, tuple[float, ...]]
    """Per ``pp_p2p``, ``dp_comm``, ``offload``: each rank's seconds the overlaps hide."""
    memory: dict[str, tuple[float, ...]]
    """Bytes per GPU by memory part (:data:`cost_model.estimate.MEMORY_PARTS`), each pipeline rank."""

    @property
    def pp(self) -> int:
        return len(self.layers)

    @property
    def vpp(self) -> int:
        return len(self.layers[0])

    @property
    def step_time_s(self) -> float:
        """The estimate's step time (seconds)."""
        return self.estimate.step_time_s

    @property
    def bubble_fraction(self) -> float:
        """The pipeline bubble's share of the step, ``pp_bubble / step_time_s``."""
        return self.estimate.time["pp_bubble"] / self.estimate.step_time_s


def simulated_schedule(times: ChunkTimes, layout: Layout, num_microbatches: int) -> tuple[ScheduledOp, ...]:
    """Every operation of :func:`pipeline_time`'s simulation, with its start and end (seconds).

    Raises TunerError: as :func:`pipeline_time`."""
    return tuple(simulate_pipeline(layout.pp, layout.vpp, num_microbatches, [list(r) for r in times.forward_s],
                                   [list(r) for r in times.backward_s]))
