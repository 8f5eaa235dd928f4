"""Where the estimate is known to be off, from measurements: notes to print beside a prediction.

Each note names the measurement (1 x H200, Transformer Engine 2.20.2, megatron-core 0.19.2; rows in
``benchmarks/results/h200_te_2026-12-01/`` and ``h200_te_2026-12-02/``).
They are not corrections: the measured slices are small (1-4 layers on one GPU), so the gaps are reported, not fitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specs import Layout, ModelSpec, RecomputeGranularity

if TYPE_CHECKING:
    from cost_model.calibration import Calibration
    from specs import GPUSpec

__all__ = ["Gap", "gaps", "known_gaps"]


@dataclass(frozen=True, slots=True)
class Gap:
    """A measured gap of the estimate: its id (the anchor of its long form in ``docs/known_gaps.md``), one line to print
    beside a prediction, and the long form with its measurements."""

    id: str
    short: str
    long: str

    @property
    def line(self) -> str:
        """The short form and where the long form is."""
        return f"{self.short} (docs/known_gaps.md#{self.id})"


def known_gaps(layout: Layout, model: ModelSpec | None = None, gpu: GPUSpec | None = None,
               calibration: Calibration | None = None) -> list[str]:
    """The long forms of :func:`gaps`."""
    return [g.long for g in gaps(layout, model, gpu, calibration)]


def gaps(layout: Layout, model: ModelSpec | None = None, gpu: GPUSpec | None = None,
         calibration: Calibration | None = None) -> list[Gap]:
    """Measured gaps of the estimate that apply to ``layout`` (and ``model`` and ``gpu`` when given), one line each
    (empty when none apply). ``calibration`` (default: the shipped one) is the one the estimate used.

    - Blackwell Ultra (``GPUSpec.generation``, B300 / GB300): its compute is priced through a factor fitted to
      NVIDIA's published runs (:attr:`cost_model.calibration.Calibration.gemm_generation_factor_blackwell_ultra`), not
      measured by this project (``benchmarks/results/2026-12-02_validation``).
    - CPU optimizer offload: memory is priced from the allocator's view (``h200_te_2026-12-01/call20``-``22``; peak
      +2.4% / +5.1%, host -3.1% / +0.3% at offload 0.5 / 1.0, on the rows it was read from), but the step was
      predicted 14-25% too short, and with DP > 1 the first optimizer's clones are priced from the source only.
      ``h200_te_2026-12-02/call30``-``31`` timed the primitives (``benchmarks/h200_cpu_adam.py``,
      ``benchmarks/h200_offload.py``): fused CPU AdamW per thread, and, with the precision-aware optimizer, the
      host-blocking copy of the fp32 masters from pageable memory (``optimizer/cpu_offloading/hybrid_optimizer.py``,
      ``_get_sub_optimizer_param_groups``: ``.cpu().pin_memory()`` then ``.float()``); their sum is within -5% to +13%
      of the optimizer's step on 1, 16 threads and both parameter kinds but for fp32 on 16 threads (+33%), and -10% of
      a whole step's offload time. They are reported, not priced: priced from them, the seed's reference port (8
      single-thread processes per node) would be 38% too fast.
    - recompute (full, or selective ``moe``) on MoE layers (a MoE model, or no model given): timed on the decoder
      alone (``h200_te_2026-12-01/call23``, ``benchmarks/h200_recompute.py``, no output layer or loss in the
      difference) the extra time was 0.93-1.04x the predicted extra (MiniMax-M2 full 0.98, ``moe`` 0.93; Qwen3-30B-A3B
      full 1.04; its ``moe`` 0.44 with a 5 ms spread between rounds); reseeded and re-run
      (``h200_te_2026-12-01/call24``) MiniMax-M2 full 1.22, ``moe`` 1.24, Qwen3-30B-A3B full 0.51 and ``moe`` 0.38
      with passes 30 ms apart (ratios under the shipped calibration: the release term and TE's partial CUDA graphs):
      the 1-GPU MoE slices are host-bound (the profile had the GPU busy 44 of 77 ms of a MiniMax-M2 pass). As the
      difference of two whole harness steps it was 0.8-2.3x on each of two machines
      (``h200_te_2026-12-01/call20``-``22``, ``h200_te_2026-12-01/call25``). On a dense (MLA) layer full recompute
      cost 1.06-1.08x, ``mlp`` 1.10-1.11x and ``core_attn`` 1.02-1.05x: no note.
    - selective ``layernorm`` recompute on MoE layers: +5.4 ms per MiniMax-M2 layer per 8,192-token micro-batch
      (rounds +3.4 and +7.4 ms) where the model prices 0.1 ms, Qwen3-30B-A3B +6.6 ms with a 6.4 ms spread
      (``h200_te_2026-12-01/call23``); reseeded (``h200_te_2026-12-01/call24``) +4.0 and -15.3 ms with 9-11 ms between
      rounds. By the GPU kernels' time (``h200_te_2026-12-02/call32``, ``PROFILE=all``) it added +0.8 and -1.0 ms:
      host time, not GPU work. Full and ``moe`` recompute of MoE layers by kernels: 0.35-0.58x the predicted extra,
      rounds within 2 ms (ratios under the shipped calibration).
    - MLA (``kv_lora_rank`` > 0): with the fused RoPE a dense DeepSeek-V3 layer's forward + backward took 70.8 ms per
      8,192-token micro-batch on the decoder alone against 63.9 ms predicted (the embedding's backward, about 3 ms, is
      in the measured time and not in the predicted one). Timed alone, core attention with all 128 heads (no kv
      grouping) ran 8-13% longer than MLA's shape at 32 heads, from which its factor comes
      (``benchmarks/h200_attention.py``). The unfused RoPE (``apply_rope_fusion`` off, as the harness runs it) costs
      5.23 ms more, priced (:func:`cost_model.terms.compute.mla_unfused_rope_time`), which brought ``mla_up_proj``
      recompute from 3.3x to 1.08-1.09x.
    - GPT-OSS's clamped quick-GEGLU: +0.010 s on a 0.51 s step of a 2-layer GPT-OSS-120B slice (about 2%;
      ``h200_te_2026-12-01/call18``), not priced. Its attention sinks (+0.011 s there) are priced
      (:attr:`cost_model.calibration.Calibration.attention_sink_extra_keys`: 0.006 s predicted).
    """
    out: list[Gap] = []
    if gpu is not None and gpu.generation == "blackwell_ultra":
        from cost_model.calibration import DEFAULT_CALIBRATION

        factor = (calibration or DEFAULT_CALIBRATION).gemm_generation_factor_blackwell_ultra
        out.append(Gap(
            "blackwell-ultra", f"{gpu.name}: compute priced {factor:.2f}x Blackwell's by a factor fitted to published runs",
            f"{gpu.name} (Blackwell Ultra): its datasheet gives it the dense bf16 and fp8 peaks of B200 / GB200, yet "
            "NVIDIA's tables ran the same layouts faster there, so its compute is priced "
            f"{factor:.2f}x Blackwell's through a factor fitted to those "
            "runs (gemm_generation_factor_blackwell_ultra), not measured by this project (docs/validation.md)"
        ))
    if layout.optimizer_offload_fraction > 0:
        dp = layout.world_size // max(1, layout.tp * layout.pp * layout.cp)
        msg = ("CPU optimizer offload: on 1 x H200 the memory matched the first steps' peak (+2-5%, host -3% to 0%), "
               "but the predicted step was 14-25% too short (-14.2% / -24.7% at offload 0.5 / 1.0, docs/validation.md). Timed alone "
               "(benchmarks/h200_cpu_adam.py), torch's fused CPU AdamW stepped 0.57 G parameters/s on one thread and 3.9 G on 16; torchrun "
               "(--nproc-per-node > 1) and Ray actors (slime's train actors ask for 1 CPU) leave each process one thread unless "
               "OMP_NUM_THREADS is set")
        if layout.use_precision_aware_optimizer:
            msg += ("; with the precision-aware optimizer, megatron-core 0.13-0.19 keeps the fp32 masters in pageable host "
                    "memory, so each step also copies 4 B per offloaded parameter back at 6.7 GB/s and holds the process "
                    "meanwhile (2.29 s against 0.83 s with pinned fp32 masters, 2.44 G parameters, 16 threads; "
                    "Megatron-LM main pins them since PR 4547). The model keeps its derived per-node CPU Adam "
                    "rate: priced from these primitives instead, the seed's reference port would be predicted 38% too "
                    "fast, so the offload step's price is not settled")
        if dp > 1:
            msg += (f"; at DP {dp} the 'optimizer' part and the host memory include the first HybridDeviceOptimizer's fp32 "
                    "clones of this rank's unsharded parameters (megatron-core 0.19 builds it before DistributedOptimizer "
                    "replaces it; they do not shrink with DP, so offload can cost GPU memory here), freed only when Python's "
                    "cyclic collector runs (gc.collect() after the build freed them on H200); priced from the source, not "
                    "measured at DP > 1")
        out.append(Gap("offload", "CPU optimizer offload: step measured 14-25% longer than predicted on 1 x H200",
                       msg + ": confirm with a real trial"))
    moe = model is None or model.is_moe
    selective = layout.recompute_granularity is RecomputeGranularity.selective
    heavy = layout.recompute_granularity is RecomputeGranularity.full or (selective and "moe" in layout.recompute_modules)
    if heavy and moe:
        out.append(Gap(
            "recompute", "recompute of MoE layers: measured 0.4-2.3x the predicted extra time",
            "recompute: on 1 x H200, timed on the decoder alone, full and selective 'moe' recompute of MoE layers cost "
            "0.93-1.24x the predicted extra time on MiniMax-M2, 0.38-1.04x on Qwen3-30B-A3B, whose single passes spread "
            "by up to 30 ms (the 1-GPU MoE slices are host-bound: the GPU was busy 57% of a MiniMax-M2 pass); as the "
            "difference of two whole trial steps it measured 0.8-2.3x on two machines (benchmarks/results/"
            "h200_te_2026-12-01); by the GPU kernels' time (h200_te_2026-12-02/call32, rounds within 2 ms) it added 0.35-0.58x the "
            "predicted extra: the model's extra re-pays the fixed per-expert costs of the forward, host time that a "
            "GPU-bound step may hide: confirm the step with a real trial"
        ))
    if selective and "layernorm" in layout.recompute_modules and moe:
        out.append(Gap(
            "recompute-layernorm", "'layernorm' recompute of MoE layers: a few ms per layer of host time not priced",
            "recompute 'layernorm': on 1 x H200 it cost +5.4 and +6.6 ms per MoE slice per 8,192-token micro-batch in one "
            "run and +4.0 and -15.3 ms (rounds 9-11 ms apart) in a reseeded re-run, against 0.1 ms predicted "
            "(benchmarks/results/h200_te_2026-12-01); its GPU kernels added +0.8 and -1.0 ms (h200_te_2026-12-02/call32, "
            "rounds 1.2-1.4 ms apart), so the difference was the host-bound slices' host time: on a host-bound step "
            "such layouts may be predicted a few ms per layer too fast"
        ))
    if model is not None and model.is_mla:
        out.append(Gap(
            "mla", "MLA: a dense layer measured 5-10% slower than predicted on 1 x H200",
            "MLA: on 1 x H200 a dense DeepSeek-V3 layer with the fused RoPE (Megatron-LM's default) took 70.8 ms per "
            "8,192-token micro-batch against 63.9 ms predicted (decoder alone, the embedding's ~3 ms backward included); "
            "timed alone, its core attention with 128 heads and no kv grouping ran 8-13% longer than the head-dim "
            "factor measured at 32 heads predicts (benchmarks/results/h200_te_2026-12-02/call29): predicted 5-10% too fast"
        ))
    if model is not None and model.activation_func == "quick_gelu":
        out.append(Gap(
            "gpt-oss", "GPT-OSS: the clamped quick-GEGLU (about 2% of a step) is not priced",
            "GPT-OSS features: on 1 x H200 the clamped quick-GEGLU cost about 2% of a 2-layer slice's step (about 4% of "
            "its layers' own time), which the model does not price (docs/measurements.md, GPT-OSS-120B's layer features; "
            "the attention sinks are priced): predicted a little too fast"
        ))
    return out
