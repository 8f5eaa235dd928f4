"""Communication time: tensor / sequence parallel, context parallel, expert parallel and data parallel.

Rank placement follows Megatron's default order ``tp-cp-ep-dp-pp`` (experts ``etp-ep-edp-pp``,
``megatron/core/parallel_state.py``): a group of ``span`` consecutive ranks stays on NVLink while
``span <= nvlink_size``. Ring collectives move ``(g - 1) / g`` of the tensor per GPU (NCCL's
all-gather / reduce-scatter bus-bandwidth formula, nccl-tests PERFORMANCE.md). Bandwidths are the
datasheet's times :class:`cost_model.calibration.Calibration` efficiencies; times are seconds per
layer per micro-batch (``(n, 1)``) unless stated."""

from __future__ import annotations

import numpy as np

from cost_model.terms import state
from cost_model.terms.context import Array, BoolArray, TableContext, col
from specs import ModelSpec
from specs.units import BF16_BYTES, FP32_BYTES

#: Sequence-parallel collectives around each TP-split block (attention, dense MLP, shared experts)
#: per micro-batch: an all-gather before and a reduce-scatter after it in forward, and the two
#: conjugates in backward (Korthikanti et al. 2022 §4.2.2, the g / g-bar operators).
SP_COLLECTIVES_PER_BLOCK = 4.0

#: Passes of the K/V blocks (CP ring) or of Q, K, V and the output (CP all-to-all): forward once,
#: backward twice (the gradients of K and V travel as well as K and V again).
CP_PASSES = 3.0

#: All-to-alls per MoE layer per pass: dispatch and combine (token_dispatcher.py).
EP_A2A_PER_PASS = 2.0

#: Expert GEMMs per local expert per pass: fc1 and fc2 forward; their dgrad and wgrad backward.
EXPERT_GEMMS_FORWARD = 2.0
EXPERT_GEMMS_BACKWARD = 4.0

#: Quantisation kernels per GEMM input with fp8 current scaling (``--fp8-recipe tensorwise``): an amax reduction
#: and the cast, where delayed scaling casts with the previous amax in one kernel (TE ``Float8CurrentScalingQuantizer``
#: vs ``Float8Quantizer``). [inferred from TE's quantizers; the measured tensorwise row is predicted with it,
#: docs/measurements.md]
FP8_CURRENT_SCALING_KERNELS = 2.0

#: Data-parallel bytes per parameter per step with the distributed optimizer: the fp32 gradient
#: reduce-scatter and the bf16 parameter all-gather (megatron/core/distributed/param_and_grad_buffer.py).
DISTOPT_BYTES_PER_PARAM = FP32_BYTES + BF16_BYTES

#: Megatron FSDP bytes per parameter per micro-batch: bf16 parameters all-gathered for forward
#: and again for backward, fp32 gradients reduce-scattered.
FSDP_BYTES_PER_PARAM = 2 * BF16_BYTES + FP32_BYTES


def span_crosses_node(span: Array, nvlink_size: int) -> BoolArray:
    """A group of ``span`` consecutive ranks leaves the NVLink domain (Megatron packs groups on consecutive ranks).

    Returns: Bool, the shape of ``span``."""
    return span > nvlink_size


def collective_bandwidth(c: TableContext, crosses: BoolArray) -> Array:
    """Per-GPU bandwidth of point-to-point exchanges (the CP ring's K/V passes, pipeline sends): NVLink x
    ``nvlink_efficiency`` inside the NVLink domain, the node's network share per GPU x ``network_efficiency`` across it
    (a GPU's neighbour on another node is reached through its own NIC). NCCL ring collectives: :func:`ring_bandwidth`.

    Returns: Bytes/s, the shape of ``crosses``."""
    cluster, cal = c.cluster, c.cal
    nv = cluster.gpu.nvlink_bytes_per_s * cal.nvlink_efficiency
    net = cluster.inter_node_bytes_per_s / cluster.gpus_per_node * cal.network_efficiency
    return np.where(crosses, net, nv)


