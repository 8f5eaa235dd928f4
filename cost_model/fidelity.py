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

    What each gap measured, and where: ``docs/known_gaps.md`` (the section of each :attr:`Gap.id`)."""
    out: list[Gap] = []
    if gpu is not None and gpu.generation == "blackwell_ultra":
        from cost_model.calibration import DEFAULT_CALIBRATION

        factor = (calibration or DEFAULT_CALIBRATION).gemm_generation_factor_blackwell_ultra
        out.append(Gap(
            "blackwell-ultra",
            f"{gpu.name}: compute priced {factor:.2f}x Blackwell's by a factor fitted to published runs",
            f"{gpu.name} (Blackwell Ultra): its datasheet gives it the dense bf16 and fp8 peaks of B200 / GB200, yet "
            "NVIDIA's tables ran the same layouts faster there, so its compute is priced "
            f"{factor:.2f}x Blackwell's through a factor fitted to those "
            "runs (gemm_generation_factor_blackwell_ultra), not measured by this project (docs/validation.md)"))
    if layout.optimizer_offload_fraction > 0:
        dp = layout.world_size // max(1, layout.tp * layout.pp * layout.cp)
        msg = ("CPU optimizer offload: on 1 x H200 the memory matched the first steps' peak (+2-5%, host -3% to 0%), "
               "but the predicted step was 14-25% too short (-14.2% / -24.7% at offload 0.5 / 1.0, "
               "docs/validation.md). Timed alone "
               "(benchmarks/h200_cpu_adam.py), torch's fused CPU AdamW stepped 0.57 G parameters/s on one thread and "
               "3.9 G on 16; torchrun "
               "(--nproc-per-node > 1) and Ray actors (slime's train actors ask for 1 CPU) leave each process one "
               "thread unless OMP_NUM_THREADS is set")
        if layout.use_precision_aware_optimizer:
            msg += ("; with the precision-aware optimizer, megatron-core 0.13-0.19 keeps the fp32 masters in pageable "
                    "host memory, so each step also copies 4 B per offloaded parameter back at 6.7 GB/s and holds the "
                    "process meanwhile (2.29 s against 0.83 s with pinned fp32 masters, 2.44 G parameters, 16 threads; "
                    "Megatron-LM main pins them since PR 4547). The model keeps its derived per-node CPU Adam "
                    "rate: priced from these primitives instead, the seed's reference port would be predicted 38% too "
                    "fast, so the offload step's price is not settled")
        if dp > 1:
            msg += (f"; at DP {dp} the 'optimizer' part and the host memory include the first HybridDeviceOptimizer's "
                    "fp32 clones of this rank's unsharded parameters (megatron-core 0.19 builds it before "
                    "DistributedOptimizer "
                    "replaces it; they do not shrink with DP, so offload can cost GPU memory here), freed only when "
                    "Python's "
                    "cyclic collector runs (gc.collect() after the build freed them on H200); priced from the source, "
                    "not measured at DP > 1")
        out.append(Gap("offload", "CPU optimizer offload: step measured 14-25% longer than predicted on 1 x H200",
                       msg + ": confirm with a real trial"))
    moe = model is None or model.is_moe
    selective = layout.recompute_granularity is RecomputeGranularity.selective
    heavy = layout.recompute_granularity is RecomputeGranularity.full or (selective
                                                                          and "moe" in layout.recompute_modules)
    if heavy and moe:
        out.append(Gap(
            "recompute", "recompute of MoE layers: measured 0.4-2.3x the predicted extra time",
            "recompute: on 1 x H200, timed on the decoder alone, full and selective 'moe' recompute of MoE layers cost "
            "0.93-1.24x the predicted extra time on MiniMax-M2, 0.38-1.04x on Qwen3-30B-A3B, whose single passes "
            "spread "
            "by up to 30 ms (the 1-GPU MoE slices are host-bound: the GPU was busy 57% of a MiniMax-M2 pass); as the "
            "difference of two whole trial steps it measured 0.8-2.3x on two machines (benchmarks/results/"
            "h200_te_2026-12-01); by the GPU kernels' time (h200_te_2026-12-02/call32, rounds within 2 ms) it added "
            "0.35-0.58x the "
            "predicted extra: the model's extra re-pays the fixed per-expert costs of the forward, host time that a "
            "GPU-bound step may hide: confirm the step with a real trial"
        ))
    if selective and "layernorm" in layout.recompute_modules and moe:
        out.append(Gap(
            "recompute-layernorm", "'layernorm' recompute of MoE layers: a few ms per layer of host time not priced",
            "recompute 'layernorm': on 1 x H200 it cost +5.4 and +6.6 ms per MoE slice per 8,192-token micro-batch in "
            "one run and +4.0 and -15.3 ms (rounds 9-11 ms apart) in a reseeded re-run, against 0.1 ms predicted "
            "(benchmarks/results/h200_te_2026-12-01); its GPU kernels added +0.8 and -1.0 ms "
            "(h200_te_2026-12-02/call32, "
            "rounds 1.2-1.4 ms apart), so the difference was the host-bound slices' host time: on a host-bound step "
            "such layouts may be predicted a few ms per layer too fast"
        ))
    if model is not None and model.is_mla:
        out.append(Gap(
            "mla", "MLA: a dense layer measured 5-10% slower than predicted on 1 x H200",
            "MLA: on 1 x H200 a dense DeepSeek-V3 layer with the fused RoPE (Megatron-LM's default) took 70.8 ms per "
            "8,192-token micro-batch against 63.9 ms predicted (decoder alone, the embedding's ~3 ms backward "
            "included); "
            "timed alone, its core attention with 128 heads and no kv grouping ran 8-13% longer than the head-dim "
            "factor measured at 32 heads predicts (benchmarks/results/h200_te_2026-12-02/call29): predicted 5-10% too "
            "fast"
        ))
    if model is not None and model.activation_func == "quick_gelu":
        out.append(Gap(
            "gpt-oss", "GPT-OSS: the clamped quick-GEGLU (about 2% of a step) is not priced",
            "GPT-OSS features: on 1 x H200 the clamped quick-GEGLU cost about 2% of a 2-layer slice's step (about 4% "
            "of its layers' own time), which the model does not price (docs/measurements.md, GPT-OSS-120B's layer "
            "features; the attention sinks are priced): predicted a little too fast"
        ))
    return out
