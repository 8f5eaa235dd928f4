"""The search on simulated clusters: how often a policy's final pick is within a few percent of the true best,
and what it spent, over worlds drawn from the model's error structure (:mod:`launch.simulated`).

Policies (:data:`POLICIES`):

* ``model``: no trial; the fastest predicted of the candidates that surely fit (:attr:`Prepared.surely_fits`);
* ``queue``: today's default before the trial policy: :func:`tuner.study.run_study` with ``policy="queue"`` over the
  candidates of a fixed ``--memory-headroom`` of 0.07 (:data:`TODAY_HEADROOM`), on a
  :class:`~launch.simulated.SimulatedBackend`;
* ``gain``: the same with the default configuration (``policy="gain"``, the error bars' pruning);
* ``random``: the default configuration's candidates in a random order, each a trial stopped by the study's pruner
  (the same margin), until the GPU-hours of ``gain`` (else of ``queue``) in the same world are spent.

A study's final pick is the measured layout with the highest throughput, its runs taken together
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

from launch.base import TrialFailed, TrialStopped
from launch.harness.pruner import StepTimePruner
from launch.simulated import ErrorStructure, SimulatedBackend, World, WorldTable
from specs.layout import Layout
from tuner.report import fastest_measured
from tuner.study import Prepared, TuneConfig, _optuna, prepare, run_study, trial_rows
from tuner.study.config import trial_warmup_steps
from tuner.study.run import POLICY_BEST_ATTR

__all__ = ["POLICIES", "TODAY_HEADROOM", "Case", "WorldResult", "prepare_case", "run_world", "summarize"]

#: Every policy the benchmark knows, in report order.
POLICIES = ("model", "queue", "gain", "random")

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
    today = prepare(dataclasses.replace(config, policy="queue", memory_headroom=TODAY_HEADROOM))
    base = WorldTable(new.model, new.cluster, new.workload, new.enumeration.valid, estimates=new.estimates,
                      calibration=new.calibration, options=new.options)
    return Case(new=new, today=today, base=base)


def _backend(world: World, cfg: TuneConfig) -> SimulatedBackend:
    return SimulatedBackend(world, steps=cfg.trial_steps, warmup_steps=trial_warmup_steps(cfg), timeout_s=cfg.trial_timeout_s)


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
    cfg = dataclasses.replace(prep.config, results_dir=tmp, seed=seed % 2**32)
    backend = _backend(world, cfg)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(_optuna, "ThreadSafeRDBStorage", _in_memory))
        result = run_study(dataclasses.replace(prep, config=cfg), backend=backend)
    rows = trial_rows(result.study)
    chosen = result.study.user_attrs.get(POLICY_BEST_ATTR)  # the gain policy's answer (posterior mean), if it named one
    best = next((r for r in rows if r["trial"] == chosen), None) or fastest_measured(rows)
    return (Layout.from_dict(best["layout"]) if best else None), backend


def _random(prep: Prepared, world: World, seed: int, gpu_hours: float) -> tuple[Layout | None, SimulatedBackend]:
    cfg = prep.config
    backend = _backend(world, cfg)
    pruner = StepTimePruner(warmup_steps=trial_warmup_steps(cfg), margin=cfg.prune_margin) if cfg.prune_margin is not None else None
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


def run_world(case: Case, seed: int, policies: Iterable[str], *, tmp_root: str | None = None,
              errors: ErrorStructure | None = None) -> list[WorldResult]:
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
    pickable = {"model": new.surely_fits, "queue": today.fits, "gain": new.contenders, "random": new.fits}
    out: dict[str, WorldResult] = {}

    def record(policy: str, pick: Layout | None, backend: SimulatedBackend | None) -> None:
        done = [t.true_step_time_s for t in backend.trials if t.outcome == "measured"] if backend else []
        out[policy] = WorldResult(
            policy=policy, seed=seed, regret=_regret(world, best_tps, pick), gpu_hours=backend.gpu_hours if backend else 0.0,
            trials=len(backend.trials) if backend else 0, outcomes=_outcomes(backend) if backend else {},
            pick=pick.label if pick else "",
            regret_best_measured=float(1.0 - world.tokens_per_s_per_gpu(min(done)) / best_tps) if done else math.nan,
            best_pruned=not bool(pickable[policy][best]))

    if "model" in wanted:
        fit = np.flatnonzero(new.surely_fits)
        row = int(fit[np.argmax(new.estimates.tokens_per_s_per_gpu[fit])])
        record("model", new.enumeration.valid.row(row), None)
    for policy, prep in (("queue", today), ("gain", new)):
        if policy in wanted:
            with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
                record(policy, *_study(prep, world, seed, tmp))
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
            "best_pruned": sum(r.best_pruned for r in rs) / len(rs),
        }
        tried = [r.regret_best_measured for r in rs if math.isfinite(r.regret_best_measured)]
        if tried:
            out[p]["regret_best_measured_median"] = _quantile(tried, 0.5)
            out[p]["best_measured_within_2pct"] = sum(x <= 0.02 for x in tried) / len(tried)
    return out
