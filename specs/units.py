"""Units and element sizes used by every package (SI inside the code; GiB only when printing).

Sources: IEC 80000-13 (GiB = 2**30 bytes); IEEE 754 / bfloat16 element sizes."""

from __future__ import annotations

#: Bytes in one gibibyte (what ``nvidia-smi`` and PyTorch's memory stats call GiB / "GB").
GIB = 2**30
#: Bytes in one mebibyte.
MIB = 2**20
#: Bytes per element of bf16 / fp16.
BF16_BYTES = 2.0
#: Bytes per element of fp32.
FP32_BYTES = 4.0
#: Bytes per element of fp8 (E4M3 / E5M2).
FP8_BYTES = 1.0

DEFAULT_MEMORY_HEADROOM = 0.07
"""Fraction of HBM kept free by default (``--memory-headroom``): the largest under-prediction of the reserved
peak measured on H200, 6.0% (the no-TE harness, 15 rows, with its own calibration; 1.9% with TE over 5
layouts), plus one point. Source: ``benchmarks/results/2026-12-01_validation``, "Memory headroom"."""
