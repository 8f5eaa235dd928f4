"""Stopping a trial early when it is clearly slower than the best so far (no torch here).

Optuna's ``should_prune`` raises ``NotImplementedError`` for multi-objective studies, so after ``min_steps`` measured
steps a trial stops when its running median throughput is below ``best / (1 + margin)`` (0.25: far beyond a healthy
run's step-time noise). A pruned trial is not a failure: its steps are kept."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = ["StepTimePruner"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimePruner:
    """The pruning rule; pure (no state), so it can be tested and reused."""

    warmup_steps: int = 2  # leading steps that are never judged (allocator and NCCL warm-up)
    min_steps: int = 2  # measured steps after warm-up before a trial can be stopped
    margin: float = 0.25  # A trial is stopped when best / its median throughput exceeds 1 + margin

    def decide(self, tokens_per_s_per_gpu: list[float], best_tokens_per_s_per_gpu: float | None) -> str | None:
        """The reason to stop the trial now, or None; ``best_tokens_per_s_per_gpu`` None or NaN prunes nothing."""
        best = best_tokens_per_s_per_gpu
        if best is None or not math.isfinite(best) or best <= 0:
            return None
        measured = tokens_per_s_per_gpu[self.warmup_steps:]
        if len(measured) < self.min_steps:
            return None
        med = statistics.median(measured)
        if med * (1.0 + self.margin) < best:
            return (
                f"pruned after {len(tokens_per_s_per_gpu)} steps: median {med:,.1f} tokens/s/GPU over {len(measured)} "
                f"measured steps is {best / med - 1:.0%} below the best so far "
                f"({best:,.1f}); margin {self.margin:.0%}"
            )
        return None
