"""The Optuna study over the pruned candidates, and what a tuning run produces.

Data flow (shared/design/ARCHITECTURE.md): enumerate the search space, check
Megatron's rules, estimate every valid layout with the analytical model, drop
those that do not fit, then let an Optuna study evaluate layouts through a
backend: the predicted Pareto front and the fastest predicted candidates are
enqueued first (``enqueue_trial``), the sampler explores the rest, and no layout
is evaluated twice (also across re-runs of the same study).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

from cost_model.calibration import Calibration, load_calibration
from cost_model.estimate import EstimateTable, estimate_table
from launch import BackendSettings, TrialBackend, TrialFailed, TrialStopped, get_backend
from launch.harness.pruner import StepTimePruner
from launch.harness.spec import slice_model
from search_spaces.rules import check_layout
from search_spaces.space import Enumeration, SearchSpace, enumerate_layouts
from specs import Cluster, ModelSpec, RunOptions, Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Dispatcher, Layout, LayoutTable, categories
from tuner.pareto import pareto_mask

__all__ = ["TuneConfig", "Prepared", "TuneResult", "CandidateIndex", "DIMENSIONS", "prepare", "run_study", "trial_rows"]

log = logging.getLogger(__name__)

#: Training stacks a recipe can target.
STACKS = ("slime", "megatron")

@dataclass(frozen=True, kw_only=True, slots=True)
class TuneConfig:
    """Everything a tuning run depends on; saved with the study (``config.yaml``)."""

    model: str
    gpus: str
    gpus_per_node: int | None = None
    network_gbps: float | None = None
    """Per-node network bandwidth in Gb/s (default: the seed's 3,200)."""
    usd_per_gpu_hour: float | None = None
    seq_length: int = 8192
    global_batch_size: int = 128
    precision: str = "bf16"
    space: str | None = None
    calibration: str | None = None
    memory_headroom: float = 0.10
    study: str | None = None
    storage: str | None = None
    trials: int | None = None
    """Trials to run (evaluated or skipped); None = 48."""
    backend: str = "model"
    stack: str = "slime"
    """Training stack the recipe targets: ``slime`` (drops the allgather dispatcher, which
    slime rewrites to alltoall) or ``megatron`` (Megatron-LM / Megatron-Bridge)."""
    seed: int = 0
    results_dir: str = "results"
    layers: int | None = None
    """Slice the model to its first N decoder layers at full width (``--layers``) for the
    estimate and the trials; None = the whole model."""
    trial_steps: int = 20
    """Optimizer steps per real trial, warm-up included."""
    trial_warmup_steps: int | None = None
    """Leading steps of a real trial left out of its median step time; None = half of
    ``trial_steps``. On 2 x H200 (MiniMax-M2 slice, no TE, 2026-11-29) a trial's step time fell by
    20-40% over its first ~10 steps before it settled
    (benchmarks/results/h200_x2_2026-11-29/step_times.jsonl), hence 10 of the default 20."""
    trial_timeout_s: float = 900.0
    """Wall-clock limit of one real trial, model build included (seconds)."""
    prune_margin: float | None = 0.25
    """Stop a real trial whose running median throughput is below best / (1 + margin); None = never prune."""
    command_template: str | None = None
    """The launch template of the ``command`` backend (``--command-template FILE``)."""
    ray_address: str | None = None
    """``--ray-address``: ``auto``, ``HOST:PORT`` or ``ray://...``; None starts a local Ray instance (``ray`` backend)."""
    parallel_trials: int = 1
    """Trials run at once by this worker (``ray`` backend: each its own placement group)."""
    trial_env: tuple[str, ...] = ()
    """``KEY=VALUE`` environment variables for every rank of a real trial (``ray`` backend)."""
    recalibrate_after: int = 4
    """Real trials: refit the cost model to the measurements after every this many measured trials and
    re-rank the candidates not yet run (0 = never; the queue is then fixed at the start)."""
    confirm_runs: int = 0
    """Real trials: after the search, measure the fastest measured layout and those within its trials' noise
    (:func:`tuner.report.measured_ties`; at most :data:`MAX_FINALISTS` layouts) this many more times each,
    interleaved; reports and recipes then use each layout's runs together (0 = no confirmation). A top-up:
    runs a layout already has from an earlier run (or another worker) count toward this number."""

    def study_name(self, model: ModelSpec, cluster: Cluster) -> str:
        if self.study:
            return self.study
        name = re.sub(r"\[\d+ layers?\]$", "", model.name)  # a --layers slice is named below
        base = Path(name).stem if name.endswith(".json") else name
        # a default name obeys the --study rule (_STUDY_NAME_RE), whatever a config.json path is called
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).lstrip("._-")[:64] or "model"
        sl = f"-L{self.layers}" if self.layers else ""
        return f"{base}{sl}-{cluster.label}-s{self.seq_length}-gbs{self.global_batch_size}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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

    @property
    def n_valid(self) -> int:
        return len(self.enumeration.valid)

    @property
    def n_fit(self) -> int:
        return int(self.fits.sum())


def harness_without_te(backend: str) -> bool:
    """The study's trials run the harness (``local`` / ``ray``) and Transformer Engine is not importable
    here. For ``ray`` this is read on the driver: run the driver in the nodes' Python environment."""
    from launch.harness.spec import HarnessEnv

    return backend in ("local", "ray") and not HarnessEnv.detect().transformer_engine


def run_options_for_backend(backend: str) -> RunOptions:
    """Run options the estimate assumes for a study's trials: the trial harness (``local`` and ``ray``
    backends) without Transformer Engine (not importable here) saves the attention output twice
    (:data:`specs.HARNESS_RUN_OPTIONS`); with TE, and for the ``model`` and ``command``
    backends, a production Megatron-core run with TE (:data:`specs.DEFAULT_RUN_OPTIONS`)."""
    from specs import DEFAULT_RUN_OPTIONS, HARNESS_RUN_OPTIONS

    return HARNESS_RUN_OPTIONS if harness_without_te(backend) else DEFAULT_RUN_OPTIONS


def _split_label(first: int, last: int) -> str:
    return "even" if not first and not last else f"{first}/{last}"


_STUDY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

#: Most trials one run accepts, and most layouts it enqueues.
MAX_TRIALS = 100_000
MAX_ENQUEUED = 256


def trial_warmup_steps(config: TuneConfig) -> int:
    """The warm-up steps of a real trial: ``config.trial_warmup_steps``, or half of ``trial_steps`` when None."""
    return config.trial_steps // 2 if config.trial_warmup_steps is None else config.trial_warmup_steps


