"""What a tuning run depends on (:class:`TuneConfig`) and its validation, in one place.

Every check of a user's input that needs no model or hardware data is here (:func:`_validate_config`);
each raises :class:`~specs.errors.TunerError` naming the flag and what it accepts, before any work.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from specs import NEWEST_MEGATRON_CORE, Cluster, ModelSpec, RunOptions, megatron_core_version
from specs.errors import TunerError
from specs.study_files import (
    RECORD_ERRORS,
    STUDY_OUTPUT_FILES,
    STUDY_OWN_FILES,
    check_output_path,
    is_study_folder,
    read_study_record,
)

__all__ = [
    "ClusterOptions", "JobOptions", "SearchOptions", "StackOptions", "StudyOptions", "TrialOptions", "WorkloadOptions",
    "DEFAULT_TRIALS", "STACKS", "TuneConfig", "harness_without_te", "n_trials", "run_options_for_backend",
    "study_run_options", "trial_env_dict", "trial_warmup_steps",
    # specs.study_files', which the study code and the command lines import from here
    "RECORD_ERRORS", "STUDY_OUTPUT_FILES", "STUDY_OWN_FILES", "check_output_path", "is_study_folder",
    "read_study_record",
]

#: Training stacks a recipe can target (``specs/data/stacks/``; ``megatron`` is ``megatron-lm``).
STACKS = ("slime", "megatron-lm", "megatron-bridge", "nemo-rl", "megatron")

#: Trial policies of real trials (:attr:`TrialOptions.policy`).
POLICIES = ("gain", "queue")

#: Layouts a run evaluates when ``--trials`` is not given.
DEFAULT_TRIALS = 48

_STUDY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")  # "+": LoRA targets in a default name
_DEFAULT_STOP_CONFIDENCE = 0.9
_DEFAULT_STOP_GAIN = 0.02
_DEFAULT_RECALIBRATE_AFTER = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOptions:
    """The job (``tune --help``'s Job options): the model, the GPUs and what a ``tune --from`` launch brings."""

    model: str
    gpus: str
    layers: int | None = None
    """Slice the model to its first N decoder layers at full width (``--layers``); None = the whole model."""
    allow_config_args: bool = False
    baseline: dict[str, Any] | None = None
    """A layout (:meth:`specs.Layout.to_dict`) evaluated first (``tune --from``: the launch's own)."""
    user_args: tuple[str, ...] = ()
    """The launch file's own arguments that the exported commands keep (``tune --from``)."""
    bridge_yaml: str = ""
    """A ``tune --from`` Megatron-Bridge YAML's text, which the ``bridge`` export writes into."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterOptions:
    """The cluster's options beside ``--gpus`` (``tune --help``'s Cluster options); None = the GPU's server type's."""

    gpus_per_node: int | None = None
    network_gbps: float | None = None
    """Per-node network bandwidth in Gb/s, over the fabric's."""
    network: str | None = None
    """The scale-out fabric (:func:`specs.load_network`); None = the GPU's server type's default."""
    megatron_core: str | None = None
    """megatron-core release whose rules apply (``--megatron-core``); None = the newest the project knows."""
    host_memory_gib: float | None = None
    """Host memory per node in GiB (``--host-memory-gib``); None = the server type's (H200 p5en: 2,048)."""
    usd_per_gpu_hour: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadOptions:
    """The workload (``tune --help``'s Workload options; :class:`specs.Workload`)."""

    seq_length: int = 8192
    global_batch_size: int = 128
    precision: str = "bf16"
    task: str = "pretrain"
    lora_rank: int = 32
    lora_target_modules: tuple[str, ...] = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchOptions:
    """The search (``tune --help``'s Search options)."""

    space: str | None = None
    calibration: str | None = None
    memory_headroom: float | None = None
    """Fraction of HBM kept free, the whole fit rule; None = the error bars' rule (:mod:`cost_model.uncertainty`)."""
    trials: int | None = None
    """Layouts this run evaluates (None = :data:`DEFAULT_TRIALS`); skips and confirmations are extra."""
    backend: str = "model"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialOptions:
    """Real trials and their policy (``tune --help``'s Trials options; the heartbeats of shared storage)."""

    trial_steps: int = 20
    trial_warmup_steps: int | None = None
    """None = half of ``trial_steps`` (benchmarks/results/h200_x2_2026-11-29/step_times.jsonl)."""
    trial_timeout_s: float = 900.0
    trial_profile_step: int | None = None
    """``local`` backend: profile this step of each trial (:attr:`HarnessSpec.profile_step`)."""
    prune_margin: float | None = 0.25
    """Stop a real trial whose running median throughput is below best / (1 + margin); None = never prune."""
    command_template: str | None = None
    ray_address: str | None = None
    parallel_trials: int = 1
    trial_env: tuple[str, ...] = ()
    gpu_hours: float | None = None
    policy: str = "gain"
    stop_confidence: float = _DEFAULT_STOP_CONFIDENCE
    stop_gain: float = _DEFAULT_STOP_GAIN
    recalibrate_after: int = _DEFAULT_RECALIBRATE_AFTER
    confirm_runs: int = 0
    """Confirmation runs per finalist (:func:`tuner.report.measured_ties`), those from earlier included."""
    heartbeat_interval_s: int = 60
    """Real trials with ``--storage``: seconds between heartbeats (``heartbeat_interval``)."""
    heartbeat_grace_s: int = 180
    """Real trials with ``--storage``: a RUNNING trial whose last heartbeat is older is failed and its layout queued
    again (Optuna's ``grace_period``, ``RetryHeartbeatStaleTrialCallback``); also a ``model`` trial RUNNING as long."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyOptions:
    """Where the study is kept and how it goes on (``tune --help``'s Study options)."""

    study: str | None = None
    storage: str | None = None
    resume: bool = False
    """``--resume``: evaluate :data:`DEFAULT_TRIALS` more layouts in a study that holds trials."""
    results_dir: str = "results"
    seed: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class StackOptions:
    """The training stack and the run flags over it (``tune --help``'s Run options)."""

    stack: str = "slime"
    """Training stack the recipe targets (:data:`STACKS`), a preset of :mod:`specs.stacks` the estimates use."""
    run_flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Run flags over the stack's (:class:`specs.stacks.RunFlags` fields; lists for tuples)."""


#: The keys of :meth:`TuneConfig.to_dict` in the order a study's ``config.yaml`` lists them.
_STORED_ORDER = (
    "model", "gpus", "gpus_per_node", "network_gbps", "network", "megatron_core", "host_memory_gib", "usd_per_gpu_hour",
    "seq_length", "global_batch_size", "precision", "space", "calibration", "memory_headroom", "study", "storage",
    "trials", "resume", "backend", "stack", "run_flags", "baseline", "user_args", "bridge_yaml", "task", "lora_rank",
    "lora_target_modules", "seed", "results_dir", "layers", "trial_steps", "trial_warmup_steps", "allow_config_args",
    "trial_timeout_s", "trial_profile_step", "prune_margin", "command_template", "ray_address", "parallel_trials",
    "trial_env", "gpu_hours", "policy", "stop_confidence", "stop_gain", "recalibrate_after", "confirm_runs",
    "heartbeat_interval_s", "heartbeat_grace_s",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneConfig:
    """Everything a tuning run depends on, by ``tune --help``'s option groups (:meth:`to_dict`)."""

    job: JobOptions
    cluster: ClusterOptions = dataclasses.field(default_factory=ClusterOptions)
    workload: WorkloadOptions = dataclasses.field(default_factory=WorkloadOptions)
    search: SearchOptions = dataclasses.field(default_factory=SearchOptions)
    trial: TrialOptions = dataclasses.field(default_factory=TrialOptions)
    store: StudyOptions = dataclasses.field(default_factory=StudyOptions)
    run: StackOptions = dataclasses.field(default_factory=StackOptions)

    @classmethod
    def from_dict(cls, flat: Mapping[str, Any], base: TuneConfig | None = None) -> TuneConfig:
        """The config of :meth:`to_dict`'s flat keys, the rest ``base``'s or the defaults."""
        left = dict(flat)
        groups: dict[str, Any] = {}
        for name, kind in get_type_hints(cls).items():
            own = {f.name: left.pop(f.name) for f in dataclasses.fields(kind) if f.name in left}
            groups[name] = kind(**own) if base is None else dataclasses.replace(getattr(base, name), **own)
        if left:
            raise TypeError(f"TuneConfig has no option {', '.join(left)}")
        return cls(**groups)

    @property
    def measured(self) -> bool:
        """Its backend's trials run on GPUs; a name not registered here counts as measured."""
        from launch.registry import BACKENDS, backend_class

        return self.search.backend not in BACKENDS or backend_class(self.search.backend).source == "measured"

    def study_name(self, model: ModelSpec, cluster: Cluster) -> str:
        """``--study``, or ``<model>[-L<layers>]-<cluster>-s<seq>-gbs<batch>`` and a suffix for each other input that
        differs from its default, so that it opens its own study. Obeys the ``--study`` name rule."""
        if self.store.study:
            return self.store.study
        w, cl, run = self.workload, self.cluster, self.run
        name = re.sub(r"\[\d+ layers?\]$", "", model.name)  # a --layers slice is named below
        base = Path(name).stem if name.endswith(".json") else name
        # a default name obeys the --study rule (_STUDY_NAME_RE), whatever a config.json path is called
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).lstrip("._-")[:64] or "model"
        sl = f"-L{self.job.layers}" if self.job.layers else ""
        extra = ""
        if w.precision != "bf16":
            extra += f"-{w.precision}"
        if cluster.network is not None and cluster.network.key != cluster.gpu.network:
            extra += f"-{cluster.network.key}"
        if cl.network_gbps is not None:
            extra += "-" + format(cl.network_gbps, "g").replace("+", "") + "gbps"
        if run.stack != "slime":
            extra += f"-{run.stack}"
        if cl.megatron_core is not None:
            release = "{}.{}".format(*megatron_core_version(cl.megatron_core))
            if release != NEWEST_MEGATRON_CORE:
                extra += f"-mc{release}"
        if w.task != "pretrain":
            extra += f"-{w.task}"
        if w.task == "lora" and w.lora_rank != 32:
            extra += str(w.lora_rank)
        if w.task == "lora" and tuple(w.lora_target_modules) != WorkloadOptions().lora_target_modules:
            extra += "-" + "+".join(m.removeprefix("linear_") for m in w.lora_target_modules)
        if run.run_flags:  # run options other than the stack's: a short digest of them
            import hashlib
            import json

            extra += "-r" + hashlib.sha1(
                json.dumps(run.run_flags, sort_keys=True, default=str).encode()).hexdigest()[:6]
        if self.measured:
            extra += f"-{self.search.backend}"
        return f"{base}{sl}-{cluster.label}-s{w.seq_length}-gbs{w.global_batch_size}{extra}"[:128]

    def to_dict(self) -> dict[str, Any]:
        """Every group's fields as one flat mapping (``config.yaml``), the storage URL without password."""
        d = {k: v for f in dataclasses.fields(self) for k, v in dataclasses.asdict(getattr(self, f.name)).items()}
        d["storage"] = None if self.store.storage is None else without_password(self.store.storage)
        return {k: d.pop(k) for k in _STORED_ORDER} | d


def n_trials(config: TuneConfig) -> int:
    """Layouts the run evaluates: ``--trials``, or :data:`DEFAULT_TRIALS` when None."""
    return config.search.trials if config.search.trials is not None else DEFAULT_TRIALS


def policy_params(prep: Any, max_trials: int) -> Any:
    """The :class:`tuner.study.policy.PolicyParams` of a prepared study (start-up prior: 60 s, 300 s multi-node)."""
    from tuner.study.policy import PolicyParams

    cfg, bars = prep.config.trial, prep.bars
    return PolicyParams(
        sigma=bars.throughput.sigma, bias=bars.throughput.mu, memory_sigma=bars.memory.sigma,
        **({"memory_shared": bars.memory.shared} if bars.memory.shared is not None else {}),
        confidence=cfg.stop_confidence, min_gain=cfg.stop_gain, steps=cfg.trial_steps,
        startup_s=60.0 if prep.cluster.num_gpus <= prep.cluster.gpus_per_node else 300.0,
        gpu_hours=cfg.gpu_hours, max_trials=max_trials,
    )


def cheapest_trial_gpu_hours(prep: Any) -> float:
    """GPU-hours of one trial of the quickest contender (start-up prior and steps); NaN if none."""
    pp = policy_params(prep, 1)
    step = prep.estimates.step_time_s[prep.contenders]
    return (float((pp.startup_s + pp.steps * float(step.min())) * prep.cluster.num_gpus / 3600) if len(step)
            else float("nan"))


def check_budget(prep: Any) -> None:
    """Refuse (TunerError) a ``--gpu-hours`` smaller than one trial of the quickest contender."""
    from tuner.study.policy import fmt_gpu_hours

    cfg = prep.config.trial
    if cfg.gpu_hours is None or not prep.config.measured or cfg.policy != "gain":
        return
    cheapest = cheapest_trial_gpu_hours(prep)
    if cfg.gpu_hours < cheapest:
        raise TunerError(f"--gpu-hours {cfg.gpu_hours:g}: one trial of the quickest candidate is predicted to cost "
                         f"{fmt_gpu_hours(cheapest)} GPU-hours ({prep.cluster.num_gpus} GPUs, start-up and "
                         f"{cfg.trial_steps} steps); give at least that")


def harness_without_te(backend: str) -> bool:
    """The study's trials run the harness (``local``, ``ray``) and TE is not importable here."""
    if not _runs_harness(backend):
        return False
    from launch.harness.spec import HarnessEnv

    return not HarnessEnv.detect().transformer_engine


def _runs_harness(backend: str) -> bool:
    """:attr:`launch.base.TrialBackend.runs_harness` of ``backend`` (False for a name not registered)."""
    from launch.registry import BACKENDS, backend_class

    return backend in BACKENDS and backend_class(backend).runs_harness


def run_options_for_backend(backend: str, megatron_core: str | None = None) -> RunOptions:
    """Run options the estimate assumes for a study's trials: the harness's (with or without TE) or production."""
    from specs import DEFAULT_RUN_OPTIONS, HARNESS_RUN_OPTIONS, HARNESS_TE_RUN_OPTIONS

    if _runs_harness(backend):
        opts = HARNESS_RUN_OPTIONS if harness_without_te(backend) else HARNESS_TE_RUN_OPTIONS
    else:
        opts = DEFAULT_RUN_OPTIONS
    return dataclasses.replace(opts, megatron_core=megatron_core) if megatron_core else opts


def study_run_options(config: TuneConfig) -> Any:
    """The :class:`specs.stacks.StackRun` of a study (``local`` and ``ray``: the harness's options)."""
    from specs.stacks import RunFlags, resolve_run_options

    given: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in (config.run.run_flags or {}).items()}
    flags = RunFlags(**given)
    backend, megatron_core = config.search.backend, config.cluster.megatron_core
    run = resolve_run_options(flags, config.run.stack, precision=config.workload.precision, megatron_core=megatron_core)
    if backend in ("local", "ray"):
        if run.flags:
            raise TunerError(f"--backend {backend}: real trials run the trial harness's own stack, so run flags "
                             f"({', '.join(run.flags)}) cannot apply; leave them out, or use --backend model or "
                             "command")
        return dataclasses.replace(run, options=run_options_for_backend(backend, megatron_core))
    return run


