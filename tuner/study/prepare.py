"""Preparation: load the inputs, enumerate the space, check Megatron's rules, estimate every valid layout
and keep those predicted to fit (the candidates a study evaluates), with the predicted Pareto front."""

from __future__ import annotations

import dataclasses
import math
import shlex
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_model.calibration import Calibration, load_calibration
from cost_model.estimate import EstimateTable, estimate_table
from cost_model.uncertainty import ErrorBars, error_bars
from search_spaces.rules import RuleEnv, check_layout
from search_spaces.space import Enumeration, SearchSpace, enumerate_layouts
from specs import (
    DEFAULT_RUN_OPTIONS,
    Cluster,
    Layout,
    LayoutTable,
    ModelSpec,
    Precision,
    RunOptions,
    Workload,
    load_model,
    parse_gpus,
)
from specs.errors import TunerError, enum_member
from specs.hardware import network_bytes_per_s
from specs.layout import Dispatcher
from specs.model import slice_model
from tuner.pareto import pareto_mask
from tuner.study.config import TuneConfig, _validate_config, harness_without_te, study_run_options

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
    """The candidates: valid layouts not surely over the GPU's memory (or ``--memory-headroom``'s) nor the host's."""
    front: np.ndarray
    """Indices (into the valid table) of the predicted Pareto front among fitting layouts."""
    enumerate_seconds: float
    estimate_seconds: float
    options: RunOptions = DEFAULT_RUN_OPTIONS
    """The run options the estimates assumed."""
    stack: Any = None
    """The :class:`specs.stacks.StackRun` of the run (the preset, the flags over it)."""
    baseline_row: int | None = None
    """Row of the valid table that is ``config.job.baseline``, if any."""
    n_over_host: int = 0
    """Layouts that fit in GPU memory but are predicted over ``--host-memory-gib`` per node (refused)."""
    bars: ErrorBars | None = None
    """The error bars of this job's predictions (:func:`cost_model.uncertainty.error_bars`)."""
    headroom: float = 0.0
    """Fraction of HBM a layout must leave free to surely fit: ``--memory-headroom``, else the error bars'."""

    @property
    def surely_fits(self) -> np.ndarray:
        """Candidates that fit even at the high end of their memory interval (the rest "may not fit")."""
        return self.fits & self.estimates.fits

    @property
    def contenders(self) -> np.ndarray:
        """Candidates whose optimistic throughput reaches the pessimistic one of the fastest that surely fits."""
        sure = self.surely_fits
        if self.bars is None or not sure.any():
            return self.fits
        tps = self.estimates.tokens_per_s_per_gpu
        floor = float(tps[sure].max()) * self.bars.throughput.low
        return self.fits & (tps * self.bars.throughput.high >= floor)

    @property
    def n_valid(self) -> int:
        """Layouts that break no rule."""
        return len(self.enumeration.valid)

    @property
    def n_fit(self) -> int:
        """Valid layouts predicted to fit in memory: the candidates."""
        return int(self.fits.sum())


