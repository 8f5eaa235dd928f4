"""Communication terms, worked out by hand on TEST_CLUSTER (4 nodes of 4 GPUs).

Bandwidths: NVLink 4e11 B/s x 0.75 = 3e11 for rings, x 0.55 = 2.2e11 for all-to-all; network
2e11 B/s per node / 4 GPUs x 0.8 = 4e10 per GPU. BASE: tp 2, pp 2, cp 2, ep 4, etp 1, dp 2, edp 2,
512 tokens per micro-batch, h 64.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from term_fixtures import BASE, TEST_CAL, TINY_DENSE, make_ctx

from cost_model.terms import activations, comm
from specs import RunOptions, Workload

NV, NET, A2A = 3e11, 4e10, 2.2e11
FORCED = RunOptions(moe_router_force_load_balancing=True)


def test_span_crosses_node():
    assert comm.span_crosses_node(np.array([1.0, 4.0, 8.0]), 4).tolist() == [False, False, True]


def test_collective_bandwidth():
    out = comm.collective_bandwidth(make_ctx(**BASE), np.array([False, True]))
    assert out.tolist() == pytest.approx([NV, NET])


def test_ring_bandwidth_counts_the_nics_of_the_group_on_a_node():
    c = make_ctx(**BASE)  # 4 GPUs per node
    group, stride = np.array([4.0, 8.0, 8.0, 8.0, 2.0]), np.array([1.0, 1.0, 2.0, 4.0, 8.0])
    # inside a node; 4 ranks per node (4 NICs); 2 per node; 1 per node; ranks 8 apart: 1 per node
    assert comm.ring_bandwidth(c, group, stride).tolist() == pytest.approx([NV, 4 * NET, 2 * NET, NET, NET])
    many = dataclasses.replace(c, nvlink_size=16)
    # a 16-GPU NVLink domain, group 32 ranks 1 apart: 16 NICs would be 16 x NET, more than NVLink, which caps it
    assert comm.ring_bandwidth(many, np.array([32.0]), np.array([1.0]))[0] == pytest.approx(NV)


def test_ring_time():
    out = comm.ring_time(np.array([100.0]), np.array([1.0, 4.0]), np.array([10.0]))
    assert out.tolist() == [0.0, 100 * 3 / 4 / 10]


def test_distinct_groups_hit_by_hand():
    # 4 GPUs of 2 experts, top-2 of 8: 4 x (1 - 6/8 x 5/7)
    assert comm.distinct_groups_hit(8, 2, np.array([4.0]))[0] == pytest.approx(4 * (1 - 6 / 8 * 5 / 7))


def test_tp_collective_time_inside_and_across_nodes():
    assert comm.tp_collective_time(make_ctx(**BASE))[0, 0] == pytest.approx(2 * 512 * 64 / 2 / NV)
    wide = make_ctx(
        model=TINY_DENSE, tp=8, sequence_parallel=True
    )  # 8 > 4 GPUs per node: the ring leaves through 4 NICs
    assert comm.tp_collective_time(wide)[0, 0] == pytest.approx(2 * 1024 * 64 * 7 / 8 / (4 * NET))


def test_tp_block_comm_four_collectives_less_the_overlap():
    one = np.array([[1.0]])
    c = make_ctx(**BASE)
    ovl = make_ctx(options=RunOptions(tp_comm_overlap=True), **BASE)
    assert comm.tp_attention_comm(c, one)[0, 0] == 4 and comm.tp_attention_comm(ovl, one)[0, 0] == 4 * 0.5
    assert comm.tp_dense_mlp_comm(c, one)[0, 0] == 4 and comm.tp_dense_mlp_comm(ovl, one)[0, 0] == 4 * 0.5


def test_tp_moe_comm_shared_experts_and_etp():
    one = np.array([[1.0]])
    c = make_ctx(**BASE)
    assert comm.tp_moe_comm(c, one, activations.routed_token_copies(c))[0, 0] == 4  # shared experts only (etp 1)
    e = make_ctx(options=FORCED, **{**BASE, "cp": 1, "etp": 2})
    copies = activations.routed_token_copies(e)[0, 0]  # 1,024 x 2 x 2 / 2
    assert comm.tp_moe_comm(e, one, activations.routed_token_copies(e))[0, 0] == pytest.approx(
        4 + 4 * 2 * copies * 64 / 2 / NV
    )
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert comm.tp_moe_comm(d, one, activations.routed_token_copies(d))[0, 0] == 0  # no shared experts, no ETP


def test_cp_ring_time():
    # K/V blocks (kv_dim 64) passed cp - 1 = 1 time per pass, 3 passes, half hidden
    assert comm.cp_ring_time(make_ctx(**BASE))[0, 0] == pytest.approx(3 * 1 * 2 * 512 * 64 / 2 / NV * 0.5)
    wide = make_ctx(tp=2, cp=4, ep=2, sequence_parallel=True)  # tp x cp = 8 ranks: the network; 256 tokens
    assert comm.cp_ring_time(wide)[0, 0] == pytest.approx(3 * 3 * 2 * 256 * 64 / 2 / NET * 0.5)
    assert comm.cp_ring_time(make_ctx(tp=2, pp=2, ep=4, sequence_parallel=True))[0, 0] == 0


def test_cp_all_to_all_time():
    sent = 2 * 512 * (64 + 64 + 64) / 2 * 1 / 2
    assert comm.cp_all_to_all_time(make_ctx(**BASE))[0, 0] == pytest.approx(3 * sent / NV)
    assert comm.cp_comm_time(make_ctx(options=RunOptions(cp_comm_type="a2a"), **BASE))[0, 0] == pytest.approx(
        3 * sent / NV
    )
    assert comm.cp_comm_time(make_ctx(**BASE))[0, 0] == pytest.approx(comm.cp_ring_time(make_ctx(**BASE))[0, 0])


def test_ep_local_peers_and_remote_fraction():
    for layout, peers, remote in (
        (BASE, 4, 0.0),  # ep 4 on one node
        (dict(tp=2, ep=8, sequence_parallel=True), 4, 0.5),  # ep 8 over two nodes
        (dict(tp=2, ep=4, etp=2, sequence_parallel=True), 2, 0.5),  # peers 2 apart: 2 per node
    ):
        c = make_ctx(**layout)
        assert comm.ep_local_peers(c)[0] == peers
        assert comm.ep_remote_fraction(c)[0, 0] == remote


def test_ep_send_bytes():
    # one copy per routed expert on another EP rank: 2 x 512 / 2 x 64 x top-2 x 3/4 x 1.2
    assert comm.ep_send_bytes(make_ctx(**BASE))[0, 0] == pytest.approx(2 * 256 * 64 * 2 * 3 / 4 * 1.2)
    # allgather: every token to each of the 3 other EP ranks
    assert comm.ep_send_bytes(make_ctx(**BASE, dispatcher="allgather"))[0, 0] == pytest.approx(2 * 256 * 64 * 3)


def test_flex_dispatch_time_inside_a_node():
    c = make_ctx(options=FORCED, **BASE)
    hit = 4 * (1 - 6 / 8 * 5 / 7)  # distinct GPUs of 4 that hold one of a token's 2 experts
    nvlink = 2 * 256 * 64 * hit * 3 / 4
    # called for an alltoall row: NCCL's NVLink efficiency (no fixed flex speed-up any more)
    assert comm.flex_dispatch_time(c, comm.ep_remote_fraction(c))[0, 0] == pytest.approx(nvlink / A2A)
    deep = make_ctx(options=FORCED, dispatcher="flex+deepep", **BASE)
    assert comm.flex_dispatch_time(deep, comm.ep_remote_fraction(deep))[0, 0] == pytest.approx(
        nvlink / (4e11 * 0.96)
    )  # DeepEP README


def test_flex_dispatch_time_across_nodes_deepep_sends_once_per_node():
    # ep 8 over 2 nodes, 1,024 tokens / tp 2 per GPU, forced balance
    lay = dict(tp=2, ep=8, sequence_parallel=True)
    tok = 2 * 1024 / 2 * 64
    gpus_hit = 8 * (1 - 7 / 8 * 6 / 7)  # = 2
    nvlink = tok * gpus_hit * 7 / 8
    hybrid = make_ctx(options=FORCED, dispatcher="flex+hybridep", **lay)
    net_hybrid = tok * gpus_hit * 0.5  # per GPU: the remote half of the GPUs hit
    # no network named: NVLink at the backend's own efficiency (HybridEP 0.82, DeepEP 0.96), the network at NCCL's
    assert comm.flex_dispatch_time(hybrid, comm.ep_remote_fraction(hybrid))[0, 0] == pytest.approx(
        max(nvlink / (4e11 * 0.82), net_hybrid / NET)
    )
    deep = make_ctx(options=FORCED, dispatcher="flex+deepep", **lay)
    # DeepEP too: the bytes for the remote GPUs hit at NCCL's figure (no fabric named here)
    assert comm.flex_dispatch_time(deep, comm.ep_remote_fraction(deep))[0, 0] == pytest.approx(
        max(nvlink / (4e11 * 0.96), net_hybrid / NET)
    )


def test_flex_dispatch_time_at_the_fabric_s_efficiency():
    """On InfiniBand NDR HybridEP's network part runs at its own figure (1.0 of the NIC, per NVLink domain hit: the
    next test); DeepEP's at NCCL's fitted figure per remote GPU hit (its kernel bandwidth did not show in NVIDIA's
    training pairs, docs/validation.md), as alltoall's."""
    import dataclasses

    from term_fixtures import TEST_CLUSTER, TEST_WORKLOAD, TINY_MOE

    from cost_model.terms.context import build_context
    from specs import load_network
    from specs.layout import Layout, LayoutTable

    ib = dataclasses.replace(TEST_CLUSTER, network=load_network("ib-ndr"))
    lay = Layout(world_size=16, tp=2, ep=8, sequence_parallel=True, dispatcher="flex+deepep")
    c = build_context(TINY_MOE, ib, TEST_WORKLOAD, LayoutTable.from_layouts([lay]), TEST_CAL, FORCED)
    assert (
        c.dispatch_network_efficiency[0, 0] == TEST_CAL.network_efficiency
        and c.dispatch_nvlink_efficiency[0, 0] == 0.96
    )
    tok = 2 * 1024 / 2 * 64
    net_deep = tok * 2 * 0.5  # 2 GPUs hit, half of them remote
    nvlink = tok * 2 * 7 / 8
    assert comm.flex_dispatch_time(c, comm.ep_remote_fraction(c))[0, 0] == pytest.approx(
        max(nvlink / (4e11 * 0.96), net_deep / (2e11 / 4 * TEST_CAL.network_efficiency))
    )
    hy = build_context(
        TINY_MOE,
        ib,
        TEST_WORKLOAD,
        LayoutTable.from_layouts([lay.replace(dispatcher="flex+hybridep")]),
        TEST_CAL,
        FORCED,
    )
    assert hy.dispatch_network_efficiency[0, 0] == 1.0
    nccl = build_context(
        TINY_MOE, ib, TEST_WORKLOAD, LayoutTable.from_layouts([lay.replace(dispatcher="alltoall")]), TEST_CAL, FORCED
    )
    assert nccl.dispatch_network_efficiency[0, 0] == TEST_CAL.network_efficiency


