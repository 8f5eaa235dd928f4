"""Pipeline-schedule, recompute-time and optimizer terms, by hand; in-flight micro-batches against
Megatron's warm-up counts (megatron/core/pipeline_parallel/schedules.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from term_fixtures import BASE, TINY_DENSE, make_ctx

from cost_model.terms import optimizer, recompute, schedule
from specs import Workload

NV, NET = 3e11, 4e10
SELECTIVE = dict(
    recompute_granularity="selective", recompute_modules=("core_attn", "layernorm", "moe_act", "shared_experts")
)


# --------------------------------------------------------------------------- in-flight micro-batches


def megatron_warmup(pp: int, rank: int, vpp: int, m: int) -> int:
    """Warm-up forwards of pipeline rank ``rank``, written from schedules.py (core 0.16, slime's pin 1dcf0da):

    - ``forward_backward_pipelining_without_interleaving``: ``min(pp - rank - 1, M)``;
    - ``forward_backward_pipelining_with_interleaving`` (``microbatch_group_size_per_vp_stage`` = pp,
      the default): ``M x vpp`` (all of them) when ``M == pp``, else
      ``min((pp - rank - 1) * 2 + (vpp - 1) * pp, M x vpp)``, in virtual (one-chunk) micro-batches.
    """
    if vpp == 1:
        return min(pp - rank - 1, m)
    total = m * vpp
    if m == pp:
        return total
    return min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)


def megatron_peak_inflight(pp: int, rank: int, vpp: int, m: int) -> float:
    """Micro-batches (of the rank's whole layers) held at the peak: the warm-up forwards plus the first
    steady-state forward, capped at every micro-batch, in units of ``vpp`` chunks."""
    total = m * vpp
    return min(megatron_warmup(pp, rank, vpp, m) + 1, total) / vpp


def _all_ranks(c, pp: int):
    """The context with one rank class per pipeline rank (the estimate keeps only class representatives)."""
    ranks = np.arange(pp, dtype=float)[None, :]
    return dataclasses.replace(c, rank=ranks, live=np.ones_like(ranks, dtype=bool), rank_count=np.ones_like(ranks))


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("vpp", [1, 2, 4])
@pytest.mark.parametrize("m_per_pp", [1, 2, 4])
def test_inflight_microbatches_match_megatron_warmup(pp, vpp, m_per_pp):
    m = pp * m_per_pp
    # TINY_DENSE has 8 layers: use 32 so that every pp x vpp splits them; tp 1, cp 1 -> dp = 16 / pp
    model = TINY_DENSE.replace(num_layers=32, moe_layer_freq=(0,) * 32)
    dp = 16 // pp
    c = _all_ranks(
        make_ctx(model=model, pp=pp, vpp=vpp, workload=Workload(seq_length=1024, global_batch_size=m * dp)), pp
    )
    assert c.micro_batches[0] == m
    ours = schedule.inflight_microbatches(c)[0]
    for r in range(pp):
        want = megatron_peak_inflight(pp, r, vpp, m)
        if vpp > 1 and m == pp and r > 0:
            # Not modelled (docstring): with M == pp Megatron runs every forward first on every rank;
            # ours counts that on rank 0 (the one that holds the most) only.
            assert ours[r] <= want
            continue
        assert ours[r] == want, (pp, vpp, m, r)


def test_inflight_1f1b_by_hand():
    assert schedule.inflight_1f1b(make_ctx(**BASE)).tolist() == [[2.0, 1.0]]  # pp 2: min(pp - r, M = 8)
    few = make_ctx(**BASE, micro_batch_size=8)  # M = 16 / (8 x 2) = 1
    assert schedule.inflight_1f1b(few).tolist() == [[1.0, 1.0]]


def test_inflight_interleaved_by_hand():
    # pp 4, vpp 2, M 8 (dp 2): rank 0 (3 x 2 + 1 x 4 + 1) / 2, rank 1 (2 x 2 + 4 + 1) / 2, rank 3 (0 + 4 + 1) / 2
    c = make_ctx(model=TINY_DENSE, tp=2, pp=4, vpp=2, sequence_parallel=True)
    assert c.rank.tolist() == [[0.0, 1.0, 3.0]]
    assert schedule.inflight_interleaved(c).tolist() == [[5.5, 4.5, 2.5]]
    assert schedule.inflight_microbatches(c).tolist() == [[5.5, 4.5, 2.5]]
    assert schedule.inflight_microbatches(make_ctx(**BASE)).tolist() == [[2.0, 1.0]]


# --------------------------------------------------------------------------- step time and bubble


def test_slowest_and_mean_rank_time():
    assert schedule.slowest_rank_time(np.array([[1.0, 3.0]])).tolist() == [3.0]
    assert schedule.mean_rank_time(make_ctx(**BASE), np.array([[1.0, 3.0]])).tolist() == [2.0]
    c = make_ctx(model=TINY_DENSE, tp=2, pp=4, sequence_parallel=True)  # classes: rank 0, ranks 1-2, rank 3
    assert c.rank_count.tolist() == [[1.0, 2.0, 1.0]]
    assert schedule.mean_rank_time(c, np.array([[1.0, 2.0, 5.0]])).tolist() == [(1 + 2 * 2 + 5) / 4]


def test_busy_time_shares_the_ranks_busy_time():
    c = make_ctx(**BASE)  # M 8, pp 2, one rank per class
    # a part taking 1 s on rank 0 and 3 s on rank 1, out of a mean of 2 s per micro-batch: all of M x mean = 16 s
    assert schedule.busy_time(c, np.array([[1.0, 3.0]]), np.array([2.0])).tolist() == [8 * 2 * ((1 + 3) / 2 / 2)]
    assert schedule.busy_time(c, np.array([[1.0, 0.0]]), np.array([2.0])).tolist() == [8 * 2 * (1 / 2 / 2)]
    assert schedule.busy_time(c, np.array([[0.0, 0.0]]), np.array([0.0])).tolist() == [0.0]


def test_fill_drain_and_bubble():
    assert schedule.fill_drain_microbatches(make_ctx(**BASE)).tolist() == [1.0]
    il = make_ctx(model=TINY_DENSE, tp=2, pp=4, vpp=2, sequence_parallel=True)
    assert schedule.fill_drain_microbatches(il).tolist() == [3 / 2]
    # M = 8 micro-batches at the slowest rank's 3 s, plus 1 fill/drain at the mean 2 s, less 8 x 2 s busy
    assert schedule.bubble_time(make_ctx(**BASE), np.array([3.0]), np.array([2.0])).tolist() == [8 * 3 + 1 * 2 - 8 * 2]


def test_pp_p2p():
    c = make_ctx(**BASE)
    assert schedule.pp_p2p_bytes(c).tolist() == [2 * (1 * 1024 / 2) * 64 / 2]
    # stages 16 / 2 = 8 ranks apart: over the network; 2 transfers x M 8 x vpp 1, nothing hidden without VPP
    assert schedule.pp_p2p_time(c)[0] == pytest.approx(2 * 8 * 1 * 32768 / NET)
    il = make_ctx(model=TINY_DENSE, tp=2, pp=4, vpp=2, sequence_parallel=True)  # 80% hidden with VPP
    assert schedule.pp_p2p_time(il)[0] == pytest.approx(2 * 8 * 2 * 65536 / NET * (1 - 0.8))
    near = make_ctx(model=TINY_DENSE, tp=2, pp=8, sequence_parallel=True)  # stages 2 ranks apart: NVLink; M 16
    assert schedule.pp_p2p_time(near)[0] == pytest.approx(2 * 16 * 1 * 65536 / NV)
    assert schedule.pp_p2p_time(make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True))[0] == 0


# --------------------------------------------------------------------------- recompute time


def test_forward_times():
    c = make_ctx(**BASE)
    one = np.array([[1.0]])
    # linear + core attention's forward (3 x core x its measured share 0.238) + elementwise / (1 + 2) + half of the 4 TP
    # collectives
    assert recompute.attention_forward_time(c, one, 2 * one, 3 * one, 4 * one)[0, 0] == pytest.approx(
        1 + 6 * 0.238 + 1 + 2
    )
    assert (
        recompute.moe_forward_time(c, one, 2 * one, 3 * one, 6 * one, 4 * one, 5 * one)[0, 0] == 1 + 2 + 3 + 2 + 2 + 5
    )
    assert recompute.dense_forward_time(c, one, 6 * one, 4 * one)[0, 0] == 1 + 6 * 0.5 / 3 + 2
    # MLA's unfused RoPE: its forward share (0.56, measured) re-runs with the attention side's forward
    assert recompute.attention_forward_time(c, one, 2 * one, 3 * one, 4 * one, 10 * one)[0, 0] == pytest.approx(
        1 + 6 * 0.238 + 1 + 2 + 5.6
    )


def test_selective_recompute_times():
    one = np.array([[1.0]])
    c = make_ctx(**BASE, **SELECTIVE)
    assert recompute.selective_attention_time(c, 2 * one, 6 * one, 5 * one)[0, 0] == pytest.approx(
        6 * 0.238 + 6 * 0.5 / 3
    )  # core_attn's forward + layernorm
    up = make_ctx(**BASE, recompute_granularity="selective", recompute_modules=("mla_up_proj", "core_attn"))
    assert recompute.selective_attention_time(up, 2 * one, 6 * one, 5 * one)[0, 0] == pytest.approx(
        6 * 0.238 + 5
    )  # + the up-projections
    # mla_up_proj re-runs the unfused RoPE's forward with the up-projections (checkpointed together); core_attn does not
    assert recompute.selective_attention_time(up, 2 * one, 6 * one, 5 * one, 10 * one)[0, 0] == pytest.approx(
        6 * 0.238 + 5 + 5.6
    )
    assert recompute.selective_attention_time(c, 2 * one, 6 * one, 5 * one, 10 * one)[0, 0] == pytest.approx(
        6 * 0.238 + 6 * 0.5 / 3
    )
    assert (
        recompute.selective_moe_time(c, 10 * one, 6 * one, 4 * one)[0, 0] == 6 * 0.5 / 3 + 4
    )  # moe_act + shared_experts
    moe = make_ctx(**BASE, recompute_granularity="selective", recompute_modules=("moe", "shared_experts"))
    assert recompute.selective_moe_time(moe, 10 * one, 6 * one, 4 * one)[0, 0] == 10  # the whole forward, shared in it
    mlp = make_ctx(**BASE, recompute_granularity="selective", recompute_modules=("mlp",))
    assert (
        recompute.selective_dense_time(mlp, 7 * one)[0, 0] == 7
        and recompute.selective_dense_time(c, 7 * one)[0, 0] == 0
    )
    none = make_ctx(**BASE)
    assert recompute.selective_attention_time(none, 2 * one, 6 * one, 5 * one)[0, 0] == 0


def test_full_recompute_share_and_layer_times():
    frac = np.array([[0.25, 0.5]])
    full = dict(**BASE, recompute_granularity="full", recompute_num_layers=1)
    uniform, block = make_ctx(**full, recompute_method="uniform"), make_ctx(**full, recompute_method="block")
    assert recompute.full_recompute_share(uniform, frac).tolist() == [[1.0, 1.0]]
    assert recompute.full_recompute_share(block, frac).tolist() == [[0.25, 0.5]]
    one = np.array([[1.0]])
    assert recompute.recompute_moe_time(block, frac, one, 2 * one, 9 * one).tolist() == [[0.75, 1.5]]
    assert recompute.recompute_dense_time(block, frac, one, 3 * one, 9 * one).tolist() == [[1.0, 2.0]]
    sel = make_ctx(**BASE, **SELECTIVE)
    assert recompute.recompute_moe_time(sel, frac, one, 2 * one, 9 * one).tolist() == [[9.0, 9.0]]


# --------------------------------------------------------------------------- optimizer


def test_optimizer_step_time():
    c = make_ctx(**BASE, optimizer_offload_fraction=0.25)
    owned = np.array([[100.0, 300.0]])
    # 32 HBM bytes per parameter kept on the GPU, at 1.5e12 B/s; the slower rank
    assert optimizer.optimizer_step_time(c, owned)[0] == pytest.approx(32 * 300 * 0.75 / 1.5e12)


def test_offload_times():
    owned = np.array([[100.0, 300.0]])
    c = make_ctx(**BASE, optimizer_offload_fraction=0.25)
    off = optimizer.offloaded_params(c, owned)
    assert off.tolist() == [75.0]
    assert optimizer.cpu_adam_time(c, off)[0] == pytest.approx(75 * 4 / 2e9)  # 4 GPUs share a node's CPUs
    assert optimizer.offload_copy_time(c, off)[0] == pytest.approx(75 * 6 / (5e10 * 0.7))  # fp32 down, bf16 up
    assert optimizer.offload_time(c, owned)[0] == pytest.approx(75 * 4 / 2e9 + 75 * 6 / (5e10 * 0.7) * (1 - 0.3))
    serial = make_ctx(**BASE, optimizer_offload_fraction=0.25, overlap_cpu_optimizer_d2h_h2d=False)
    assert optimizer.offload_time(serial, owned)[0] == pytest.approx(75 * 4 / 2e9 + 75 * 6 / (5e10 * 0.7))
    assert optimizer.offload_time(make_ctx(**BASE), owned)[0] == 0


def test_host_memory_per_node():
    """The node's host memory: 4 GPUs x (the process's RSS + offloaded parameters x host bytes per parameter + the
    first optimizer's fp32 clones of the offloaded share of the unsharded parameters)."""
    owned = np.array([[100.0, 300.0]])
    params = np.array([[200.0, 600.0]])  # unsharded: DP 2
    c = make_ctx(
        **BASE, optimizer_offload_fraction=0.25
    )  # precision-aware (the default): 16 + 4 B per offloaded parameter
    assert optimizer.host_offload_bytes_per_param(c)[0, 0] == 20
    proc = c.cal.host_process_bytes
    # the offload parts compared without the processes' RSS, which would hide them in a relative tolerance
    assert optimizer.host_bytes_per_node(c, owned)[0] - 4 * proc == pytest.approx(4 * (75 * 20 + 75 * 4))
    assert optimizer.host_bytes_per_node(c, owned, params)[0] - 4 * proc == pytest.approx(4 * (75 * 20 + 150 * 4))
    plain = make_ctx(**BASE, optimizer_offload_fraction=0.25, use_precision_aware_optimizer=False)
    assert optimizer.host_offload_bytes_per_param(plain)[0, 0] == 20
    assert optimizer.host_bytes_per_node(make_ctx(**BASE), owned, params)[0] == pytest.approx(
        4 * proc
    )  # no offload: the processes only
