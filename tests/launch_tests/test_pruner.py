"""Pruning decisions of the step-time pruner."""

from __future__ import annotations

import math

from launch.harness.pruner import StepTimePruner


def test_never_prunes_without_a_best_or_before_enough_steps():
    p = StepTimePruner(warmup_steps=2, min_steps=2, margin=0.25)
    assert p.decide([1.0] * 10, None) is None
    assert p.decide([1.0] * 10, math.nan) is None
    assert p.decide([1.0, 1.0, 1.0], 100.0) is None  # only one measured step after warm-up


def test_prunes_clearly_slower_trials_only():
    p = StepTimePruner(warmup_steps=2, min_steps=2, margin=0.25)
    slow = [10.0, 50.0, 70.0, 72.0]  # warm-up steps are not judged
    assert p.decide(slow, 100.0) is not None
    assert "below the best so far" in p.decide(slow, 100.0)
    assert p.decide([10.0, 50.0, 81.0, 79.0], 100.0) is None  # 20% slower: within the margin
    assert p.decide([10.0, 50.0, 120.0, 130.0], 100.0) is None  # faster


def test_median_resists_one_slow_step():
    p = StepTimePruner(warmup_steps=0, min_steps=3, margin=0.1)
    assert p.decide([100.0, 20.0, 100.0], 100.0) is None