def test_hybridep_across_infiniband_is_counted_per_node_hit():
    """HybridEP's published IB bandwidth (hybrid_ep README, H100: ~1.0 of the NIC) is counted per (token, NVLink
    domain) pair, the token's own domain included: across nodes its time is the domains hit over the NIC at 1.0, not the
    remote GPUs hit (DeepEP's, NCCL's, stays per remote GPU)."""
    import dataclasses

    from term_fixtures import TEST_CLUSTER, TEST_WORKLOAD, TINY_MOE

    from cost_model.terms.context import build_context
    from specs import load_network
    from specs.layout import Layout, LayoutTable

    ib = dataclasses.replace(TEST_CLUSTER, network=load_network("ib-ndr"))
    # ep 8 over 2 nodes of 4 GPUs, tp 2: 8 experts, a token's top-2 hit 2 GPUs and 2 * (1 - 4/8 * 3/7) = 1.571 nodes
    lay = Layout(world_size=16, tp=2, ep=8, sequence_parallel=True, dispatcher="flex+hybridep")
    c = build_context(TINY_MOE, ib, TEST_WORKLOAD, LayoutTable.from_layouts([lay]), TEST_CAL, FORCED)
    assert c.network_counted_per_node[0, 0] and c.dispatch_network_efficiency[0, 0] == 1.0
    tok = 2 * 1024 / 2 * 64
    nodes_hit = 2 * (1 - 4 / 8 * 3 / 7)
    nvlink = tok * 2 * 7 / 8
    expected = max(nvlink / (4e11 * 0.82), tok * nodes_hit / (2e11 / 4 * 1.0))
    assert comm.flex_dispatch_time(c, comm.ep_remote_fraction(c))[0, 0] == pytest.approx(expected)
    deep = build_context(
        TINY_MOE, ib, TEST_WORKLOAD, LayoutTable.from_layouts([lay.replace(dispatcher="flex+deepep")]), TEST_CAL, FORCED
    )
    assert not deep.network_counted_per_node[0, 0]
    # inside one node nothing crosses the NIC, whatever the count
    one = build_context(TINY_MOE, ib, TEST_WORKLOAD, LayoutTable.from_layouts([lay.replace(ep=2)]), TEST_CAL, FORCED)
    hit2 = 2 * (1 - 4 / 8 * 3 / 7)
    assert comm.flex_dispatch_time(one, comm.ep_remote_fraction(one))[0, 0] == pytest.approx(
        tok * hit2 * 1 / 2 / (4e11 * 0.82)
    )


