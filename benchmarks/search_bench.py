"""The search on simulated clusters: how often a policy's final pick is within a few percent of the true best,
and what it spent, over worlds drawn from the model's error structure (:mod:`benchmarks.simulated`).

Policies (:data:`POLICIES`):

* ``model``: no trial; the fastest predicted of the candidates that surely fit (:attr:`Prepared.surely_fits`);
* ``queue``: today's default before the trial policy: :func:`tuner.study.run_study` with ``policy="queue"`` over the
  candidates of a fixed ``--memory-headroom`` of 0.07 (:data:`TODAY_HEADROOM`), on a
  :class:`~benchmarks.simulated.SimulatedBackend`;
* ``gain``: the same with the default configuration (``policy="gain"``, the error bars' pruning);
* ``random``: the default configuration's candidates in a random order, each a trial stopped by the study's pruner
  (the same margin), until the GPU-hours of ``gain`` (else of ``queue``) in the same world are spent;
* ``gain+slice``: the gain policy with slice trials (:class:`~tuner.study.policy.GainPolicy` given each candidate's
  slice, :meth:`~benchmarks.simulated.SimulatedBackend.run_slice`), driven by this module's own loop (:func:`gain_loop`:
  the study's policy loop without Optuna: the same candidates, prior, pruner and stopping rule); no real backend
  offers slice trials;
* ``slice-a2a``: ``gain+slice`` where a slice sees nothing of an all-to-all across nodes (``a2a="in-node"``);
* ``slice-noa2a``: ``gain+slice`` where a slice sees nothing of the all-to-all (``a2a="none"``);
* ``slice-300s``: ``gain+slice`` with a slice start-up of 300 s (a full-scale trial's at 64 GPUs) in place of
  :data:`~benchmarks.simulated.SLICE_STARTUP_S`;
* ``gain-loop``: :func:`gain_loop` without slices (to compare the loop with the study's ``gain``).

A slice never becomes the pick: the gain policy's answer is its incumbent, a layout measured in full. A study's
final pick (``queue``) is the measured layout with the highest throughput, its runs taken together
(:func:`tuner.study.trial_rows`, :func:`tuner.report.fastest_measured`). Regret = 1 - true throughput of the pick /
true throughput of the world's best layout: the fastest of *all* valid layouts that truly fit, those the model
pruned included. A pick that truly does not fit (``model`` only: trials pick measured layouts) has regret 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import optuna

from benchmarks.simulated import SLICE_STARTUP_S, ErrorStructure, SimulatedBackend, World, WorldTable, slice_plan
from launch.base import FailureKind, TrialFailed, TrialStopped
from launch.harness.pruner import StepTimePruner
from specs.layout import Layout
from tuner.report import fastest_measured
from tuner.study import Prepared, TuneConfig, _optuna, prepare, run_study, trial_rows
from tuner.study.candidates import CandidateIndex
from tuner.study.config import n_trials, policy_params, trial_warmup_steps
from tuner.study.policy import GainPolicy
from tuner.study.run import POLICY_BEST_ATTR

__all__ = [
    "POLICIES", "SLICE_POLICIES", "TODAY_HEADROOM", "Case", "WorldResult", "gain_loop", "prepare_case", "run_world",
    "summarize",
]

#: The policies of :func:`gain_loop`: (slices, the all-to-all a slice sees (:func:`~benchmarks.simulated.slice_plan`),
#: slice start-up seconds).
SLICE_POLICIES: dict[str, tuple[bool, str, float]] = {
    "gain-loop": (False, "all", SLICE_STARTUP_S),
    "gain+slice": (True, "all", SLICE_STARTUP_S),
    "slice-a2a": (True, "in-node", SLICE_STARTUP_S),
    "slice-noa2a": (True, "none", SLICE_STARTUP_S),
    "slice-300s": (True, "all", 300.0),
}

#: Every policy the benchmark knows, in report order.
POLICIES = ("model", "queue", "gain", *SLICE_POLICIES, "random")

#: The fixed memory headroom of the ``queue`` policy's candidates: the default before the error bars (the largest
#: under-prediction of the reserved peak measured on H200 plus one point, docs/validation.md).
TODAY_HEADROOM = 0.07


@dataclass(frozen=True, slots=True)
class WorldResult:
    """One policy in one world."""

    policy: str
    seed: int
    regret: float
    """1 - true throughput of the pick / the world's true best (1: no pick, or a pick that does not fit)."""
    gpu_hours: float
    trials: int
    outcomes: dict[str, int]
    """Trials by outcome: measured, pruned, oom, crash, timeout."""
    pick: str
    """The pick's label ("" when none)."""
    regret_best_measured: float = math.nan
    """The regret of the truly fastest layout this policy measured to the end (NaN: none, or no trial): the part of
    :attr:`regret` that the search left (the rest is the pick's noise)."""
    slices: int = 0
    """Slice trials (``gain+slice``; not counted in :attr:`trials`, their GPU-hours in :attr:`gpu_hours`)."""
    best_pruned: bool = False
    """The world's true best was not among the layouts this policy could pick (pruned before any trial: the
    candidates of its configuration; ``gain``: those not surely slower, :attr:`Prepared.contenders`)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Case:
    """One job prepared once for every world: the default configuration's candidates (``new``), those of the
    fixed headroom of the ``queue`` policy (``today``), and the table the worlds are drawn on."""

    new: Prepared
    today: Prepared
    base: WorldTable


def prepare_case(config: TuneConfig) -> Case:
    """The candidates of ``config`` (:func:`tuner.study.prepare`), with ``policy="queue"`` and ``memory_headroom``
    :data:`TODAY_HEADROOM` as well, and the table every world of the case is drawn on: done once per case.

    Raises:
        TunerError: what :func:`tuner.study.prepare` raises.
    """
    new = prepare(config)
    # the queue policy takes no GPU-hour budget (--gpu-hours belongs to the gain policy)
    today = prepare(TuneConfig.from_dict(dict(policy="queue", memory_headroom=TODAY_HEADROOM, gpu_hours=None), config))
    base = WorldTable(
        new.model, new.cluster, new.workload, new.enumeration.valid, estimates=new.estimates,
        calibration=new.calibration, options=new.options,
    )
    return Case(new=new, today=today, base=base)


def _backend(world: World, cfg: TuneConfig) -> SimulatedBackend:
    return SimulatedBackend(
        world, steps=cfg.trial.trial_steps, warmup_steps=trial_warmup_steps(cfg), timeout_s=cfg.trial.trial_timeout_s
    )


def _outcomes(backend: SimulatedBackend) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in backend.trials:
        out[t.outcome] = out.get(t.outcome, 0) + 1
    return out


def _regret(world: World, best_tps: float, layout: Layout | None) -> float:
    if layout is None:
        return 1.0
    step, peak = world.truth_of(layout)
    if peak > world.cluster.gpu.hbm_bytes:
        return 1.0
    return float(1.0 - world.tokens_per_s_per_gpu(step) / best_tps)


def _in_memory(url: str, **_: Any) -> optuna.storages.BaseStorage:
    """Optuna's in-memory storage in place of a study's own SQLite file (the same trials, without the database's
    bookkeeping, most of a simulated study's time)."""
    return optuna.storages.InMemoryStorage()


def _study(prep: Prepared, world: World, seed: int, tmp: str) -> tuple[Layout | None, SimulatedBackend]:
    cfg = TuneConfig.from_dict(dict(results_dir=tmp, seed=seed % 2**32), prep.config)
    backend = _backend(world, cfg)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(_optuna, "ThreadSafeRDBStorage", _in_memory))
        result = run_study(dataclasses.replace(prep, config=cfg), backend=backend)
    rows = trial_rows(result.study)
    chosen = result.study.user_attrs.get(POLICY_BEST_ATTR)  # the gain policy's answer (posterior mean), if it named one
    best = next((r for r in rows if r.trial == chosen), None) or fastest_measured(rows)
    return (best.layout if best else None), backend


