"""What every cost-model term reads: :func:`build_context` turns (model, cluster, workload, layouts, calibration, run
options) into a frozen :class:`TableContext` of the parallel sizes, pipeline-rank classes, tokens per micro-batch,
effective peaks and the masks the layouts' enum values imply (from their properties, never their spellings). Shapes:
``(n,)`` per layout, ``(n, 1)`` as a column, ``(n, K)`` per layout and pipeline-rank class
(:mod:`cost_model.terms.ranks`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from cost_model.calibration import Calibration
from cost_model.terms import ranks
from specs import Cluster, ModelSpec, Precision, RunOptions, Workload
from specs.errors import TunerError
from specs.layout import RECOMPUTE_MODULES, Dispatcher, LayoutTable, RecomputeGranularity, RecomputeMethod, enum_mask
from specs.network import intra_domain_efficiency
from specs.units import BF16_BYTES, FP32_BYTES

Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: Bytes per element of each ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` value.
_STATE_DTYPE_BYTES = {"fp32": FP32_BYTES, "bf16": BF16_BYTES}

_E = TypeVar("_E", bound=Enum)
_S = TypeVar("_S", bound=np.generic)


def col(a: npt.NDArray[_S]) -> npt.NDArray[_S]:
    """A per-layout array ``(n,)`` as a column ``(n, 1)``, to broadcast against rank classes."""
    return a[:, None]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelDims:
    """A model's dimensions and per-layer parameter counts, as floats (the terms' notation).

    Names follow Korthikanti et al. 2022 where they have one (h, a) and Megatron's
    ``TransformerConfig`` otherwise; counts are elements (:class:`specs.ModelSpec`)."""

    h: float
    """``hidden_size``."""
    heads: float
    """``num_attention_heads`` (a)."""
    vocab: float
    """``vocab_size`` (V)."""
    experts: float
    """``num_experts``, at least 1 (so a dense model divides by 1)."""
    topk: float
    """``moe_router_topk`` (k)."""
    moe_ffn: float
    """``moe_ffn_hidden_size`` of one routed expert."""
    shared_ffn: float
    """``moe_shared_expert_intermediate_size`` (0: no shared expert)."""
    ffn: float
    """``ffn_hidden_size`` of the dense layers."""
    mlp_matrices: float
    """Weight matrices per MLP: 3 gated (SwiGLU), 2 otherwise."""
    mtp: float
    """``mtp_num_layers``."""
    q_dim: float
    """Query width: heads x head dim (MLA: heads x (qk_head_dim + qk_pos_emb_head_dim))."""
    kv_dim: float
    """Key + value width: 2 x groups x head dim (MLA: the compressed kv_lora_rank + qk_pos_emb_head_dim)."""
    ctx_dim: float
    """Attention output width: heads x head dim (MLA: heads x v_head_dim)."""
    saved_kv_dim: float
    """Key + value width as the core attention receives (and TE's fused attention saves) them: ``kv_dim`` for
    GQA; MLA: the expanded keys and values, ``heads x (qk_head_dim + qk_pos_emb_head_dim + v_head_dim)``."""
    latent_dim: float
    """MLA's saved low-rank latents, ``q_lora_rank + kv_lora_rank`` (the up-projections' inputs); 0 for GQA."""
    up_projection_params: float
    """MLA's up-projection weights (what ``mla_up_proj`` recompute re-runs): ``q_lora_rank x heads x (qk_head_dim +
    qk_pos_emb_head_dim) + kv_lora_rank x heads x (qk_head_dim + v_head_dim)``; 0 for GQA."""
    expanded_qkv_dim: float
    """What ``mla_up_proj`` recompute discards: the expanded Q, K and V after the up-projections and RoPE,
    ``q_dim + saved_kv_dim`` for MLA (megatron/core/transformer/multi_latent_attention.py, ``recompute_up_proj``
    under ``CheckpointWithoutOutput``); 0 for GQA."""
    attention_params: float
    """Attention matmul weights of one layer (:meth:`ModelSpec.attention_params`)."""
    layer_norm_params: float
    """Norm weights of one layer: the two pre-norms (2h) and the attention's QK / latent norms."""
    dense_mlp_params: float
    shared_expert_params: float
    router_params: float
    expert_params: float
    """Weights of ONE routed expert."""
    embedding_params: float
    """Input embedding, V x h (the untied output layer has as many again)."""
    is_moe: bool
    last_layer_moe: bool
    """The last decoder layer is MoE (MTP layers copy its type, notes §6.1)."""
    qk_layernorm: bool
    is_mla: bool
    gated: bool
    """Gated MLPs (SwiGLU, ``gated_linear_unit``)."""
    untied_output: bool
    """``--untie-embeddings-and-output-weights``."""
    expert_bias: bool = False
    """The routed experts' linear layers have biases (``add_bias_linear``, GPT-OSS)."""
    fused_activation: bool = False
    """The activation is fused with its bias whatever the run's ``bias_activation_fusion`` says: GPT-OSS's clamped
    quick-GEGLU (Megatron-Bridge ``gpt_oss_bridge.py`` sets ``bias_activation_fusion``; so does this project's
    harness)."""

    @classmethod
    def of(cls, model: ModelSpec) -> ModelDims:
        """The dimensions of ``model``."""
        h = float(model.hidden_size)
        nh = float(model.num_attention_heads)
        d = float(model.kv_channels)
        if model.is_mla:
            q_dim = nh * (model.qk_head_dim + model.qk_pos_emb_head_dim)
            kv_dim = float(model.kv_lora_rank + model.qk_pos_emb_head_dim)
            ctx_dim = nh * model.v_head_dim
            saved_kv = nh * (model.qk_head_dim + model.qk_pos_emb_head_dim + model.v_head_dim)
            latent = float(model.q_lora_rank + model.kv_lora_rank)
            expanded = q_dim + saved_kv
            up = float(model.q_lora_rank) * q_dim + float(model.kv_lora_rank) * nh * (model.qk_head_dim
                                                                                      + model.v_head_dim)
        else:
            q_dim, kv_dim, ctx_dim = nh * d, 2 * float(model.num_query_groups) * d, nh * d
            saved_kv, latent, expanded, up = kv_dim, 0.0, 0.0, 0.0
        return cls(
            h=h, heads=nh, vocab=float(model.vocab_size), experts=float(max(model.num_experts, 1)),
            topk=float(model.moe_router_topk), moe_ffn=float(model.moe_ffn_hidden_size),
            shared_ffn=float(model.moe_shared_expert_intermediate_size), ffn=float(model.ffn_hidden_size),
            mlp_matrices=float(model.mlp_matrices), mtp=float(model.mtp_num_layers), q_dim=q_dim, kv_dim=kv_dim,
            ctx_dim=ctx_dim, saved_kv_dim=saved_kv, latent_dim=latent, expanded_qkv_dim=expanded,
            up_projection_params=up, attention_params=float(model.attention_params()),
            layer_norm_params=2 * h + float(model.attention_norm_params()),
            dense_mlp_params=float(model.dense_mlp_params()), shared_expert_params=float(model.shared_expert_params()),
            router_params=float(model.router_params()), expert_params=float(model.expert_params()),
            embedding_params=float(model.embedding_params()), is_moe=model.is_moe,
            last_layer_moe=bool(model.moe_layer_freq[-1]) if model.num_layers else False,
            qk_layernorm=model.qk_layernorm, is_mla=model.is_mla, gated=model.gated_linear_unit,
            untied_output=model.untie_embeddings_and_output_weights, expert_bias=bool(model.add_bias_linear),
            fused_activation=model.activation_func == "quick_gelu")


