"""The analytical memory and step-time model, vectorised over a table of layouts: every quantity is a numpy array per
layout (``(n,)``) or per layout and pipeline-rank class (``(n, K)``, K 1 to 4 whatever ``pp``). :func:`estimate_table`
adds up the terms of :mod:`cost_model.terms`, picks the worst pipeline rank and derives the throughput; :func:`estimate`
is one layout of it.

Sources of the formulas:

- weights, gradients and optimizer states: Megatron's ``megatron/training/theoretical_memory_usage.py`` (EP-aware
  form, notes §6.1), with the precision-aware optimizer's dtypes and CPU offload added;
- activations: Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) per tensor, extended to GQA, flash attention, MoE
  token copies and each recompute choice; in-flight micro-batches from ``megatron/core/pipeline_parallel/schedules.py``;
- FLOPs: :mod:`cost_model.flops` (Megatron's ``num_floating_point_operations``);
- pipeline bubble ``(pp-1)/(m*vpp)``: Narayanan et al. 2021 (arXiv 2104.04473 §2.2);
- rank placement: Megatron's default order ``tp-cp-ep-dp-pp`` (``parallel_state.py``).

Every efficiency and overhead constant is a field of :class:`cost_model.calibration.Calibration`."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from cost_model import step_detail
from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.flops import megatron_flops_per_token, mfu
from cost_model.terms import (
    activations,
    comm,
    compute,
    context,
    lora,
    memory,
    optimizer,
    params,
    recompute,
    schedule,
    state,
)
from cost_model.terms.context import Array, TableContext
from cost_model.types import Estimate
from search_spaces.rules import RuleEnv, check_layout
from specs import DEFAULT_RUN_OPTIONS, Cluster, ModelSpec, RunOptions, Workload
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout, LayoutTable
from specs.units import DEFAULT_MEMORY_HEADROOM

MEMORY_PARTS = (
    "weights",
    "main_grads",
    "optimizer",
    "activations",
    "logits",
    "dispatcher_buffers",
    "framework_overhead",
)
TIME_PARTS = (
    "compute",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_bubble",
    "pp_p2p",
    "dp_comm",
    "optimizer",
    "offload",
)

#: Rows estimated at once: a larger table is estimated in blocks of this many rows, so the estimate's temporaries
#: (tens of float64 arrays of shape (rows, rank classes), about 1 KB a row) stay bounded. Blocks of 2**16 took
#: less CPU than 2**18 or 2**20 on the main job's space and on wider ones (docs/benchmarks.md, "Speed at scale").
ROW_BLOCK = 1 << 16


@dataclass(frozen=True, slots=True)
class EstimateTable:
    """Estimates for every row of a :class:`LayoutTable` (arrays of shape ``(n,)``)."""

    memory: dict[str, Array]
    """Bytes per part (:data:`MEMORY_PARTS`), worst pipeline rank (the rank with the highest total)."""
    peak_bytes: Array
    """Sum of ``memory``, bytes per GPU."""
    time: dict[str, Array]
    """Seconds per step per part (:data:`TIME_PARTS`)."""
    step_time_s: Array
    tokens_per_s_per_gpu: Array
    mfu: Array
    """6 x N_active x tokens/s/GPU / dense bf16 peak (the seed's convention)."""
    model_tflops_per_gpu: Array
    """Megatron's model FLOPs per step / step time / GPUs, TFLOP/s."""
    usd_per_million_tokens: Array
    hbm_bytes: float
    usable_bytes: float
    """``hbm_bytes x (1 - memory_headroom)``: the fit limit."""
    host_bytes_per_node: Array
    """Predicted host memory per node, bytes (:func:`cost_model.terms.optimizer.host_bytes_per_node`)."""
    host_memory_bytes: float
    """The cluster's host memory per node (``--host-memory-gib``), bytes; 0 = not checked."""

    @property
    def fits(self) -> npt.NDArray[np.bool_]:
        """Rows whose predicted peak is at most the usable memory."""
        return self.peak_bytes <= self.usable_bytes

    @property
    def host_fits(self) -> npt.NDArray[np.bool_]:
        """Rows whose predicted host memory per node is at most the cluster's (all rows when it is not set)."""
        if not self.host_memory_bytes:
            return np.ones(len(self.peak_bytes), dtype=np.bool_)
        return self.host_bytes_per_node <= self.host_memory_bytes

    def row(self, i: int, layout: Layout) -> Estimate:
        return Estimate(
            layout=layout,
            memory={k: float(v[i]) for k, v in self.memory.items()},
            peak_bytes=float(self.peak_bytes[i]),
            hbm_bytes=self.hbm_bytes,
            usable_bytes=self.usable_bytes,
            time={k: float(v[i]) for k, v in self.time.items()},
            step_time_s=float(self.step_time_s[i]),
            tokens_per_s_per_gpu=float(self.tokens_per_s_per_gpu[i]),
            mfu=float(self.mfu[i]),
            model_tflops_per_gpu=float(self.model_tflops_per_gpu[i]),
            usd_per_million_tokens=float(self.usd_per_million_tokens[i]),
            host_bytes_per_node=float(self.host_bytes_per_node[i]),
            host_memory_bytes=self.host_memory_bytes,
        )


# --------------------------------------------------------------------------- composition


def _total(parts: dict[str, Array]) -> Array:
    """The sum of ``parts``, added in their order."""
    out: Array | None = None
    for v in parts.values():
        out = v if out is None else out + v
    assert out is not None, "no parts"
    return out


def _memory_by_rank(c: TableContext, dense: Array, experts: Array, owned: Array, copies: Array) -> dict[str, Array]:
    """Every memory part per pipeline-rank class, bytes ``(n, K)``, in :data:`MEMORY_PARTS` order."""
    layer_in = activations.layer_input_bytes(c)
    attention = activations.attention_bytes(c)
    moe_block = activations.moe_block_bytes(c, copies)
    dense_block = activations.dense_block_bytes(c)
    full_moe = attention + moe_block
    full_dense = attention + dense_block
    saved_attention = activations.saved_attention_bytes(c)
    kept_moe = activations.kept_bytes(full_moe, saved_attention, activations.saved_moe_bytes(c, moe_block, copies))
    kept_dense = activations.kept_bytes(full_dense, saved_attention, activations.saved_dense_bytes(c, dense_block))
    fraction = activations.recomputed_fraction(c)
    per_rank = activations.rank_activation_bytes(
        c, activations.stored_layer_bytes(c, layer_in, kept_moe, fraction),
        activations.stored_layer_bytes(c, layer_in, kept_dense, fraction)
    )
    inflight = schedule.inflight_microbatches(c)
    act = memory.activation_bytes(
        c, memory.offload_kept_bytes(c, per_rank), inflight, memory.embedding_activation_bytes(c, inflight),
        memory.working_set_bytes(c, full_moe, full_dense) + memory.a2a_overlap_extra_bytes(c, full_moe),
    ) + memory.cuda_graph_buffer_bytes(c, inflight)
    logits = memory.logits_bytes(c)
    buffers = memory.dispatcher_buffer_bytes(c, copies)
    tdense, texp = lora.trainable_params(c, dense, experts)
    return {
        "weights": state.weight_bytes(c, dense, experts) + lora.adapter_weight_bytes(c),
        "main_grads": state.main_grad_bytes(c, tdense, texp),
        "optimizer": state.optimizer_state_bytes(c, owned) + state.offload_build_bytes(c, tdense, texp),
        "activations": act,
        "logits": logits * c.live,
        "dispatcher_buffers": buffers,
        "framework_overhead": memory.framework_overhead_bytes(c, act + logits + buffers),
    }


def _time_per_microbatch(c: TableContext, copies: Array) -> dict[str, Array]:
    """Seconds per micro-batch per rank class ``(n, K)`` of the parts that scale with micro-batches:
    compute, recompute, tp_comm, cp_comm, ep_comm."""
    # Per layer, (n, 1).
    linear = compute.attention_linear_time(c)
    core = compute.core_attention_time(c)
    experts = compute.expert_time(c)
    router = compute.router_time(c)
    shared = compute.shared_expert_time(c)
    mlp = compute.dense_mlp_time(c)
    elem_attn = compute.attention_elementwise_time(c)
    elem_moe = compute.moe_elementwise_time(c, copies)
    rope = compute.mla_unfused_rope_time(c)
    collective = comm.tp_collective_time(c)
    tp_attn = comm.tp_attention_comm(c, collective)
    tp_dense = comm.tp_dense_mlp_comm(c, collective)
    tp_moe = comm.tp_moe_comm(c, collective, copies)
    a2a = comm.ep_all_to_all_time(c) if c.dims.is_moe else np.zeros_like(c.tokens)
    ep_forward = comm.ep_forward_time(c, a2a)
    fwd_attn = recompute.attention_forward_time(c, linear, core, elem_attn, tp_attn, rope)
    fwd_moe = recompute.moe_forward_time(c, experts, router, shared, elem_moe, tp_moe, ep_forward)
    fwd_dense = recompute.dense_forward_time(c, mlp, elem_attn, tp_dense)
    sel_attn = recompute.selective_attention_time(c, core, elem_attn, compute.mla_up_projection_time(c), rope)
    share = recompute.full_recompute_share(c, activations.recomputed_fraction(c))
    rec_moe = recompute.recompute_moe_time(c, share, fwd_attn, fwd_moe,
                                           sel_attn + recompute.selective_moe_time(c, fwd_moe, elem_moe, shared))
    rec_dense = recompute.recompute_dense_time(c, share, fwd_attn, fwd_dense,
                                               sel_attn + recompute.selective_dense_time(c, fwd_dense))
    ad_attn, ad_dense, ad_moe = lora.adapter_time(c, copies)
    # MLA's unfused RoPE is memory-bound work too
    c_attn = compute.attention_compute_time(c, linear, core, elem_attn + rope) + ad_attn
    c_moe = compute.moe_compute_time(c, experts, router, shared, elem_moe) + ad_moe
    c_dense = compute.dense_compute_time(c, mlp, elem_attn) + ad_dense
    # Per rank class: the rank's MoE and dense layers, (n, K).
    nm, nd = c.moe_layers, c.dense_layers
    return {
        "compute": nm * (c_attn + c_moe) + nd * (c_attn + c_dense) + compute.logits_time(c),
        "recompute": nm * rec_moe + nd * rec_dense,
        "tp_comm": nm * (tp_attn + tp_moe) + nd * (tp_attn + tp_dense),
        "cp_comm": c.layers * comm.cp_comm_time(c),
        "ep_comm": nm * comm.ep_layer_time(c, a2a),
    }


def _microbatch_window(c: TableContext, per_mb: dict[str, Array]) -> Array:
    """Seconds of one micro-batch per rank class ``(n, K)`` (0 on ranks that do not exist): the busy time the per-step
    data-parallel communication can hide behind (:func:`cost_model.terms.comm.dp_comm_time`), also the pipeline's
    per-micro-batch time. One definition for the table and the single-layout details, so their DP times agree."""
    out: Array = (per_mb["compute"] + per_mb["tp_comm"] + per_mb["cp_comm"] + per_mb["ep_comm"]
                  + per_mb["recompute"]) * c.live
    return out


def _time_parts(c: TableContext, dense: Array, experts: Array, owned: Array,
                per_mb: dict[str, Array]) -> dict[str, Array]:
    """Seconds per step per part ``(n,)``, in :data:`TIME_PARTS` order, from :func:`_time_per_microbatch`'s ``per_mb``.

    The step runs M micro-batches at the slowest rank's pace plus the fill and drain
    (:func:`cost_model.terms.schedule.bubble_time`); each micro-batch part is its share of the
    ranks' busy time ``M x mean``."""
    total = _microbatch_window(c, per_mb)
    slowest = schedule.slowest_rank_time(total)
    mean = schedule.mean_rank_time(c, total)
    return {
        "compute": schedule.busy_time(c, per_mb["compute"], mean),
        "recompute": schedule.busy_time(c, per_mb["recompute"], mean),
        "tp_comm": schedule.busy_time(c, per_mb["tp_comm"], mean),
        "cp_comm": schedule.busy_time(c, per_mb["cp_comm"], mean),
        "ep_comm": schedule.busy_time(c, per_mb["ep_comm"], mean),
        "pp_bubble": schedule.bubble_time(c, slowest, mean),
        "pp_p2p": schedule.pp_p2p_time(c),
        "dp_comm": comm.dp_comm_time(c, *lora.trainable_params(c, dense, experts), total),
        "optimizer": optimizer.optimizer_step_time(c, owned),
        "offload": optimizer.offload_time(c, owned),
    }


def estimate_table(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    table: LayoutTable,
    *,
    calibration: Calibration = DEFAULT_CALIBRATION,
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
    options: RunOptions = DEFAULT_RUN_OPTIONS,
) -> EstimateTable:
    """Predict peak memory and step time for every layout of ``table`` (rows already valid by
    :func:`search_spaces.rules.check_table`; ``cluster.num_gpus`` equal to their ``world_size``): an
    :class:`EstimateTable` of ``(n,)`` arrays. A layout fits when its predicted peak is at most ``(1 - memory_headroom)
    x HBM``; ``options`` are the run flags shared by every row.

    Raises TunerError: ``memory_headroom`` outside [0, 1), a precision the GPU has no tensor cores for, or calibration
    constants that give a non-finite step time or peak memory."""
    _check_headroom(memory_headroom)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        n = len(table)
        if n <= ROW_BLOCK:
            out = _estimate_rows(model, cluster, workload, table, calibration, memory_headroom, options)[0]
        else:
            blocks = (table.select(slice(lo, lo + ROW_BLOCK)) for lo in range(0, n, ROW_BLOCK))  # views
            out = _in_blocks((_estimate_rows(model, cluster, workload, b, calibration, memory_headroom,
                                             options)[0] for b in blocks), n)
    return _checked(out)


def _check_headroom(memory_headroom: float) -> None:
    if not 0.0 <= memory_headroom < 1.0:
        raise TunerError(f"--memory-headroom must be in [0, 1), got {memory_headroom}")


def _checked(out: EstimateTable) -> EstimateTable:
    """``out``, or TunerError when a row's step time or peak memory is not finite (bad calibration constants)."""
    bad = ~(np.isfinite(out.step_time_s) & np.isfinite(out.peak_bytes) & (out.step_time_s > 0))
    if bad.any():
        parts = sorted({k for k, v in {**out.time, **out.memory}.items() if not np.all(np.isfinite(v[bad]))})
        raise TunerError(
            f"the calibration constants give a non-finite step time or peak memory for {int(bad.sum())} of {len(bad)} "
            "layouts "
            f"(parts: {', '.join(parts) or 'step'}): check the constants of the --calibration file; the shipped ones "
            "are in cost_model/data/calibration.yaml")
    return out


def _in_blocks(blocks: Iterator[EstimateTable], n: int) -> EstimateTable:
    """One table of the ``n`` rows of ``blocks``, in order (their scalars are the same): each block is copied
    into arrays made for all ``n`` rows when the first comes, and dropped."""
    first = next(blocks)
    whole = {k: np.empty(n, dtype=v.dtype) for k, v in _row_arrays(first).items()}
    lo = 0
    for b in itertools.chain([first], blocks):
        arrays = _row_arrays(b)
        m = len(b.step_time_s)
        for k, v in arrays.items():
            whole[k][lo:lo + m] = v
        lo += m
    assert lo == n, (lo, n)
    return EstimateTable(
        memory={k: whole[f"memory.{k}"] for k in first.memory},
        peak_bytes=whole["peak_bytes"],
        time={k: whole[f"time.{k}"] for k in first.time},
        step_time_s=whole["step_time_s"],
        tokens_per_s_per_gpu=whole["tokens_per_s_per_gpu"],
        mfu=whole["mfu"],
        model_tflops_per_gpu=whole["model_tflops_per_gpu"],
        usd_per_million_tokens=whole["usd_per_million_tokens"],
        hbm_bytes=first.hbm_bytes,
        usable_bytes=first.usable_bytes,
        host_bytes_per_node=whole["host_bytes_per_node"],
        host_memory_bytes=first.host_memory_bytes,
    )


def _row_arrays(t: EstimateTable) -> dict[str, Array]:
    """The per-row arrays of ``t`` by name (``memory.<part>``, ``time.<part>``, the other fields)."""
    return {
        **{f"memory.{k}": v for k, v in t.memory.items()},
        "peak_bytes": t.peak_bytes,
        **{f"time.{k}": v for k, v in t.time.items()},
        "step_time_s": t.step_time_s,
        "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
        "mfu": t.mfu,
        "model_tflops_per_gpu": t.model_tflops_per_gpu,
        "usd_per_million_tokens": t.usd_per_million_tokens,
        "host_bytes_per_node": t.host_bytes_per_node,
    }


def _estimate_rows(model: ModelSpec, cluster: Cluster, workload: Workload, table: LayoutTable,
                   calibration: Calibration, memory_headroom: float,
                   options: RunOptions) -> tuple[EstimateTable, TableContext, Array, dict[str, Array]]:
    """The :class:`EstimateTable` of ``table``'s rows, with what the single estimate reuses: the context, the routed
    token copies and :func:`_time_per_microbatch`'s seconds per rank class."""
    c = context.build_context(model, cluster, workload, table, calibration, options)
    lora.check_targets(c)
    dense = params.dense_params(c)
    experts = params.expert_params(c)
    owned = state.owned_params(c, *lora.trainable_params(c, dense, experts))
    copies = activations.routed_token_copies(c)

    by_rank = _memory_by_rank(c, dense, experts, owned, copies)
    total = np.where(c.live, _total(by_rank), -1.0)
    worst = np.argmax(total, axis=1)
    rows = np.arange(c.n)
    per_mb = _time_per_microbatch(c, copies)
    time = _time_parts(c, dense, experts, owned, per_mb)

    step = _total(time)
    tps = c.global_batch * c.seq / step / c.world
    return EstimateTable(
        memory={k: v[rows, worst] for k, v in by_rank.items()},
        peak_bytes=total[rows, worst],
        time=time,
        step_time_s=step,
        tokens_per_s_per_gpu=tps,
        mfu=mfu(model, tps, cluster.gpu.peak_flops_bf16, workload.task),
        model_tflops_per_gpu=megatron_flops_per_token(model, workload.seq_length) * tps / 1e12,
        usd_per_million_tokens=cluster.usd_per_gpu_hour / (tps * 3600.0) * 1e6,
        hbm_bytes=cluster.gpu.hbm_bytes,
        usable_bytes=cluster.gpu.hbm_bytes * (1 - memory_headroom),
        host_bytes_per_node=optimizer.host_bytes_per_node(c, owned, np.add(*lora.trainable_params(c, dense, experts))),
        host_memory_bytes=cluster.host_memory_bytes_per_node,
    ), c, copies, per_mb


def estimate(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    layout: Layout,
    *,
    calibration: Calibration = DEFAULT_CALIBRATION,
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
    options: RunOptions = DEFAULT_RUN_OPTIONS,
) -> Estimate:
    """Predict one layout's peak memory per GPU and step time.

    Checks Megatron's rules first. Memory and every time part but the bubble are :func:`estimate_table`'s; the pipeline
    is timed by simulating Megatron's order over each rank's and chunk's passes (:mod:`cost_model.step_detail`), so
    ``pp_bubble`` is the simulated time less the ranks' mean busy time (equal to the closed form with equal ranks). The
    last :data:`RECENT_ESTIMATES` results are kept: a repeat with the same model, cluster and workload objects and equal
    other inputs returns the same :class:`Estimate`.

    Raises InfeasibleLayout: the first rule the layout breaks. Raises TunerError: a world size other than the cluster's
    GPU count."""
    key = (id(model), id(cluster), id(workload), layout, calibration, memory_headroom, options)
    with _recent_lock:
        hit = _recent.get(key)
        if hit is not None and hit[0] is model and hit[1] is cluster and hit[2] is workload:
            _recent.move_to_end(key)
            return hit[3]
    est = _single(model, cluster, workload, layout, calibration, memory_headroom, options, details=False)[0]
    with _recent_lock:
        _recent[key] = (model, cluster, workload, est)
        while len(_recent) > RECENT_ESTIMATES:
            _recent.popitem(last=False)
    return est


#: Single estimates :func:`estimate` keeps, the most recent first out last: a study's report asks again for the
#: estimates of its front, which its trials made. Keyed by the identity of the model, cluster and workload objects
#: (held by the entry, so an identity is never reused while it is kept) and the value of the rest.
RECENT_ESTIMATES = 256
_recent: OrderedDict[tuple[Any, ...], tuple[ModelSpec, Cluster, Workload, Estimate]] = OrderedDict()
_recent_lock = threading.Lock()


def estimate_details(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    layout: Layout,
    *,
    calibration: Calibration = DEFAULT_CALIBRATION,
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
    options: RunOptions = DEFAULT_RUN_OPTIONS,
) -> step_detail.StepDetails:
    """:func:`estimate` with what it is made of: each pipeline rank's and chunk's forward and backward by part,
    the simulated schedule, what the overlaps hide, each rank's tail (DP, optimizer, offload) and memory by part.

    Returns: A :class:`cost_model.step_detail.StepDetails` (seconds, bytes); its ``estimate`` is :func:`estimate`'s.

    Raises InfeasibleLayout: the layout breaks a rule.
    Raises TunerError: the layout's world size differs from the cluster's GPU count."""
    det = _single(model, cluster, workload, layout, calibration, memory_headroom, options, details=True)[1]
    assert det is not None
    return det


def _single(
    model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, calibration: Calibration,
    memory_headroom: float,
    options: RunOptions, *, details: bool,
) -> tuple[Estimate, step_detail.StepDetails | None]:
    """:func:`estimate` (and, with ``details``, :func:`estimate_details`) of one layout."""
    if layout.world_size != cluster.num_gpus:
        raise TunerError(f"layout world_size {layout.world_size} differs from the cluster's {cluster.num_gpus} GPUs")
    # the run options' own rules (activation offloading, CUDA graphs); the cluster's (fabric, release) are the caller's
    broken = check_layout(layout, model, workload, RuleEnv(cpu_offloading_num_layers=options.cpu_offloading_num_layers,
                                                           cuda_graph_impl=options.cuda_graph_effective_impl))
    if broken:
        rule_id, reason = broken[0]
        raise InfeasibleLayout(rule_id, reason)
    _check_headroom(memory_headroom)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        table, c, copies, per_mb = _estimate_rows(model, cluster, workload, LayoutTable.from_layouts([layout]),
                                                  calibration, memory_headroom, options)
    row = _checked(table).row(0, layout)
    m = int(c.micro_batches[0])
    times = step_detail.chunk_times(c, per_mb, _time_per_microbatch, copies, model, layout, hidden=details)
    est = row
    if layout.pp > 1:
        busy = sum(row.time[p] for p in step_detail.CHUNK_PARTS)  # the ranks' mean busy time, M x mean
        time = dict(row.time)
        time["pp_bubble"] = max(step_detail.pipeline_time(times, layout, m) - busy, 0.0)
        step = sum(time[p] for p in TIME_PARTS)
        k = row.step_time_s / step  # throughput, MFU and TFLOP/s scale with 1 / step, $/token with step
        est = dataclasses.replace(row, time=time, step_time_s=step, tokens_per_s_per_gpu=row.tokens_per_s_per_gpu * k,
                                  mfu=row.mfu * k,
                                  model_tflops_per_gpu=row.model_tflops_per_gpu * k,
                                  usd_per_million_tokens=row.usd_per_million_tokens / k)
    if not details:
        return est, None
    return est, _details(c, est, times, copies, per_mb, model, layout, m)


def _details(c: TableContext, est: Estimate, times: step_detail.ChunkTimes, copies: Array, per_mb: dict[str, Array],
             model: ModelSpec, layout: Layout, m: int) -> step_detail.StepDetails:
    """The :class:`~cost_model.step_detail.StepDetails` of one layout (see :func:`estimate_details`)."""
    layers, moe = step_detail.chunk_layers(model, layout)
    cls = step_detail.rank_class_of(model, layout, [int(x) for x in c.rank[0]])
    dense = params.dense_params(c)
    experts = params.expert_params(c)
    tdense, texp = lora.trainable_params(c, dense, experts)
    owned = state.owned_params(c, tdense, texp)
    c0 = step_detail.no_overlap(c)
    total = _total({p: per_mb[p] for p in step_detail.CHUNK_PARTS})
    window = _microbatch_window(c, per_mb)
    tail: dict[str, list[float]] = {p: [] for p in step_detail.TAIL_PARTS}
    hidden: dict[str, list[float]] = {"pp_p2p": [], "dp_comm": [], "offload": []}
    p2p, p2p0 = float(schedule.pp_p2p_time(c)[0]), float(schedule.pp_p2p_time(c0)[0])
    for k in cls:
        one = np.zeros_like(c.live)
        one[0, k] = True  # the class alone: the per-step terms' slowest rank is this one
        ck, ck0 = dataclasses.replace(c, live=one), dataclasses.replace(c0, live=one)
        dp, opt, off = (float(comm.dp_comm_time(ck, tdense, texp, window)[0]),
                        float(optimizer.optimizer_step_time(ck, owned)[0]),
                        float(optimizer.offload_time(ck, owned)[0]))
        for name, v in (("pp_p2p", p2p), ("dp_comm", dp), ("optimizer", opt), ("offload", off)):
            tail[name].append(v)
        hidden["pp_p2p"].append(max(p2p0 - p2p, 0.0))
        hidden["dp_comm"].append(max(float(comm.dp_comm_time(ck0, tdense, texp, window)[0]) - dp, 0.0))
        hidden["offload"].append(max(float(optimizer.offload_time(ck0, owned)[0]) - off, 0.0))
    by_rank = _memory_by_rank(c, dense, experts, owned, copies)
    closed = float(m * schedule.slowest_rank_time(total)[0]
                   + schedule.fill_drain_microbatches(c)[0] * schedule.mean_rank_time(c, total)[0])
    sched = step_detail.simulated_schedule(times, layout, m)
    return step_detail.StepDetails(
        estimate=est,
        num_microbatches=m,
        rank_class=cls,
        layers=layers,
        moe_layers=moe,
        times=times,
        schedule=sched,
        pipeline_s=max(op.end_s for op in sched),
        closed_form_pipeline_s=closed,
        tail={k: tuple(v) for k, v in tail.items()},
        tail_hidden={k: tuple(v) for k, v in hidden.items()},
        memory={k: tuple(float(v[0, j]) for j in cls) for k, v in by_rank.items()},
    )