def _validate_config(config: TuneConfig) -> None:
    if config.study is not None and not _STUDY_NAME_RE.match(config.study):
        raise TunerError(
            f"--study {config.study!r}: a study name is 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (it names the folder results/<study>/)"
        )
    if config.trials is not None and not 1 <= config.trials <= MAX_TRIALS:
        raise TunerError(f"--trials must be from 1 to {MAX_TRIALS:,}, got {config.trials}")
    if config.seed < 0 or config.seed >= 2**32:
        raise TunerError(f"--seed must be from 0 to 2**32 - 1, got {config.seed}")
    if config.layers is not None and (isinstance(config.layers, bool) or not isinstance(config.layers, int) or config.layers < 1):
        raise TunerError(f"--layers must be a positive integer (decoder layers of the slice), got {config.layers!r}")
    if config.prune_margin is not None and not (math.isfinite(config.prune_margin) and config.prune_margin >= 0):
        raise TunerError(f"--prune-margin must be a finite number >= 0 (negative: never prune), got {config.prune_margin}")
    if not 1 <= config.trial_steps <= 100_000:
        raise TunerError(f"--trial-steps must be from 1 to 100,000, got {config.trial_steps}")
    if not 0 <= trial_warmup_steps(config) < config.trial_steps:
        raise TunerError(
            f"--trial-warmup-steps must be from 0 to {config.trial_steps - 1} (fewer than --trial-steps {config.trial_steps}), got {config.trial_warmup_steps}"
        )
    if not (math.isfinite(config.trial_timeout_s) and config.trial_timeout_s > 0):
        raise TunerError(f"--trial-timeout must be a positive number of seconds, got {config.trial_timeout_s}")
    if config.command_template and config.backend != "command":
        raise TunerError(f"--command-template is for --backend command (this run uses --backend {config.backend})")
    if config.ray_address is not None and config.backend != "ray":
        raise TunerError(f"--ray-address is for --backend ray (this run uses --backend {config.backend})")
    if config.ray_address is not None:
        from launch.ray_backend import parse_ray_address

        parse_ray_address(config.ray_address)
    if isinstance(config.parallel_trials, bool) or not isinstance(config.parallel_trials, int) or not 1 <= config.parallel_trials <= 64:
        raise TunerError(f"--parallel-trials must be from 1 to 64, got {config.parallel_trials!r}")
    if config.parallel_trials > 1 and config.backend != "ray":
        raise TunerError(f"--parallel-trials > 1 needs --backend ray (the {config.backend} backend runs one trial at a time)")
    trial_env_dict(config.trial_env)
    if isinstance(config.confirm_runs, bool) or not isinstance(config.confirm_runs, int) or not 0 <= config.confirm_runs <= 20:
        raise TunerError(f"--confirm-runs must be from 0 (no confirmation) to 20 more runs per layout, got {config.confirm_runs!r}")
    if config.confirm_runs and config.backend == "model":
        raise TunerError("--confirm-runs re-measures real trials; --backend model measures nothing (use --backend local, ray or command)")
    if isinstance(config.recalibrate_after, bool) or not isinstance(config.recalibrate_after, int) or not 0 <= config.recalibrate_after <= 1000:
        raise TunerError(f"--recalibrate-after must be from 0 (never) to 1,000 measured trials, got {config.recalibrate_after!r}")
    if config.trial_env and config.backend != "ray":
        raise TunerError(f"--trial-env is for --backend ray (this run uses --backend {config.backend})")
    if config.storage is not None:
        _check_storage_syntax(config.storage)


def _mask(url: str) -> str:
    """A storage URL with its password hidden."""
    return re.sub(r"(://[^:/@]+:)[^@/]*@", r"\1***@", url)


def prepare(config: TuneConfig) -> Prepared:
    """Load inputs, enumerate, check rules and estimate every valid layout.

    Raises:
        TunerError: bad input (model, GPUs, space, calibration), or no layout of
            the space fits in memory (the message names the fewest GPUs that would).
    """
    _validate_config(config)
    model = slice_model(load_model(config.model), config.layers)
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
        inter_node_bytes_per_s=config.network_gbps * 1e9 / 8 if config.network_gbps is not None else None,
        usd_per_gpu_hour=config.usd_per_gpu_hour,
    )
    workload = Workload(seq_length=config.seq_length, global_batch_size=config.global_batch_size, precision=config.precision)
    if workload.precision.value == "fp8" and not cluster.gpu.peak_flops_fp8:
        raise TunerError(f"--precision fp8: {cluster.gpu.name} has no fp8 tensor cores; use --precision bf16")
    space = SearchSpace.load(config.space)
    if config.stack not in STACKS:
        raise TunerError(f"--stack {config.stack!r}: accepted {', '.join(STACKS)}")
    stack_notes: list[str] = []
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
    opts = run_options_for_backend(config.backend)
    t0 = time.perf_counter()
    en = enumerate_layouts(space, model, cluster.num_gpus, workload)
    en.notes.extend(stack_notes)
    t1 = time.perf_counter()
    est = estimate_table(model, cluster, workload, en.valid, calibration=cal, memory_headroom=config.memory_headroom, options=opts)
    t2 = time.perf_counter()
    fits = est.fits
    if not fits.any():
        raise TunerError(_no_fit_message(config, model, cluster, workload, space, cal, en, est))
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
            en2 = enumerate_layouts(space, model, n, workload)
            if len(en2.valid) == 0:
                continue
            e2 = estimate_table(model, c2, workload, en2.valid, calibration=cal, memory_headroom=config.memory_headroom,
                                options=run_options_for_backend(config.backend))
        except TunerError:
            continue
        if e2.fits.any():
            return msg + f" The fewest GPUs on which a layout of this space fits: {n} ({c2.label}). Try --gpus {n}x{cluster.gpu.name}."
    return msg + " No cluster up to 16,384 GPUs of this kind fits it with this space; widen the space (offload, recompute)."


@dataclass(slots=True)
class TuneResult:
    prepared: Prepared
    study: optuna.Study
    study_name: str
    storage: str
    out_dir: Path
    evaluated_now: int
    skipped_now: int
    backend: str
    pruned_now: int = 0
    """Real trials stopped early by the pruner in this run."""
    failed_now: int = 0
    """Real trials that ran out of memory, timed out or crashed in this run."""
    confirmed_now: int = 0
    """Confirmation runs (``--confirm-runs``) measured in this run."""
    confirm_note: str | None = None
    """Why the confirmation asked for did not run, if it did not."""


def trial_env_dict(items: Sequence[str]) -> dict[str, str]:
    """``--trial-env KEY=VALUE`` items as a dict.

    Raises:
        TunerError: an item without ``=`` or with a name that is not an environment variable name.
    """
    out: dict[str, str] = {}
    for it in items:
        k, sep, v = str(it).partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise TunerError(f"--trial-env {it!r}: expected NAME=VALUE, e.g. --trial-env NCCL_IB_HCA=mlx5")
        out[k] = v
    return out


