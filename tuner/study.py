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
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import optuna
import yaml

from cost_model.calibration import Calibration, load_calibration
from cost_model.errors import InfeasibleLayout, TunerError
from cost_model.estimate import EstimateTable, estimate_table
from cost_model.specs import Cluster, ModelSpec, Workload, load_model, parse_gpus
from launch import TrialBackend, TrialFailed, get_backend
from search_spaces.layout import Layout, LayoutTable
from search_spaces.rules import check_layout
from search_spaces.space import Enumeration, SearchSpace, enumerate_layouts
from tuner.pareto import pareto_mask

__all__ = ["TuneConfig", "Prepared", "TuneResult", "prepare", "run_study", "trial_rows", "PARAM_NAMES"]

log = logging.getLogger(__name__)

#: Layout dimensions the sampler chooses, in the order they are suggested.
PARAM_NAMES = (
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "micro_batch_size",
    "recompute",
    "optimizer_offload_fraction",
    "dispatcher",
    "pipeline_split",
)


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
    """Trials to evaluate; None = the predicted front plus 32."""
    backend: str = "model"
    seed: int = 0
    results_dir: str = "results"

    def study_name(self, model: ModelSpec, cluster: Cluster) -> str:
        if self.study:
            return self.study
        base = Path(model.name).stem if model.name.endswith(".json") else model.name
        return f"{base}-{cluster.label}-s{self.seq_length}-gbs{self.global_batch_size}"

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
    keys: dict[str, int] = field(default_factory=dict)
    """Layout key -> row index of the valid table, for fitting layouts."""

    @property
    def n_valid(self) -> int:
        return len(self.enumeration.valid)

    @property
    def n_fit(self) -> int:
        return int(self.fits.sum())


def _recompute_label(row: dict[str, Any]) -> str:
    lay = Layout.from_dict(row)
    return lay.recompute_label


def _split_label(first: int, last: int) -> str:
    return "even" if not first and not last else f"{first}/{last}"


def _params_of(layout: Layout) -> dict[str, Any]:
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp,
        "cp": layout.cp,
        "ep": layout.ep,
        "etp": layout.etp,
        "micro_batch_size": layout.micro_batch_size,
        "recompute": layout.recompute_label,
        "optimizer_offload_fraction": layout.optimizer_offload_fraction,
        "dispatcher": layout.dispatcher.value,
        "pipeline_split": _split_label(layout.num_layers_in_first_pipeline_stage, layout.num_layers_in_last_pipeline_stage),
    }


def prepare(config: TuneConfig) -> Prepared:
    """Load inputs, enumerate, check rules and estimate every valid layout.

    Raises:
        TunerError: bad input (model, GPUs, space, calibration), or no layout of
            the space fits in memory (the message names the fewest GPUs that would).
    """
    model = load_model(config.model)
    cluster = parse_gpus(
        config.gpus,
        gpus_per_node=config.gpus_per_node,
        inter_node_bytes_per_s=config.network_gbps * 1e9 / 8 if config.network_gbps else None,
        usd_per_gpu_hour=config.usd_per_gpu_hour,
    )
    workload = Workload(seq_length=config.seq_length, global_batch_size=config.global_batch_size, precision=config.precision)
    space = SearchSpace.load(config.space)
    cal = load_calibration(config.calibration)
    t0 = time.perf_counter()
    en = enumerate_layouts(space, model, cluster.num_gpus, workload)
    t1 = time.perf_counter()
    est = estimate_table(model, cluster, workload, en.valid, calibration=cal, memory_headroom=config.memory_headroom)
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
        worst = ", ".join(f"{k} ({v})" for k, v in sorted(en.rule_counts.items(), key=lambda kv: -kv[1])[:3])
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
    step = cluster.gpus_per_node
    for mult in range(2, 65):
        n = cluster.num_gpus * mult if cluster.num_gpus < step else (cluster.num_nodes * mult) * step
        if n > 16384:
            break
        try:
            c2 = dataclasses.replace(cluster, num_gpus=n)
            en2 = enumerate_layouts(space, model, n, workload)
            if len(en2.valid) == 0:
                continue
            e2 = estimate_table(model, c2, workload, en2.valid, calibration=cal, memory_headroom=config.memory_headroom)
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


def _storage_url(config: TuneConfig, out_dir: Path) -> str:
    if config.storage:
        return config.storage
    return f"sqlite:///{(out_dir / 'study.db').as_posix()}"


