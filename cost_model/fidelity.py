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

    - CPU optimizer offload: the predicted peak was 13-20% under the reserved peak (offload 0.5: 65.4 GiB predicted
      against 81.7 reserved; 1.0: 42.6 against 49.2), beyond the default 7% headroom; the predicted host memory 24-26%
      under the peak RSS (43.4 GiB against 58.9; 84.5 against 111.5); the predicted step 15-25% too short.
    - recompute (full, or selective ``moe``): the extra time was 1.5-1.7x the predicted extra time (MiniMax-M2
      1-layer slice: full +0.32 s measured against +0.21 s, selective ``moe`` +0.32 s against +0.19 s).
    - GPT-OSS's attention sinks (``softmax_type`` learnable) and clamped quick-GEGLU: +0.011 s and +0.010 s on a 0.51 s
      step of a 2-layer GPT-OSS-120B slice (about 2% each; "GPT-OSS-120B's layer features", call18), not priced.
    """
    out: list[str] = []
    if layout.optimizer_offload_fraction > 0:
        out.append(
            "CPU optimizer offload: on 1 x H200 the predicted peak was 13-20% under the reserved peak, the predicted host "
            "memory 24-26% under the measured RSS and the predicted step 15-25% too short (docs/measurements.md, TE sweep); "
            "the memory headroom does not cover that: confirm with a real trial"
        )
    heavy = layout.recompute_granularity is RecomputeGranularity.full or "moe" in layout.recompute_modules
    if heavy:
        out.append(
            "recompute: on 1 x H200 the measured extra time of full and selective 'moe' recompute was 1.5-1.7x the "
            "predicted extra time (docs/measurements.md, TE sweep): such layouts are predicted a little too fast"
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