def _random(prep: Prepared, world: World, seed: int, gpu_hours: float) -> tuple[Layout | None, SimulatedBackend]:
    cfg = prep.config
    backend = _backend(world, cfg)
    pruner = (
        StepTimePruner(warmup_steps=trial_warmup_steps(cfg), margin=cfg.trial.prune_margin)
        if cfg.trial.prune_margin is not None
        else None
    )
    rows = np.flatnonzero(prep.fits)
    order = np.random.default_rng([seed, 5]).permutation(rows)
    best: tuple[float, Layout] | None = None
    for i in order:
        if backend.gpu_hours >= gpu_hours:
            break
        lay = prep.enumeration.valid.row(int(i))
        best_tps = best[0] if best else None

        def report(tps: Sequence[float], _best: float | None = best_tps) -> str | None:
            return pruner.decide(list(tps), _best) if pruner else None

        try:
            m = backend.run(lay, model=prep.model, cluster=prep.cluster, workload=prep.workload, reporter=report)
        except (TrialFailed, TrialStopped):
            continue
        if best is None or m.tokens_per_s_per_gpu > best[0]:
            best = (m.tokens_per_s_per_gpu, lay)
    return (best[1] if best else None), backend


def gain_loop(
    prep: Prepared, world: World, *, slices: bool, a2a: str = "all", slice_startup_s: float = SLICE_STARTUP_S
) -> tuple[Layout | None, SimulatedBackend]:
    """The study's gain policy loop, one trial at a time, without Optuna: the contenders (:attr:`Prepared.contenders`),
    :func:`~tuner.study.config.policy_params`, full trials stopped by the study's pruner against the best measured
    first run, a pruned trial fed back as the median of its steps after the warm-up; with ``slices``, the policy is
    given each contender's slice (:func:`~benchmarks.simulated.slice_plan`; the unseen error's sigma,
    :meth:`~benchmarks.simulated.World.slice_unseen_sigma`, from the world's error structure, not its draws) and slice
    trials run on :meth:`~benchmarks.simulated.SimulatedBackend.run_slice`. Returns the policy's answer (its incumbent,
    a
    layout measured in full) and the backend (its trials and GPU-hours)."""
    cfg = prep.config
    backend = _backend(world, cfg)
    rows = np.flatnonzero(prep.contenders)
    est = prep.estimates
    index = CandidateIndex(prep.enumeration.valid, prep.fits)
    codes = np.stack([index.codes[d][rows] for d in index.params] or [np.zeros(len(rows), dtype=np.int64)], axis=1)
    params = dataclasses.replace(policy_params(prep, n_trials(cfg)), slice_startup_s=slice_startup_s)
    extra: dict[str, Any] = {}
    if slices:
        plan = slice_plan(prep.model, prep.cluster, prep.enumeration.valid, est, a2a=a2a)
        extra = {
            "slice_step_time_s": plan.predicted_step_time_s[rows],
            "slice_gpus": plan.gpus[rows].astype(np.float64),
            "slice_sigma": world.slice_unseen_sigma(plan)[rows],
        }
    policy = GainPolicy(
        predicted=est.tokens_per_s_per_gpu[rows],
        step_time_s=est.step_time_s[rows],
        peak_bytes=est.peak_bytes[rows],
        codes=codes,
        hbm_bytes=prep.cluster.gpu.hbm_bytes,
        gpus=prep.cluster.num_gpus,
        params=params,
        **extra,
    )
    pruner = (
        StepTimePruner(warmup_steps=trial_warmup_steps(cfg), margin=cfg.trial.prune_margin)
        if cfg.trial.prune_margin is not None
        else None
    )
    warm = trial_warmup_steps(cfg)
    best: float | None = None
    while True:
        d = policy.next()
        if d.index is None:
            break
        lay = prep.enumeration.valid.row(int(rows[d.index]))
        before = backend.gpu_seconds
        if d.slice:
            try:
                m = backend.run_slice(lay, a2a=a2a, startup_s=slice_startup_s)
                ratio: float | None = m.predicted_step_time_s / m.step_time_s
            except TrialFailed:
                ratio = None
            policy.observe_slice(d.index, ratio, gpu_hours=(backend.gpu_seconds - before) / 3600)
            continue

        def report(tps: Sequence[float], _best: float | None = best, _repeat: bool = d.repeat) -> str | None:
            return pruner.decide(list(tps), _best) if pruner is not None and not _repeat else None

        try:
            meas = backend.run(lay, model=prep.model, cluster=prep.cluster, workload=prep.workload, reporter=report)
        except TrialStopped as e:
            steps = list(e.tokens_per_s_per_gpu)
            policy.observe(
                d.index,
                float(np.median(steps[warm:] or steps)),
                gpu_hours=(backend.gpu_seconds - before) / 3600,
                pruned=True,
            )
            continue
        except TrialFailed as e:
            policy.observe(
                d.index,
                None,
                gpu_hours=(backend.gpu_seconds - before) / 3600,
                failed=True,
                out_of_memory=e.kind == FailureKind.oom,
            )
            continue
        policy.observe(
            d.index, meas.tokens_per_s_per_gpu, gpu_hours=(backend.gpu_seconds - before) / 3600,
            peak_bytes=meas.peak_bytes,
        )
        if not d.repeat:
            best = meas.tokens_per_s_per_gpu if best is None else max(best, meas.tokens_per_s_per_gpu)
    inc = policy.incumbent()
    return (prep.enumeration.valid.row(int(rows[inc])) if inc is not None else None), backend