def trial_warmup_steps(config: TuneConfig) -> int:
    """The warm-up steps of a real trial: ``--trial-warmup-steps``, or half of ``--trial-steps`` when None."""
    t = config.trial
    return t.trial_steps // 2 if t.trial_warmup_steps is None else t.trial_warmup_steps


def trial_env_dict(items: Sequence[str]) -> dict[str, str]:
    """``--trial-env KEY=VALUE`` items as a dict (TunerError for an item that is not NAME=VALUE)."""
    out: dict[str, str] = {}
    for it in items:
        k, sep, v = str(it).partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise TunerError(f"--trial-env {it!r}: expected NAME=VALUE, e.g. --trial-env NCCL_IB_HCA=mlx5")
        out[k] = v
    return out


def _mask(url: str) -> str:
    """A storage URL with its password hidden."""
    return re.sub(r"(://[^:/@]+:)[^@/]*@", r"\1***@", url)


def without_password(url: str) -> str:
    """A storage URL without its password (``postgresql://user@host/db``): what a file or the study keeps."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1@", url)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate_config(config: TuneConfig) -> None:
    """Raise TunerError for the first bad flag or combination (nothing that needs the model or the hardware)."""
    t, st, headroom, layers = config.trial, config.store, config.search.memory_headroom, config.job.layers
    if st.study is not None and not _STUDY_NAME_RE.fullmatch(st.study):
        raise TunerError(
            f"--study {st.study!r}: a study name is 1-128 letters, digits, '.', '_', '+' or '-', starting with a "
            "letter or digit (it names the folder results/<study>/)"
        )
    if config.search.trials is not None and config.search.trials < 1:
        raise TunerError(f"--trials must be at least 1, got {config.search.trials}")
    if st.seed < 0 or st.seed >= 2**32:
        raise TunerError(f"--seed must be from 0 to 2**32 - 1, got {st.seed}")
    if layers is not None and (not _is_int(layers) or layers < 1):
        raise TunerError(f"--layers must be a positive integer (decoder layers of the slice), got {layers!r}")
    if t.prune_margin is not None and not (math.isfinite(t.prune_margin) and t.prune_margin >= 0):
        raise TunerError("--prune-margin must be a finite number >= 0 (negative: never prune), got "
                         f"{t.prune_margin}")
    if t.trial_steps < 1:
        raise TunerError(f"--trial-steps must be from 1 up, got {t.trial_steps}")
    if not 0 <= trial_warmup_steps(config) < t.trial_steps:
        raise TunerError(
            f"--trial-warmup-steps must be from 0 to {t.trial_steps - 1} (fewer than --trial-steps "
            f"{t.trial_steps}), got {t.trial_warmup_steps}"
        )
    from launch.registry import backend_class, backends_where

    name = config.search.backend
    backend = backend_class(name)  # its traits decide which backend-only flags it takes

    def _reads(flag: str) -> str:
        return backends_where(lambda b: flag in b.own_flags)

    if config.workload.task == "lora" and backend.source == "measured":
        raise TunerError(f"--task lora: the trials of --backend {name} would train every weight (the harness "
                         "and the command's layout arguments have no LoRA); use --backend "
                         f"{backends_where(lambda b: b.source != 'measured')} (predictions)")
    ps = t.trial_profile_step
    if ps is not None and not 1 <= ps <= t.trial_steps:
        raise TunerError(f"--trial-profile-step must be a step from 1 to --trial-steps ({t.trial_steps}), got "
                         f"{ps}")
    if ps is not None and "--trial-profile-step" not in backend.own_flags:
        raise TunerError(f"--trial-profile-step is for --backend {_reads('--trial-profile-step')} (its trial folders "
                         f"are on this machine; this run uses --backend {name})")
    if not (math.isfinite(t.trial_timeout_s) and t.trial_timeout_s > 0):
        raise TunerError(f"--trial-timeout must be a positive number of seconds, got {t.trial_timeout_s}")
    if config.cluster.megatron_core is not None:
        from specs import megatron_core_version

        megatron_core_version(config.cluster.megatron_core)
    if t.command_template and "--command-template" not in backend.own_flags:
        raise TunerError(f"--command-template is for --backend {_reads('--command-template')} (this run uses --backend "
                         f"{name})")
    if t.ray_address is not None and "--ray-address" not in backend.own_flags:
        raise TunerError(f"--ray-address is for --backend {_reads('--ray-address')} (this run uses --backend "
                         f"{name})")
    if t.ray_address is not None:
        from launch.ray_backend import parse_ray_address

        parse_ray_address(t.ray_address)
    if t.parallel_trials < 1:
        raise TunerError(f"--parallel-trials must be at least 1, got {t.parallel_trials!r}")
    if t.parallel_trials > 1 and "--parallel-trials" not in backend.own_flags:
        raise TunerError(f"--parallel-trials > 1 needs --backend {_reads('--parallel-trials')} (the {name} "
                         "backend runs one trial at a time)")
    trial_env_dict(t.trial_env)
    if t.confirm_runs < 0:
        raise TunerError("--confirm-runs must be 0 (no confirmation) or more runs per layout, got "
                         f"{t.confirm_runs!r}")
    if t.confirm_runs and backend.source != "measured":
        raise TunerError(f"--confirm-runs re-measures real trials; --backend {name} measures nothing "
                         f"(use --backend {backends_where(lambda b: b.source == 'measured')})")
    if t.recalibrate_after < 0:
        raise TunerError("--recalibrate-after must be 0 (never) or a number of measured trials, got "
                         f"{t.recalibrate_after!r}")
    if t.trial_env and "--trial-env" not in backend.own_flags:
        raise TunerError(f"--trial-env is for --backend {_reads('--trial-env')} (this run uses --backend "
                         f"{name})")
    if not 1 <= t.heartbeat_interval_s < t.heartbeat_grace_s:  # else a live trial would be failed as stale
        raise TunerError(f"the heartbeat grace period ({t.heartbeat_grace_s!r} s) must exceed its interval "
                         f"({t.heartbeat_interval_s!r} s, at least 1)")
    _validate_policy(config)
    if headroom is not None and not (math.isfinite(headroom) and 0 <= headroom < 1):
        raise TunerError(f"--memory-headroom must be a fraction from 0 to 1 (e.g. 0.07), got {headroom}")
    if st.storage is not None:
        _check_storage_syntax(st.storage)
    _check_results_dir(st.results_dir)


def _validate_policy(config: TuneConfig) -> None:
    """Raise TunerError for a bad flag of the real-trial search policy."""
    t = config.trial
    if t.gpu_hours is not None:
        if not (math.isfinite(t.gpu_hours) and t.gpu_hours > 0):
            raise TunerError(f"--gpu-hours must be a positive number of GPU-hours, got {t.gpu_hours}")
        if not config.measured:
            raise TunerError("--gpu-hours is a budget of real trials; --backend model measures nothing (use --backend "
                             "local, ray or command)")
    if t.policy not in POLICIES:
        raise TunerError(f"--trial-policy {t.policy!r}: accepted {', '.join(POLICIES)}")
    if t.policy == "queue" and (t.gpu_hours is not None
                                or (t.stop_gain, t.stop_confidence) != (_DEFAULT_STOP_GAIN, _DEFAULT_STOP_CONFIDENCE)):
        raise TunerError("--gpu-hours, --stop-gain and --stop-confidence drive the gain policy; --trial-policy queue "
                         "runs --trials layouts in the predicted order (leave them out, or use --trial-policy gain)")
    if t.policy == "gain" and config.measured and (t.confirm_runs or t.recalibrate_after != _DEFAULT_RECALIBRATE_AFTER):
        raise TunerError("--confirm-runs and --recalibrate-after belong to --trial-policy queue; the gain policy "
                         "repeats close rivals and learns from every measurement itself (leave them out, or use "
                         "--trial-policy queue)")
    if not (math.isfinite(t.stop_confidence) and 0 < t.stop_confidence < 1):
        raise TunerError("--stop-confidence must be a fraction strictly between 0 and 1 (e.g. 0.9), got "
                         f"{t.stop_confidence}")
    if not (math.isfinite(t.stop_gain) and 0 <= t.stop_gain < 1):
        raise TunerError(f"--stop-gain must be a fraction at least 0 and below 1 (e.g. 0.02), got {t.stop_gain}")
    if not config.measured and ((t.stop_gain, t.stop_confidence) != (_DEFAULT_STOP_GAIN, _DEFAULT_STOP_CONFIDENCE)):
        raise TunerError("--stop-gain and --stop-confidence stop real trials; --backend model measures nothing "
                         "(use --backend local, ray or command)")


def storage_file(url: str) -> Path | None:
    """The file of a file-backed storage (journal, SQLite) as written; None for any other URL."""
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        path = path[2:] if path.startswith("//") else path
        return Path(path) if path else None
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return None
    db = u.database or ""
    if not u.drivername.startswith("sqlite") or db in ("", ":memory:") or db.startswith("file:"):
        return None
    return Path(db)


def storage_place(url: str) -> str:
    """``url`` with its file resolved (two names of one file compare equal), without password."""
    f = storage_file(url)
    if f is None:
        return without_password(url)
    try:
        return ("journal:" if url.startswith("journal:") else "sqlite:///") + str(f.resolve())
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        return url


def _check_results_dir(results_dir: str) -> None:
    """Raise TunerError when ``--results-dir`` or a folder above it is a file."""
    p = Path(results_dir)
    for a in (p, *p.parents):
        if a.exists():
            if not a.is_dir():
                raise TunerError(f"--results-dir {results_dir!r}: {a} is a file, not a folder; give a folder (it will "
                                 "hold <results-dir>/<study>/)")
            return


def _check_storage_syntax(url: str) -> None:
    """Raises TunerError for a ``--storage`` that cannot be a storage URL (before any work)."""
    if not url:
        raise TunerError("--storage is empty; give an RDB URL (sqlite:///path.db, postgresql://...) or journal:PATH")
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if not path or path == "//":
            raise TunerError("--storage journal:PATH needs a file path, e.g. journal:/shared/tune/study.log")
    elif "://" not in url:
        raise TunerError(f"--storage {_mask(url)!r}: expected an RDB URL (sqlite:///path.db, "
                         "postgresql://user@host/db) or journal:PATH")
    elif url.split("?")[0] in ("sqlite://", "sqlite:///", "sqlite:///:memory:"):
        raise TunerError(f"--storage {url!r} is an in-memory database: the study would be lost when tune exits; give a "
                         "file, e.g. sqlite:///tune.db")
    else:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            dialect = make_url(url).get_dialect()  # the database kind is one SQLAlchemy knows
        except (ArgumentError, NoSuchModuleError, ValueError) as e:
            raise TunerError(f"--storage {_mask(url)!r}: not an RDB URL SQLAlchemy can open "
                             f"({_mask(str(e).splitlines()[0])}); give sqlite:///path.db, postgresql://user@host/db, "
                             "mysql://... or journal:PATH") from None
        try:
            dialect.import_dbapi()
        except ImportError as e:
            extra = (" (the postgres extra: pip install 'megatron-layout-tuner[postgres]')"
                     if url.startswith("postgres") else "")
            raise TunerError(f"--storage {_mask(url)!r}: its database driver is not installed ({e}); pip install "
                             f"{'psycopg[binary]' if 'psycopg' in str(e) else e.name or 'the driver'}{extra}") from None