@dataclass(frozen=True, kw_only=True, slots=True)
class TableContext:
    """The derived quantities of one :class:`LayoutTable` that the terms share.

    Built once per :func:`cost_model.estimate.estimate_table` call by :func:`build_context`."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    cal: Calibration
    options: RunOptions
    dims: ModelDims

    # ---- cluster and workload (scalars) --------------------------------------------------
    world: int
    """GPUs in the job."""
    gpus_per_node: int
    """GPUs sharing a node's network links and CPUs."""
    nvlink_size: int
    """GPUs that reach each other over NVLink (:attr:`specs.Cluster.nvlink_size`)."""
    seq: float
    """``seq_length``, tokens."""
    global_batch: float
    """``global_batch_size``, rows."""
    gemm_peak_flops: float
    """GEMM peak at the workload's precision x its efficiency ratio x the family factor, FLOP/s
    (the ratio and factor scale the efficiencies; folded into the peak here)."""
    bf16_peak_flops: float
    """Dense bf16 peak x the family factor, FLOP/s (attention, router, output layer, MFU)."""
    hbm_bytes_per_s: float
    """Achieved HBM bandwidth, ``hbm_bytes_per_s x hbm_efficiency``, bytes/s."""
    low_precision_weight_bytes: float
    """Bytes per parameter of the quantised weight copy (:attr:`specs.Precision.low_precision_weight_bytes`)."""
    saved_gemm_input_bytes: float
    """Bytes per element of a saved GEMM input (:attr:`specs.Precision.saved_gemm_input_bytes`): 2 in bf16 and
    on a stack without Transformer Engine (this project's no-TE harness runs bf16 only)."""
    quantized: bool
    """The GEMMs run in a low precision (fp8, mxfp8, nvfp4): TE saves quantised copies of their inputs."""
    load_imbalance: Array
    """Slowest expert rank's routed tokens over the mean, ``(n, 1)``: ``moe_load_imbalance`` with natural routing
    of a MoE model and experts spread over EP > 1 ranks; 1 with ``--moe-router-force-load-balancing``, a dense
    model, or EP 1 (one rank holds every expert, so it gets every copy: measured on 1 x H200, the experts' saved
    tensors are exactly ``tokens x topk`` copies, docs/measurements.md)."""

    # ---- per layout (n,) -------------------------------------------------------------------
    tp: Array
    pp: Array
    vpp: Array
    cp: Array
    ep: Array
    etp: Array
    mbs: Array
    """``micro_batch_size``, rows."""
    dp: Array
    """Dense data-parallel size, ``world / (tp pp cp)``."""
    edp: Array
    """Expert data-parallel size, ``world / (etp ep pp)``."""
    micro_batches: Array
    """Micro-batches per step per DP rank, ``M = max(floor(gbs / (mbs dp)), 1)``."""
    overlap_offload: BoolArray
    """``--overlap-cpu-optimizer-d2h-h2d``."""

    # ---- per layout and pipeline-rank class (n, K) -------------------------------------------
    rank: Array
    """Representative pipeline rank of the class (its lowest)."""
    live: BoolArray
    """The column is a real class (not padding)."""
    rank_count: Array
    """Pipeline ranks in the class."""
    is_first: BoolArray
    """The class is pipeline rank 0 (embedding)."""
    is_last: BoolArray
    """The class is the last pipeline rank (output layer, loss, MTP)."""
    layers: Array
    """Decoder layers per rank."""
    moe_layers: Array
    dense_layers: Array
    block_layers: Array
    """Layers recomputed per rank under block recompute (:attr:`RankArrays.block_layers`)."""

    # ---- per layout as a column (n, 1) -------------------------------------------------------
    tokens: Array
    """Tokens per micro-batch on one TP group, ``mbs x seq / cp``."""
    recompute_num_layers: Array
    """``recompute_num_layers``, at least 1."""
    selective: BoolArray
    """Selective recompute (:attr:`RecomputeGranularity.recomputes_modules`)."""
    full: BoolArray
    """Full recompute (:attr:`RecomputeGranularity.recomputes_whole_layers`)."""
    uniform: BoolArray
    """Uniform full recompute (:attr:`RecomputeMethod.recomputes_every_layer`); else block."""
    recomputed: Mapping[str, BoolArray]
    """Per ``--recompute-modules`` entry: selective recompute with that module listed."""
    distributed_optimizer: BoolArray
    precision_aware: BoolArray
    """``--use-precision-aware-optimizer``."""
    exp_avg_bytes: Array
    """Bytes per element of Adam's first moment (``--exp-avg-dtype``)."""
    exp_avg_sq_bytes: Array
    """Bytes per element of Adam's second moment (``--exp-avg-sq-dtype``)."""
    offload_fraction: Array
    """``--optimizer-offload-fraction`` (0 = none)."""
    flex: BoolArray
    """Flex dispatcher (:attr:`Dispatcher.is_flex`)."""
    allgather: BoolArray
    """Allgather dispatcher (:attr:`Dispatcher.is_allgather`)."""
    network_counted_per_node: BoolArray
    """The row's dispatcher's network efficiency is counted on one copy per NVLink domain hit
    (:attr:`specs.network.DispatcherOnFabric.counted` ``per_node``), ``(n, 1)``; else on one per remote GPU hit."""
    dispatch_nvlink_efficiency: Array
    """Fraction of NVLink bandwidth the row's dispatcher reaches inside an NVLink domain: a flex backend's own
    published figure (``intra_domain`` of ``specs/data/networks.yaml``), else NCCL's
    (``alltoall_nvlink_efficiency``), ``(n, 1)``."""
    dispatch_network_efficiency: Array
    """Fraction of the per-GPU NIC bandwidth the row's dispatcher reaches across the cluster's fabric
    (:meth:`specs.Network.dispatcher`), else NCCL's (``network_efficiency``), ``(n, 1)``."""

    @property
    def n(self) -> int:
        """Layouts in the table."""
        return len(self.tp)

    def recomputes(self, module: str) -> BoolArray:
        """Rows with selective recompute of ``module`` (a :data:`specs.RECOMPUTE_MODULES` entry), ``(n, 1)``."""
        return self.recomputed[module]


