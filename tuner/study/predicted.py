"""Trials of a backend that measures nothing (``model``: milliseconds a layout, less than a storage transaction).

The sampler (NSGA-II, same seed) runs on an in-memory study through ``ask``/``tell``; only evaluated layouts reach
the study's storage, each written whole: on the default storage in batches of one transaction
(:func:`tuner.study._optuna.add_finished_trials`, every :data:`FLUSH_EVERY_S` seconds or :data:`FLUSH_EVERY` trials
and when the run ends); on a shared storage claimed as a RUNNING trial, checked against the other workers' trials and
finished (``docs/benchmarks.md``). Skipped proposals are drawn again within the same trial
(:class:`CandidateSampler`) and never written.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from cost_model.types import Estimate
from launch import TrialFailed
from specs.errors import InfeasibleLayout
from tuner.study import _optuna
from tuner.study.proposals import DUPLICATE, QUEUED_FALLBACK, QUEUED_FIRST, Proposal
from tuner.study.records import TrialRecord, claimed_elsewhere, failure_of, prediction_of, result_of, summary_of

if TYPE_CHECKING:
    from tuner.study.run import StudyRun

__all__ = ["FLUSH_EVERY", "FLUSH_EVERY_S", "CandidateSampler", "PredictedTrials", "Queued", "memo_parents"]

#: Evaluated trials written to the default storage at least this often (trials, seconds).
FLUSH_EVERY = 256
FLUSH_EVERY_S = 2.0


def memo_parents(sampler: optuna.samplers.NSGAIISampler) -> optuna.samplers.NSGAIISampler:
    """``sampler`` with each generation's parents cached in memory (Optuna scans every trial at each proposal),
    returned as Optuna's cache returns them."""
    own = sampler.get_parent_population
    parents: dict[tuple[int, int], list[FrozenTrial]] = {}
    selected: set[tuple[int, int]] = set()

    def get_parent_population(study: optuna.Study, generation: int) -> list[FrozenTrial]:
        key = (id(study), generation)
        if key in parents:
            return parents[key]
        got = own(study, generation)
        if key in selected or generation == 0:
            parents[key] = got
        else:
            selected.add(key)
        return got

    sampler.get_parent_population = get_parent_population  # type: ignore[method-assign]
    return sampler


@dataclass(frozen=True, slots=True)
class Queued:
    """A candidate put in front of the sampler (:meth:`CandidateSampler.push`)."""

    params: dict[str, str]
    attrs: dict[str, Any]
    """The user attributes its trial records (``enqueued``, ``repeat_of``)."""
    repeat: bool = False
    """A run again of a layout the study evaluated (not a duplicate)."""


@dataclass(frozen=True, slots=True)
class Sampled:
    """What :class:`CandidateSampler` settled on for one trial."""

    proposal: Proposal | None
    """The layout to run; None: the run stops sampling (a fallback is queued, or the space ran out)."""
    fallback: int | None
    """Row of the candidate to queue after :data:`~tuner.study.proposals.FALLBACK_AFTER_SKIPS` skips in a row."""
    attrs: dict[str, Any] | None = None
    """The user attributes of a queued candidate's trial (None: sampled by the inner sampler)."""


