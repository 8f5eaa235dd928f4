"""Pareto front of throughput (maximise) against peak memory (minimise)."""

from __future__ import annotations

import numpy as np

__all__ = ["pareto_mask"]


def pareto_mask(throughput: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Shape (n,) bool mask of the points no other point dominates (throughput >= and memory <= with one strict;
    of exact ties the first is kept). ``throughput`` (tokens/s/GPU) and ``memory`` (bytes): shape (n,)."""
    n = len(throughput)
    if n == 0:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((memory, -throughput))  # by throughput desc, then memory asc
    mem = memory[order]
    best_before = np.concatenate(([np.inf], np.fmin.accumulate(mem)[:-1]))  # the least memory of those ahead
    keep = np.zeros(n, dtype=bool)
    keep[order] = mem < best_before
    return keep
