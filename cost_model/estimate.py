"""The analytical memory and step-time model, vectorised over a table of layouts.

One implementation serves both one layout (:func:`estimate`) and a whole search
space (:func:`estimate_table`): every quantity is a numpy array with one entry
per layout (shape ``(n,)``) or per layout and pipeline-rank class (shape ``(n, K)``:
ranks that hold the same layers form one class, so K is 1 to 4, whatever ``pp``).

Sources of the formulas:
- weights, gradients and optimizer states: Megatron's
  ``megatron/training/theoretical_memory_usage.py`` (EP-aware form, notes §6.1),
  with the precision-aware optimizer's dtypes and CPU offload added;
- activations: Korthikanti et al. 2022 (arXiv 2205.05198, Table 2) per tensor,
  extended to GQA, flash attention (no s x s scores kept), MoE token copies and
  each recompute choice; in-flight micro-batches of the 1F1B and interleaved
  schedules from ``megatron/core/pipeline_parallel/schedules.py`` (warm-up counts);
- FLOPs: :mod:`cost_model.flops` (Megatron's ``num_floating_point_operations``);
- pipeline bubble ``(pp-1)/(m*vpp)``: Narayanan et al. 2021 (arXiv 2104.04473 §2.2);
- rank placement: Megatron's default order ``tp-cp-ep-dp-pp`` (``parallel_state.py``).

Every efficiency and overhead constant is a named field of
:class:`cost_model.calibration.Calibration`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from cost_model.calibration import DEFAULT_CALIBRATION, Calibration
from cost_model.flops import megatron_flops_per_token
from cost_model.types import Estimate
from search_spaces.pipeline import stage_layer_counts
from search_spaces.rules import check_layout
from specs import DEFAULT_RUN_OPTIONS, Cluster, ModelSpec, Precision, RunOptions, Workload
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout, LayoutTable
from specs.layout import categories as _categories

__all__ = ["EstimateTable", "estimate", "estimate_table", "MEMORY_PARTS", "TIME_PARTS"]

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

BF16 = 2.0
FP32 = 4.0


@dataclass(frozen=True, slots=True)
class EstimateTable:
    """Estimates for every row of a :class:`LayoutTable` (arrays of shape ``(n,)``)."""

    memory: dict[str, np.ndarray]
    """Bytes per part, worst pipeline rank (the rank with the highest total)."""
    peak_bytes: np.ndarray
    time: dict[str, np.ndarray]
    """Seconds per step per part."""
    step_time_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    mfu: np.ndarray
    model_tflops_per_gpu: np.ndarray
    usd_per_million_tokens: np.ndarray
    hbm_bytes: float
    usable_bytes: float

    @property
    def fits(self) -> np.ndarray:
        return self.peak_bytes <= self.usable_bytes

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
        )


# --------------------------------------------------------------------------- pipeline ranks


@lru_cache(maxsize=4096)
def _rank_classes(
    moe_layer_freq: tuple[int, ...], pp: int, vpp: int, first: int, last: int
) -> tuple[tuple[int, int, int, int, tuple[int, ...]], ...]:
    """Pipeline ranks grouped into classes that have the same layers.

    Layers are assigned in execution order, stage ``i = v*pp + r`` (Megatron's
    VPP-major layout), so a model whose first layers are dense (DeepSeek-V3)
    puts them on rank 0's first chunk. Ranks with the same (layers, MoE layers,
    chunk sizes, first/last role) take the same time per micro-batch; among
    them the lowest rank holds the most in-flight micro-batches, so it stands
    for the class in memory.

    Returns:
        One tuple per class: (lowest rank, decoder layers, MoE layers, number of
        ranks, layers per chunk).
    """
    counts = stage_layer_counts(len(moe_layer_freq), pp, vpp, first, last)
    n_layers = [0] * pp
    n_moe = [0] * pp
    pos = 0
    for v in range(vpp):
        for r in range(pp):
            c = counts[r][v]
            n_layers[r] += c
            n_moe[r] += sum(moe_layer_freq[pos : pos + c])
            pos += c
    classes: dict[tuple[object, ...], list[int]] = {}
    for r in range(pp):
        key = (r == 0, r == pp - 1, n_layers[r], n_moe[r], tuple(counts[r]))
        classes.setdefault(key, []).append(r)
    return tuple((rs[0], k[2], k[3], len(rs), k[4]) for k, rs in classes.items())  # type: ignore[misc]


def _rank_arrays(model: ModelSpec, t: LayoutTable) -> dict[str, np.ndarray]:
    """Per row and rank class (n, K): representative rank, layers, MoE layers, ranks in the class,
    and layers under block recompute (the first ``recompute_num_layers`` of every chunk)."""
    pp = t["pp"]
    vpp = t["vpp"]
    first = t["num_layers_in_first_pipeline_stage"]
    last = t["num_layers_in_last_pipeline_stage"]
    code = ((pp * 64 + vpp) * 4096 + first) * 4096 + last
    uniq, first_row, inv = np.unique(code, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    per = [
        _rank_classes(model.moe_layer_freq, int(pp[i]), int(vpp[i]), int(first[i]), int(last[i])) for i in first_row
    ]
    K = max(len(c) for c in per) if per else 1
    nmax = max((max(max(ch) for *_, ch in c) for c in per), default=1) + 1
    rep = np.full((len(per), K), -1.0)
    nl = np.zeros((len(per), K))
    nm = np.zeros((len(per), K))
    cnt = np.zeros((len(per), K))
    blk = np.zeros((len(per), K, nmax + 1))
    for u, classes in enumerate(per):
        for k_, (r, a, b, c, ch) in enumerate(classes):
            rep[u, k_], nl[u, k_], nm[u, k_], cnt[u, k_] = r, a, b, c
            chunks = np.array(ch, dtype=float)
            blk[u, k_] = [np.minimum(chunks, N).sum() for N in range(nmax + 1)]
    rnl = np.clip(t["recompute_num_layers"], 1, nmax)
    return {
        "rank": rep[inv],
        "layers": nl[inv],
        "moe": nm[inv],
        "count": cnt[inv],
        "block_layers": blk[inv[:, None], np.arange(K)[None, :], rnl[:, None]],
    }


# --------------------------------------------------------------------------- helpers


def _str_mask(values: np.ndarray, pred: Callable[[str], bool]) -> np.ndarray:
    """``pred`` applied to each distinct string of ``values`` (fast for few distinct values)."""
    uniq, inv = _categories(values)
    return np.array([pred(u) for u in uniq], dtype=bool)[inv]


def _gemm_eff(flops: np.ndarray, cal: Calibration) -> np.ndarray:
    f = np.maximum(flops, 1.0)
    return cal.gemm_efficiency * f / (f + cal.gemm_half_size_flops)


def _distinct_groups_hit(num_experts: float, topk: float, groups: np.ndarray) -> np.ndarray:
    """Expected number of groups (GPUs or nodes, each holding ``num_experts / groups`` experts)
    that hold at least one of a token's ``topk`` distinct experts, under uniform routing (what
    ``--moe-router-force-load-balancing`` does): ``groups * (1 - prod_i (E - E/groups - i) / (E - i))``,
    i = 0..topk-1 (hypergeometric: the chance that no chosen expert is in a given group).

    Units: a count (0 < result <= min(groups, topk)). Used for the flex dispatcher's deduplicated
    sends (DeepEP README: tokens are sent once per destination rank / node).
    """
    g = np.maximum(np.asarray(groups, dtype=float), 1.0)
    per = num_experts / g
    miss = np.ones_like(g)
    for i in range(int(topk)):
        miss = miss * np.clip((num_experts - per - i) / (num_experts - i), 0.0, 1.0)
    return g * (1.0 - miss)


def _span_crosses_node(span: np.ndarray, nvlink_size: int) -> np.ndarray:
    """A group of ``span`` consecutive ranks leaves the NVLink domain (Megatron packs groups on consecutive ranks)."""
    return span > nvlink_size


def _collective_bw(crosses: np.ndarray, cluster: Cluster, cal: Calibration) -> np.ndarray:
    """Per-GPU bandwidth (bytes/s) of a ring collective: NVLink inside a node, the node's
    network share per GPU across nodes."""
    nv = cluster.gpu.nvlink_bytes_per_s * cal.nvlink_efficiency
    net = cluster.inter_node_bytes_per_s / cluster.gpus_per_node * cal.network_efficiency
    return np.where(crosses, net, nv)


def _ring_time(bytes_full: np.ndarray, group: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """All-gather or reduce-scatter of a ``bytes_full`` tensor over ``group`` ranks."""
    g = np.maximum(group, 1)
    return np.where(g > 1, bytes_full * (g - 1) / g / bw, 0.0)


# --------------------------------------------------------------------------- the model


def estimate_table(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    table: LayoutTable,
    *,
    calibration: Calibration = DEFAULT_CALIBRATION,
    memory_headroom: float = 0.10,
    options: RunOptions = DEFAULT_RUN_OPTIONS,
) -> EstimateTable:
    """Predict peak memory and step time for every layout of ``table``.

    The table's rows must already satisfy Megatron's rules
    (:func:`search_spaces.rules.check_table`); results for invalid rows are
    meaningless.

    Args:
        model: the model.
        cluster: the GPUs; ``cluster.num_gpus`` must equal the rows' ``world_size``.
        workload: sequence length, global batch and precision.
        table: the layouts (n rows).
        calibration: efficiency constants.
        memory_headroom: fraction of HBM kept free; a layout fits when its
            predicted peak is at most ``(1 - memory_headroom) * HBM``.
        options: run flags shared by every row (routing, overlaps, CUDA graphs, FSDP,
            CP communication type); the default is the seed's run.

    Returns:
        An :class:`EstimateTable` with arrays of shape ``(n,)``.

    Raises:
        TunerError: ``memory_headroom`` outside [0, 1), or a precision the GPU has no
            tensor cores for.
    """
    if not 0.0 <= memory_headroom < 1.0:
        raise TunerError(f"--memory-headroom must be in [0, 1), got {memory_headroom}")
    cal = calibration
    opt = options
    gpu = cluster.gpu
    prec = Precision(workload.precision)
    if prec != Precision.bf16 and not gpu.peak_flops(prec):
        raise TunerError(f"precision {prec.value}: {gpu.name} has no tensor cores for it")
    fam = cal.family_factor(gpu.family)
    n = len(table)
    world = cluster.num_gpus
    gpn = cluster.gpus_per_node  # GPUs sharing a node's network links and CPUs
    nvl = cluster.nvlink_size  # GPUs that reach each other over NVLink
    s = float(workload.seq_length)
    gbs = float(workload.global_batch_size)

    tp = table["tp"].astype(float)
    pp_i = table["pp"]
    pp = pp_i.astype(float)
    vpp = table["vpp"].astype(float)
    cp = table["cp"].astype(float)
    ep = table["ep"].astype(float)
    etp = table["etp"].astype(float)
    mbs = table["micro_batch_size"].astype(float)
    dp = table.dp.astype(float)
    edp = table.edp.astype(float)
    M = np.maximum(np.floor(gbs / (mbs * dp)), 1.0)  # micro-batches per step per DP rank

    ranks = _rank_arrays(model, table)
    r_idx = ranks["rank"]  # (n, K): representative pipeline rank of each rank class
    live = ranks["count"] > 0
    rank_count = ranks["count"]
    is_first = r_idx == 0
    is_last = r_idx == (pp_i[:, None] - 1)
    n_layers = ranks["layers"]
    n_moe = ranks["moe"]
    n_dense = n_layers - n_moe
    mtp = float(model.mtp_num_layers)

    # ---- model dimensions ------------------------------------------------------------
    h = float(model.hidden_size)
    nh = float(model.num_attention_heads)
    ng = float(model.num_query_groups)
    d = float(model.kv_channels)
    Vv = float(model.vocab_size)
    E = float(max(model.num_experts, 1))
    k = float(model.moe_router_topk)
    fm = float(model.moe_ffn_hidden_size)
    fs = float(model.moe_shared_expert_intermediate_size)
    f = float(model.ffn_hidden_size)
    mats = float(model.mlp_matrices)
    if model.is_mla:
        q_dim = nh * (model.qk_head_dim + model.qk_pos_emb_head_dim)
        kv_dim = float(model.kv_lora_rank + model.qk_pos_emb_head_dim)
        ctx_dim = nh * model.v_head_dim
    else:
        q_dim, kv_dim, ctx_dim = nh * d, 2 * ng * d, nh * d

    # ---- parameters per rank (elements) -----------------------------------------------
    attn_p = float(model.attention_params())
    norm_p = 2 * h + float(model.attention_norm_params())
    P_dense = (
        n_layers * (attn_p / tp[:, None] + norm_p)
        + n_dense * (float(model.dense_mlp_params()) / tp[:, None])
        + n_moe * (float(model.shared_expert_params()) / tp[:, None] + float(model.router_params()))
    )
    emb = float(model.embedding_params())
    P_dense = P_dense + is_first * emb / tp[:, None]
    out_copy = 1.0 if model.untie_embeddings_and_output_weights else 0.0
    P_dense = P_dense + is_last * np.where(pp[:, None] > 1, 1.0, out_copy) * emb / tp[:, None]
    P_dense = P_dense + is_last * h  # final norm
    last_moe = bool(model.moe_layer_freq[-1]) if model.num_layers else False
    if mtp:
        mtp_layer = attn_p + norm_p + 2 * h * h + (float(model.shared_expert_params()) + float(model.router_params()) if last_moe else float(model.dense_mlp_params()))
        P_dense = P_dense + is_last * mtp * mtp_layer / tp[:, None]
    P_exp = (n_moe + is_last * (mtp if last_moe else 0.0)) * (E / ep[:, None]) * (float(model.expert_params()) / etp[:, None])
    if not model.is_moe:
        P_exp = np.zeros_like(P_exp)
    P_dense = P_dense * live
    P_exp = P_exp * live

    # ---- weights, gradients, optimizer --------------------------------------------------
    pa = table["use_precision_aware_optimizer"][:, None]
    distopt = table["use_distributed_optimizer"][:, None]
    off = table["optimizer_offload_fraction"][:, None]
    # Master weights: with the precision-aware optimizer and bf16 params, TE FusedAdam keeps
    # only the 16 remainder bits of the FP32 master (store_param_remainders, default True in
    # megatron/core/optimizer/optimizer_config.py) -> 2 bytes; else 4.
    master_b = np.where(pa, 2.0, FP32)
    m_b = np.where(_str_mask(table["exp_avg_dtype"], lambda v: v == "bf16")[:, None], BF16, FP32)
    v_b = np.where(_str_mask(table["exp_avg_sq_dtype"], lambda v: v == "bf16")[:, None], BF16, FP32)
    opt_bpp = master_b + m_b + v_b
    dense_shard = np.where(distopt, (dp * cp)[:, None], 1.0)
    exp_shard = np.where(distopt, edp[:, None], 1.0)
    lp_extra = prec.low_precision_weight_bytes  # quantised weight copy (fp8 / MX / NVFP4)
    mem_weights = (BF16 + lp_extra) * (P_dense + P_exp)
    mem_grads = FP32 * (P_dense + P_exp)
    if opt.use_megatron_fsdp:  # ZeRO-3: weights and gradients sharded like the optimizer states
        mem_weights = (BF16 + lp_extra) * (P_dense / dense_shard + P_exp / exp_shard)
        mem_grads = FP32 * (P_dense / dense_shard + P_exp / exp_shard)
    opt_params_per_gpu = P_dense / dense_shard + P_exp / exp_shard  # elements whose optimizer state this GPU owns
    mem_opt = opt_bpp * opt_params_per_gpu * (1.0 - off)

    # ---- activations per layer per micro-batch (bytes) ----------------------------------
    tok = (mbs * s / cp)[:, None]  # tokens per micro-batch on one TP group
    tpc = tp[:, None]
    etpc = etp[:, None]
    imb = cal.moe_load_imbalance if (model.is_moe and not opt.moe_router_force_load_balancing) else 1.0
    R_copies = tok * k * etpc / tpc * imb  # routed token copies per GPU (slowest expert rank)
    layer_in = BF16 * tok * h / tpc  # the layer's input (sequence-parallel shard)
    # Attention output: saved by the core attention and, without TE, again as the (permuted,
    # reshaped) input of the output projection; with TE's fused attention the two are one tensor.
    ctx_copies = 1.0 if opt.te_attention else 2.0
    a_attn = BF16 * tok / tpc * (3 * h + q_dim + kv_dim + ctx_copies * ctx_dim) + FP32 * tok * nh / tpc
    if model.qk_layernorm:
        a_attn = a_attn + BF16 * tok / tpc * (q_dim + kv_dim / 2)
    a_core = BF16 * tok * ctx_dim / tpc + FP32 * tok * nh / tpc  # attention output + softmax stats
    a_norms = 2 * BF16 * tok * h / tpc
    a_moe_experts = BF16 * R_copies * (2 * h + (mats - 1 + 1) * fm / etpc + fm / etpc) if model.is_moe else 0 * tok
    a_moe_act = BF16 * R_copies * fm / etpc if model.is_moe else 0 * tok
    a_router = FP32 * 2 * tok * E / tpc if model.is_moe else 0 * tok
    a_shared = BF16 * tok * (mats - 1 + 1) * fs / tpc
    a_moe = a_norms / 2 + layer_in + a_router + a_moe_experts + a_shared
    a_dense = a_norms / 2 + layer_in + BF16 * tok * mats * f / tpc
    full_moe = a_attn + a_moe
    full_dense = a_attn + a_dense

    gran = table["recompute_granularity"]
    meth = table["recompute_method"]
    rnl = np.maximum(table["recompute_num_layers"].astype(float), 1.0)[:, None]
    mods = table["recompute_modules"]

    mod_values, mod_inv = _categories(mods)
    mod_sets = [set(v.split(",")) for v in mod_values]

    def has(mod: str) -> np.ndarray:
        return np.array([mod in ms for ms in mod_sets], dtype=bool)[mod_inv][:, None]

    sel = _str_mask(gran, lambda v: v == "selective")[:, None]
    sav_attn = np.where(sel & has("core_attn"), a_core, 0) + np.where(sel & has("layernorm"), a_norms, 0)
    sav_moe = np.where(sel & has("moe"), a_moe - layer_in, np.where(sel & has("moe_act"), a_moe_act, 0))
    sav_moe = sav_moe + np.where(sel & has("shared_experts") & ~has("moe"), a_shared, 0)
    sav_dense = np.where(sel & has("mlp"), a_dense - layer_in, 0)
    kept_moe = full_moe - sav_attn - sav_moe
    kept_dense = full_dense - sav_attn - sav_dense

    full = _str_mask(gran, lambda v: v == "full")[:, None]
    uniform = _str_mask(meth, lambda v: v == "uniform")[:, None]
    # Full recompute, uniform: only each group's input is kept (one per recompute_num_layers).
    # Block: the first recompute_num_layers layers of every chunk keep their input only.
    block_layers = ranks["block_layers"]  # recomputed layers per rank under block recompute
    frac_rec = np.where(n_layers > 0, block_layers / np.maximum(n_layers, 1), 0.0)
    stored_moe = np.where(full, np.where(uniform, layer_in / rnl, frac_rec * layer_in + (1 - frac_rec) * kept_moe), kept_moe)
    stored_dense = np.where(full, np.where(uniform, layer_in / rnl, frac_rec * layer_in + (1 - frac_rec) * kept_dense), kept_dense)
    act_rank = n_moe * stored_moe + n_dense * stored_dense  # one micro-batch through all of a rank's layers
    # In-flight micro-batches (schedules.py warm-up): interleaved counts virtual (chunk) micro-batches.
    vppc = vpp[:, None]
    Mc = M[:, None]
    inflight_il = np.minimum((pp[:, None] - r_idx - 1) * 2 + (vppc - 1) * pp[:, None] + 1, Mc * vppc) / vppc
    inflight_1f1b = np.minimum(pp[:, None] - r_idx, Mc)
    inflight = np.where(vppc > 1, inflight_il, inflight_1f1b)
    emb_act = is_first * BF16 * tok * h / tpc * inflight
    # Working set of the layer being recomputed / run backward.
    work = np.where(full, rnl * np.maximum(full_moe * (n_moe > 0), full_dense * (n_dense > 0)),
                    np.maximum(full_moe * (n_moe > 0), full_dense * (n_dense > 0)) * 0.5)
    mem_act = (act_rank * inflight + emb_act + work) * live
    logits = is_last * cal.logits_bytes_per_element * tok * Vv / tpc * (1 + mtp)
    disp_values, disp_inv = _categories(table["dispatcher"])
    flex = np.array([v.startswith("flex") for v in disp_values], dtype=bool)[disp_inv][:, None]
    if model.is_moe:
        buf = np.where(flex, cal.flex_dispatcher_buffer_bytes, 2 * BF16 * R_copies * h)
        mem_disp = np.where(n_moe > 0, buf, 0.0) * live
    else:
        mem_disp = np.zeros_like(mem_act)
    groups = (
        (tp > 1).astype(float) + (pp > 1) + (cp > 1) + (dp > 1) + (ep > 1) + (edp > 1) + (etp > 1) + 2.0
    )[:, None]
    mem_fw = (
        cal.cuda_context_bytes
        + groups * cal.nccl_bytes_per_communicator
        + cal.allocator_overhead_fraction * (mem_act + logits + mem_disp)
    ) * live

    mem_parts_r = {
        "weights": mem_weights,
        "main_grads": mem_grads,
        "optimizer": mem_opt,
        "activations": mem_act,
        "logits": logits * live,
        "dispatcher_buffers": mem_disp,
        "framework_overhead": mem_fw,
    }
    total_r = sum(mem_parts_r.values())
    total_r = np.where(live, total_r, -1.0)
    worst = np.argmax(total_r, axis=1)
    rows = np.arange(n)
    memory = {kk: v[rows, worst] for kk, v in mem_parts_r.items()}
    peak = total_r[rows, worst]

    # ---- time per micro-batch per rank ------------------------------------------------
    # GEMMs at the workload's precision reach ``precision_ratio`` x the bf16 efficiency of its peak;
    # the family factor scales every compute efficiency (folded into the peaks here).
    peak_f = gpu.peak_flops(prec) * cal.precision_ratio(prec.value) * fam
    peak_bf16 = gpu.peak_flops_bf16 * fam
    hbm = gpu.hbm_bytes_per_s * cal.hbm_efficiency
    # forward FLOPs per layer on one GPU
    F_attn_lin = 2 * tok * attn_p / tpc
    # Causal core attention: each query sees (s+1)/2 keys on average, or fewer in a sliding window.
    keys_full = model.attended_keys_per_query(workload.seq_length, windowed=False)
    keys_win = model.attended_keys_per_query(workload.seq_length, windowed=True)
    win_share = model.num_window_layers / model.num_layers
    keys = (1 - win_share) * keys_full + win_share * keys_win
    F_core = tok * s * (q_dim + ctx_dim) / 2 / tpc * (keys / keys_full)
    F_moe = 2 * tok * k * mats * h * fm / tpc
    F_router = 2 * tok * h * E / tpc if model.is_moe else 0 * tok
    F_shared = 2 * tok * mats * h * fs / tpc
    F_dense = 2 * tok * mats * h * f / tpc
    t_attn_lin = F_attn_lin / (peak_f * _gemm_eff(F_attn_lin / 2, cal))
    t_core = F_core / (peak_bf16 * cal.attention_efficiency)
    rows_per_expert = tok * k * etpc * ep[:, None] / (tpc * E)
    gg_eff = cal.grouped_gemm_efficiency * rows_per_expert / (rows_per_expert + cal.grouped_gemm_half_rows)
    t_moe = F_moe * imb / (peak_f * np.maximum(gg_eff, 1e-3)) if model.is_moe else 0 * tok
    t_router = F_router / (peak_bf16 * _gemm_eff(F_router, cal)) if model.is_moe else 0 * tok
    t_shared = np.where(F_shared > 0, F_shared / (peak_f * _gemm_eff(np.maximum(F_shared, 1.0) / mats, cal)), 0.0)
    t_dense = np.where(F_dense > 0, F_dense / (peak_f * _gemm_eff(np.maximum(F_dense, 1.0) / mats, cal)), 0.0)
    # memory-bound work, forward+backward, per layer
    t_elem_attn = cal.elementwise_bytes_per_token_attn * h * tok / tpc / hbm
    t_elem_moe = cal.elementwise_bytes_per_copy_moe * h * R_copies / hbm if model.is_moe else 0 * tok
    # fwd + bwd (bwd = 2x fwd for GEMMs; attention's efficiency already covers its fwd+bwd)
    c_attn = 3 * (t_attn_lin + t_core) + t_elem_attn
    c_moe = 3 * (t_moe + t_router + t_shared) + t_elem_moe
    c_dense = 3 * t_dense + t_elem_attn / 2

    # TP (sequence parallel): all-gather + reduce-scatter around attention and around the dense MLP,
    # forward and backward; ETP > 1 adds the same on the dispatched tokens.
    tp_bw = _collective_bw(_span_crosses_node(tp, nvl)[:, None], cluster, cal)
    act_full = BF16 * tok * h
    coll_tp = _ring_time(act_full, tpc, tp_bw)
    tp_attn = 4 * coll_tp
    tp_dense = 4 * coll_tp
    tp_shared = np.where(fs > 0, 4 * coll_tp, 0.0)
    etp_bw = _collective_bw(_span_crosses_node(etp, nvl)[:, None], cluster, cal)
    tp_moe = tp_shared + 4 * _ring_time(BF16 * R_copies * h, etpc, etp_bw)
    if opt.tp_comm_overlap:
        tp_keep = 1.0 - cal.tp_comm_overlap_fraction
        tp_attn, tp_dense, tp_moe = tp_attn * tp_keep, tp_dense * tp_keep, tp_moe * tp_keep
    # CP ring: K/V blocks passed cp-1 times forward, twice that backward, half hidden behind attention.
    cp_bw = _collective_bw(_span_crosses_node(tp * cp, nvl)[:, None], cluster, cal)
    if opt.cp_comm_type == "a2a":
        # Ulysses-style: all-to-all of Q, K, V before and of the output after attention, x3 for fwd+bwd.
        cp_bytes = BF16 * tok * (q_dim + kv_dim + ctx_dim) / tpc * (cp[:, None] - 1) / cp[:, None]
        cp_t = np.where(cp[:, None] > 1, 3 * cp_bytes / cp_bw, 0.0)
    else:
        cp_t = np.where(cp[:, None] > 1, 3 * (cp[:, None] - 1) * BF16 * tok * kv_dim / tpc / cp_bw * (1 - cal.cp_p2p_overlap), 0.0)
    # EP all-to-all (dispatch + combine), forward and backward.
    if model.is_moe:
        ep_span = etp * ep  # EP peers are etp apart in the expert rank order (etp-ep-edp-pp)
        local_peers = np.minimum(ep, np.maximum(nvl // np.maximum(etp, 1), 1))
        remote_frac = np.where(ep_span > nvl, 1 - local_peers / ep, 0.0)[:, None]
        is_ag = np.array([v == "allgather" for v in disp_values], dtype=bool)[disp_inv][:, None]
        send = np.where(
            is_ag,
            BF16 * tok / tpc * h * (ep[:, None] - 1),  # every token to every EP rank
            BF16 * tok / tpc * h * k * (ep[:, None] - 1) / ep[:, None] * imb,
        )
        nv_a2a = gpu.nvlink_bytes_per_s * cal.alltoall_nvlink_efficiency
        net_a2a = cluster.inter_node_bytes_per_s / gpn * cal.network_efficiency
        one = np.maximum(send * (1 - remote_frac) / nv_a2a, send * remote_frac / net_a2a)
        # Flex dispatchers send a token once to each distinct GPU that holds one of its experts
        # (NCCL all-to-all sends one copy per routed expert). DeepEP's inter-node kernels go further:
        # one RDMA send per distinct remote node, forwarded there over NVLink (DeepEP README,
        # "normal kernels": NVLink + RDMA forwarding); HybridEP is counted per GPU.
        ep_c = ep[:, None]
        n_nodes = np.maximum(ep_c / local_peers[:, None], 1.0)
        gpus_hit = _distinct_groups_hit(E, k, ep_c)
        deepep = np.array([v == "flex+deepep" for v in disp_values], dtype=bool)[disp_inv][:, None]
        net_hit = np.where(deepep, _distinct_groups_hit(E, k, n_nodes) * (n_nodes - 1) / n_nodes, gpus_hit * remote_frac)
        flex_nv = BF16 * tok / tpc * h * gpus_hit * (ep_c - 1) / ep_c * imb
        flex_net = BF16 * tok / tpc * h * np.where(remote_frac > 0, net_hit, 0.0) * imb
        one_flex = np.maximum(flex_nv / nv_a2a, flex_net / net_a2a) / cal.flex_dispatch_speedup
        one = np.where(flex & ~is_ag, one_flex, one)
        # Fixed costs per pass: router / permutation kernels, the alltoall dispatcher's host sync, and
        # one GEMM launch per local expert per expert GEMM (fc1 and fc2 forward; dgrad and wgrad of
        # each backward).
        local_experts = (E / ep)[:, None]
        layer_oh = cal.moe_layer_overhead_s * (cal.cuda_graph_overhead_factor if opt.cuda_graph_moe else 1.0)
        gemm_oh = cal.expert_gemm_overhead_s * (cal.cuda_graph_overhead_factor if opt.cuda_graph_full else 1.0)
        lat = layer_oh + np.where(flex, 0.0, cal.alltoall_sync_latency_s)
        lat_fwd = lat + 2 * local_experts * gemm_oh
        lat_bwd = lat + 4 * local_experts * gemm_oh
        if opt.overlap_moe_expert_parallel_comm:
            one = one * (1.0 - cal.ep_a2a_overlap)
        comm_one_pass = np.where(ep[:, None] > 1, 2 * one, 0.0)  # dispatch + combine
        ep_one_pass = comm_one_pass + lat_fwd  # a forward pass (also a recomputed one)
        ep_layer = 2 * comm_one_pass + lat_fwd + lat_bwd  # forward and backward
    else:
        ep_one_pass = 0 * tok
        ep_layer = 0 * tok

    # Recompute: the extra forward of what is recomputed (with its communication).
    fwd_attn = t_attn_lin + t_core + t_elem_attn / 3 + tp_attn / 2
    fwd_moe = t_moe + t_router + t_shared + t_elem_moe / 3 + tp_moe / 2 + ep_one_pass
    fwd_dense = t_dense + t_elem_attn / 6 + tp_dense / 2
    rec_sel_attn = np.where(sel & has("core_attn"), t_core, 0) + np.where(sel & has("layernorm"), t_elem_attn / 6, 0)
    rec_sel_moe = np.where(sel & has("moe"), fwd_moe, np.where(sel & has("moe_act"), t_elem_moe / 6, 0))
    rec_sel_moe = rec_sel_moe + np.where(sel & has("shared_experts") & ~has("moe"), t_shared, 0)
    rec_sel_dense = np.where(sel & has("mlp"), fwd_dense, 0)
    rec_full_frac = np.where(uniform, 1.0, frac_rec)
    rec_moe = np.where(full, rec_full_frac * (fwd_attn + fwd_moe), rec_sel_attn + rec_sel_moe)
    rec_dense = np.where(full, rec_full_frac * (fwd_attn + fwd_dense), rec_sel_attn + rec_sel_dense)

    comp_r = n_moe * (c_attn + c_moe) + n_dense * (c_attn + c_dense)
    tpc_r = n_moe * (tp_attn + tp_moe) + n_dense * (tp_attn + tp_dense)
    cpc_r = n_layers * cp_t
    epc_r = n_moe * ep_layer
    rec_r = n_moe * rec_moe + n_dense * rec_dense
    F_logits = 2 * tok * h * Vv / tpc * (1 + mtp)
    logit_t = is_last * (3 * F_logits / (peak_bf16 * _gemm_eff(F_logits, cal)) + 3 * FP32 * tok * Vv / tpc / hbm)
    comp_r = comp_r + logit_t
    per_mb = (comp_r + tpc_r + cpc_r + epc_r + rec_r) * live  # seconds per micro-batch per rank
    slow = per_mb.max(axis=1)
    mean = (per_mb * rank_count).sum(axis=1) / pp
    # Pipeline: M micro-batches at the slowest rank's pace, plus fill/drain of (pp-1)/vpp of a
    # micro-batch (Narayanan et al. 2021: bubble fraction (pp-1)/(m*vpp)).
    t_pipe = M * slow + (pp - 1) / vpp * mean
    busy = M * mean
    frac = lambda part: (part * live * rank_count).sum(axis=1) / pp / np.maximum(mean, 1e-30)  # noqa: E731
    time = {
        "compute": busy * frac(comp_r),
        "recompute": busy * frac(rec_r),
        "tp_comm": busy * frac(tpc_r),
        "cp_comm": busy * frac(cpc_r),
        "ep_comm": busy * frac(epc_r),
        "pp_bubble": t_pipe - busy,
    }
    # Pipeline p2p: each chunk boundary sends the (SP-sharded) activation forward and its grad back.
    pp_cross = (world / pp) >= nvl
    p2p_bw = np.where(pp_cross, cluster.inter_node_bytes_per_s / gpn * cal.network_efficiency, gpu.nvlink_bytes_per_s * cal.nvlink_efficiency)
    p2p_bytes = BF16 * (mbs * s / cp) * h / tp
    p2p_exposed = np.where(vpp > 1, 1 - cal.pp_p2p_overlap, 1.0)
    time["pp_p2p"] = np.where(pp > 1, 2 * M * vpp * p2p_bytes / p2p_bw * p2p_exposed, 0.0)
    # Data-parallel gradient reduce-scatter (fp32 main grads) and param all-gather (bf16), per rank.
    dpcp = dp * cp
    dense_span = tp * cp * dp
    exp_span = etp * ep * edp
    dbw = _collective_bw(_span_crosses_node(dense_span, nvl)[:, None], cluster, cal)
    ebw = _collective_bw(_span_crosses_node(exp_span, nvl)[:, None], cluster, cal)
    grad_b = FP32  # --accumulate-allreduce-grads-in-fp32 (the seed's run block)
    dense_factor = np.where(distopt, grad_b + BF16, 2 * grad_b)  # RS + AG, or all-reduce = 2 x RS
    dp_r = _ring_time(dense_factor * P_dense, dpcp[:, None], dbw) + _ring_time(dense_factor * P_exp, edp[:, None], ebw)
    if opt.use_megatron_fsdp:
        # ZeRO-3: parameters all-gathered (bf16) for forward and again for backward, gradients
        # reduce-scattered, every micro-batch.
        fsdp_b = 2 * BF16 + grad_b
        dp_r = M[:, None] * (_ring_time(fsdp_b * P_dense, dpcp[:, None], dbw) + _ring_time(fsdp_b * P_exp, edp[:, None], ebw))
    dp_hidden = cal.dp_overlap if (opt.overlap_grad_reduce or opt.use_megatron_fsdp) else 0.0
    time["dp_comm"] = (dp_r * live).max(axis=1) * (1 - dp_hidden)
    time["optimizer"] = (cal.optimizer_bytes_per_param * opt_params_per_gpu * (1 - off) / hbm * live).max(axis=1)
    # CPU optimizer offload: the node's CPUs step the offloaded states of all its GPUs; gradients
    # go down (fp32) and parameters come back (bf16) over PCIe.
    cpu_params = (opt_params_per_gpu * off * live).max(axis=1)
    per_node = float(min(gpn, world))
    t_cpu = cpu_params * per_node / cal.cpu_adam_params_per_s_per_node
    t_pcie = cpu_params * (FP32 + BF16) / (gpu.pcie_bytes_per_s * cal.pcie_efficiency)
    ovl = np.where(table["overlap_cpu_optimizer_d2h_h2d"], cal.offload_overlap, 0.0)
    time["offload"] = t_cpu + t_pcie * (1 - ovl)

    step = sum(time.values())
    tokens = gbs * s
    tps = tokens / step / world
    flops_tok = megatron_flops_per_token(model, workload.seq_length)
    usable = gpu.hbm_bytes * (1 - memory_headroom)
    return EstimateTable(
        memory=memory,
        peak_bytes=peak,
        time={kk: time[kk] for kk in TIME_PARTS},
        step_time_s=step,
        tokens_per_s_per_gpu=tps,
        mfu=6.0 * model.active_params() * tps / peak_bf16,
        model_tflops_per_gpu=flops_tok * tps / 1e12,
        usd_per_million_tokens=cluster.usd_per_gpu_hour / (tps * 3600.0) * 1e6,
        hbm_bytes=gpu.hbm_bytes,
        usable_bytes=usable,
    )


def estimate(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    layout: Layout,
    *,
    calibration: Calibration = DEFAULT_CALIBRATION,
    memory_headroom: float = 0.10,
    options: RunOptions = DEFAULT_RUN_OPTIONS,
) -> Estimate:
    """Predict one layout's peak memory per GPU and step time.

    Checks Megatron's rules first.

    Raises:
        InfeasibleLayout: the layout breaks a rule (the first one; ``tune check``
            lists them all).
        TunerError: the layout's world size differs from the cluster's GPU count.
    """
    if layout.world_size != cluster.num_gpus:
        raise TunerError(f"layout world_size {layout.world_size} differs from the cluster's {cluster.num_gpus} GPUs")
    broken = check_layout(layout, model, workload)
    if broken:
        rule_id, reason = broken[0]
        raise InfeasibleLayout(rule_id, reason)
    t = LayoutTable.from_layouts([layout])
    return estimate_table(
        model, cluster, workload, t, calibration=calibration, memory_headroom=memory_headroom, options=options
    ).row(0, layout)
