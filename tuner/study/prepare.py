"""Preparation: load the inputs, enumerate the space, check Megatron's rules, estimate every valid layout
and keep those predicted to fit (the candidates a study evaluates), with the predicted Pareto front."""

from __future__ import annotations

import dataclasses
import math
import shlex
import time
from dataclasses import dataclass

import numpy as np

from cost_model.calibration import Calibration, load_calibration
from cost_model.estimate import EstimateTable, estimate_table
from launch.harness.spec import slice_model
from search_spaces.rules import RuleEnv
from search_spaces.space import Enumeration, SearchSpace, enumerate_layouts
from specs import DEFAULT_RUN_OPTIONS, Cluster, ModelSpec, RunOptions, Workload, load_model, parse_gpus
from specs.errors import TunerError
from specs.hardware import network_bytes_per_s
from specs.layout import Dispatcher
from tuner.pareto import pareto_mask
from tuner.study.config import STACKS, TuneConfig, _validate_config, harness_without_te, run_options_for_backend

__all__ = ["Prepared", "prepare"]


@dataclass(slots=True)
class Prepared:
    """The pruned candidate set, before any trial."""

    config: TuneConfig
    model: ModelSpec
    cluster: Cluster
    workload: Workload
    space: SearchSpace
    calibration: Calibration
    enumeration: Enumeration
    estimates: EstimateTable
    """Estimates of every valid layout (rows of ``enumeration.valid``)."""
    fits: np.ndarray
    front: np.ndarray
    """Indices (into the valid table) of the predicted Pareto front among fitting layouts."""
    enumerate_seconds: float
    estimate_seconds: float
    options: RunOptions = DEFAULT_RUN_OPTIONS
    """The run options the estimates assumed (the backend's stack, the megatron-core release)."""
    n_over_host: int = 0
    """Layouts that fit in GPU memory but are predicted over ``--host-memory-gib`` per node (refused)."""

    @property
    def n_valid(self) -> int:
        """Layouts that break no rule."""
        return len(self.enumeration.valid)

    @property
    def n_fit(self) -> int:
        """Valid layouts predicted to fit in memory: the candidates."""
        return int(self.fits.sum())


def prepare(config: TuneConfig) -> Prepared:
    """Load inputs, enumerate, check rules and estimate every valid layout.

    Raises:
        TunerError: bad input (model, GPUs, space, calibration), or no layout of
            the space fits in memory (the message names the fewest GPUs that would).
    """
    _validate_config(config)
    model = slice_model(load_model(config.model, allow_config_args=config.allow_config_args), config.layers)
    if model.num_experts and not model.num_moe_layers:
        first_moe = next((i for i, f in enumerate(load_model(config.model).moe_layer_freq) if f), 0) + 1
        if config.layers is None:
            raise TunerError(
                f"model {model.name!r} declares {model.num_experts} experts but none of its {model.num_layers} layers is an MoE layer "
                "(first_k_dense_replace / moe_layer_freq cover them all); fix its config"
            )
        raise TunerError(
            f"--layers {config.layers}: the first {config.layers} layers of {load_model(config.model).name} are all dense, so the "
            f"slice has no MoE layer to tune; use --layers {first_moe} or more"
        )
    cluster = parse_gpus(
        config.gpus,
        gpus_per_node=config.gpus_per_node,
        inter_node_bytes_per_s=network_bytes_per_s(config.network_gbps) if config.network_gbps is not None else None,
        usd_per_gpu_hour=config.usd_per_gpu_hour,
        network=config.network,
        host_memory_gib=config.host_memory_gib,
        require_network=True,
    )
    workload = Workload(seq_length=config.seq_length, global_batch_size=config.global_batch_size, precision=config.precision)
    if workload.precision.value == "fp8" and not cluster.gpu.peak_flops_fp8:
        raise TunerError(f"--precision fp8: {cluster.gpu.name} has no fp8 tensor cores; use --precision bf16")
    space = SearchSpace.load(config.space)
    if config.stack not in STACKS:
        raise TunerError(f"--stack {config.stack!r}: accepted {', '.join(STACKS)}")
    stack_notes: list[str] = []
    if config.allow_config_args and model.extra_megatron_args:
        stack_notes.append(f"--allow-config-args: the model's config adds to every trial and export: {shlex.join(model.extra_megatron_args)}")
    if config.stack == "slime" and Dispatcher.allgather in space.dispatcher:
        kept = tuple(d for d in space.dispatcher if d != Dispatcher.allgather)
        if not kept:
            raise TunerError("--stack slime: the search space allows only the allgather dispatcher, which slime rewrites to alltoall; add alltoall or use --stack megatron")
        space = space.replace(dispatcher=kept)
        stack_notes.append("--stack slime: the allgather dispatcher is left out (slime rewrites it to alltoall); use --stack megatron to include it")
    if harness_without_te(config.backend) and True in space.use_precision_aware_optimizer:
        # The harness turns the precision-aware optimizer off without TE (launch/harness/train.py): predict,
        # measure and export the layout as it runs (fp32 master weights, not TE's 2-byte remainders).
        space = space.replace(use_precision_aware_optimizer=(False,))
        stack_notes.append("real trials without Transformer Engine: the precision-aware optimizer is off (it needs TE's FusedAdam), "
                           "so the layouts are predicted and measured with fp32 master weights")
    cal = load_calibration(config.calibration)
    opts = run_options_for_backend(config.backend, config.megatron_core)
    env = RuleEnv.of(cluster, opts)
    t0 = time.perf_counter()
    en = enumerate_layouts(space, model, cluster.num_gpus, workload, env)
    en.notes.extend(stack_notes)
    t1 = time.perf_counter()
    est = estimate_table(model, cluster, workload, en.valid, calibration=cal, memory_headroom=config.memory_headroom, options=opts)
    t2 = time.perf_counter()
    gpu_fits = est.fits
    if not gpu_fits.any():
        raise TunerError(_no_fit_message(config, model, cluster, workload, space, cal, en, est))
    host_fits = est.host_fits
    fits = gpu_fits & host_fits
    if not fits.any():
        need = float(est.host_bytes_per_node[gpu_fits].min()) / 2**30
        raise TunerError(
            f"--host-memory-gib {cluster.host_memory_bytes_per_node / 2**30:,.3g}: every layout that fits in GPU memory needs more "
            f"host memory per node (the least: {need:,.1f} GiB predicted, the training processes and CPU optimizer offload); "
            f"give at least {math.ceil(need):,} GiB, or leave offload out of the space (--space)"
        )
    idx = np.flatnonzero(fits)
    front_local = pareto_mask(est.tokens_per_s_per_gpu[idx], est.peak_bytes[idx])
    front = idx[front_local]
    front = front[np.argsort(-est.tokens_per_s_per_gpu[front])]
    prep = Prepared(
        config=config,
        model=model,
        cluster=cluster,
        workload=workload,
        space=space,
        calibration=cal,
        enumeration=en,
        estimates=est,
        fits=fits,
        front=front,
        enumerate_seconds=t1 - t0,
        estimate_seconds=t2 - t1,
        options=opts,
        n_over_host=int(np.count_nonzero(gpu_fits & ~host_fits)),
    )
    return prep


