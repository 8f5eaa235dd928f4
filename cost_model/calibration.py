"""Named efficiency and overhead constants of the cost model, with their sources.

Every number the analytical model uses that is not a datasheet figure or an exact count is one field of
:class:`Calibration`, with its source in its docstring. A calibration file (YAML, ``{field: value}``) overrides them;
``tune calibrate`` fits them. The seed's tuned layout (seeds/001: 64 H200, MiniMax-M2, 2,034.42 tokens/s/GPU measured)
set ``grouped_gemm_efficiency``, ``moe_load_imbalance`` and ``expert_gemm_overhead_s``: a calibration point, not an
independent check."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specs._data import load_user_yaml
from specs.errors import TunerError


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Efficiency constants (fractions of a datasheet peak) and fixed overheads (bytes, seconds)."""

    gemm_efficiency: float = 0.70
    """Achieved fraction of dense peak for large bf16 GEMMs in training (attention projections, dense MLP, output
    layer). cuBLAS reaches ~790 TFLOP/s = 0.80 of 989 on a lone large bf16 GEMM on H200 (/work/.library device notes);
    Megatron reports ~0.5-0.55 model-FLOP MFU end to end for dense GPT at scale (Megatron-LM README weak-scaling table),
    the rest being attention, comm and elementwise work modelled separately."""
    gemm_half_size_flops: float = 2.0e10
    """A GEMM of this many FLOPs reaches half of ``gemm_efficiency``: efficiency =
    gemm_efficiency * F / (F + this). Small (TP-split or few-token) GEMMs are
    latency bound; 2e10 FLOP ~ 20 us at 1 PFLOP/s (typical kernel launch + tail)."""
    grouped_gemm_efficiency: float = 0.55
    """Fraction of peak for MoE expert GEMMs (Transformer Engine GroupedLinear / cuBLAS grouped GEMM) at large rows per
    expert, before the rows-per-expert penalty below. NVIDIA's MoE guide (megatron/core/transformer/moe/README.md)
    reports grouped GEMM below dense GEMM efficiency."""
    grouped_gemm_half_rows: float = 88.3
    """Rows (token copies) per local expert at which grouped-GEMM efficiency halves for an expert of unbounded size:
    the constant part of the half-point ``this + grouped_gemm_half_rows_work / (hidden x expert FFN per rank)``.
    Measured on 1 x H200 (``torch._grouped_mm``, bf16, nine MoE models' expert shapes at 256-8192 rows;
    ``benchmarks/h200_grouped_gemm.py --fit``, ``benchmarks/results/h200_te_2026-12-02/call33``); not fitted."""
    grouped_gemm_half_rows_work: float = 1.226e9
    """The shape-dependent part of the grouped GEMM's half-point, rows x hidden x expert FFN (elements): Qwen3-30B-A3B's
    2048 x 768 expert halves at ~870 rows, DeepSeek-V3's 7168 x 2048 at ~130. Same measurement (54 points, 4.2% median
    error)."""
    grouped_gemm_efficiency_floor: float = 1e-3
    """Lowest grouped-GEMM efficiency used (the curve above tends to 0 with few rows). A floor, not a measurement."""
    attention_efficiency: float = 0.45
    """Causal flash attention's forward + backward speed at head dim 128 above a call's fixed part, as a fraction of the
    bf16 peak against :func:`cost_model.terms.compute.core_attention_flops` (multiply-accumulates: the fraction of peak
    in FLOPs is twice this). The fit's start; the shipped fit is 0.2375 (FlashAttention-2, Dao 2023: ~50-70% forward,
    ~35-45% backward); cuDNN measured 0.239 on 1 x H200 (``benchmarks/results/h200_te_2026-12-02/call29``)."""
    attention_call_macs: float = 1.553e10
    """The fixed part of one full-attention kernel call per sequence, forward-equivalent multiply-accumulates at the
    head-dim-128 speed (:func:`cost_model.terms.compute.core_attention_work`): 0.197 ms of a call that does not grow
    with the work, x 989.4 TFLOP/s x 0.239 / 3. Measured on 1 x H200 (cuDNN FusedAttention,
    ``benchmarks/h200_attention.py --compare``, ``benchmarks/results/h200_te_2026-12-02/call29``); not fitted."""
    attention_window_extra_keys: float = 590.0
    """Keys per query a sliding-window layer's kernel costs beyond the window's own, at the full-attention kernel's time
    per key: GPT-OSS-120B's shape at 4,096 tokens, window 128: 0.383 against 1.292 ms full (same measurement as
    :attr:`attention_call_macs`); not fitted."""
    attention_sink_extra_keys: float = 730.0
    """Keys per query the learnable softmax (GPT-OSS's attention sinks) costs: 1.682 against 1.292 ms forward + backward
    at GPT-OSS's shape and 4,096 tokens (same measurement, head dim 64 only); not fitted."""
    elementwise_bytes_per_token_attn: float = 48.0
    """HBM bytes moved per token per layer per hidden unit by the memory-bound ops around
    attention (norms, RoPE, residual adds, casts), forward+backward, in units of hidden_size."""
    elementwise_bytes_per_copy_moe: float = 40.0
    """HBM bytes moved per routed token copy per hidden unit by permute, unpermute,
    probability scaling and SwiGLU, forward+backward, in units of hidden_size."""
    expert_bias_bytes_per_copy_moe: float = 157.0
    """Extra HBM-equivalent bytes per routed token copy per hidden unit, forward+backward, when the experts have
    biases (``add_bias_linear``, GPT-OSS): a GPT-OSS-120B slice ran 0.513 s with them, 0.480 s without, on 1 x H200
    (126 ns per copy-layer x 0.75 x 4.8 TB/s / 2,880; ``benchmarks/results/h200_te_2026-12-01/call18``); not fitted."""
    unfused_mla_rope_bytes_per_element: float = 93.5
    """HBM-equivalent bytes per q element (token x head x q head dim, ``q_dim / tp`` per token), forward + backward, of
    MLA's RoPE and q / k assembly when RoPE is not fused (``apply_rope_fusion`` off): a DeepSeek-V3 MLA layer at 8,192
    tokens ran 5.23 ms slower unfused on 1 x H200, x 0.75 x 4.8 TB/s / (8,192 x 128 x 192) elements
    (``benchmarks/results/h200_te_2026-12-01/call24``); not fitted."""
    unfused_mla_rope_forward_share: float = 0.56
    """The forward's part of :attr:`unfused_mla_rope_bytes_per_element` (what ``mla_up_proj`` recompute and full
    recompute re-run): 2.94 ms more unfused than fused on the same layer (same measurement); not fitted."""
    elementwise_backward_ratio: float = 2.0
    """Memory-bound work's backward over its forward: a norm's or activation's backward reads its saved input and the
    incoming gradient and writes the input gradient, about twice its forward's traffic (the same 2x as a GEMM's dgrad +
    wgrad, Narayanan et al. 2021 §5.1). Splits the forward+backward elementwise times above: a forward (what recompute
    re-runs) is ``1 / (1 + this)`` of them, and the fp32 cross-entropy traffic of the logits is ``1 + this`` passes.
    Chosen (``/ 3``), not fitted."""
    dense_mlp_elementwise_share: float = 0.5
    """A dense MLP block's memory-bound work (its norm, residual add and activation function) relative to the attention
    block's (``elementwise_bytes_per_token_attn``): the MLP side has about half the elementwise ops (no RoPE, no QK
    norm, no softmax-adjacent casts). Chosen (``/ 2``), not fitted."""
    norm_elementwise_share: float = 0.5
    """The two norms' share of the attention block's memory-bound time: what selective ``layernorm`` recompute re-runs
    (a forward of both norms). Chosen (``/ 6`` = this x a forward's ``1 / 3``), not fitted."""
    moe_act_elementwise_share: float = 0.5
    """The expert activation's (SwiGLU with its probability scaling) share of the MoE memory-bound
    time: what selective ``moe_act`` recompute re-runs. Chosen (``/ 6`` = this x a forward's ``1 / 3``), not fitted."""
    gemm_family_factor_ampere: float = 1.0
    """Compute efficiencies (dense GEMM, grouped GEMM, attention) on Ampere relative to Hopper,
    whose values are the fields above. Fitted by ``tune calibrate`` where rows exist."""
    gemm_family_factor_blackwell: float = 1.0
    """The same for Blackwell (B200, GB200, B300, GB300)."""
    gemm_generation_factor_blackwell_ultra: float = 1.0
    """Compute efficiencies (GEMMs at bf16 and fp8, attention; not nvfp4 GEMMs, whose datasheet peak is already 1.5x
    Blackwell's) on Blackwell Ultra (B300, GB300) relative to Blackwell's, on top of
    :attr:`gemm_family_factor_blackwell`: the datasheets give both the same bf16 and fp8 peaks, yet NVIDIA's tables ran
    the same layouts faster on Blackwell Ultra. Fitted by ``tune calibrate`` (1.19 on the published runs, 1.18-1.22 in
    every k-fold fold; ``benchmarks/results/2026-12-02_validation``)."""
    fp8_gemm_efficiency_ratio: float = 1.0
    """Achieved fraction of the fp8 peak relative to the bf16 fraction, per-tensor fp8 recipes
    (quantisation kernels and amax reductions are inside the GEMM time here)."""
    fp8_blockwise_gemm_efficiency_ratio: float = 1.0
    """The same for blockwise fp8 (128x128 / 1x128 scales, DeepSeek-V3 recipe)."""
    mxfp8_gemm_efficiency_ratio: float = 1.0
    """The same for MXFP8 (Blackwell)."""
    nvfp4_gemm_efficiency_ratio: float = 1.0
    """Achieved fraction of the fp4 peak relative to the bf16 fraction (NVFP4 recipe; Megatron
    keeps some layers and the wgrad of others in higher precision, which this ratio absorbs)."""
    hbm_efficiency: float = 0.75
    """Achieved fraction of HBM bandwidth for memory-bound kernels (STREAM-like)."""
    moe_load_imbalance: float = 1.20
    """Slowest expert rank's tokens over the mean, natural (not force-balanced) routing
    with aux-loss-free expert bias (MiniMax-M2, slime). Set with the seed's tuned layout."""
    moe_layer_overhead_s: float = 0.3e-3
    """Fixed cost per MoE layer per micro-batch per pass (forward, backward, recomputed forward),
    whatever the dispatcher: router top-k and score kernels, permutation index kernels and the
    host-side launch work of their small kernels."""
    moe_host_sync_latency_s: float = 0.5e-3
    """Extra cost per MoE layer per micro-batch per pass, whatever the dispatcher: the device-to-host copy of the
    tokens per expert that stalls the stream. The grouped GEMM takes its splits as a host list (megatron-core
    ``TEGroupedMLP.forward``: ``tokens_per_expert.tolist()`` for TE's ``GroupedLinear(m_splits)``), and DeepEP's
    normal dispatch returns the received counts as a host list too (DeepEP README, ``Buffer.dispatch``); the alltoall
    dispatcher also ``.cpu()``-s its splits (token_dispatcher.py)."""
    expert_gemm_overhead_s: float = 30e-6
    """Fixed cost per local expert per expert GEMM (fc1, fc2 forward; their dgrad and wgrad backward): Transformer
    Engine's GroupedLinear runs one cuBLAS GEMM per local expert, each with launch latency and a partial last wave. Set
    with the seed's tuned layout (32 local experts at EP 8)."""
    fp8_quantize_overhead_s: float = 17.0e-6
    """Fixed cost per local expert GEMM of quantising its operands in an fp8 / fp4 run (TE's grouped GEMM casts each
    expert's slice with its own kernels; doubled for current scaling, ``comm.FP8_CURRENT_SCALING_KERNELS``).
    **Set from one measurement**: 1 x H200, MiniMax-M2 1-layer slice, fp8 delayed, 256 local experts: 1.298 s per step
    against 1.089 s predicted without it, over 8 x 6 x 256 expert GEMMs (``mm-fp8-delayed``,
    ``benchmarks/results/h200_te_2026-12-01``). Not fitted (published runs cannot separate it from the fp8 GEMMs)."""
    nvlink_efficiency: float = 0.75
    """Achieved fraction of NVLink per-direction bandwidth by NCCL ring collectives
    (nccl-tests bus bandwidth ~360 of 450 GB/s on H100 SXM)."""
    alltoall_nvlink_efficiency: float = 0.95
    """Achieved fraction of NVLink bandwidth by NCCL all-to-all inside a node. **Set, not fitted**: the published pairs
    in which only the dispatcher changed inside one NVLink domain measured alltoall 4.0% and 4.4% faster than HybridEP
    (GPT-OSS-120B rows 133 -> 134 and 203 -> 206, docs/published_pairs.md), which needs NCCL's all-to-all near
    HybridEP's own figure (0.82, ``specs/data/networks.yaml``) with its larger bytes; fitted freely it orders both
    pairs wrong."""
    network_efficiency: float = 0.80
    """Achieved fraction of per-node network bandwidth (EFA / InfiniBand) by NCCL."""
    dp_overlap: float = 0.0
    """Fraction of data-parallel gradient reduce-scatter / param all-gather hidden behind
    compute when ``--overlap-grad-reduce`` / ``--overlap-param-gather`` are on
    (:class:`specs.RunOptions`); without them (the seed's run block) nothing is hidden."""
    tp_comm_overlap_fraction: float = 0.5
    """Fraction of TP / sequence-parallel collectives hidden with ``--tp-comm-overlap``
    (Transformer Engine userbuffers pipelining the all-gather / reduce-scatter with the GEMM)."""
    cp_p2p_overlap: float = 0.5
    """Fraction of the context-parallel K/V ring (``--cp-comm-type p2p``) hidden behind attention
    (Megatron overlaps each block's send with the previous block's attention)."""
    ep_a2a_overlap: float = 0.68
    """Fraction of EP all-to-all time hidden with ``--overlap-moe-expert-parallel-comm`` (dispatch / combine of one
    micro-batch under the compute of another). **Set from a published pair** (docs/published_pairs.md): GPT-OSS-120B on
    64 GB200, EP 64, rows 197 / 200 -> 206, overlap off -> on: +5.4% / +5.6% measured, +5.5% modelled at 0.68. Not
    fitted; the pairs span two releases, so a rough value."""
    flex_sm_share: float = 0.15
    """Share of a GPU's SMs the flex dispatchers' kernels hold while they run: Megatron's ``moe_deepep_num_sms``
    default 20 (``moe_hybridep_num_sms`` 16) of H100's 132 SMs (megatron-core ``TransformerConfig``). With EP A2A
    overlap the compute that hides their all-to-all runs on the other SMs, so the hidden part costs this share of
    its time (NCCL's all-to-all uses few channels: not modelled). Not fitted."""
    cuda_graph_overhead_factor: float = 0.3
    """Share of the fixed per-layer MoE costs (``moe_layer_overhead_s`` and ``expert_gemm_overhead_s``) left when
    whole-iteration (or whole-layer) CUDA graphs capture them (kernel launches replayed from the graph,
    ``--cuda-graph-scope full_iteration``)."""
    cuda_graph_partial_overhead_factor: float = 0.3
    """Share of ``moe_layer_overhead_s`` left when TE's per-module CUDA graphs capture only the MoE router and its
    preprocessing (``--cuda-graph-impl transformer_engine --cuda-graph-scope moe_router moe_preprocess``): the
    dispatch, the experts and the combine still launch eagerly, so less is removed than by a whole-iteration graph.
    Fitted separately from :attr:`cuda_graph_overhead_factor` (the published rows run both kinds)."""
    pp_p2p_overlap: float = 0.8
    """Fraction of pipeline send/recv time hidden (overlap_p2p_comm is on by default with VPP)."""
    optimizer_bytes_per_param: float = 32.0
    """HBM bytes moved per parameter by the fused Adam step on the GPU (read p,g,m,v; write p,m,v)."""
    cpu_adam_params_per_s_per_node: float = 2.0e9
    """Parameters per second a host's CPUs step with Adam (Megatron's HybridDeviceOptimizer with torch.optim.AdamW on
    fp32 states), shared by the node's GPUs. Derived, not fitted: torch's single-tensor AdamW makes ~6 elementwise
    passes, ~80 bytes of host memory traffic per parameter, plus ~12 bytes for the gradient and parameter copies; ~180
    GB/s achieved by eight processes sharing a 2-socket host (about a third of DDR5 peak, given thread oversubscription)
    -> ~2e9 parameters/s. ZeRO-Offload (arXiv 2101.06840) reports the same order for PyTorch's CPU Adam."""
    host_process_bytes: float = 2.36 * 2**30
    """Host memory (RSS) of one training process besides CPU optimizer offload: CUDA context, libraries, data
    loader. **Measured** on 1 x H200 with TE (``benchmarks/results/h200_te_2026-12-01/call12/sweep.jsonl``:
    peak RSS 2.33-2.38 GiB on the 4 MiniMax-M2 rows and the Qwen3 probe); not fitted."""
    pcie_efficiency: float = 0.70
    """Achieved fraction of PCIe bandwidth for pinned host<->device copies."""
    offload_overlap: float = 0.3
    """Fraction of the offload copies hidden by --overlap-cpu-optimizer-d2h-h2d."""
    cuda_context_bytes: float = 0.75 * 2**30
    """CUDA context and cuBLAS/cuDNN workspaces per process (~0.5-1 GiB on Hopper)."""
    nccl_bytes_per_communicator: float = 0.2 * 2**30
    """NCCL buffers per process group a rank belongs to (NCCL_BUFFSIZE 4 MiB x channels x peers)."""
    allocator_overhead_fraction: float = 0.08
    """Caching-allocator fragmentation on top of dynamic (activation) memory."""
    backward_working_set_fraction: float = 0.5
    """Temporaries of the layer running backward (without full recompute), as a fraction of one layer's activations: the
    gradients of its activations in flight while its saved tensors are still held (Korthikanti et al. 2022 count stored
    activations only). Under full recompute the whole group being recomputed is counted instead. Chosen, not fitted."""
    base_process_groups: float = 2.0
    """NCCL communicators every rank holds whatever the layout, on top of one per parallel dimension of size > 1
    (``nccl_bytes_per_communicator`` each), e.g. the default world group and the data-parallel-with-context group of the
    gradient reduce, which megatron/core/parallel_state.py creates for every layout. Chosen (``+ 2``), not fitted."""
    flex_dispatcher_buffer_bytes: float = 2.0 * 2**30
    """DeepEP / HybridEP communication buffers per rank (DeepEP's default NVL buffer ~1 GB plus RDMA buffer)."""
    cuda_graph_static_buffers: float = 2.0
    """Hidden-size tensors per captured layer and micro-batch in flight that per-layer CUDA graphs keep as static
    buffers (one input and one output; TE ``make_graphed_callables`` keeps per-callable static inputs / outputs).
    [inferred from the API, not measured; not fitted: the published tables have no memory column]"""
    logits_bytes_per_element: float = 6.0
    """Bytes per logit element held on the last stage: fp32 softmax kept for backward (4)
    plus the bf16 logits / gradient in flight (2) (megatron/core/tensor_parallel/cross_entropy.py)."""

    def __post_init__(self) -> None:
        import math

        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TunerError(f"calibration constant {f.name} must be a finite number, got {v!r}")
            lo, hi, lo_open = _RANGES.get(f.name, (0.0, math.inf, False))
            if v < lo or v > hi or (lo_open and v == lo):
                bound = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
                raise TunerError(f"calibration constant {f.name} = {v!r} is outside {bound}")

    def family_factor(self, family: str, generation: str = "") -> float:
        """Compute-efficiency multiplier of a GPU family (``GPUSpec.family``) and generation (``GPUSpec.generation``);
        Hopper is 1."""
        f = {"ampere": self.gemm_family_factor_ampere, "blackwell": self.gemm_family_factor_blackwell}.get(family, 1.0)
        return f * (self.gemm_generation_factor_blackwell_ultra if generation == "blackwell_ultra" else 1.0)

    def precision_ratio(self, precision: str) -> float:
        """GEMM efficiency at ``precision`` (a :class:`specs.Precision` value) relative to bf16."""
        return {
            "fp8": self.fp8_gemm_efficiency_ratio, "fp8_blockwise": self.fp8_blockwise_gemm_efficiency_ratio,
            "mxfp8": self.mxfp8_gemm_efficiency_ratio,
            "nvfp4": self.nvfp4_gemm_efficiency_ratio}.get(str(precision), 1.0)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **kw: Any) -> Calibration:
        return dataclasses.replace(self, **kw)