def prepare(config: TuneConfig) -> Prepared:
    """Load inputs, enumerate, check rules and estimate every valid layout."""
    _validate_config(config)
    model = _model(config)
    c, w, search, baseline = config.cluster, config.workload, config.search, config.job.baseline
    gbps = network_bytes_per_s(c.network_gbps) if c.network_gbps is not None else None
    cluster = parse_gpus(config.job.gpus, gpus_per_node=c.gpus_per_node, inter_node_bytes_per_s=gbps,
                         usd_per_gpu_hour=c.usd_per_gpu_hour, network=c.network, host_memory_gib=c.host_memory_gib,
                         require_network=True)
    workload = Workload(seq_length=w.seq_length, global_batch_size=w.global_batch_size,
                        precision=enum_member(Precision, w.precision, "--precision"), task=w.task,
                        lora_rank=w.lora_rank, lora_target_modules=tuple(w.lora_target_modules)).on_model(model.is_mla)
    if workload.precision.value == "fp8" and not cluster.gpu.peak_flops_fp8:
        raise TunerError(f"--precision fp8: {cluster.gpu.name} has no fp8 tensor cores; use --precision bf16")
    space = SearchSpace.load(search.space)
    stack = study_run_options(config)
    space, stack_notes = _stack_space(config, model, space, stack)
    cal = load_calibration(search.calibration)
    opts = stack.options
    env = RuleEnv.of(cluster, opts)
    t0 = time.perf_counter()
    en = enumerate_layouts(space, model, cluster.num_gpus, workload, env)
    en.notes.extend(stack_notes)
    if baseline is not None:
        en = _with_baseline(en, baseline, model, workload, env)
    t1 = time.perf_counter()
    bars = error_bars(model, cluster.gpu, workload.precision)
    headroom = bars.headroom if search.memory_headroom is None else search.memory_headroom
    est = estimate_table(model, cluster, workload, en.valid, calibration=cal, memory_headroom=headroom, options=opts)
    t2 = time.perf_counter()
    # a fixed --memory-headroom is the whole rule; else only what does not fit even at its optimistic memory is out
    gpu_fits = (est.fits if search.memory_headroom is not None
                else ~bars.surely_over(est.peak_bytes, cluster.gpu.hbm_bytes))
    if not gpu_fits.any():
        raise TunerError(_no_fit_message(config, model, cluster, workload, space, cal, en, est, headroom))
    host_fits = est.host_fits
    fits = gpu_fits & host_fits
    if not fits.any():
        need = float(est.host_bytes_per_node[gpu_fits].min()) / 2**30
        raise TunerError(
            f"--host-memory-gib {cluster.host_memory_bytes_per_node / 2**30:,.3g}: every layout that fits in GPU "
            f"memory needs more host memory per node (the least: {need:,.1f} GiB predicted, the training processes and "
            f"CPU optimizer offload); give at least {math.ceil(need):,} GiB, or leave offload out of the space "
            "(--space)"
        )
    idx = np.flatnonzero(fits)
    front_local = pareto_mask(est.tokens_per_s_per_gpu[idx], est.peak_bytes[idx])
    front = idx[front_local]
    front = front[np.argsort(-est.tokens_per_s_per_gpu[front])]
    en.notes.extend(global_batch_notes(workload.global_batch_size, cluster.num_gpus, int(en.valid.dp[front[0]]),
                                       int(en.valid["micro_batch_size"][front[0]])))
    return Prepared(config=config, model=model, cluster=cluster, workload=workload, space=space, calibration=cal,
                    enumeration=en, estimates=est, fits=fits, front=front, enumerate_seconds=t1 - t0,
                    estimate_seconds=t2 - t1, options=opts, stack=stack, baseline_row=_baseline_row(en.valid, baseline),
                    n_over_host=int(np.count_nonzero(gpu_fits & ~host_fits)), bars=bars, headroom=headroom)


def _model(config: TuneConfig) -> ModelSpec:
    """The model of ``config``, sliced to ``--layers`` (TunerError: an MoE model or slice without an MoE layer)."""
    job = config.job
    model = slice_model(load_model(job.model, allow_config_args=job.allow_config_args), job.layers)
    if model.num_experts and not model.num_moe_layers:
        first_moe = next((i for i, f in enumerate(load_model(job.model).moe_layer_freq) if f), 0) + 1
        if job.layers is None:
            raise TunerError(
                f"model {model.name!r} declares {model.num_experts} experts but none of its {model.num_layers} layers "
                "is an MoE layer (first_k_dense_replace / moe_layer_freq cover them all); fix its config"
            )
        raise TunerError(
            f"--layers {job.layers}: the first {job.layers} layers of {load_model(job.model).name} are all "
            f"dense, so the slice has no MoE layer to tune; use --layers {first_moe} or more"
        )
    return model


def _stack_space(config: TuneConfig, model: ModelSpec, space: SearchSpace, stack: Any) -> tuple[SearchSpace, list[str]]:
    """The space as the stack and the harness can run it, and the notes that say so."""
    stack_notes: list[str] = []
    if config.job.allow_config_args and model.extra_megatron_args:
        stack_notes.append("--allow-config-args: the model's config adds to every trial and export: "
                           f"{shlex.join(model.extra_megatron_args)}")
    if stack.preset.drops_allgather and Dispatcher.allgather in space.dispatcher:
        kept = tuple(d for d in space.dispatcher if d != Dispatcher.allgather)
        if not kept:
            raise TunerError("--stack slime: the search space allows only the allgather dispatcher, which slime "
                             "rewrites to alltoall; add alltoall or use --stack megatron-lm")
        space = space.replace(dispatcher=kept)
        stack_notes.append("--stack slime: the allgather dispatcher is left out (slime rewrites it to alltoall); use "
                           "--stack megatron-lm to include it")
    if harness_without_te(config.search.backend) and True in space.use_precision_aware_optimizer:
        # The harness turns the precision-aware optimizer off without TE (launch/harness/build.py): predict,
        # measure and export the layout as it runs (fp32 master weights, not TE's 2-byte remainders).
        space = space.replace(use_precision_aware_optimizer=(False,))
        stack_notes.append("real trials without Transformer Engine: the precision-aware optimizer is off (it needs "
                           "TE's FusedAdam), so the layouts are predicted and measured with fp32 master weights")
    return space, stack_notes