def _check_storage_syntax(url: str) -> None:
    """Raises TunerError for a ``--storage`` that cannot be a storage URL (before any work)."""
    if not url:
        raise TunerError("--storage is empty; give an RDB URL (sqlite:///path.db, postgresql://...) or journal:PATH")
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if not path or path == "//":
            raise TunerError("--storage journal:PATH needs a file path, e.g. journal:/shared/tune/study.log")
    elif "://" not in url:
        raise TunerError(f"--storage {_mask(url)!r}: expected an RDB URL (sqlite:///path.db, postgresql://user@host/db) or journal:PATH")
    elif url.split("?")[0] in ("sqlite://", "sqlite:///", "sqlite:///:memory:"):
        raise TunerError(f"--storage {url!r} is an in-memory database: the study would be lost when tune exits; give a file, e.g. sqlite:///tune.db")


def open_storage(url: str, *, create: bool = True) -> Any:
    """An Optuna storage for ``url``: an RDB URL (``sqlite:///...``, ``postgresql://...``) as is, or
    ``journal:PATH``, a journal file (for several workers on a shared filesystem: Optuna's
    ``JournalStorage`` with ``JournalFileBackend``, which locks the file).

    Raises:
        TunerError: ``journal:`` without a path, or a journal file that cannot be opened.
    """
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise TunerError("--storage journal:PATH needs a file path, e.g. journal:/shared/tune/study.log")
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        if not create and not Path(path).is_file():
            raise TunerError(f"--storage {url!r}: no journal file at {path}")
        if create and not Path(path).parent.is_dir():
            # not created here: on a shared filesystem a mistyped folder would give one worker a journal of its own
            raise TunerError(f"--storage {url!r}: the folder {str(Path(path).parent)!r} does not exist; create it (on the filesystem "
                             "the workers share) and run again")
        try:
            return JournalStorage(JournalFileBackend(path))
        except OSError as e:
            raise TunerError(f"--storage {url!r}: cannot open the journal file ({e.strerror or e})") from None
        except (ValueError, UnicodeDecodeError):
            raise TunerError(f"--storage {url!r}: {path} is not an Optuna journal file (JSON lines); give a new path or an existing journal") from None
    return url


def _storage_url(config: TuneConfig, out_dir: Path) -> str:
    if config.storage:
        return config.storage
    return f"sqlite:///{(out_dir / 'study.db').as_posix()}"


def _resolved(prep: Prepared) -> dict[str, Any]:
    """The inputs that decide a study's numbers, resolved (so 64xH200 and 8x8xH200 compare equal)."""
    c = prep.cluster
    return {
        "model": prep.model.name,
        "gpu": c.gpu.name,
        "num_gpus": c.num_gpus,
        "gpus_per_node": c.gpus_per_node,
        "inter_node_bytes_per_s": c.inter_node_bytes_per_s,
        "usd_per_gpu_hour": c.usd_per_gpu_hour,
        "seq_length": prep.workload.seq_length,
        "global_batch_size": prep.workload.global_batch_size,
        "precision": prep.workload.precision.value,
        "backend": prep.config.backend,
        "stack": prep.config.stack,
        "memory_headroom": prep.config.memory_headroom,
        "layers": prep.model.num_layers,
        # real trials: steps and warm-up decide what a measurement is (step times drift for ~10 steps)
        "trial_steps": prep.config.trial_steps if prep.config.backend != "model" else None,
        "trial_warmup_steps": trial_warmup_steps(prep.config) if prep.config.backend != "model" else None,
    }


