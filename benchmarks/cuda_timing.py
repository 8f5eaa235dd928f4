"""CUDA-event timing shared by the device benchmarks (``h200_ce.py``, ``h200_grouped_gemm.py``). Imports only torch,
and only when called, so it runs on the device image without the project's dependencies."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def cuda_median_seconds(fn: Callable[[], object], reps: int, warm: int) -> float:
    """Median GPU time of ``fn()`` in seconds: ``warm`` untimed calls, then ``reps`` calls, each between two CUDA events
    on the current stream and synchronised before the next (so a call's host launch time counts when the GPU waits
    for it)."""
    import torch

    ts = []
    for k in range(warm + reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if k >= warm:
            ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)
