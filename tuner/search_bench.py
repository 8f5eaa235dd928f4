"""The search on simulated clusters: how often a policy's final pick is within a few percent of the true best,
and what it spent, over worlds drawn from the model's error structure (:mod:`launch.simulated`).

Policies (:data:`POLICIES`):

* ``model``: no trial; the candidate with the highest predicted throughput;
* ``queue``: :func:`tuner.study.run_study` with the study's default configuration (``policy="queue"`` where the
  configuration has a ``policy`` field) on a :class:`~launch.simulated.SimulatedBackend`;
* ``gain``: the same with ``policy="gain"`` (only where :class:`~tuner.study.TuneConfig` has that field);
* ``random``: the candidates in a random order, each a trial stopped by the study's pruner (the same margin), until
  the GPU-hours of ``gain`` (else of ``queue``) in the same world are spent.

A study's final pick is the measured layout with the highest throughput, its runs taken together
(:func:`tuner.study.trial_rows`, :func:`tuner.report.fastest_measured`). Regret = 1 - true throughput of the pick /
true throughput of the world's best layout: the fastest of *all* valid layouts that truly fit, those the model
pruned included. A pick that truly does not fit (``model`` only: trials pick measured layouts) has regret 1.
"""

from __future__ import annotations

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
from launch.simulated import SimulatedBackend, World, WorldTable
from specs.layout import Layout
from tuner.report import fastest_measured
from tuner.study import Prepared, TuneConfig, _optuna, prepare, run_study, trial_rows
from tuner.study.config import trial_warmup_steps

__all__ = ["POLICIES", "WorldResult", "available_policies", "prepare_case", "run_world", "summarize"]

#: Every policy the benchmark knows, in report order.
POLICIES = ("model", "queue", "gain", "random")


def _has_policy_field() -> bool:
    return any(f.name == "policy" for f in dataclasses.fields(TuneConfig))


def available_policies() -> tuple[str, ...]:
    """The policies this code can run: ``gain`` only where :class:`TuneConfig` has a ``policy`` field."""
    return tuple(p for p in POLICIES if p != "gain" or _has_policy_field())


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
    best_pruned: bool
    """The world's true best was not among the study's candidates (pruned before any trial)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def prepare_case(config: TuneConfig) -> tuple[Prepared, WorldTable]:
    """The candidates of ``config`` (:func:`tuner.study.prepare`) and the table every world of the case is drawn
    on: done once per case.

    Raises:
        TunerError: what :func:`tuner.study.prepare` raises.
    """
    prep = prepare(config)
    base = WorldTable(prep.model, prep.cluster, prep.workload, prep.enumeration.valid, estimates=prep.estimates,
                      calibration=prep.calibration, options=prep.options)
    return prep, base


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


def _study(prep: Prepared, world: World, policy: str, seed: int, tmp: str) -> tuple[Layout | None, SimulatedBackend]:
    changes: dict[str, Any] = {"results_dir": tmp, "seed": seed % 2**32}
    if _has_policy_field():
        changes["policy"] = policy
    cfg = dataclasses.replace(prep.config, **changes)
    backend = _backend(world, cfg)
    with mock.patch.object(_optuna, "ThreadSafeRDBStorage", _in_memory):
        result = run_study(dataclasses.replace(prep, config=cfg), backend=backend)
    best = fastest_measured(trial_rows(result.study))
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


def run_world(prep: Prepared, base: WorldTable, seed: int, policies: Iterable[str], *, tmp_root: str | None = None) -> list[WorldResult]:
    """Draw world ``seed`` on ``base`` and run each policy in it (``random`` after ``gain`` / ``queue``, whose
    GPU-hours it spends; with neither it is skipped). Studies run in a temporary folder under ``tmp_root``.

    Raises:
        ValueError: an unknown policy, or ``gain`` where :class:`TuneConfig` has no ``policy`` field.
    """
    wanted = list(policies)
    bad = [p for p in wanted if p not in available_policies()]
    if bad:
        raise ValueError(f"policies {bad} cannot run here; available: {', '.join(available_policies())}")
    world = World(base, seed=seed)
    best = world.best_row()
    if best is None:
        return []
    best_tps = float(world.true_tokens_per_s_per_gpu[best])
    best_pruned = not bool(prep.fits[best])
    out: dict[str, WorldResult] = {}

    def record(policy: str, pick: Layout | None, backend: SimulatedBackend | None) -> None:
        out[policy] = WorldResult(
            policy=policy, seed=seed, regret=_regret(world, best_tps, pick), gpu_hours=backend.gpu_hours if backend else 0.0,
            trials=len(backend.trials) if backend else 0, outcomes=_outcomes(backend) if backend else {},
            pick=pick.label if pick else "", best_pruned=best_pruned)

    if "model" in wanted:
        fit = np.flatnonzero(prep.fits)
        row = int(fit[np.argmax(prep.estimates.tokens_per_s_per_gpu[fit])])
        record("model", prep.enumeration.valid.row(row), None)
    for policy in ("queue", "gain"):
        if policy in wanted:
            with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
                record(policy, *_study(prep, world, policy, seed, tmp))
    if "random" in wanted:
        ref = out.get("gain") or out.get("queue")
        if ref is not None:
            record("random", *_random(prep, world, seed, ref.gpu_hours))
    return [out[p] for p in POLICIES if p in out]


def _quantile(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q)) if xs else math.nan


def summarize(results: Iterable[WorldResult]) -> dict[str, dict[str, Any]]:
    """Per policy: worlds, share within 5% and 2% of the true best, median and 90th-percentile regret, median and
    90th-percentile GPU-hours, median trials, share of worlds whose true best was pruned before any trial."""
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
    return out