def _mask(table: LayoutTable, column: str, enum: type[_E], predicate: Callable[[_E], bool]) -> BoolArray:
    """:func:`specs.layout.enum_mask` as a column ``(n, 1)``."""
    return enum_mask(table, column, enum, predicate)[:, None]


def _dtype_bytes(table: LayoutTable, column: str) -> Array:
    """Bytes per element of an optimizer-state dtype column, ``(n, 1)``."""
    cats, codes = table.codes(column)
    per_category = np.array([float(_STATE_DTYPE_BYTES.get(c, 0)) for c in cats.tolist()], dtype=np.float64)
    out: Array = per_category[codes][:, None]
    return out


def build_context(model: ModelSpec, cluster: Cluster, workload: Workload, table: LayoutTable, calibration: Calibration,
                  options: RunOptions) -> TableContext:
    """The :class:`TableContext` of ``table``.

    Raises TunerError: a precision the GPU has no tensor cores for."""
    cal = calibration
    gpu = cluster.gpu
    prec = Precision(workload.precision)
    if prec != Precision.bf16 and not gpu.peak_flops(prec):
        raise TunerError(f"precision {prec.value}: {gpu.name} has no tensor cores for it")
    fam = cal.family_factor(gpu.family, gpu.generation)
    # nvfp4 GEMMs take the family factor alone: Blackwell Ultra's datasheet nvfp4 peak (GB300 15 PF dense against
    # GB200's 10) already carries what the generation factor stands for at the other precisions
    # (benchmarks/results/2026-12-02_validation)
    gemm_fam = cal.family_factor(gpu.family) if prec == Precision.nvfp4 else fam
    s = float(workload.seq_length)
    gbs = float(workload.global_batch_size)

    tp = table["tp"].astype(float)
    pp_i = table["pp"]
    pp = pp_i.astype(float)
    cp = table["cp"].astype(float)
    mbs = table["micro_batch_size"].astype(float)
    dp = table.dp.astype(float)

    r = ranks.rank_arrays(model, table)
    selective = _mask(table, "recompute_granularity", RecomputeGranularity, lambda g: g.recomputes_modules)
    mod_values, mod_inv = table.codes("recompute_modules")
    mod_sets = [set(v.split(",")) for v in mod_values.tolist()]
    recomputed = {m: selective & np.array([m in ms for ms in mod_sets], dtype=np.bool_)[mod_inv][:, None]
                  for m in RECOMPUTE_MODULES}
    nv_eff, net_eff, per_node = _dispatcher_efficiencies(table, cluster, cal)
    return TableContext(
        model=model, cluster=cluster, workload=workload, cal=cal, options=options, dims=ModelDims.of(model),
        world=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node, nvlink_size=cluster.nvlink_size, seq=s,
        global_batch=gbs, gemm_peak_flops=gpu.peak_flops(prec) * cal.precision_ratio(prec.value) * gemm_fam,
        bf16_peak_flops=gpu.peak_flops_bf16 * fam, hbm_bytes_per_s=gpu.hbm_bytes_per_s * cal.hbm_efficiency,
        low_precision_weight_bytes=prec.low_precision_weight_bytes,
        saved_gemm_input_bytes=prec.saved_gemm_input_bytes if options.te_attention else BF16_BYTES,
        quantized=prec != Precision.bf16 and options.te_attention,
        load_imbalance=np.where(table["ep"] > 1, cal.moe_load_imbalance, 1.0)[:, None]
        if (model.is_moe and not options.moe_router_force_load_balancing) else np.ones((len(table), 1)),
        tp=tp, pp=pp, vpp=table["vpp"].astype(float), cp=cp, ep=table["ep"].astype(float),
        etp=table["etp"].astype(float), mbs=mbs, dp=dp, edp=table.edp.astype(float),
        micro_batches=np.maximum(np.floor(gbs / (mbs * dp)), 1.0),
        overlap_offload=np.asarray(table["overlap_cpu_optimizer_d2h_h2d"], dtype=np.bool_), rank=r.rank,
        live=r.count > 0, rank_count=r.count, is_first=r.rank == 0, is_last=r.rank == (pp_i[:, None] - 1),
        layers=r.layers, moe_layers=r.moe, dense_layers=r.layers - r.moe, block_layers=r.block_layers,
        tokens=(mbs * s / cp)[:, None],
        recompute_num_layers=np.maximum(table["recompute_num_layers"].astype(float), 1.0)[:, None], selective=selective,
        full=_mask(table, "recompute_granularity", RecomputeGranularity, lambda g: g.recomputes_whole_layers),
        uniform=_mask(table, "recompute_method", RecomputeMethod, lambda m: m.recomputes_every_layer),
        recomputed=recomputed,
        distributed_optimizer=np.asarray(table["use_distributed_optimizer"], dtype=np.bool_)[:, None],
        precision_aware=np.asarray(table["use_precision_aware_optimizer"], dtype=np.bool_)[:, None],
        exp_avg_bytes=_dtype_bytes(table, "exp_avg_dtype"), exp_avg_sq_bytes=_dtype_bytes(table, "exp_avg_sq_dtype"),
        offload_fraction=table["optimizer_offload_fraction"].astype(float)[:, None],
        flex=_mask(table, "dispatcher", Dispatcher, lambda d: d.is_flex),
        allgather=_mask(table, "dispatcher", Dispatcher, lambda d: d.is_allgather), network_counted_per_node=per_node,
        dispatch_nvlink_efficiency=nv_eff, dispatch_network_efficiency=net_eff)