def test_ep_all_to_all_time():
    nccl = 2 * 256 * 64 * 2 * 3 / 4 * 1.2 / A2A
    assert comm.ep_all_to_all_time(make_ctx(**BASE))[0, 0] == pytest.approx(nccl)
    ovl = make_ctx(options=RunOptions(overlap_moe_expert_parallel_comm=True), **BASE)
    assert comm.ep_all_to_all_time(ovl)[0, 0] == pytest.approx(
        nccl * (1 - 0.68)
    )  # ep_a2a_overlap 0.68 (the published pair)
    flex = make_ctx(**BASE, dispatcher="flex+hybridep")
    flex_one = comm.flex_dispatch_time(flex, comm.ep_remote_fraction(flex))[0, 0]
    assert comm.ep_all_to_all_time(flex)[0, 0] == pytest.approx(flex_one)
    # with overlap the hidden 68% of a flex all-to-all still costs the SMs its kernels hold (15% of it)
    flex_ovl = make_ctx(options=RunOptions(overlap_moe_expert_parallel_comm=True), **BASE, dispatcher="flex+hybridep")
    assert comm.ep_all_to_all_time(flex_ovl)[0, 0] == pytest.approx(flex_one * 0.32 + flex_one * 0.68 * 0.15)
    # across nodes NCCL's NVLink and network parts run in parallel: the slower counts
    wide = make_ctx(options=FORCED, tp=2, ep=8, sequence_parallel=True)
    send = 2 * 1024 / 2 * 64 * 2 * 7 / 8
    assert comm.ep_all_to_all_time(wide)[0, 0] == pytest.approx(max(send * 0.5 / A2A, send * 0.5 / NET))
    # allgather: an all-gather ring over etp x ep, here 8 ranks on 4-GPU nodes, 4 of them (4 NICs) per node; inside a
    # node NV
    gather = make_ctx(options=FORCED, tp=2, ep=8, sequence_parallel=True, dispatcher="allgather")
    assert comm.ep_all_to_all_time(gather)[0, 0] == pytest.approx(2 * 1024 / 2 * 64 * 7 / (4 * NET))
    inside = make_ctx(**BASE, dispatcher="allgather")  # ep 4 on one node
    assert comm.ep_all_to_all_time(inside)[0, 0] == pytest.approx(2 * 256 * 64 * 3 / NV)


