"""Where the estimate is known to be off, from measurements: notes to print beside a prediction.

Each note names the measurement (``docs/measurements.md``, "The Transformer Engine sweep (issue 14)", 1 x H200,
Transformer Engine 2.20.2, megatron-core 0.19.2, 2026-12-01; rows in ``benchmarks/results/h200_te_2026-12-01/``).
They are not corrections: the measured slices are small (1-4 layers on one GPU), so the gaps are reported, not fitted.
"""

from __future__ import annotations

from specs import Layout, ModelSpec, RecomputeGranularity

__all__ = ["known_gaps"]


def known_gaps(layout: Layout, model: ModelSpec | None = None) -> list[str]:
    """Measured gaps of the estimate that apply to ``layout`` (and ``model`` when given), one line each (empty when none
    apply).

    - CPU optimizer offload: memory is priced from the allocator's view of the fifth batch (peak +2.4% / +5.1%, host
      -3.1% / +0.3% at offload 0.5 / 1.0, on the rows it was read from), but the step was predicted 10-24% too short,
      and with DP > 1 the first optimizer's clones are priced from the source only.
    - recompute (full, or selective ``moe``) on MoE layers (a MoE model, or no model given): timed on the decoder alone
      (sixth batch, ``benchmarks/h200_recompute.py``, no output layer or loss in the difference) the extra time was
      0.83-0.92x the predicted extra (MiniMax-M2 full 0.86, ``moe`` 0.83; Qwen3-30B-A3B full 0.92; its ``moe`` 0.39 with
      a 5 ms spread between rounds); as the difference of two whole harness steps it was 0.8-2.3x (fifth batch), a
      measurement that varied 2x between machines. On a dense (MLA) layer full recompute cost 1.17x and ``mlp`` 1.09x:
      no note.
    - selective ``layernorm`` recompute on MoE layers: +5.4 ms per MiniMax-M2 layer per 8,192-token micro-batch (rounds
      +3.4 and +7.4 ms) where the model prices 0.1 ms; Qwen3-30B-A3B +6.6 ms with a 6.4 ms spread; the cause is not found
      and the runs' routing differed between variants.
    - MLA (``kv_lora_rank`` > 0): a dense DeepSeek-V3 layer's forward + backward took 76.8 ms per 8,192-token micro-batch
      on the decoder alone against 61.8 ms predicted (the prediction 19.6% short; the layer 24% slower), and selective
      ``mla_up_proj`` recompute cost 3.3x its predicted 1.4 ms: the model prices MLA's up-projection GEMMs but not the
      RoPE and q / k / v assembly around them (measured with megatron-core's unfused RoPE, ``apply_rope_fusion`` off, as
      the harness runs it; the fused path is not measured).
    - GPT-OSS's attention sinks (``softmax_type`` learnable) and clamped quick-GEGLU: +0.011 s and +0.010 s on a 0.51 s
      step of a 2-layer GPT-OSS-120B slice (about 2% each; "GPT-OSS-120B's layer features", call18), not priced.
    """
    out: list[str] = []
    if layout.optimizer_offload_fraction > 0:
        dp = layout.world_size // max(1, layout.tp * layout.pp * layout.cp)
        msg = ("CPU optimizer offload: on 1 x H200 the memory matched the first steps' peak (+2-5%, host -3% to 0%), "
               "but the predicted step was 10-24% too short (docs/measurements.md, fifth batch)")
        if dp > 1:
            msg += (f"; at DP {dp} the 'optimizer' part and the host memory include the first HybridDeviceOptimizer's fp32 "
                    "clones of this rank's unsharded parameters (megatron-core 0.19 builds it before DistributedOptimizer "
                    "replaces it; they do not shrink with DP, so offload can cost GPU memory here), freed only when Python's "
                    "cyclic collector runs (gc.collect() after the build freed them on H200); priced from the source, not "
                    "measured at DP > 1")
        out.append(msg + ": confirm with a real trial")
    moe = model is None or model.is_moe
    selective = layout.recompute_granularity is RecomputeGranularity.selective
    heavy = layout.recompute_granularity is RecomputeGranularity.full or (selective and "moe" in layout.recompute_modules)
    if heavy and moe:
        out.append(
            "recompute: on 1 x H200 full and selective 'moe' recompute of MoE layers cost 0.83-0.92x the predicted extra "
            "time, timed on the decoder alone (one case 0.39x, its rounds 5 ms apart; docs/measurements.md, sixth batch); "
            "as the difference of two whole trial steps it measured 0.8-2.3x (fifth batch): confirm the step with a real trial"
        )
    if selective and "layernorm" in layout.recompute_modules and moe:
        out.append(
            "recompute 'layernorm': on 1 x H200 it cost about 5 ms per MoE layer per 8,192-token micro-batch (+3.4 to "
            "+7.4 ms over two rounds whose router weights differed, not yet repeated; 0.1 ms predicted; "
            "docs/measurements.md, sixth batch), a cost the model does not price: such layouts may be predicted too fast"
        )
    if model is not None and model.is_mla:
        out.append(
            "MLA: on 1 x H200 a dense DeepSeek-V3 layer took 76.8 ms per 8,192-token micro-batch against 61.8 ms predicted "
            "(decoder alone) and 'mla_up_proj' recompute cost 3.3x its predicted 1.4 ms, with megatron-core's unfused "
            "RoPE: the RoPE and q / k / v assembly around MLA's up-projections are not priced, and the fused RoPE path "
            "(apply_rope_fusion) is not measured (docs/measurements.md, sixth batch): predicted too fast"
        )
    feats = [f for f, on in (("attention sinks", model is not None and model.softmax_type != "vanilla"),
                             ("the clamped quick-GEGLU", model is not None and model.activation_func == "quick_gelu")) if on]
    if feats:
        out.append(
            f"GPT-OSS features: on 1 x H200 {' and '.join(feats)} each cost about 2% of a 2-layer slice's step (about 4% of "
            "its layers' own time), which the model does not price (docs/measurements.md, GPT-OSS-120B's layer features): "
            "predicted a little too fast"
        )
    return out