def _dispatcher_efficiencies(table: LayoutTable, cluster: Cluster, cal: Calibration) -> tuple[Array, Array, BoolArray]:
    """Per row, the dispatcher's NVLink and network efficiencies (:attr:`TableContext.dispatch_nvlink_efficiency`,
    :attr:`TableContext.dispatch_network_efficiency`) and whether the network one is counted per NVLink domain hit
    (:attr:`TableContext.network_counted_per_node`; without a named fabric, NCCL's figure, per GPU), each ``(n, 1)``."""
    intra = intra_domain_efficiency()
    cats, codes = table.codes("dispatcher")
    nv = np.full(len(cats), cal.alltoall_nvlink_efficiency)
    net = np.full(len(cats), cal.network_efficiency)
    per_node = np.zeros(len(cats), dtype=np.bool_)
    members = {d.value: d for d in Dispatcher}
    for i, v in enumerate(cats.tolist()):
        d = members.get(v)
        if d is None:
            continue
        nv[i] = intra.get(d.value) or cal.alltoall_nvlink_efficiency
        if cluster.network is not None:
            on_fabric = cluster.network.dispatcher(d)
            net[i] = on_fabric.efficiency or cal.network_efficiency
            per_node[i] = on_fabric.counted == "per_node"
    return nv[codes][:, None], net[codes][:, None], per_node[codes][:, None]