def run_world(
    case: Case, seed: int, policies: Iterable[str], *, tmp_root: str | None = None, errors: ErrorStructure | None = None
) -> list[WorldResult]:
    """Draw world ``seed`` on ``case.base`` (with ``errors``; None: the job's error bars) and run each policy in it
    (``random`` after ``gain`` / ``queue``, whose GPU-hours it spends; with neither it is skipped). Studies run in a
    temporary folder under ``tmp_root``.

    Raises:
        ValueError: an unknown policy.
    """
    wanted = list(policies)
    bad = [p for p in wanted if p not in POLICIES]
    if bad:
        raise ValueError(f"policies {bad}: available {', '.join(POLICIES)}")
    world = World(case.base, seed=seed, errors=errors)
    best = world.best_row()
    if best is None:
        return []
    best_tps = float(world.true_tokens_per_s_per_gpu[best])
    new, today = case.new, case.today
    pickable = {
        "model": new.surely_fits,
        "queue": today.fits,
        "gain": new.contenders,
        "random": new.fits,
        **{p: new.contenders for p in SLICE_POLICIES},
    }
    out: dict[str, WorldResult] = {}

    def record(policy: str, pick: Layout | None, backend: SimulatedBackend | None) -> None:
        done = [t.true_step_time_s for t in backend.trials if t.outcome == "measured"] if backend else []
        full = [t for t in backend.trials if not t.outcome.startswith("slice")] if backend else []
        out[policy] = WorldResult(
            policy=policy,
            seed=seed,
            regret=_regret(world, best_tps, pick),
            gpu_hours=backend.gpu_hours if backend else 0.0,
            trials=len(full),
            slices=len(backend.trials) - len(full) if backend else 0,
            outcomes=_outcomes(backend) if backend else {},
            pick=pick.label if pick else "",
            regret_best_measured=float(1.0 - world.tokens_per_s_per_gpu(min(done)) / best_tps) if done else math.nan,
            best_pruned=not bool(pickable[policy][best]),
        )

    if "model" in wanted:
        fit = np.flatnonzero(new.surely_fits)
        row = int(fit[np.argmax(new.estimates.tokens_per_s_per_gpu[fit])])
        record("model", new.enumeration.valid.row(row), None)
    for policy, prep in (("queue", today), ("gain", new)):
        if policy in wanted:
            with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
                record(policy, *_study(prep, world, seed, tmp))
    for policy, (slices, a2a, startup) in SLICE_POLICIES.items():
        if policy in wanted:
            record(policy, *gain_loop(new, world, slices=slices, a2a=a2a, slice_startup_s=startup))
    if "random" in wanted:
        ref = out.get("gain") or out.get("queue")
        if ref is not None:
            record("random", *_random(new, world, seed, ref.gpu_hours))
    return [out[p] for p in POLICIES if p in out]