def test_moe_fixed_costs():
    c = make_ctx(**BASE)  # alltoall: layer cost 0.3 ms + host sync 0.5 ms; 8/4 = 2 local experts x 30 us per GEMM
    assert comm.moe_fixed_cost_forward(c)[0, 0] == pytest.approx(0.3e-3 + 0.5e-3 + 2 * 2 * 30e-6)
    assert comm.moe_fixed_cost_backward(c)[0, 0] == pytest.approx(0.3e-3 + 0.5e-3 + 4 * 2 * 30e-6)
    flex = make_ctx(**BASE, dispatcher="flex+deepep")  # the same host sync: the grouped GEMM's splits are a host list
    assert comm.moe_fixed_cost_forward(flex)[0, 0] == pytest.approx(0.3e-3 + 0.5e-3 + 2 * 2 * 30e-6)
    # TE graphs of the router only: the partial factor on the layer cost, none on the per-expert GEMMs (still eager)
    cal = TEST_CAL.replace(cuda_graph_overhead_factor=0.3, cuda_graph_partial_overhead_factor=0.6)
    graphs = make_ctx(cal=cal, options=RunOptions(cuda_graph_scope=("moe_router",)), **BASE)
    assert comm.moe_fixed_cost_forward(graphs)[0, 0] == pytest.approx(0.3e-3 * 0.6 + 0.5e-3 + 2 * 2 * 30e-6)
    # a whole-iteration graph: the full factor on both
    whole = make_ctx(cal=cal, options=RunOptions(cuda_graph_scope=("full_iteration",)), **BASE)
    assert comm.moe_fixed_cost_backward(whole)[0, 0] == pytest.approx(0.3e-3 * 0.3 + 0.5e-3 + 4 * 2 * 30e-6 * 0.3)
    both = make_ctx(cal=cal, options=RunOptions(cuda_graph_scope=("moe_router", "full")), **BASE)  # whole layers win
    assert comm.moe_fixed_cost_forward(both)[0, 0] == pytest.approx(0.3e-3 * 0.3 + 0.5e-3 + 2 * 2 * 30e-6 * 0.3)