def model_spec_to_dict(model: ModelSpec) -> dict[str, Any]:
    """A ModelSpec as plain JSON-able values (stored with a study, so reports survive a moved config file)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model).items()}


def model_spec_from_dict(d: dict[str, Any]) -> ModelSpec:
    return ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _check_study_config(study: optuna.Study, config: TuneConfig, name: str, calibration: Calibration, resolved: dict[str, Any]) -> None:
    old_res = study.user_attrs.get("resolved")
    if old_res is not None:
        # Keys added in later versions (e.g. "layers") are compared only when the stored study has them.
        diff = [k for k in resolved if k in old_res and old_res[k] != resolved[k]]
        if diff:
            was = ", ".join(f"{k}={old_res.get(k)!r}" for k in diff)
            now = ", ".join(f"{k}={resolved[k]!r}" for k in diff)
            raise TunerError(
                f"study {name!r} already exists with {was}; this run asks for {now}. "
                "Use another --study name (or the same inputs to resume it)."
            )
    old_cal = study.user_attrs.get("calibration")
    if old_cal is not None and old_cal != calibration.to_dict():
        changed = sorted(k for k in set(old_cal) | set(calibration.to_dict()) if old_cal.get(k) != calibration.to_dict().get(k))
        raise TunerError(
            f"study {name!r} was evaluated with other cost-model constants ({', '.join(changed)} differ); its "
            "predictions would mix with new ones. Use another --study name, or the same --calibration to resume."
        )


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """Finished trials of a study as flat dicts (layout fields plus results), for reports and export.

    Confirmation runs (``--confirm-runs``: trials with ``repeat_of``) are folded into the trial they
    repeat: ``runs`` (finished runs, the trial's own included), each run's ``runs_tokens_per_s_per_gpu``
    and ``runs_step_time_s``; ``step_time_s`` becomes the mean step time of the runs and
    ``tokens_per_s_per_gpu`` the runs' tokens over their time (the harmonic mean of their
    throughputs, so the two agree); ``peak_gib`` the highest run's, ``headroom_gib`` the lowest;
    MFU and $/1M tokens follow. Confirmation runs that failed are listed in ``runs_failed``
    (trial, kind, memory reached in GiB where known). ``step_times_s`` stay the first run's.
    """
    rows: list[dict[str, Any]] = []
    repeats: dict[int, list[dict[str, Any]]] = {}
    failed: dict[int, list[dict[str, Any]]] = {}
    for t in study.get_trials(deepcopy=False):
        rep = t.user_attrs.get("repeat_of")
        if t.state == optuna.trial.TrialState.FAIL and rep is not None and "failure" in t.user_attrs:
            f = t.user_attrs["failure"]
            failed.setdefault(int(rep), []).append({"trial": t.number, "kind": f.get("kind"), "memory_reached_gib": f.get("memory_reached_gib")})
            continue
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        res = t.user_attrs.get("result")
        if not res or "layout" not in res:
            continue
        if rep is not None:
            repeats.setdefault(int(rep), []).append(res)
            continue
        rows.append({"trial": t.number, "key": t.user_attrs.get("key", ""), **res})
    for r in rows:
        if r["trial"] in failed:
            r["runs_failed"] = failed[r["trial"]]
        more = repeats.get(r["trial"], [])
        if not more:
            continue
        runs = [r, *more]
        tps = [float(x["tokens_per_s_per_gpu"]) for x in runs]
        steps = [float(x.get("step_time_s", float("nan"))) for x in runs]
        mean = len(tps) / sum(1.0 / x for x in tps)
        first = float(r["tokens_per_s_per_gpu"])
        r.update(
            runs=len(runs), runs_tokens_per_s_per_gpu=tps, runs_step_time_s=steps,
            tokens_per_s_per_gpu=mean, step_time_s=sum(steps) / len(steps),
            peak_gib=max(float(x["peak_gib"]) for x in runs), headroom_gib=min(float(x.get("headroom_gib", float("nan"))) for x in runs),
            mfu=float(r.get("mfu", float("nan"))) * mean / first, usd_per_million_tokens=float(r.get("usd_per_million_tokens", float("nan"))) * first / mean,
        )
    return rows


#: Search dimensions (Optuna parameters) and the LayoutTable columns each one sets.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "tp": ("tp", "sequence_parallel"),
    "pp": ("pp",),
    "vpp": ("vpp",),
    "cp": ("cp",),
    "ep": ("ep",),
    "etp": ("etp",),
    "micro_batch_size": ("micro_batch_size",),
    "recompute": ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
    "optimizer_offload_fraction": ("optimizer_offload_fraction",),
    "overlap_cpu_optimizer_d2h_h2d": ("overlap_cpu_optimizer_d2h_h2d",),
    "dispatcher": ("dispatcher",),
    "pipeline_split": ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"),
    "use_distributed_optimizer": ("use_distributed_optimizer",),
    "use_precision_aware_optimizer": ("use_precision_aware_optimizer",),
    "exp_avg_dtype": ("exp_avg_dtype",),
    "exp_avg_sq_dtype": ("exp_avg_sq_dtype",),
}


def _label(dim: str, layout: Layout) -> str:
    if dim == "recompute":
        return layout.recompute_label
    if dim == "pipeline_split":
        return _split_label(layout.num_layers_in_first_pipeline_stage, layout.num_layers_in_last_pipeline_stage)
    if dim == "tp":
        return str(layout.tp)
    v = getattr(layout, dim)
    if isinstance(v, float):
        return f"{v:g}"
    if hasattr(v, "value"):
        return str(v.value)
    return str(v).lower() if isinstance(v, bool) else str(v)


class CandidateIndex:
    """Maps search-dimension labels to rows of the valid layout table, vectorised.

    Each dimension's distinct column values get an integer code; a row's code is
    the mixed-radix number of its dimension codes. Looking a layout up is a
    binary search, so a study never builds Python objects for every candidate.
    """

    def __init__(self, valid: LayoutTable, fits: np.ndarray) -> None:
        self.valid = valid
        n = len(valid)
        self.codes: dict[str, np.ndarray] = {}
        self.labels: dict[str, list[str]] = {}
        self.rep_row: dict[str, list[int]] = {}
        code = np.zeros(n, dtype=np.int64)
        for dim, cols in DIMENSIONS.items():
            key = np.zeros(n, dtype=np.int64)
            for c in cols:
                col = valid[c]
                if col.dtype.kind == "U":
                    _, inv = categories(col)
                else:
                    _, inv = np.unique(col, return_inverse=True)
                    inv = inv.reshape(-1)
                key = key * (int(inv.max()) + 1 if n else 1) + inv
            _, first, inv = np.unique(key, return_index=True, return_inverse=True)
            inv = inv.reshape(-1)
            reps = [int(i) for i in first]
            self.codes[dim] = inv
            self.rep_row[dim] = reps
            self.labels[dim] = [_label(dim, valid.row(i)) for i in reps]
            code = code * len(reps) + inv
        self.row_code = code
        fit_rows = np.flatnonzero(fits)
        order = np.argsort(code[fit_rows])
        self._fit_sorted_codes = code[fit_rows][order]
        self._fit_sorted_rows = fit_rows[order]
        self._label_index = {d: {lab: i for i, lab in enumerate(labs)} for d, labs in self.labels.items()}

    @property
    def params(self) -> list[str]:
        """Dimensions with more than one choice: the Optuna parameters."""
        return [d for d in DIMENSIONS if len(self.labels[d]) > 1]

    def params_of_row(self, row: int) -> dict[str, str]:
        return {d: self.labels[d][int(self.codes[d][row])] for d in self.params}

    def find_fitting(self, params: dict[str, str]) -> int | None:
        """Row of the valid table with these labels, if it exists and fits; else None."""
        code = 0
        for d in DIMENSIONS:
            idx = self._label_index[d].get(params.get(d, self.labels[d][0]))
            if idx is None:
                return None
            code = code * len(self.labels[d]) + idx
        pos = int(np.searchsorted(self._fit_sorted_codes, code))
        if pos < len(self._fit_sorted_codes) and self._fit_sorted_codes[pos] == code:
            return int(self._fit_sorted_rows[pos])
        return None

    def build(self, params: dict[str, str]) -> Layout:
        """A layout with these labels, valid or not (to explain why it was skipped)."""
        base = self.valid.row(0).to_dict()
        for d, cols in DIMENSIONS.items():
            lab = params.get(d, self.labels[d][0])
            rep = self.valid.row(self.rep_row[d][self._label_index[d][lab]]).to_dict()
            for c in cols:
                base[c] = rep[c]
        base["sequence_parallel"] = base["tp"] > 1
        return Layout.from_dict(base)


def _spread(front: np.ndarray, peak: np.ndarray, k: int) -> list[int]:
    """Up to ``k`` points of the front spread evenly over its memory range, both ends included."""
    if len(front) <= k:
        return [int(i) for i in front]
    by_mem = front[np.argsort(peak[front])]
    picks = np.unique(np.round(np.linspace(0, len(by_mem) - 1, k)).astype(int))
    return [int(by_mem[i]) for i in picks]


def _open_study(cfg: TuneConfig, prep: Prepared, name: str, out_dir: Path) -> tuple[optuna.Study, str]:
    """Create or load the study, check it was made with the same inputs, and store them in it."""
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TunerError(f"--results-dir {cfg.results_dir!r}: cannot create {out_dir} ({e.strerror})") from None
    try:
        return _open_study_in(cfg, prep, name, out_dir)
    except BaseException:
        if created:
            try:
                out_dir.rmdir()  # only if still empty: a refused study leaves no folder behind
            except OSError:
                pass
        raise


class _FailedTrialOneLine(logging.Filter):
    """Optuna logs a failed trial with its traceback; a trial that failed as an outcome (out of memory,
    timeout, crash: :class:`TrialFailed`) or was interrupted (Ctrl-C) keeps only Optuna's one line naming the trial and the error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], (TrialFailed, KeyboardInterrupt)):
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_optuna() -> None:
    """Optuna at WARNING, without tracebacks for trial outcomes (on every handler of its root logger)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for h in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, _FailedTrialOneLine) for f in h.filters):
            h.addFilter(_FailedTrialOneLine())


def _open_study_in(cfg: TuneConfig, prep: Prepared, name: str, out_dir: Path) -> tuple[optuna.Study, str]:
    storage = _storage_url(cfg, out_dir)
    _quiet_optuna()
    try:
        study = optuna.create_study(
            study_name=name,
            storage=open_storage(storage),
            directions=["maximize", "minimize"],
            sampler=optuna.samplers.NSGAIISampler(seed=cfg.seed, population_size=16),
            load_if_exists=True,
        )
    except TunerError:
        raise
    except (ValueError, ImportError) as e:  # bad storage URL, missing DB driver, unreadable journal
        if storage.startswith("journal:"):
            raise TunerError(f"--storage {_mask(storage)!r}: not an Optuna journal file (JSON lines) or unreadable; give a new path or an existing journal") from None
        raise TunerError(f"--storage {_mask(storage)!r}: cannot open the study ({_mask(str(e))})") from None
    except Exception as e:  # SQLAlchemy errors: unwritable path, locked or corrupt file
        if type(e).__module__.startswith("sqlalchemy"):
            raise TunerError(f"--storage {_mask(storage)!r}: cannot open the study ({type(e).__name__}: {_mask(str(e).splitlines()[0])})") from None
        raise
    _check_study_config(study, cfg, name, prep.calibration, _resolved(prep))
    old_space = study.user_attrs.get("space")
    new_space = json.loads(json.dumps(prep.space.to_dict()))  # as the storage gives it back
    if old_space is not None and old_space != new_space:
        changed = sorted(k for k in set(old_space) | set(new_space) if old_space.get(k) != new_space.get(k))
        raise TunerError(
            f"study {name!r} was searched over another space ({', '.join(changed)} differ); Optuna cannot change a study's "
            "choices. Use another --study name, or the same --space to resume."
        )
    study.set_user_attr("config", cfg.to_dict())
    study.set_user_attr("resolved", _resolved(prep))
    study.set_user_attr("model_spec", model_spec_to_dict(prep.model))
    study.set_user_attr("calibration", prep.calibration.to_dict())
    study.set_user_attr("space", prep.space.to_dict())
    try:
        (out_dir / "config.yaml").write_text(
            yaml.safe_dump({"config": cfg.to_dict(), "resolved": _resolved(prep), "space": prep.space.to_dict(), "calibration": prep.calibration.to_dict()}, sort_keys=False)
        )
    except OSError as e:
        raise TunerError(f"cannot write {out_dir / 'config.yaml'} ({e.strerror or e})") from None
    return study, storage


class _StudyLock:
    """One ``tune`` process at a time on a study in its default SQLite file: an exclusive ``flock`` on
    ``results/<study>/.tune.lock`` for the run (released when the run ends or the process dies). A second
    run would otherwise take the first one's RUNNING trials for leftovers of an interrupt and fail them."""

    def __init__(self, out_dir: Path, name: str) -> None:
        import fcntl
        import os

        self.path = out_dir / ".tune.lock"
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise TunerError(f"cannot create the study folder {out_dir} ({e.strerror})") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                who = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            except OSError:
                who = ""
            os.close(self.fd)
            raise TunerError(
                f"study {name!r} is being run by another tune process{f' (pid {who})' if who else ''}; wait for it to finish, "
                "or let several workers share it through --storage journal:PATH or an RDB URL"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        import os

        try:
            os.close(self.fd)  # closing the descriptor drops the flock
        except OSError:
            pass


def run_study(
    prep: Prepared,
    *,
    on_trial: Callable[[int, int], None] | None = None,
    backend: TrialBackend | None = None,
) -> TuneResult:
    """Create or resume the study and evaluate trials through the backend (see :func:`_run_study`).

    With the default storage (the study's own SQLite file) one process at a time runs a study.

    Raises:
        TunerError: the study exists with different inputs, the storage URL is bad, or another
            ``tune`` process is running the same study in its default storage.
    """
    cfg = prep.config
    name = cfg.study_name(prep.model, prep.cluster)
    out_dir = Path(cfg.results_dir) / name
    if cfg.storage:
        return _run_study(prep, on_trial=on_trial, backend=backend)
    created = not out_dir.exists()
    lock = _StudyLock(out_dir, name)
    try:
        return _run_study(prep, on_trial=on_trial, backend=backend)
    finally:
        lock.release()  # the file stays (removing it could let two runs lock two files), unless the study was refused
        if created and [p.name for p in out_dir.iterdir()] == [lock.path.name]:
            try:
                lock.path.unlink()
                out_dir.rmdir()
            except OSError:
                pass


def _run_study(
    prep: Prepared,
    *,
    on_trial: Callable[[int, int], None] | None = None,
    backend: TrialBackend | None = None,
) -> TuneResult:
    """Create or resume the study and evaluate trials through the backend.

    The predicted Pareto front (spread over its memory range) and the fastest
    predicted candidates are enqueued first; NSGA-II (Optuna's multi-objective
    default) samples the remaining quarter of the trials. A sampled combination
    that breaks a rule, is predicted not to fit, or was already evaluated in this
    study is recorded as PRUNED with the reason and never reaches the backend.

    Args:
        prep: the pruned candidates from :func:`prepare`.
        on_trial: called with (0, total) when the study is open and trials start, then after every trial with
            (done, total), e.g. to start and move a progress bar.
        backend: overrides ``prep.config.backend`` (tests).

    Returns:
        The study and what this run added.

    Raises:
        TunerError: the study exists with different inputs, or the storage URL is bad.
    """
    cfg = prep.config
    name = cfg.study_name(prep.model, prep.cluster)
    out_dir = Path(cfg.results_dir) / name
    backend = backend or get_backend(cfg.backend, BackendSettings(
        calibration=prep.calibration,
        memory_headroom=cfg.memory_headroom,
        trials_dir=out_dir / "trials",
        num_gpus=prep.cluster.num_gpus,
        steps=cfg.trial_steps,
        warmup_steps=trial_warmup_steps(cfg),
        timeout_s=cfg.trial_timeout_s,
        command_template=cfg.command_template,
        address=cfg.ray_address,
        gpus_per_node=prep.cluster.gpus_per_node,
        extra_env=trial_env_dict(cfg.trial_env),
    ))
    n = backend.cluster_gpus()
    if n is not None and n < prep.cluster.num_gpus:
        backend.close()
        raise TunerError(
            f"--backend ray: the Ray cluster has {n:g} GPUs and --gpus asks for {prep.cluster.num_gpus}; connect to a bigger "
            "cluster (--ray-address auto on one of its nodes) or tune a slice that fits (--layers N with --gpus for what the cluster has)"
        )
    try:
        study, storage = _open_study(cfg, prep, name, out_dir)
    except BaseException:
        backend.close()  # a Ray instance this run started must not outlive a refused study
        raise
    pruner = StepTimePruner(warmup_steps=trial_warmup_steps(cfg), margin=cfg.prune_margin) if cfg.prune_margin is not None else None

    valid = prep.enumeration.valid
    est = prep.estimates
    index = CandidateIndex(valid, prep.fits)
    params = index.params
    # Evaluated layouts (a trial skipped as a duplicate of another is not one: that other may have been interrupted).
    seen: set[str] = {t.user_attrs["key"] for t in study.get_trials(deepcopy=False)
                      if "key" in t.user_attrs and _settled(t) and not str(t.user_attrs.get("skipped", "")).startswith("duplicate")}
    # Layouts still queued by an interrupted run: run them before enqueuing more.
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if not cfg.storage:
        # The default storage is this study's own SQLite file, driven by one `tune` process at a time:
        # a trial still RUNNING there was cut off by an interrupt. (With --storage, other workers may
        # be running their trials now: leave them.)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            study._storage.set_trial_user_attr(t._trial_id, "interrupted", "left running by an interrupted run")
            study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)

    # Enqueue: the predicted front spread over memory, then the fastest predicted candidates.
    n_trials = cfg.trials if cfg.trials is not None else 48
    fit_idx = np.flatnonzero(prep.fits)
    fastest = fit_idx[np.argsort(-est.tokens_per_s_per_gpu[fit_idx])[: 4 * min(n_trials, MAX_ENQUEUED)]]
    real = backend.measured
    if real:
        # Real trials cost minutes: the fastest predicted layouts first (the pruner then stops slower ones early).
        order = [int(i) for i in fastest] + _spread(prep.front, est.peak_bytes, max(2, n_trials // 2))
    else:
        order = _spread(prep.front, est.peak_bytes, max(2, n_trials // 2)) + [int(i) for i in fastest]
    queued: list[int] = []
    qkeys: set[str] = set()
    budget = min(MAX_ENQUEUED, max(1, (3 * n_trials) // 4)) - len(waiting)
    for i in order:
        if len(queued) >= budget:
            break
        lay_i = valid.row(i)
        k = lay_i.key()
        if k in seen or k in qkeys:
            continue
        if backend.refusal(lay_i, prep.model, prep.workload):
            continue  # the backend cannot run it here (e.g. flex without DeepEP): do not spend a trial on it
        queued.append(i)
        qkeys.add(k)
    # Real trials with --recalibrate-after K: enqueue only what runs next, so that after every K measured
    # trials the cost model is refitted to them and the rest of the queue re-ranked by the new prediction.
    recal_k = cfg.recalibrate_after if real else 0
    lazy = recal_k > 0
    first = queued[: max(1, cfg.parallel_trials)] if lazy else queued
    rest = queued[len(first):]
    for i in first:
        study.enqueue_trial(index.params_of_row(i), user_attrs={"enqueued": "predicted front / fastest predicted"})
    recal_state = {"fits": 0, "calibration": prep.calibration}

    counters: dict[str, Any] = {"evaluated": 0, "skipped": 0, "pruned": 0, "failed": 0, "confirmed": 0}
    gpu = prep.cluster.gpu
    n_active = prep.model.active_params()

    lock = threading.Lock()
    mine: set[int] = set()  # trial numbers this process runs (other workers may share the storage)

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        try:
            return _objective(trial)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", "cut off by Ctrl-C")  # a resumed run evaluates this layout again
            raise

    def _objective(trial: optuna.Trial) -> tuple[float, float]:
        mine.add(trial.number)
        repeat_of = trial.user_attrs.get("repeat_of")  # a confirmation run of that trial's layout (--confirm-runs)
        if done["confirming"] and repeat_of is None:
            # another worker took a queued confirmation run, so Optuna sampled a new layout: not a search now
            trial.set_user_attr("skipped", "sampled during the confirmation phase (its queued runs were taken by another worker)")
            raise optuna.TrialPruned("not a confirmation run")
        chosen = {p: trial.suggest_categorical(p, index.labels[p]) for p in params}
        row = index.find_fitting(chosen)
        lay = valid.row(row) if row is not None else index.build(chosen)
        key = lay.key()
        trial.set_user_attr("key", key)
        with lock:
            dup = repeat_of is None and (key in seen or _claimed_elsewhere(study, trial.number, key))
            if not dup:
                seen.add(key)
        if dup:
            with lock:
                counters["skipped"] += 1
            trial.set_user_attr("skipped", "duplicate: this layout was already evaluated (or is being run) in this study")
            raise optuna.TrialPruned("duplicate layout")
        if row is None:
            counters["skipped"] += 1
            broken = check_layout(lay, prep.model, prep.workload)
            why = "; ".join(f"[{r}] {m}" for r, m in broken) if broken else "predicted not to fit in memory"
            trial.set_user_attr("skipped", why)
            raise optuna.TrialPruned(why)
        pred = {
            "pred_tokens_per_s_per_gpu": float(est.tokens_per_s_per_gpu[row]),
            "pred_peak_gib": float(est.peak_bytes[row]) / 2**30,
            "pred_step_time_s": float(est.step_time_s[row]),
        }

        def reporter(tps: Sequence[float]) -> str | None:
            trial.set_user_attr("intermediate_tokens_per_s_per_gpu", [float(x) for x in tps])
            if pruner is None or repeat_of is not None:  # a confirmation run is measured to the end
                return None
            return pruner.decide(list(tps), _best_measured(study))

        try:
            m = backend.run(lay, model=prep.model, cluster=prep.cluster, workload=prep.workload, reporter=reporter,
                            trial_number=trial.number)
        except TrialFailed as e:
            counters["failed"] += 1
            fail = {"kind": e.kind.value, "message": str(e), "log_path": e.log_path, "layout": lay.to_dict(), "label": lay.label, **pred}
            if e.memory_reached_bytes == e.memory_reached_bytes:  # not NaN
                fail["memory_reached_gib"] = e.memory_reached_bytes / 2**30
            trial.set_user_attr("failure", fail)
            raise
        except TrialStopped as e:
            counters["pruned"] += 1
            trial.set_user_attr("pruned", {
                "reason": e.reason, "layout": lay.to_dict(), "label": lay.label, "log_path": e.log_path,
                "step_times_s": list(e.step_times_s), "tokens_per_s_per_gpu": list(e.tokens_per_s_per_gpu), **pred,
            })
            raise optuna.TrialPruned(e.reason) from None
        except InfeasibleLayout as e:
            counters["skipped"] += 1
            trial.set_user_attr("skipped", str(e))
            raise optuna.TrialPruned(str(e)) from None
        tps = m.tokens_per_s_per_gpu
        trial.set_user_attr(
            "result",
            {
                "layout": lay.to_dict(),
                "label": lay.label,
                "source": m.source,
                "tokens_per_s_per_gpu": tps,
                "peak_gib": m.peak_bytes / 2**30,
                "headroom_gib": (gpu.hbm_bytes - m.peak_bytes) / 2**30,
                "step_time_s": float(np.median(m.step_times_s)) if m.step_times_s else float("nan"),
                "mfu": 6.0 * n_active * tps / gpu.peak_flops_bf16,
                "usd_per_million_tokens": prep.cluster.usd_per_gpu_hour / (tps * 3600) * 1e6,
                "pred_tokens_per_s_per_gpu": float(est.tokens_per_s_per_gpu[row]),
                "pred_peak_gib": float(est.peak_bytes[row]) / 2**30,
                "pred_step_time_s": float(est.step_time_s[row]),
                "pred_model_tflops_per_gpu": float(est.model_tflops_per_gpu[row]),
            },
        )
        if m.source == "measured":
            res = dict(trial.user_attrs["result"])
            res.update(
                step_times_s=[float(x) for x in m.step_times_s],
                losses=[float(x) for x in m.losses],
                peak_allocated_gib=float(m.extra.get("peak_allocated_bytes", float("nan"))) / 2**30,
                step_time_cv=m.extra.get("step_time_cv"),
                wall_s=m.extra.get("wall_s"),
                log_path=m.log_path,
                notes=m.extra.get("notes", []),
            )
            trial.set_user_attr("result", res)
        counters["confirmed" if repeat_of is not None else "evaluated"] += 1
        return tps, m.peak_bytes / 2**30

    done = {"n": 0, "total": n_trials, "confirming": False}

    def _cb(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        done["n"] += 1
        # no new search trial is queued once the search's trials are spent (nor while confirming)
        if lazy and not done["confirming"] and done["n"] < done["total"]:
            with lock:
                _recalibrate_and_requeue(study, prep, index, rest, seen, recal_k, recal_state)
        if on_trial:
            on_trial(done["n"], done["total"])

    if cfg.parallel_trials > 1:
        _serialize_state_changes(study)
    # Ctrl-C with trials running in worker threads (--parallel-trials): Optuna waits for them, so tell the
    # backend to stop them (each kills its processes and frees its placement group) before it waits.
    old_handler = None
    if threading.current_thread() is threading.main_thread():
        def _on_sigint(signum: int, frame: Any) -> None:
            backend.cancel()
            raise KeyboardInterrupt

        old_handler = signal.signal(signal.SIGINT, _on_sigint)
    # Confirmation runs left queued by an interrupted run go first (Optuna runs the oldest queued trial first);
    # they do not count against --trials.
    leftover = sum(1 for t in waiting if t.user_attrs.get("repeat_of") is not None)
    done["total"] = n_trials + leftover
    try:
        if on_trial:
            on_trial(0, done["total"])  # the study is open and its queue set: trials start now
        study.optimize(objective, n_trials=n_trials + leftover, callbacks=[_cb], catch=(TrialFailed,), gc_after_trial=False,
                       n_jobs=cfg.parallel_trials if cfg.backend == "ray" else 1)
        if real and cfg.confirm_runs:
            _confirm(study, cfg.confirm_runs, objective, _cb, done, counters, on_trial)
    except KeyboardInterrupt:
        backend.cancel()
        _settle(study, mine)  # Optuna does not wait for its worker threads: let them record their trials
        raise
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
        backend.close()
    return TuneResult(
        prepared=prep,
        study=study,
        study_name=name,
        storage=storage,
        out_dir=out_dir,
        evaluated_now=counters["evaluated"],
        skipped_now=counters["skipped"],
        backend=backend.name,
        pruned_now=counters["pruned"],
        failed_now=counters["failed"],
        confirmed_now=counters["confirmed"],
        confirm_note=counters.get("confirm_note"),
    )


def _recalibrate_and_requeue(
    study: optuna.Study, prep: Prepared, index: CandidateIndex, rest: list[int], seen: set[str], every: int, state: dict[str, Any]
) -> None:
    """After each real trial: every ``every`` measured trials, refit the cost model's constants to the
    study's measurements (:func:`cost_model.calibrate.fit_observations`: step-time and memory constants)
    and re-rank the not yet enqueued candidates ``rest`` by the refitted prediction; then enqueue the next one.

    The refit and its error are recorded in the study (``recalibrations``); a fit that fails (e.g. all
    measurements alike) keeps the previous constants and is recorded too.
    """
    from cost_model.calibrate import Observation, fit_observations

    measured = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if (t.user_attrs.get("result") or {}).get("source") == "measured" and "repeat_of" not in t.user_attrs]
    n = len(measured)
    if n >= every * (state["fits"] + 1) and n >= 2:
        obs = []
        for t in measured:
            r = t.user_attrs["result"]
            peak = r.get("peak_gib")
            st_s = float(r.get("step_time_s") or "nan")
            obs.append(Observation(model=prep.model, cluster=prep.cluster, workload=prep.workload, layout=Layout.from_dict(r["layout"]),
                                   step_time_s=st_s if math.isfinite(st_s) and st_s > 0 else None,
                                   peak_gib=float(peak) if peak and math.isfinite(float(peak)) else None, label=f"trial {t.number}"))
        record: dict[str, Any] = {"after_measured_trials": n}
        try:
            fit = fit_observations(obs, start=state["calibration"], max_nfev=100)
            state["calibration"] = fit.calibration
            if rest:
                sub = prep.enumeration.valid.select(np.asarray(rest))
                est = estimate_table(prep.model, prep.cluster, prep.workload, sub, calibration=fit.calibration,
                                     memory_headroom=prep.config.memory_headroom, options=run_options_for_backend(prep.config.backend))
                order = np.argsort(-est.tokens_per_s_per_gpu, kind="stable")
                rest[:] = [rest[int(j)] for j in order]
            record.update(step_median_abs_error=(fit.step.median_abs_error if fit.step else None),
                          memory_median_abs_error=fit.memory_median_abs_error, constants=fit.calibration.to_dict(),
                          next=[prep.enumeration.valid.row(i).label for i in rest[:3]])
        except TunerError as e:
            record["error"] = str(e)
        state["fits"] += 1
        study.set_user_attr("recalibrations", [*study.user_attrs.get("recalibrations", []), record])
    while rest:
        i = rest.pop(0)
        if prep.enumeration.valid.row(i).key() in seen:
            continue
        study.enqueue_trial(index.params_of_row(i), user_attrs={"enqueued": "fastest predicted" + (" after recalibration" if state["fits"] else "")})
        break


def _serialize_state_changes(study: optuna.Study) -> None:
    """Make trial state changes atomic among this process's threads.

    Optuna's worker threads (``n_jobs > 1``) pop an enqueued (WAITING) trial by reading the waiting
    trials, then setting one RUNNING if it is still WAITING; on SQLite that check-and-set is not
    atomic between threads, and two threads were seen to take the same trial ("Cannot tell a PRUNED
    trial"). A lock around ``set_trial_state_values`` closes that race inside this process; across
    processes the RDB server's row locks or the journal file's lock do.
    """
    storage = study._storage
    orig = storage.set_trial_state_values
    lock = threading.Lock()

    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return orig(*args, **kwargs)

    storage.set_trial_state_values = locked  # type: ignore[method-assign]


#: Layouts a confirmation re-measures at most: the fastest measured one and up to three within its noise.
MAX_FINALISTS = 4
#: Rounds of confirmation: after a round the finalists are chosen again (the best by mean may be a layout
#: measured once, and ties widen with the spread between runs), and any short of runs topped up.
MAX_CONFIRM_ROUNDS = 3


def _confirm(study: optuna.Study, runs: int, objective: Callable[..., Any], callback: Callable[..., None], done: dict[str, Any],
             counters: dict[str, Any], on_trial: Callable[[int, int], None] | None) -> None:
    """``--confirm-runs``: bring each finalist (:func:`_finalists`) to ``runs`` confirmation runs, interleaved.

    Runs a finalist already has (finished, failed, running or queued, from an earlier run or another worker
    sharing the storage) count; only the shortfall is queued. Not run while search trials are still queued
    (Optuna runs the oldest queued trial first): ``counters["confirm_note"]`` says so.
    """
    for _ in range(MAX_CONFIRM_ROUNDS):
        finalists = _finalists(study)
        trials = study.get_trials(deepcopy=False)
        queued = [t for t in trials if t.state == optuna.trial.TrialState.WAITING and t.user_attrs.get("repeat_of") is None]
        if finalists and queued:
            counters["confirm_note"] = (f"confirmation not run: {len(queued)} queued layouts of the search are still waiting; "
                                        "re-run the same command (with more --trials) to run them, then confirm")
            return
        have: dict[int, int] = {}
        for t in trials:
            rep = t.user_attrs.get("repeat_of")
            if rep is not None and not (t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("interrupted")):
                have[int(rep)] = have.get(int(rep), 0) + 1
        by_number = {t.number: t for t in trials}
        need = {n: runs - have.get(n, 0) for n in finalists if runs - have.get(n, 0) > 0}
        if not need:
            return
        # interleaved (A B C A B C ...), so a drift of the machine's state over time reaches them alike; one at a
        # time, as concurrent trials on one host slow each other
        for r in range(max(need.values())):
            for n in finalists:
                if need.get(n, 0) > r:
                    study.enqueue_trial(by_number[n].params, user_attrs={
                        "repeat_of": n, "enqueued": f"confirmation run {have.get(n, 0) + r + 1} of {runs} of trial {n}"})
        todo = sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
        done["confirming"] = True
        done["total"] = done["n"] + todo
        if on_trial:
            on_trial(done["n"], done["total"])
        study.optimize(objective, n_trials=todo, callbacks=[callback], catch=(TrialFailed,), gc_after_trial=False, n_jobs=1)


def _finalists(study: optuna.Study) -> list[int]:
    """Trial numbers to confirm: the fastest measured layout, then those within its trials' noise (fastest first)."""
    from tuner.report import fastest_measured, measured_ties

    rows = trial_rows(study)
    best = fastest_measured(rows)
    if best is None:
        return []
    return [best["trial"]] + [t["trial"] for t in measured_ties(rows, best["trial"])][: MAX_FINALISTS - 1]


def _settle(study: optuna.Study, numbers: set[int], wait_s: float = 60.0) -> None:
    """After an interrupt: wait (at most ``wait_s``) for this process's trials to leave RUNNING, then mark any left as FAIL."""
    deadline = time.monotonic() + wait_s
    while True:
        running = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)) if t.number in numbers]
        if not running:
            return
        if time.monotonic() > deadline:
            for t in running:
                try:
                    study._storage.set_trial_user_attr(t._trial_id, "interrupted", "still running after the interrupt")
                    study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
                except Exception:  # noqa: BLE001 - finished in the meantime
                    pass
            return
        time.sleep(0.2)


def _claimed_elsewhere(study: optuna.Study, number: int, key: str) -> bool:
    """Another trial of the study (of any worker sharing its storage) has this layout: finished, or
    running with a lower number (of two workers that pick a layout at once, the later trial yields)."""
    for t in study.get_trials(deepcopy=False):
        if t.number == number or t.user_attrs.get("key") != key or "skipped" in t.user_attrs:
            continue
        if _settled(t) or (t.state == optuna.trial.TrialState.RUNNING and t.number < number):
            return True
    return False


def _settled(t: optuna.trial.FrozenTrial) -> bool:
    """The trial's layout has an outcome: finished, and not a FAIL marked ``interrupted`` (cut off by Ctrl-C,
    or left RUNNING by an interrupted run of the default storage; a worker killed while it ran a trial of a shared
    --storage leaves it RUNNING), whose layout a resumed run evaluates again.
    A FAIL from an unexpected error stays settled, so a layout that always breaks the run is not retried forever."""
    if not t.state.is_finished():
        return False
    return not (t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("interrupted"))


def _best_measured(study: optuna.Study) -> float | None:
    """Highest measured tokens/s/GPU among the study's finished trials; None if none was measured."""
    best = None
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        r = t.user_attrs.get("result") or {}
        if r.get("source") == "measured" and "repeat_of" not in t.user_attrs:  # a trial's own run, as the pruner compares
            v = float(r.get("tokens_per_s_per_gpu", 0.0))
            best = v if best is None or v > best else best
    return best
