"""Where the estimate is known to be off, from measurements: notes to print beside a prediction.

Each note names the measurement (``docs/measurements.md``, "The Transformer Engine sweep (issue 14)", 1 x H200,
Transformer Engine 2.20.2, megatron-core 0.19.2, 2026-12-01; rows in ``benchmarks/results/h200_te_2026-12-01/``).
They are not corrections: the measured slices are small (1-4 layers on one GPU), so the gaps are reported, not fitted.
"""

from __future__ import annotations

from specs import Layout, RecomputeGranularity

__all__ = ["known_gaps"]


def known_gaps(layout: Layout) -> list[str]:
    """Measured gaps of the estimate that apply to ``layout``, one line each (empty when none apply).

    - CPU optimizer offload: the reserved peak was 13-20% above the prediction (offload 0.5: 81.7 GiB reserved
      against 65.4 predicted; 1.0: 49.2 against 42.6), beyond the default 7% headroom; step time 15-25% above it;
      host memory (RSS) 24-26% above the predicted host memory (58.9 GiB against 43.4; 111.5 against 84.5).
    - recompute (full, or selective ``moe``): the extra time was 1.5-1.7x the predicted extra time (MiniMax-M2
      1-layer slice: full +0.32 s measured against +0.21 s, selective ``moe`` +0.32 s against +0.19 s).
    """
    out: list[str] = []
    if layout.optimizer_offload_fraction > 0:
        out.append(
            "CPU optimizer offload: on 1 x H200 the reserved peak was 13-20% above the predicted peak, the host memory 24-26% "
            "above its prediction and the step 15-25% slower (docs/measurements.md, TE sweep); the memory headroom does not "
            "cover that: confirm with a real trial"
        )
    heavy = layout.recompute_granularity is RecomputeGranularity.full or "moe" in layout.recompute_modules
    if heavy:
        out.append(
            "recompute: on 1 x H200 the measured extra time of full and selective 'moe' recompute was 1.5-1.7x the "
            "predicted extra time (docs/measurements.md, TE sweep): such layouts are predicted a little too fast"
        )
    return out
