"""The analytical model: memory and step time of a layout, FLOPs, MFU, $/token, calibration and validation.

Builds on :mod:`specs` (model, GPU, cluster, workload, layout) and :mod:`search_spaces` (Megatron's rules and pipeline
stage splits). Must not import Optuna, Ray, torch or megatron (shared/design/ARCHITECTURE.md)."""

from __future__ import annotations

from cost_model.calibration import DEFAULT_CALIBRATION, Calibration, load_calibration
from cost_model.estimate import EstimateTable, estimate, estimate_table
from cost_model.flops import megatron_flops_per_token, mfu, usd_per_million_tokens
from cost_model.types import Estimate

__all__ = [
    "Calibration", "DEFAULT_CALIBRATION", "Estimate", "EstimateTable", "estimate", "estimate_table", "load_calibration",
    "megatron_flops_per_token", "mfu", "usd_per_million_tokens"]