#: Accepted ranges (low, high, low excluded?): efficiencies are fractions of a peak, overlaps are
#: fractions hidden, the imbalance and speedup are ratios >= 1 / > 0; the rest are non-negative.
_RANGES: dict[str, tuple[float, float, bool]] = {
    # a kernel or link at 1% of its datasheet peak or less is a typo, not a calibration (1e-300 made a step 1e300 s)
    **{k: (0.01, 1.0, False) for k in (
        "gemm_efficiency", "grouped_gemm_efficiency", "attention_efficiency", "hbm_efficiency", "nvlink_efficiency",
        "alltoall_nvlink_efficiency", "network_efficiency", "pcie_efficiency")},
    **{k: (0.0, 1.0, True) for k in ("cuda_graph_overhead_factor", "cuda_graph_partial_overhead_factor")},
    **{k: (0.0, 1.0, False) for k in (
        "dp_overlap", "pp_p2p_overlap", "offload_overlap", "allocator_overhead_fraction", "flex_sm_share",
        "tp_comm_overlap_fraction", "cp_p2p_overlap", "ep_a2a_overlap")},
    # a GPU family's or precision's compute at a tenth of its datasheet's share or less is a typo, not a calibration
    **{k: (0.1, 2.0, False) for k in (
        "gemm_family_factor_ampere", "gemm_family_factor_blackwell", "gemm_generation_factor_blackwell_ultra",
        "fp8_gemm_efficiency_ratio", "fp8_blockwise_gemm_efficiency_ratio", "mxfp8_gemm_efficiency_ratio",
        "nvfp4_gemm_efficiency_ratio")},
    "moe_load_imbalance": (1.0, float("inf"), False),
    "grouped_gemm_efficiency_floor": (0.0, 1.0, True),
    "elementwise_backward_ratio": (0.0, 10.0, True),
    "dense_mlp_elementwise_share": (0.0, 2.0, False),
    "norm_elementwise_share": (0.0, 1.0, False),
    "moe_act_elementwise_share": (0.0, 1.0, False),
    "unfused_mla_rope_forward_share": (0.0, 1.0, False),
    "backward_working_set_fraction": (0.0, 4.0, False),
    "cuda_graph_static_buffers": (0.0, 16.0, False),
    "base_process_groups": (0.0, 64.0, False),
    "cpu_adam_params_per_s_per_node": (0.0, float("inf"), True),
    "host_process_bytes": (0.0, 2.0**40, False),
    "grouped_gemm_half_rows": (0.0, float("inf"), False),
    "grouped_gemm_half_rows_work": (0.0, float("inf"), False),
    # the attention kernel's measured extras (1.55e10 MACs, 590 and 730 keys): bounded well above what
    # any kernel showed, so a typo cannot overflow a step to inf
    "attention_call_macs": (0.0, 1e13, False),
    "attention_window_extra_keys": (0.0, 1e6, False),
    "attention_sink_extra_keys": (0.0, 1e6, False),
    # fixed costs per layer, GEMM or quantisation: a second or more per call is a typo (1e300 would make every step inf)
    **{k: (0.0, 1.0, False) for k in ("moe_layer_overhead_s", "moe_host_sync_latency_s", "expert_gemm_overhead_s",
                                      "fp8_quantize_overhead_s")},
}