def _check_study_config(study: optuna.Study, config: TuneConfig, name: str) -> None:
    old = study.user_attrs.get("config")
    if not old:
        return
    keys = ("model", "gpus", "gpus_per_node", "seq_length", "global_batch_size", "precision", "backend")
    diff = [k for k in keys if old.get(k) != config.to_dict().get(k)]
    if diff:
        was = ", ".join(f"{k}={old.get(k)!r}" for k in diff)
        now = ", ".join(f"{k}={config.to_dict().get(k)!r}" for k in diff)
        raise TunerError(
            f"study {name!r} already exists with {was}; this run asks for {now}. "
            "Use another --study name (or the same inputs to resume it)."
        )


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """Finished trials of a study as flat dicts (layout fields plus results), for reports and export."""
    rows = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        ua = t.user_attrs
        if "layout" not in ua:
            continue
        rows.append({"trial": t.number, **ua})
    return rows


def run_study(
    prep: Prepared,
    *,
    on_trial: Callable[[int, int], None] | None = None,
    backend: TrialBackend | None = None,
) -> TuneResult:
    """Create or resume the study and evaluate trials through the backend.

    Args:
        prep: the pruned candidates from :func:`prepare`.
        on_trial: called after every trial with (done, total), e.g. to move a progress bar.
        backend: overrides ``prep.config.backend`` (tests).

    Returns:
        The study and what this run added.

    Raises:
        TunerError: the study exists with different inputs, or the storage URL is bad.
    """
    cfg = prep.config
    name = cfg.study_name(prep.model, prep.cluster)
    out_dir = Path(cfg.results_dir) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    storage = _storage_url(cfg, out_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            directions=["maximize", "minimize"],
            sampler=optuna.samplers.TPESampler(seed=cfg.seed, multivariate=True, group=True, n_startup_trials=8),
            load_if_exists=True,
        )
    except (ValueError, ImportError) as e:  # bad storage URL, missing DB driver
        raise TunerError(f"--storage {storage!r}: cannot open the study ({e})") from None
    except Exception as e:  # SQLAlchemy errors: unwritable path, locked or corrupt file
        if type(e).__module__.startswith("sqlalchemy"):
            raise TunerError(f"--storage {storage!r}: cannot open the study ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        raise
    _check_study_config(study, cfg, name)
    study.set_user_attr("config", cfg.to_dict())
    study.set_user_attr("space", prep.space.to_dict())
    (out_dir / "config.yaml").write_text(
        yaml.safe_dump({"config": cfg.to_dict(), "space": prep.space.to_dict(), "calibration": prep.calibration.to_dict()}, sort_keys=False)
    )
    backend = backend or get_backend(cfg.backend, calibration=prep.calibration, memory_headroom=cfg.memory_headroom)

    valid = prep.enumeration.valid
    est = prep.estimates
    fit_idx = np.flatnonzero(prep.fits)
    fit_layouts = {valid.row(int(i)).key(): int(i) for i in fit_idx}
    prep.keys = fit_layouts
    seen: set[str] = {t.user_attrs["key"] for t in study.get_trials(deepcopy=False) if "key" in t.user_attrs and t.state.is_finished()}

    # Enqueue: the predicted front, then the fastest predicted candidates, not yet evaluated.
    order = list(prep.front) + [int(i) for i in fit_idx[np.argsort(-est.tokens_per_s_per_gpu[fit_idx])]]
    n_trials = cfg.trials if cfg.trials is not None else len(prep.front) + 32
    queued: list[int] = []
    qkeys: set[str] = set()
    for i in order:
        if len(queued) >= n_trials:
            break
        lay = valid.row(int(i))
        k = lay.key()
        if k in seen or k in qkeys:
            continue
        queued.append(int(i))
        qkeys.add(k)
    for i in queued[: max(n_trials // 2, min(len(prep.front), n_trials))]:
        study.enqueue_trial(_params_of(valid.row(i)), user_attrs={"enqueued": "predicted front / top candidate"})

    # Choices the sampler sees, from the valid table.
    choices = {
        "tp": sorted(set(valid["tp"].tolist())),
        "pp": sorted(set(valid["pp"].tolist())),
        "vpp": sorted(set(valid["vpp"].tolist())),
        "cp": sorted(set(valid["cp"].tolist())),
        "ep": sorted(set(valid["ep"].tolist())),
        "etp": sorted(set(valid["etp"].tolist())),
        "micro_batch_size": sorted(set(valid["micro_batch_size"].tolist())),
        "recompute": sorted({valid.row(int(i)).recompute_label for i in _first_of_each(valid, "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")}),
        "optimizer_offload_fraction": sorted(set(valid["optimizer_offload_fraction"].tolist())),
        "dispatcher": sorted(set(valid["dispatcher"].tolist())),
        "pipeline_split": sorted({_split_label(int(a), int(b)) for a, b in zip(valid["num_layers_in_first_pipeline_stage"], valid["num_layers_in_last_pipeline_stage"])}),
    }
    label_to_row = {}
    for i in _first_of_each(valid, "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"):
        lay = valid.row(int(i))
        label_to_row[lay.recompute_label] = lay
    template = valid.row(0)

    def build(params: dict[str, Any]) -> Layout:
        rec = label_to_row[params["recompute"]]
        split = params["pipeline_split"]
        first, last = (0, 0) if split == "even" else (int(x) for x in split.split("/"))
        return template.replace(
            tp=int(params["tp"]),
            pp=int(params["pp"]),
            vpp=int(params["vpp"]),
            cp=int(params["cp"]),
            ep=int(params["ep"]),
            etp=int(params["etp"]),
            micro_batch_size=int(params["micro_batch_size"]),
            sequence_parallel=int(params["tp"]) > 1,
            recompute_granularity=rec.recompute_granularity,
            recompute_method=rec.recompute_method,
            recompute_num_layers=rec.recompute_num_layers,
            recompute_modules=rec.recompute_modules,
            optimizer_offload_fraction=float(params["optimizer_offload_fraction"]),
            dispatcher=params["dispatcher"],
            num_layers_in_first_pipeline_stage=first,
            num_layers_in_last_pipeline_stage=last,
        )

    counters = {"evaluated": 0, "skipped": 0}

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        params = {p: trial.suggest_categorical(p, choices[p]) for p in PARAM_NAMES}
        lay = build(params)
        key = lay.key()
        trial.set_user_attr("key", key)
        trial.set_user_attr("label", lay.label)
        if key in seen:
            counters["skipped"] += 1
            trial.set_user_attr("skipped", "duplicate: this layout was already evaluated in this study")
            raise optuna.TrialPruned("duplicate layout")
        if key not in fit_layouts:
            counters["skipped"] += 1
            broken = check_layout(lay, prep.model, prep.workload)
            why = "; ".join(f"[{r}] {m}" for r, m in broken) if broken else "predicted not to fit in memory"
            trial.set_user_attr("skipped", why)
            seen.add(key)
            raise optuna.TrialPruned(why)
        seen.add(key)
        try:
            m = backend.run(lay, model=prep.model, cluster=prep.cluster, workload=prep.workload)
        except TrialFailed as e:
            trial.set_user_attr("failure", e.kind.value)
            trial.set_user_attr("log_path", e.log_path)
            trial.set_user_attr("layout", lay.to_dict())
            raise
        except InfeasibleLayout as e:
            counters["skipped"] += 1
            trial.set_user_attr("skipped", str(e))
            raise optuna.TrialPruned(str(e)) from None
        row = fit_layouts[key]
        trial.set_user_attr("layout", lay.to_dict())
        trial.set_user_attr("source", m.source)
        trial.set_user_attr("tokens_per_s_per_gpu", m.tokens_per_s_per_gpu)
        trial.set_user_attr("peak_gib", m.peak_bytes / 2**30)
        trial.set_user_attr("headroom_gib", (prep.cluster.gpu.hbm_bytes - m.peak_bytes) / 2**30)
        trial.set_user_attr("pred_tokens_per_s_per_gpu", float(est.tokens_per_s_per_gpu[row]))
        trial.set_user_attr("pred_peak_gib", float(est.peak_bytes[row]) / 2**30)
        trial.set_user_attr("pred_step_time_s", float(est.step_time_s[row]))
        trial.set_user_attr("mfu", 6.0 * prep.model.active_params() * m.tokens_per_s_per_gpu / prep.cluster.gpu.peak_flops_bf16)
        trial.set_user_attr("pred_model_tflops_per_gpu", float(est.model_tflops_per_gpu[row]))
        trial.set_user_attr("usd_per_million_tokens", prep.cluster.usd_per_gpu_hour / (m.tokens_per_s_per_gpu * 3600) * 1e6)
        trial.set_user_attr("step_time_s", float(np.median(m.step_times_s)) if m.step_times_s else float("nan"))
        counters["evaluated"] += 1
        return m.tokens_per_s_per_gpu, m.peak_bytes / 2**30

    done = {"n": 0}

    def _cb(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        done["n"] += 1
        if on_trial:
            on_trial(done["n"], n_trials)

    try:
        study.optimize(objective, n_trials=n_trials, callbacks=[_cb], catch=(TrialFailed,), gc_after_trial=False)
    finally:
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
    )


def _first_of_each(table: LayoutTable, *cols: str) -> list[int]:
    """Row index of the first occurrence of each distinct combination of ``cols``."""
    if len(table) == 0:
        return []
    key = table[cols[0]].astype(str)
    for c in cols[1:]:
        key = np.char.add(np.char.add(key, "|"), table[c].astype(str))
    _, first = np.unique(key, return_index=True)
    return sorted(int(i) for i in first)