def test_fp8_quantize_cost_per_local_expert_gemm():
    fp8 = Workload(seq_length=1024, global_batch_size=16, precision="fp8")
    cal = TEST_CAL.replace(fp8_quantize_overhead_s=10e-6)
    assert comm.fp8_quantize_cost(make_ctx(cal=cal, **BASE)) == 0.0  # bf16
    blockwise = Workload(seq_length=1024, global_batch_size=16, precision="fp8_blockwise")
    assert (
        comm.fp8_quantize_cost(make_ctx(cal=cal, workload=blockwise, **BASE)) == 0.0
    )  # measured for per-tensor fp8 only
    assert comm.fp8_quantize_cost(make_ctx(cal=cal, workload=fp8, **BASE)) == pytest.approx(10e-6)
    cs = make_ctx(cal=cal, workload=fp8, options=RunOptions(fp8_recipe="tensorwise"), **BASE)
    assert comm.fp8_quantize_cost(cs) == pytest.approx(2 * 10e-6)  # amax reduction + cast
    # it adds to every local expert GEMM (2 local experts; 2 forward GEMMs each)
    c = make_ctx(cal=cal, workload=fp8, **BASE)
    assert comm.moe_fixed_cost_forward(c)[0, 0] == pytest.approx(0.3e-3 + 0.5e-3 + 2 * 2 * (30e-6 + 10e-6))


def test_ep_forward_and_layer_times():
    a2a = np.array([[1e-3]])
    c = make_ctx(**BASE)
    fwd, bwd = 0.3e-3 + 0.5e-3 + 4 * 30e-6, 0.3e-3 + 0.5e-3 + 8 * 30e-6
    assert comm.ep_forward_time(c, a2a)[0, 0] == pytest.approx(2e-3 + fwd)  # dispatch + combine
    assert comm.ep_layer_time(c, a2a)[0, 0] == pytest.approx(2 * 2e-3 + fwd + bwd)
    ep1 = make_ctx(tp=2, pp=2, sequence_parallel=True)  # ep 1: no all-to-all, 8 local experts
    assert comm.ep_layer_time(ep1, a2a)[0, 0] == pytest.approx(2 * (0.3e-3 + 0.5e-3) + (2 + 4) * 8 * 30e-6)
    d = make_ctx(model=TINY_DENSE, tp=2, sequence_parallel=True)
    assert comm.ep_forward_time(d, a2a)[0, 0] == 0 and comm.ep_layer_time(d, a2a)[0, 0] == 0


def test_dp_comm_time():
    dense, experts = np.array([[100.0, 200.0]]), np.array([[10.0, 20.0]])
    # BASE: dense group tp x cp x dp = 8 and expert group etp x ep x edp = 8 leave the node; the slower rank (1):
    # reduce-scatter fp32 + all-gather bf16 = 6 B/param over dp x cp = 4 (ranks tp = 2 apart: 2 of them, so 2 NICs, per
    # node) and edp = 2 (etp x ep = 4 apart: one per node, one NIC)
    slow = 6 * 200 * 3 / 4 / (2 * NET) + 6 * 20 / 2 / NET
    assert comm.dp_comm_time(make_ctx(**BASE), dense, experts)[0] == pytest.approx(slow)
    ovl = make_ctx(options=RunOptions(overlap_grad_reduce=True), **BASE)  # dp_overlap 0.25 hidden
    assert comm.dp_comm_time(ovl, dense, experts)[0] == pytest.approx(slow * 0.75)
    allreduce = make_ctx(**BASE, use_distributed_optimizer=False, use_precision_aware_optimizer=False)
    assert comm.dp_comm_time(allreduce, dense, experts)[0] == pytest.approx(
        8 * 200 * 3 / 4 / (2 * NET) + 8 * 20 / 2 / NET
    )
    fsdp = make_ctx(options=RunOptions(use_megatron_fsdp=True), **BASE)  # every micro-batch (8), 2 x bf16 + fp32
    assert comm.dp_comm_time(fsdp, dense, experts)[0] == pytest.approx(
        8 * (8 * 200 * 3 / 4 / (2 * NET) + 8 * 20 / 2 / NET) * 0.75
    )


