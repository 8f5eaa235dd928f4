"""Stopping a trial early when it is clearly slower than the best trial so far (no torch here).

Optuna's ``trial.report`` / ``should_prune`` raise ``NotImplementedError`` for
multi-objective studies (this tuner maximises tokens/s/GPU and minimises memory), so
the tuner prunes with this small rule instead, called after every step a trial
reports:

after ``min_steps`` measured steps (warm-up steps not counted), stop the trial if its
running median throughput is below ``best / (1 + margin)``, where ``best`` is the
highest median tokens/s/GPU of the trials measured so far in the study. With the
default margin of 0.25 a trial is stopped only when it is more than 25% slower than
the best, far beyond the few-percent step-time noise of a healthy run.

A pruned trial is not a failure: it did run, and its measured steps are kept.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = ["StepTimePruner"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTimePruner:
    """The pruning rule; pure (no state), so it can be tested and reused."""

    warmup_steps: int = 2
    """Leading steps that are never judged (allocator and NCCL warm-up)."""
    min_steps: int = 2
    """Measured steps after warm-up before a trial can be stopped."""
    margin: float = 0.25
    """A trial is stopped when best / its median throughput exceeds 1 + margin."""

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.min_steps < 1 or not self.margin >= 0:
            raise ValueError(f"pruner needs warmup_steps >= 0, min_steps >= 1, margin >= 0; got {self.warmup_steps}, {self.min_steps}, {self.margin}")

    def decide(self, tokens_per_s_per_gpu: list[float], best_tokens_per_s_per_gpu: float | None) -> str | None:
        """The reason to stop the trial now, or None to let it run on.

        Args:
            tokens_per_s_per_gpu: the trial's throughput per finished step so far, warm-up included.
            best_tokens_per_s_per_gpu: the best median throughput measured in the study so
                far; None or NaN when nothing was measured yet (then nothing is pruned).
        """
        if best_tokens_per_s_per_gpu is None or not math.isfinite(best_tokens_per_s_per_gpu) or best_tokens_per_s_per_gpu <= 0:
            return None
        measured = tokens_per_s_per_gpu[self.warmup_steps:]
        if len(measured) < self.min_steps:
            return None
        med = statistics.median(measured)
        if med * (1.0 + self.margin) < best_tokens_per_s_per_gpu:
            return (
                f"pruned after {len(tokens_per_s_per_gpu)} steps: median {med:,.1f} tokens/s/GPU over {len(measured)} "
                f"measured steps is {best_tokens_per_s_per_gpu / med - 1:.0%} below the best so far "
                f"({best_tokens_per_s_per_gpu:,.1f}); margin {self.margin:.0%}"
            )
        return None