def global_batch_notes(global_batch_size: int, num_gpus: int, dp: int, micro_batch_size: int) -> list[str]:
    """Notes on ``--global-batch``: fewer rows than GPUs, or one micro-batch per DP rank."""
    notes = []
    if global_batch_size < num_gpus:
        notes.append(
            f"--global-batch {global_batch_size:,} is fewer rows than GPUs ({num_gpus:,}): the batch caps data "
            f"parallelism at {global_batch_size:,}, so each model replica spans at least "
            f"{math.ceil(num_gpus / global_batch_size):,} GPUs; check the batch you will train with"
        )
    if global_batch_size // (dp * micro_batch_size) <= 1:
        notes.append(
            f"the predicted fastest layout runs one micro-batch per step on each of its {dp:,} data-parallel ranks "
            f"(--global-batch {global_batch_size:,} / DP {dp:,} / micro-batch {micro_batch_size}): its pipeline cannot "
            "fill and no gradient reduction overlaps the backward; a larger --global-batch gives each rank more "
            "micro-batches"
        )
    return notes


def _with_baseline(en: Enumeration, baseline: dict[str, Any], model: ModelSpec, workload: Workload,
                   env: RuleEnv) -> Enumeration:
    """``en`` with the user's launch layout (``tune --from``) added to its valid layouts if missing and valid."""
    if _baseline_row(en.valid, baseline) is not None:
        return en
    lay = Layout.from_dict(baseline)
    if check_layout(lay, model, workload, env):
        return en  # it breaks a rule: the launch block says which
    valid = en.valid.append(LayoutTable.from_layouts([lay]))
    notes = [*en.notes, f"your launch's layout ({lay.label}) is outside the search space: added as a candidate"]
    return dataclasses.replace(en, valid=valid, considered=en.considered + 1, notes=notes)


def _baseline_row(valid: Any, baseline: dict[str, Any] | None) -> int | None:
    """The row of ``valid`` equal to the layout ``baseline`` (its ``to_dict``), or None."""
    if baseline is None or len(valid) == 0:
        return None
    want = Layout.from_dict(baseline).key()
    cols = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size")
    mask = np.ones(len(valid), dtype=bool)
    for c in cols:
        mask &= np.asarray(valid[c]) == baseline[c]
    for i in np.flatnonzero(mask):
        if valid.row(int(i)).key() == want:
            return int(i)
    return None


def _no_fit_message(config: TuneConfig, model: ModelSpec, cluster: Cluster, workload: Workload, space: SearchSpace,
                    cal: Calibration, en: Enumeration, est: EstimateTable, headroom: float) -> str:
    if len(en.valid) == 0:
        worst = ", ".join(f"{k} ({v})" for k, v in sorted(en.rule_counts.items(), key=lambda kv: -kv[1])[:3] if v)
        return (
            f"no layout of the search space is valid for {model.name} on {cluster.num_gpus} GPUs "
            f"(seq {workload.seq_length}, global batch {workload.global_batch_size}); most common rules broken: "
            f"{worst}. Change --global-batch / --gpus or widen the space (--space)."
        )
    best = float(est.peak_bytes.min()) / 2**30
    msg = (
        f"{model.name} fits on no layout of the search space on {cluster.label}: the smallest predicted peak is "
        f"{best:.1f} GiB per GPU against {est.usable_bytes / 2**30:.1f} GiB usable "
        f"({cluster.gpu.hbm_bytes / 2**30:.1f} GiB less {headroom:.0%} headroom)."
        if config.search.memory_headroom is not None else
        f"{model.name} fits on no layout of the search space on {cluster.label}: the smallest predicted peak is "
        f"{best:.1f} GiB per GPU, over the GPU's {cluster.gpu.hbm_bytes / 2**30:.1f} GiB even at the low end of its "
        "memory interval (docs/error_bars.md)."
    )
    per = cluster.gpus_per_node
    node_counts = sorted({k * 2**e for k in (1, 3) for e in range(0, 14)})
    sizes = [n for n in (k * per for k in node_counts) if cluster.num_gpus < n <= 16384]
    if cluster.num_gpus < per:
        sizes = [n for n in (2, 4, 8) if cluster.num_gpus < n < per] + sizes
    for n in sizes:
        try:
            c2 = dataclasses.replace(cluster, num_gpus=n, gpus_per_node=min(
                max(cluster.gpus_per_node, min(n, cluster.gpu.gpus_per_node)), n))
            en2 = enumerate_layouts(space, model, n, workload, RuleEnv.of(c2, study_run_options(config).options))
            if len(en2.valid) == 0:
                continue
            e2 = estimate_table(model, c2, workload, en2.valid, calibration=cal, memory_headroom=headroom,
                                options=study_run_options(config).options)
        except TunerError:
            continue
        if e2.fits.any():
            return msg + (f" The fewest GPUs on which a layout of this space fits: {n} ({c2.label}). "
                          f"Try --gpus {n}x{cluster.gpu.name}.")
    return msg + (" No cluster up to 16,384 GPUs of this kind fits it with this space; widen the space (offload, "
                  "recompute).")
