"""The bottom layer: shared types, units and errors of every package.

Model, GPU, cluster and workload descriptions (:class:`ModelSpec`, :class:`GPUSpec`, :class:`Cluster`,
:class:`Workload`, :class:`RunOptions`), the parallel layout (:class:`Layout`, :class:`LayoutTable` and its enums), the
one user-error type (:class:`TunerError`), the units and the consoles the command lines print through
(:mod:`specs.console`). It imports nothing else of this project; every other package may import it
(``tests/test_package_order.py`` checks the order ``specs`` < ``search_spaces`` < ``cost_model`` < ``launch`` < ``rl`` <
``tuner``)."""

from __future__ import annotations

from specs.errors import InfeasibleLayout, TunerError
from specs.hardware import (
    DEFAULT_INTER_NODE_BYTES_PER_S,
    DEFAULT_USD_PER_GPU_HOUR,
    Cluster,
    GPUSpec,
    list_gpus,
    load_gpu,
    parse_gpus,
)
from specs.layout import RECOMPUTE_MODULES, Dispatcher, Layout, LayoutTable, RecomputeGranularity, RecomputeMethod
from specs.model import ModelSpec, list_models, load_model, model_from_hf_config
from specs.network import DispatcherOnFabric, Network, list_networks, load_network
from specs.precision import Precision
from specs.units import BF16_BYTES, DEFAULT_MEMORY_HEADROOM, FP8_BYTES, FP32_BYTES, GIB, MIB
from specs.versions import KNOWN_MEGATRON_CORE, NEWEST_MEGATRON_CORE, megatron_core_version
from specs.workload import (
    CUDA_GRAPH_MOE_SCOPES,
    DEFAULT_RUN_OPTIONS,
    HARNESS_RUN_OPTIONS,
    HARNESS_TE_RUN_OPTIONS,
    RunOptions,
    Workload,
)

__all__ = [
    "BF16_BYTES", "DEFAULT_MEMORY_HEADROOM", "CUDA_GRAPH_MOE_SCOPES", "Cluster", "DEFAULT_INTER_NODE_BYTES_PER_S",
    "DEFAULT_RUN_OPTIONS", "DEFAULT_USD_PER_GPU_HOUR", "Dispatcher", "DispatcherOnFabric", "FP32_BYTES", "FP8_BYTES",
    "GIB", "GPUSpec", "HARNESS_RUN_OPTIONS", "HARNESS_TE_RUN_OPTIONS", "KNOWN_MEGATRON_CORE", "NEWEST_MEGATRON_CORE",
    "InfeasibleLayout", "Layout", "LayoutTable", "MIB", "ModelSpec", "Network", "Precision", "RECOMPUTE_MODULES",
    "RecomputeGranularity", "RecomputeMethod", "RunOptions", "TunerError", "Workload", "list_gpus", "list_models",
    "list_networks", "load_gpu", "load_model", "load_network", "megatron_core_version", "model_from_hf_config",
    "parse_gpus"]
