"""Pareto front of throughput (maximise) against peak memory (minimise)."""

from __future__ import annotations

import numpy as np

__all__ = ["pareto_mask"]


def pareto_mask(throughput: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated points.

    A point is dominated when another has throughput >= and memory <= with at
    least one strict. Ties in both keep the first occurrence only.

    Args:
        throughput: shape (n,), higher is better (tokens/s/GPU).
        memory: shape (n,), lower is better (bytes).

    Returns:
        Shape (n,) bool.
    """
    n = len(throughput)
    if n == 0:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((memory, -throughput))  # by throughput desc, then memory asc
    keep = np.zeros(n, dtype=bool)
    best_mem = np.inf
    for i in order:
        if memory[i] < best_mem:
            keep[i] = True
            best_mem = memory[i]
    return keep