class CandidateSampler(optuna.samplers.BaseSampler):
    """A sampler (``inner``, NSGA-II) whose trials are only layouts to run: the queued candidates (:meth:`push`)
    first, then (``explore``) ``inner``'s samples; a proposal ``propose`` skips is counted by ``note_skip`` and drawn
    again in the same trial until one runs, ``note_skip`` returns a fallback row (proposed here with ``fallback``,
    else left to the caller) or ``stop()``. Trials are told apart by Optuna's trial id."""

    def __init__(self, inner: optuna.samplers.BaseSampler, distributions: dict[str, BaseDistribution],
                 propose: Callable[[dict[str, str], bool], Proposal | None], note_skip: Callable[[], int | None],
                 stop: Callable[[], bool], *, fallback: Callable[[int], Queued] | None = None,
                 explore: bool = True) -> None:
        self.inner = inner
        self.distributions = distributions
        self._propose, self._note_skip, self._stop = propose, note_skip, stop
        self._fallback, self.explore = fallback, explore
        self._sampled: dict[int, Sampled] = {}
        self.queue: collections.deque[Queued] = collections.deque()
        """Candidates proposed before the inner sampler is asked (:meth:`push`)."""

    def push(self, params: dict[str, str], attrs: dict[str, Any], *, repeat: bool = False) -> None:
        """Queue a candidate: the next trial this process samples takes it, unless ``propose`` skips it then."""
        self.queue.append(Queued(params, attrs, repeat))

    def take(self, trial_id: int) -> Sampled | None:
        """What the trial of this id settled on, once; None for a trial whose parameters were fixed."""
        return self._sampled.pop(trial_id, None)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def _settle(self, trial: FrozenTrial, sampled: Sampled, params: dict[str, Any]) -> dict[str, Any]:
        self._sampled[_optuna.trial_id_of(trial)] = sampled
        return params

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        while True:
            try:
                q = self.queue.popleft()
            except IndexError:
                break
            prop = self._propose(q.params, q.repeat)
            if prop is not None and prop.skip is None:
                return self._settle(trial, Sampled(prop, None, q.attrs), q.params)
        if not self.explore or self._stop():
            return self._settle(trial, Sampled(None, None), {})
        space = self.inner.infer_relative_search_space(study, trial)
        _optuna.pin_generation(self.inner, study, trial)  # one generation for the trial, however many draws
        while True:
            rel = self.inner.sample_relative(study, trial, space)
            params = {p: rel[p] if p in rel else self.inner.sample_independent(study, trial, p, d)
                      for p, d in self.distributions.items()}
            prop = self._propose(params, False)
            if prop is not None and prop.skip is None:
                return self._settle(trial, Sampled(prop, None), params)
            row = self._note_skip()
            if row is not None and self._fallback is not None:
                q = self._fallback(row)
                prop = self._propose(q.params, False)
                if prop is not None and prop.skip is None:
                    return self._settle(trial, Sampled(prop, None, q.attrs), q.params)
                continue
            if row is not None or self._stop():
                return self._settle(trial, Sampled(None, row), params)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)
        if not self.distributions and not _optuna.is_queued(trial):
            # no parameter to suggest, so Optuna never asks sample_relative: the trial settles on a candidate here
            self.sample_relative(study, trial, {})

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