def ring_bandwidth(c: TableContext, group: Array, stride: Array | float) -> Array:
    """Per-GPU bandwidth of an NCCL ring collective over ``group`` ranks ``stride`` apart (``(n,)`` or ``(n, 1)``):
    NVLink x ``nvlink_efficiency`` inside the NVLink domain; across domains the ring leaves each domain through the NICs
    of the group's ranks there (``m = min(group, nvlink_size // stride)``, one NIC per GPU), so a GPU moves its share at
    ``m`` x its network share (x ``network_efficiency``), at most at NVLink speed. Assumes the ranks split evenly over
    the domains (as :func:`span_crosses_node`).

    Source: NCCL's multi-node rings (one channel per NIC); nccl-tests ``all_reduce_perf`` 400-450 GB/s bus bandwidth on
    8 x H100 nodes with 8 x NDR 400G (a cluster-validation guide, not measured here), up to 8 x the NIC share."""
    cluster, cal = c.cluster, c.cal
    nv = cluster.gpu.nvlink_bytes_per_s * cal.nvlink_efficiency
    net = cluster.inter_node_bytes_per_s / cluster.gpus_per_node * cal.network_efficiency
    g, s = np.maximum(group, 1), np.maximum(stride, 1)
    per_domain = np.clip(c.nvlink_size // s, 1, g)
    return np.where(span_crosses_node(g * s, c.nvlink_size), np.minimum(nv, per_domain * net), nv)


def ring_time(bytes_full: Array, group: Array, bw: Array) -> Array:
    """All-gather or reduce-scatter of a ``bytes_full`` tensor over ``group`` ranks: ``bytes x (g - 1) / g / bw``
    (0 for a group of one).

    Returns: Seconds, the broadcast shape."""
    g = np.maximum(group, 1)
    return np.where(g > 1, bytes_full * (g - 1) / g / bw, 0.0)


def distinct_groups_hit(num_experts: float, topk: float, groups: Array) -> Array:
    """Expected number of groups (GPUs or nodes, each holding ``num_experts / groups`` experts) holding at least one of
    a token's ``topk`` distinct experts under uniform routing: ``groups * (1 - prod_i (E - E/groups - i) / (E - i))``, i
    = 0..topk-1 (hypergeometric). A count in ``(0, min(groups, topk)]``, for the flex dispatcher's deduplicated sends.
    """
    g: Array = np.maximum(np.asarray(groups, dtype=np.float64), 1.0)
    per = num_experts / g
    miss = np.ones_like(g)
    for i in range(int(topk)):
        miss = miss * np.clip((num_experts - per - i) / (num_experts - i), 0.0, 1.0)
    return g * (1.0 - miss)


def holders_hit(model: ModelSpec, holders: Array) -> Array:
    """Expected number of expert holders (GPUs or NVLink domains, each with ``E / holders`` experts in order) holding
    one of a token's ``topk`` experts under forced (uniform) routing, the shape of ``holders``. With group-limited
    routing (``--moe-router-num-groups G``, ``--moe-router-group-topk K``: ``group_limited_topk`` picks K of G
    contiguous groups, ``megatron/core/transformer/moe/router.py``): holders spanning whole groups (``holders >= G``)
    get :func:`distinct_groups_hit` ``(K E / G, topk, K holders / G)``, holders of whole groups ``(G, K, holders)``;
    without, ``(E, topk, holders)``. DeepSeek-V3 (256 experts, G 8, K 4) over 8 domains: 3.6 hit, not 5.3."""
    e, k = float(model.num_experts), float(model.moe_router_topk)
    g, kg = float(model.moe_router_num_groups), float(model.moe_router_group_topk)
    h: Array = np.maximum(np.asarray(holders, dtype=np.float64), 1.0)
    if not (g > 1 and 0 < kg < g):
        return distinct_groups_hit(e, k, h)
    spans = distinct_groups_hit(kg * e / g, k, kg * h / g)
    within = distinct_groups_hit(g, kg, h)
    return np.where(h >= g, spans, within)


def tp_collective_time(c: TableContext) -> Array:
    """One sequence-parallel all-gather (or reduce-scatter) of a layer's bf16 activation,
    ``2 x tokens x h``, over the TP group."""
    bw = ring_bandwidth(c, col(c.tp), 1)
    return ring_time(BF16_BYTES * c.tokens * c.dims.h, col(c.tp), bw)


def _tp_kept(c: TableContext) -> float:
    """Share of TP collectives left exposed: ``1 - tp_comm_overlap_fraction`` with ``--tp-comm-overlap``, else 1."""
    return 1.0 - c.cal.tp_comm_overlap_fraction if c.options.tp_comm_overlap else 1.0


def tp_attention_comm(c: TableContext, collective: Array) -> Array:
    """TP / SP communication of the attention block, forward + backward: :data:`SP_COLLECTIVES_PER_BLOCK`
    collectives, less what ``--tp-comm-overlap`` hides.

    Args: collective: :func:`tp_collective_time`, ``(n, 1)``."""
    return SP_COLLECTIVES_PER_BLOCK * collective * _tp_kept(c)


def tp_dense_mlp_comm(c: TableContext, collective: Array) -> Array:
    """TP / SP communication of a dense MLP block, forward + backward (as :func:`tp_attention_comm`)."""
    return SP_COLLECTIVES_PER_BLOCK * collective * _tp_kept(c)


def tp_moe_comm(c: TableContext, collective: Array, copies: Array) -> Array:
    """TP communication of a MoE layer's MLP side, forward + backward: the shared experts' SP collectives (if any) plus,
    with ETP > 1, the same four collectives on the dispatched token copies (``2 x copies x h``) over the ETP group.

    Args: collective: :func:`tp_collective_time`, ``(n, 1)``; copies: routed token copies per GPU, ``(n, 1)``."""
    shared = np.where(c.dims.shared_ffn > 0, SP_COLLECTIVES_PER_BLOCK * collective, 0.0)
    bw = ring_bandwidth(c, col(c.etp), 1)
    experts = SP_COLLECTIVES_PER_BLOCK * ring_time(BF16_BYTES * copies * c.dims.h, col(c.etp), bw)
    return (shared + experts) * _tp_kept(c)


def _cp_bandwidth(c: TableContext) -> Array:
    """CP peers are ``tp`` ranks apart: the group spans ``tp x cp`` ranks."""
    return collective_bandwidth(c, col(span_crosses_node(c.tp * c.cp, c.nvlink_size)))


def cp_ring_time(c: TableContext) -> Array:
    """``--cp-comm-type p2p``: the K/V blocks (``2 x tokens x kv_dim / tp``) are passed ``cp - 1`` times
    per pass, :data:`CP_PASSES` passes, ``1 - cp_p2p_overlap`` of it exposed (Megatron overlaps each
    block's send with the previous block's attention; TE ``AttnFuncWithCPAndKVP2P``).

    Returns: Seconds, ``(n, 1)``; 0 without CP."""
    cp = col(c.cp)
    sent = CP_PASSES * (cp - 1) * BF16_BYTES * c.tokens * c.dims.kv_dim / col(c.tp)
    t = sent / _cp_bandwidth(c) * (1 - c.cal.cp_p2p_overlap)
    return np.where(cp > 1, t, 0.0)


def cp_all_to_all_time(c: TableContext) -> Array:
    """``--cp-comm-type a2a`` (Ulysses): all-to-all of Q, K, V before and of the output after attention, ``2 x tokens x
    (q_dim + kv_dim + ctx_dim) / tp x (cp - 1) / cp`` bytes per pass, :data:`CP_PASSES` passes, not overlapped.

    Returns: Seconds, ``(n, 1)``; 0 without CP."""
    m = c.dims
    cp = col(c.cp)
    sent = BF16_BYTES * c.tokens * (m.q_dim + m.kv_dim + m.ctx_dim) / col(c.tp) * (cp - 1) / cp
    return np.where(cp > 1, CP_PASSES * sent / _cp_bandwidth(c), 0.0)


def cp_comm_time(c: TableContext) -> Array:
    """CP communication per layer, forward + backward, for the run's ``cp_comm_type``."""
    if c.options.cp_comm_type == "a2a":
        return cp_all_to_all_time(c)
    return cp_ring_time(c)


def ep_local_peers(c: TableContext) -> Array:
    """EP peers inside one NVLink domain: EP peers are ``etp`` ranks apart (``etp-ep-edp-pp``),
    so ``min(ep, nvlink_size // etp)``.

    Returns: A count, ``(n,)``."""
    per_domain: Array = c.nvlink_size // np.maximum(c.etp, 1)
    return np.minimum(c.ep, np.maximum(per_domain, 1))


def ep_remote_fraction(c: TableContext) -> Array:
    """Share of a GPU's EP peers on other nodes: ``1 - local peers / ep`` when the EP group (``etp x ep``
    ranks) leaves the NVLink domain, else 0.

    Returns: A fraction, ``(n, 1)``."""
    return col(np.where(c.etp * c.ep > c.nvlink_size, 1 - ep_local_peers(c) / c.ep, 0.0))


def ep_send_bytes(c: TableContext) -> Array:
    """Bytes a GPU sends per all-to-all (dispatch or combine) through NCCL: one copy per routed expert on
    another EP rank, ``2 x tokens / tp x h x topk x (ep - 1) / ep x imbalance``; allgather sends every
    token to every EP rank, ``2 x tokens / tp x h x (ep - 1)``.

    Returns: Bytes, ``(n, 1)``."""
    m = c.dims
    ep = col(c.ep)
    tok = BF16_BYTES * c.tokens / col(c.tp) * m.h
    return np.where(c.allgather, tok * (ep - 1), tok * m.topk * (ep - 1) / ep * c.load_imbalance)


def _a2a_bandwidths(c: TableContext) -> tuple[float, float]:
    """(NVLink all-to-all, network per GPU) bandwidths, bytes/s."""
    cluster, cal = c.cluster, c.cal
    nv = cluster.gpu.nvlink_bytes_per_s * cal.alltoall_nvlink_efficiency
    net = cluster.inter_node_bytes_per_s / cluster.gpus_per_node * cal.network_efficiency
    return nv, net


def flex_dispatch_time(c: TableContext, remote: Array) -> Array:
    """One flex all-to-all (DeepEP / HybridEP): a token goes once to each distinct GPU that holds one of its experts
    (:func:`holders_hit` over ``ep`` GPUs); NVLink and network traffic overlap. ``remote`` is
    :func:`ep_remote_fraction`.

    Each link runs at the dispatcher's own published bandwidth: on NVLink ``dispatch_nvlink_efficiency`` (DeepEP 0.96,
    HybridEP 0.82, ``specs/data/networks.yaml``); across nodes ``dispatch_network_efficiency`` of the per-GPU NIC share
    on the bytes its figure counts (:attr:`TableContext.network_counted_per_node`): per remote GPU hit for DeepEP
    (NCCL's fitted figure: its README's kernel bandwidth would put it ahead of alltoall where NVIDIA measured it 1-6%
    behind, docs/published_pairs.md), per NVLink domain hit for HybridEP (its ``count_rdma_send_from_routing_map``,
    DeepEP ``hybrid_ep`` branch README: 41-54 GB/s at EP 16-64 on H100 + IB)."""
    m, cluster = c.dims, c.cluster
    nv = cluster.gpu.nvlink_bytes_per_s * c.dispatch_nvlink_efficiency
    net = cluster.inter_node_bytes_per_s / cluster.gpus_per_node * c.dispatch_network_efficiency
    ep = col(c.ep)
    tok = BF16_BYTES * c.tokens / col(c.tp) * m.h
    gpus_hit = holders_hit(c.model, ep)
    domains = ep / col(ep_local_peers(c))
    copies_across = np.where(c.network_counted_per_node, holders_hit(c.model, domains), gpus_hit * remote)
    over_nvlink = tok * gpus_hit * (ep - 1) / ep * c.load_imbalance
    over_network = np.where(remote > 0, tok * copies_across * c.load_imbalance, 0.0)
    return np.maximum(over_nvlink / nv, over_network / net)


def ep_all_to_all_time(c: TableContext) -> Array:
    """One dispatch or combine: NCCL all-to-all (alltoall, :func:`ep_send_bytes`; the NVLink and network parts in
    parallel, the slower one counts), NCCL all-gather / reduce-scatter (allgather: a ring over the expert TP x EP group,
    :func:`ring_bandwidth`) or flex (:func:`flex_dispatch_time`), less
    ``ep_a2a_overlap`` of it with ``--overlap-moe-expert-parallel-comm``; a flex dispatcher's hidden part still costs
    ``flex_sm_share`` of it, the compute slowed by the SMs its kernels hold."""
    nv, net = _a2a_bandwidths(c)
    remote = ep_remote_fraction(c)
    send = ep_send_bytes(c)
    nccl = np.maximum(send * (1 - remote) / nv, send * remote / net)
    # allgather: an NCCL all-gather (dispatch) / reduce-scatter (combine) over the expert TP x EP group, a ring
    # (MoEAllGatherTokenDispatcher, gather_from_sequence_parallel_region(group=tp_ep_group)): :func:`ring_bandwidth`
    nccl = np.where(c.allgather, send / ring_bandwidth(c, col(c.etp * c.ep), 1.0), nccl)
    one = np.where(c.flex, flex_dispatch_time(c, remote), nccl)
    if c.options.overlap_moe_expert_parallel_comm:
        hidden = one * c.cal.ep_a2a_overlap
        # the flex kernels run on SMs of their own (Megatron's moe_deepep_num_sms / moe_hybridep_num_sms): the compute
        # they overlap slows by that share of the GPU while they run
        one = one - hidden + np.where(c.flex, hidden * c.cal.flex_sm_share, 0.0)
    return one


def _fixed_layer_cost(c: TableContext) -> Array:
    """Per MoE layer per pass: ``moe_layer_overhead_s`` (x ``cuda_graph_overhead_factor`` under whole-iteration CUDA
    graphs, x ``cuda_graph_partial_overhead_factor`` when graphs capture only the router / preprocessing) plus the
    host sync of the tokens per expert, ``moe_host_sync_latency_s``, for every dispatcher (the grouped GEMM's splits
    are a host list)."""
    cal = c.cal
    o = c.options
    graphs = (cal.cuda_graph_overhead_factor if o.cuda_graph_full
              else cal.cuda_graph_partial_overhead_factor if o.cuda_graph_moe else 1.0)
    layer = cal.moe_layer_overhead_s * graphs
    return layer + cal.moe_host_sync_latency_s + np.zeros_like(c.tokens)


def fp8_quantize_cost(c: TableContext) -> float:
    """Fixed cost of quantising one local expert GEMM's operands with per-tensor fp8 (``delayed`` / ``tensorwise``),
    seconds (a scalar): ``fp8_quantize_overhead_s`` (x :data:`FP8_CURRENT_SCALING_KERNELS` for current scaling); TE's
    ``GroupedLinear`` quantises each expert's slice with kernels of its own (docs/measurements.md). 0 for other
    precisions (blockwise, MXFP8, NVFP4: not measured) and without TE."""
    if c.workload.precision.value != "fp8" or not c.options.te_attention:
        return 0.0
    kernels = FP8_CURRENT_SCALING_KERNELS if c.options.fp8_recipe == "tensorwise" else 1.0
    return c.cal.fp8_quantize_overhead_s * kernels


def _expert_gemm_cost(c: TableContext) -> float:
    """``expert_gemm_overhead_s`` plus :func:`fp8_quantize_cost` per local expert GEMM (x ``cuda_graph_overhead_factor``
    under whole-iteration graphs)."""
    cal = c.cal
    return (cal.expert_gemm_overhead_s + fp8_quantize_cost(c)) * (cal.cuda_graph_overhead_factor
                                                                  if c.options.cuda_graph_full else 1.0)


def moe_fixed_cost_forward(c: TableContext) -> Array:
    """Fixed cost of a MoE layer's forward (also a recomputed one): the per-layer cost plus one GEMM
    launch per local expert (``E / ep``) for fc1 and fc2."""
    return _fixed_layer_cost(c) + EXPERT_GEMMS_FORWARD * col(c.dims.experts / c.ep) * _expert_gemm_cost(c)


def moe_fixed_cost_backward(c: TableContext) -> Array:
    """Fixed cost of a MoE layer's backward: the per-layer cost plus dgrad and wgrad launches of fc1 and fc2
    per local expert."""
    return _fixed_layer_cost(c) + EXPERT_GEMMS_BACKWARD * col(c.dims.experts / c.ep) * _expert_gemm_cost(c)


def ep_forward_time(c: TableContext, a2a: Array) -> Array:
    """EP time of one forward pass of a MoE layer (also what a recomputed forward costs):
    :data:`EP_A2A_PER_PASS` all-to-alls (0 when ep = 1) plus the forward fixed cost.

    Args: a2a: :func:`ep_all_to_all_time`, ``(n, 1)``.

    Returns: Seconds, ``(n, 1)``; 0 for a dense model."""
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    return np.where(col(c.ep) > 1, EP_A2A_PER_PASS * a2a, 0.0) + moe_fixed_cost_forward(c)


def ep_layer_time(c: TableContext, a2a: Array) -> Array:
    """EP time of a MoE layer, forward + backward: two passes of :data:`EP_A2A_PER_PASS` all-to-alls
    and both fixed costs.

    Args: a2a: :func:`ep_all_to_all_time`, ``(n, 1)``.

    Returns: Seconds, ``(n, 1)``; 0 for a dense model."""
    if not c.dims.is_moe:
        return np.zeros_like(c.tokens)
    one_pass = np.where(col(c.ep) > 1, EP_A2A_PER_PASS * a2a, 0.0)
    return 2 * one_pass + moe_fixed_cost_forward(c) + moe_fixed_cost_backward(c)


def dp_bytes_per_param(c: TableContext) -> Array:
    """Data-parallel bytes per parameter per step, ``(n, 1)``: with the distributed optimizer the main-gradient
    reduce-scatter in the gradient dtype (:func:`cost_model.terms.state.main_grad_bytes_per_param`) and the parameter
    all-gather in the compute weights' dtype (bf16, or the quantised bytes with ``fp8_param_gather``,
    param_and_grad_buffer.py); without it an all-reduce, two gradient reduce-scatters. (:data:`DISTOPT_BYTES_PER_PARAM`
    = 6 with fp32 grads and bf16 weights.)"""
    grad = state.main_grad_bytes_per_param(c)
    gather = c.low_precision_weight_bytes if c.options.low_precision_params(c.workload.precision) else BF16_BYTES
    return np.where(c.distributed_optimizer, grad + gather, 2 * grad)


def dp_comm_time(c: TableContext, dense: Array, experts: Array, window: Array | None = None) -> Array:
    """Data-parallel communication per step on the slowest rank, ``(n,)``: the dense parameters' gradient reduce-scatter
    and parameter all-gather over DP x CP, the experts' over EDP (:func:`dp_bytes_per_param`; an all-reduce without the
    distributed optimizer); with Megatron FSDP every micro-batch (:data:`FSDP_BYTES_PER_PARAM`). ``dense`` and
    ``experts`` are parameters per GPU, ``(n, K)``.

    With ``--overlap-grad-reduce`` (or FSDP) ``dp_overlap`` of it is hidden, but never more than ``window`` (seconds of
    one micro-batch per rank class, ``(n, K)``; None: no bound): megatron-core reduces the gradients in the last
    micro-batch's backward only (the others run under ``no_sync``, schedules.py) and gathers the parameters in the first
    one's forward (distributed_data_parallel.py), so the distributed optimizer hides at most one micro-batch per rank;
    FSDP, which gathers and reduces every micro-batch, at most all of them."""
    opt, cal = c.options, c.cal
    dpcp = col(c.dp * c.cp)
    dense_bw = ring_bandwidth(c, dpcp, col(c.tp))  # the DP x CP group: ranks tp apart (tp-cp-ep-dp-pp)
    exp_bw = ring_bandwidth(c, col(c.edp), col(c.etp * c.ep))  # EDP: etp x ep apart (etp-ep-edp-pp)
    if opt.use_megatron_fsdp:
        b = FSDP_BYTES_PER_PARAM
        per_rank = col(c.micro_batches) * (ring_time(b * dense, dpcp, dense_bw)
                                           + ring_time(b * experts, col(c.edp), exp_bw))
    else:
        per_param = dp_bytes_per_param(c)
        per_rank = ring_time(per_param * dense, dpcp, dense_bw) + ring_time(per_param * experts, col(c.edp), exp_bw)
    share = cal.dp_overlap if (opt.overlap_grad_reduce or opt.use_megatron_fsdp) else 0.0
    hidden = share * per_rank
    if window is not None:
        hidden = np.minimum(hidden, window * (col(c.micro_batches) if opt.use_megatron_fsdp else 1.0))
    worst: Array = ((per_rank - hidden) * c.live).max(axis=1)
    return worst