def _no_fit_message(
    config: TuneConfig,
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    space: SearchSpace,
    cal: Calibration,
    en: Enumeration,
    est: EstimateTable,
) -> str:
    if len(en.valid) == 0:
        worst = ", ".join(f"{k} ({v})" for k, v in sorted(en.rule_counts.items(), key=lambda kv: -kv[1])[:3] if v)
        return (
            f"no layout of the search space is valid for {model.name} on {cluster.num_gpus} GPUs "
            f"(seq {workload.seq_length}, global batch {workload.global_batch_size}); most common rules broken: {worst}. "
            "Change --global-batch / --gpus or widen the space (--space)."
        )
    best = float(est.peak_bytes.min()) / 2**30
    msg = (
        f"{model.name} fits on no layout of the search space on {cluster.label}: the smallest predicted peak is "
        f"{best:.1f} GiB per GPU against {est.usable_bytes / 2**30:.1f} GiB usable "
        f"({cluster.gpu.hbm_bytes / 2**30:.1f} GiB less {config.memory_headroom:.0%} headroom)."
    )
    per = cluster.gpus_per_node
    node_counts = sorted({k * 2**e for k in (1, 3) for e in range(0, 14)})
    sizes = [n for n in (k * per for k in node_counts) if cluster.num_gpus < n <= 16384]
    if cluster.num_gpus < per:
        sizes = [n for n in (2, 4, 8) if cluster.num_gpus < n < per] + sizes
    for n in sizes:
        try:
            c2 = dataclasses.replace(cluster, num_gpus=n, gpus_per_node=min(max(cluster.gpus_per_node, min(n, cluster.gpu.gpus_per_node)), n))
            en2 = enumerate_layouts(space, model, n, workload, RuleEnv.of(c2, run_options_for_backend(config.backend, config.megatron_core)))
            if len(en2.valid) == 0:
                continue
            e2 = estimate_table(model, c2, workload, en2.valid, calibration=cal, memory_headroom=config.memory_headroom,
                                options=run_options_for_backend(config.backend))
        except TunerError:
            continue
        if e2.fits.any():
            return msg + f" The fewest GPUs on which a layout of this space fits: {n} ({c2.label}). Try --gpus {n}x{cluster.gpu.name}."
    return msg + " No cluster up to 16,384 GPUs of this kind fits it with this space; widen the space (offload, recompute)."