class PredictedTrials:
    """The trial loop of a predicted backend; ``writes`` counts its storage transactions."""

    def __init__(self, run: StudyRun) -> None:
        self.study_run = run
        self.study = run.study
        self.shared = bool(run.cfg.store.storage)
        self.pending: list[FrozenTrial] = []
        self.writes = 0
        self._last_flush = time.monotonic()
        self._next_number = 0 if self.shared else run.next_number()

    def _mirror(self) -> optuna.Study:
        """The in-memory study the sampler runs on: the study's COMPLETE trials, then the queue."""
        run = self.study_run
        self.sampler = CandidateSampler(
            memo_parents(optuna.samplers.NSGAIISampler(seed=run.cfg.store.seed, population_size=16)),
            dict(run.index.distributions()), self._propose, run.note_skip, lambda: not run.budget_left())
        mirror = optuna.create_study(directions=["maximize", "minimize"], sampler=self.sampler)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            mirror.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=t.values, params=t.params,
                                                       distributions=t.distributions, system_attrs=t.system_attrs))
        for row in run.queue.first:
            mirror.enqueue_trial(run.index.params_of_row(row), user_attrs=TrialRecord(enqueued=QUEUED_FIRST).attrs())
        return mirror

    def run(self) -> None:
        """Evaluate layouts until the budget is spent or the space ran out (on Ctrl-C, after writing them)."""
        run = self.study_run
        mirror = self._mirror()
        try:
            while run.budget_left():
                trial = mirror.ask()
                params = {p: trial.suggest_categorical(p, run.index.labels[p]) for p in run.index.params}
                sampled = self.sampler.take(_optuna.trial_id_of(trial))
                prop = self._propose(params) if sampled is None else sampled.proposal
                if prop is None or prop.skip is not None or not run.reserve():
                    mirror.tell(trial, state=TrialState.PRUNED)
                    if sampled is None and (prop is None or prop.skip is not None):  # a queued candidate
                        self._skipped(mirror)
                    elif sampled is not None and sampled.fallback is not None:
                        self._enqueue_fallback(mirror, sampled.fallback)
                    continue
                self._evaluate(mirror, trial, prop)
                if len(self.pending) >= FLUSH_EVERY or time.monotonic() - self._last_flush > FLUSH_EVERY_S:
                    self.flush()
        finally:
            self.flush()

    def _propose(self, params: dict[str, str], repeat: bool = False) -> Proposal | None:
        """:meth:`StudyRun.resolve`; on a shared storage another worker's layout is a duplicate."""
        prop = self.study_run.resolve(params, explain=False)
        if prop is not None and prop.skip is None and self.shared and claimed_elsewhere(
                self.study.get_trials(deepcopy=False), None, prop.key, stale_before=self._stale_before()):
            prop = Proposal(prop.params, prop.row, prop.layout, prop.key, DUPLICATE)
        return prop

    def _skipped(self, mirror: optuna.Study) -> None:
        row = self.study_run.note_skip()
        if row is not None:
            self._enqueue_fallback(mirror, row)

    def _enqueue_fallback(self, mirror: optuna.Study, row: int) -> None:
        mirror.enqueue_trial(self.study_run.index.params_of_row(row),
                             user_attrs=TrialRecord(enqueued=QUEUED_FALLBACK).attrs())

    def _stale_before(self) -> datetime.datetime:
        return datetime.datetime.now() - datetime.timedelta(seconds=self.study_run.heartbeat.grace_s)

    def _evaluate(self, mirror: optuna.Study, trial: optuna.Trial, prop: Proposal) -> None:
        run = self.study_run
        prep = run.prep
        assert prop.row is not None
        enqueued = TrialRecord.of(trial).enqueued
        run.take(prop.key)
        state, values, outcome = TrialState.COMPLETE, None, "evaluated"
        try:
            m = run.backend.run(prop.layout, model=prep.model, cluster=prep.cluster, workload=prep.workload,
                                trial_number=None if self.shared else self._next_number + len(self.pending))
        except InfeasibleLayout:
            run.release()
            run.refuse(prop.key)
            mirror.tell(trial, state=TrialState.PRUNED)
            self._skipped(mirror)
            return
        except TrialFailed as e:
            failure = failure_of(prop.layout, e, prediction_of(run.predict(prop.layout)))
            record = TrialRecord(key=prop.key, enqueued=enqueued, failure=failure, **summary_of(failure))
            state, outcome = TrialState.FAIL, "failed"
        except BaseException as e:  # Ctrl-C or a bug: not a result; a bug is recorded (as Optuna would) and raised
            failed = mirror.tell(trial, state=TrialState.FAIL)
            run.release()
            if not isinstance(e, KeyboardInterrupt):
                self._write(failed,
                            TrialRecord(key=prop.key, enqueued=enqueued, error=f"{type(e).__name__}: {e}"[:2000]),
                            TrialState.FAIL, None)
            raise
        else:
            pred = m.extra.get("estimate")  # the model backend's measurement is the estimate itself
            result = result_of(prop.layout, m, pred if isinstance(pred, Estimate) else run.predict(prop.layout),
                               model=prep.model, cluster=prep.cluster, task=prep.workload.task)
            record = TrialRecord(key=prop.key, enqueued=enqueued, result=result, **summary_of(result))
            values = [m.tokens_per_s_per_gpu, m.peak_bytes / 2**30]
        mirror.tell(trial, values, state=state)
        frozen = mirror.get_trials(deepcopy=False)[trial.number]  # Study.tell returns a deep copy
        if self._write(frozen, record, state, values):
            run.finished(outcome)
        else:  # another worker claimed the layout at the same moment, with a lower number: it counts there
            run.release()
            self._skipped(mirror)

    def _write(self, frozen: FrozenTrial, record: TrialRecord, state: TrialState, values: list[float] | None) -> bool:
        """Write one evaluated trial (buffered on the default storage); False when another worker's claim wins."""
        common: dict[str, Any] = dict(params=dict(frozen.params), distributions=dict(frozen.distributions),
                                      user_attrs=record.attrs(), system_attrs=dict(frozen.system_attrs))
        if not self.shared:
            self.pending.append(optuna.trial.create_trial(state=state, values=values, **common))
            return True
        tid, number = _optuna.create_trial(self.study, optuna.trial.create_trial(state=TrialState.RUNNING, **common))
        self.writes += 1
        try:
            if claimed_elsewhere(self.study.get_trials(deepcopy=False), tid, record.key or "",
                                 stale_before=self._stale_before()):
                _optuna.set_trial_user_attr(self.study, tid, "skipped",
                                            DUPLICATE + " (claimed by another worker at the same moment)")
                _optuna.set_trial_state(self.study, tid, TrialState.PRUNED)
                self.writes += 2
                return False
            _optuna.set_trial_state(self.study, tid, state, values)
            self.writes += 1
            return True
        except BaseException:
            try:
                _optuna.set_trial_user_attr(self.study, tid, "interrupted", "cut off by Ctrl-C")
                _optuna.set_trial_state(self.study, tid, TrialState.FAIL)
            except Exception:  # noqa: BLE001 - finished meanwhile
                pass
            raise

    def flush(self) -> None:
        """Write the buffered trials in one transaction, a Ctrl-C held until the write and the buffer agree."""
        if self.pending:
            batch = list(self.pending)
            with _sigint_deferred():
                self.writes += _optuna.add_finished_trials(self.study, batch)
                self.pending = []
                self._next_number += len(batch)
        self._last_flush = time.monotonic()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold SIGINT for the block and deliver it after it to the handler that was there before (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if got:
        signal.raise_signal(signal.SIGINT)