#: The class defaults above, before any fit (kept for reference and for tests of the fit itself).
BASE_CALIBRATION = Calibration()

#: The shipped calibration file: ``constants`` fitted by ``tune calibrate`` plus its ``provenance``
#: (data, command, date, k-fold errors). Loaded by default by every estimating command.
SHIPPED_CALIBRATION_FILE = Path(__file__).parent / "data" / "calibration.yaml"


def _read_constants(p: Path, base: Calibration) -> Calibration:
    data = load_user_yaml(p, f"--calibration {str(p)!r}", "a calibration YAML")
    if data is None:
        raise TunerError(f"--calibration {str(p)!r}: the file is empty; write constant: value lines (or a 'tune "
                         "calibrate' output), or leave --calibration out for the shipped calibration")
    if isinstance(data, dict) and "constants" in data:
        stray = sorted(str(k) for k in set(data) - {"constants", "provenance"})
        if stray:
            raise TunerError(f"--calibration {str(p)!r}: {stray} sit beside the 'constants' section and would be "
                             "ignored; put them under 'constants' (the file has 'constants' and 'provenance' only)")
        data = data["constants"]
    if not isinstance(data, dict):
        raise TunerError(f"--calibration {str(p)!r}: expected a mapping of constant names to numbers")
    if not data:
        raise TunerError(f"--calibration {str(p)!r}: names no constant; write constant: value lines (or a 'tune "
                         "calibrate' output), or leave --calibration out for the shipped calibration")
    names = {f.name for f in dataclasses.fields(Calibration)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise TunerError(f"--calibration {str(p)!r}: unknown constants {unknown}; accepted: {sorted(names)}")
    bad = [k for k, v in data.items() if not isinstance(v, (int, float)) or isinstance(v, bool)]
    if bad:
        def _numeric_text(v: Any) -> bool:
            try:
                return isinstance(v, str) and float(v) == float(v)
            except ValueError:
                return False

        hint = ("; YAML reads a number such as 1e30 as text: write it with a decimal point and a signed exponent "
                "(1.0e+30)"
                if any(_numeric_text(data[k]) for k in bad) else "")
        raise TunerError(f"--calibration {str(p)!r}: values of {bad} are not numbers{hint}")
    try:
        return base.replace(**{k: float(v) for k, v in data.items()})
    except TunerError as e:
        raise TunerError(f"--calibration {str(p)!r}: {e}") from None


DEFAULT_CALIBRATION = _read_constants(SHIPPED_CALIBRATION_FILE, BASE_CALIBRATION)


def load_calibration(path: str | Path | None) -> Calibration:
    """Read a calibration YAML (``{constant: value}``, or a ``tune calibrate`` output with a
    ``constants`` section); None gives the shipped calibration (``cost_model/data/calibration.yaml``).
    Constants the file does not name keep their shipped values.

    Raises TunerError: unreadable file, unknown constant names, or non-numeric values."""
    if path is None:
        return DEFAULT_CALIBRATION
    p = Path(path)
    return _read_constants(p, DEFAULT_CALIBRATION)