def _quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q)) if xs else math.nan


def summarize(results: Iterable[WorldResult]) -> dict[str, dict[str, Any]]:
    """Per policy: worlds, share within 5% and 2% of the true best, median and 90th-percentile regret, median and
    90th-percentile GPU-hours, median trials, share of worlds whose true best was pruned before any trial; where
    known, the median :attr:`WorldResult.regret_best_measured` and the share of it within 2%."""
    by: dict[str, list[WorldResult]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for p in POLICIES:
        rs = by.get(p)
        if not rs:
            continue
        reg = [r.regret for r in rs]
        out[p] = {
            "worlds": len(rs),
            "within_5pct": sum(x <= 0.05 for x in reg) / len(rs),
            "within_2pct": sum(x <= 0.02 for x in reg) / len(rs),
            "regret_median": _quantile(reg, 0.5),
            "regret_p90": _quantile(reg, 0.9),
            "gpu_hours_median": _quantile([r.gpu_hours for r in rs], 0.5),
            "gpu_hours_p90": _quantile([r.gpu_hours for r in rs], 0.9),
            "trials_median": _quantile([float(r.trials) for r in rs], 0.5),
            "slices_median": _quantile([float(r.slices) for r in rs], 0.5),
            "best_pruned": sum(r.best_pruned for r in rs) / len(rs),
        }
        tried = [r.regret_best_measured for r in rs if math.isfinite(r.regret_best_measured)]
        if tried:
            out[p]["regret_best_measured_median"] = _quantile(tried, 0.5)
            out[p]["best_measured_within_2pct"] = sum(x <= 0.02 for x in tried) / len(tried)
    return out
