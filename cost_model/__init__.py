"""The analytical model: model / GPU / cluster / workload descriptions, memory and step time, FLOPs, MFU, $/token.

Must not import Optuna, Ray, torch or megatron (shared/design/ARCHITECTURE.md).
"""

from __future__ import annotations

from cost_model.errors import InfeasibleLayout, TunerError
from cost_model.specs import (
    Cluster,
    GPUSpec,
    ModelSpec,
    Precision,
    Workload,
    list_gpus,
    list_models,
    load_gpu,
    load_model,
    parse_gpus,
)
from cost_model.calibration import DEFAULT_CALIBRATION, Calibration, load_calibration
from cost_model.flops import megatron_flops_per_token, mfu, usd_per_million_tokens

_LAZY = {"Estimate": "cost_model.types", "EstimateTable": "cost_model.estimate", "estimate": "cost_model.estimate", "estimate_table": "cost_model.estimate"}


def __getattr__(name: str) -> object:
    # The estimate needs search_spaces.Layout, whose module needs cost_model.errors: load it on first use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cost_model' has no attribute {name!r}")


__all__ = [
    "Calibration",
    "Cluster",
    "DEFAULT_CALIBRATION",
    "Estimate",
    "EstimateTable",
    "GPUSpec",
    "InfeasibleLayout",
    "ModelSpec",
    "Precision",
    "TunerError",
    "Workload",
    "estimate",
    "estimate_table",
    "list_gpus",
    "list_models",
    "load_calibration",
    "load_gpu",
    "load_model",
    "megatron_flops_per_token",
    "mfu",
    "parse_gpus",
    "usd_per_million_tokens",
]