def test_dp_overlap_hides_at_most_one_micro_batch():
    """The distributed optimizer's reduce-scatter and all-gather hide behind the last micro-batch's backward and the
    first
    one's forward: never more than one micro-batch's time per rank; FSDP's, behind every micro-batch (8 here)."""
    dense, experts = np.array([[100.0, 200.0]]), np.array([[10.0, 20.0]])
    per_rank = np.array([6 * 100 * 3 / 4 / 2 + 6 * 10 / 2, 6 * 200 * 3 / 4 / 2 + 6 * 20 / 2]) / NET  # dense: 2 NICs
    ovl = make_ctx(options=RunOptions(overlap_grad_reduce=True), **BASE)
    wide = np.array([[1.0, 1.0]])  # a window longer than the communication: only dp_overlap (0.25) limits
    assert comm.dp_comm_time(ovl, dense, experts, wide)[0] == pytest.approx(per_rank[1] * 0.75)
    narrow = np.array([[0.1, 0.05]]) * per_rank  # shorter than 0.25 of it: the window is what is hidden, per rank
    assert comm.dp_comm_time(ovl, dense, experts, narrow)[0] == pytest.approx(
        max(per_rank[0] * 0.9, per_rank[1] * 0.95)
    )
    fsdp = make_ctx(options=RunOptions(use_megatron_fsdp=True), **BASE)
    f_rank = 8 * np.array([8 * 100 * 3 / 4 / 2 + 8 * 10 / 2, 8 * 200 * 3 / 4 / 2 + 8 * 20 / 2]) / NET
    f_win = np.array([[0.01, 0.01]]) * f_rank  # hidden 8 x the window, less than dp_overlap's share
    assert comm.dp_comm_time(fsdp, dense, experts, f_win)[0] == pytest.approx(max(f_rank * (1 - 8 * 0.01)))
    none = make_ctx(**BASE)  # no overlap flag: nothing hidden whatever the window
    assert comm.dp_comm_time(none, dense, experts, wide)[0] == pytest.approx(per_rank[1])


def test_dp_bytes_per_param_follow_the_grad_and_param_dtypes():
    assert comm.dp_bytes_per_param(make_ctx(**BASE))[0, 0] == 4 + 2  # fp32 grads reduce-scattered, bf16 params gathered
    assert comm.dp_bytes_per_param(make_ctx(options=RunOptions(grad_reduce_in_fp32=False), **BASE))[0, 0] == 2 + 2
    fp8 = Workload(seq_length=1024, global_batch_size=16, precision="fp8")
    gather = make_ctx(workload=fp8, options=RunOptions(grad_reduce_in_fp32=False, fp8_param_gather=True), **BASE)
    assert comm.dp_bytes_per_param(gather)[0, 0] == 2 + 1  # fp8 params gathered in fp8
    no_distopt = make_ctx(**BASE, use_distributed_optimizer=False, use_precision_aware_optimizer=False)
    assert comm.dp_bytes_per_param(no_distopt)[0, 0] == 2 * 4  # an all-reduce


def test_holders_hit_under_group_limited_routing():
    """DeepSeek-V3's router picks 4 of 8 expert groups, then 8 experts inside them: over 8 NVLink domains (a group
    each) a token reaches 4 x (1 - C(96, 8) / C(128, 8)) domains, over 64 GPUs the distinct GPUs of 32; over 4 domains
    (two groups each) the distinct domains of 4 groups drawn from 8. Without groups the uniform count stands."""
    import math

    from specs import load_model

    ds = load_model("DeepSeek-V3")
    assert (ds.moe_router_num_groups, ds.moe_router_group_topk) == (8, 4)
    miss = math.comb(96, 8) / math.comb(128, 8)
    assert comm.holders_hit(ds, np.array([8.0]))[0] == pytest.approx(4 * (1 - miss))
    assert comm.holders_hit(ds, np.array([64.0]))[0] == pytest.approx(32 * (1 - math.comb(124, 8) / math.comb(128, 8)))
    assert comm.holders_hit(ds, np.array([4.0]))[0] == pytest.approx(4 * (1 - math.comb(6, 4) / math.comb(8, 4)))
    plain = ds.replace(moe_router_num_groups=0, moe_router_group_topk=0)
    assert comm.holders_hit(plain, np.array([8.0]))[0] == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
