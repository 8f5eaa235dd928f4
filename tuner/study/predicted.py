"""Trials of a backend that measures nothing (``model``: the analytical estimate, milliseconds a layout).

Optuna's storage costs more than such a trial: through ``Study.optimize`` every parameter, attribute and state
change of a trial is a transaction of its own (732 for the 48 trials of the main job before this module, ~50 SQL
statements each trial; ``docs/benchmarks.md``). Here the sampler (the same NSGA-II, same seed) runs on an in-memory
study, Optuna's own ``InMemoryStorage`` through ``ask``/``tell``, which holds the study's finished trials and this run's
proposals; only evaluated layouts reach the study's storage, each written whole:

* the default storage (the study's own SQLite file, one ``tune`` process at a time): evaluated trials are
  written in batches, each batch one transaction (:func:`tuner.study._optuna.add_finished_trials`), at the latest
  every :data:`FLUSH_EVERY_S` seconds or :data:`FLUSH_EVERY` trials and when the run ends, Ctrl-C or error
  included: nothing finished is lost unless the process is killed (a killed run's predictions are recomputed in
  milliseconds when it is resumed);
* a shared storage (``--storage``): each evaluated layout is claimed as a RUNNING trial with its record (one
  write), checked against the other workers' trials (a read), and finished (one write), so two workers never
  both count a layout; a claim left RUNNING by a worker that stopped is ignored once it is older than the grace
  period (:attr:`TrialOptions.heartbeat_grace_s`) and failed by the next run.

Skipped proposals are never written, and never become trials of the in-memory study either: the sampler
(:class:`CandidateSampler`) checks each NSGA-II proposal against the candidate table and draws again, within the
same trial, until it is a layout to run. The draws are the ones the sampler would make over a trial per skipped
proposal (a skipped trial completes nothing, so NSGA-II's generation and parents stay the same), so the run
evaluates the same layouts; the sampler's scans over the study's trials stay as long as the layouts evaluated.
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
    """``sampler`` with each generation's parent population kept in memory (``get_parent_population``): Optuna's
    own cache keeps the parents' trial ids in the study and finds them by a scan over every trial at each proposal.

    The first call for a generation returns what Optuna selects (in its order), later calls the cached parents in
    the study's trial order, as Optuna's cache does, so the proposals are Optuna's. The sampler stays an instance
    of Optuna's class: the generation attributes it writes on trials are named after the class.
    """
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
    """Its Optuna parameters (labels of :class:`~tuner.study.candidates.CandidateIndex`)."""
    attrs: dict[str, Any]
    """The user attributes its trial records (:meth:`TrialRecord.attrs`: ``enqueued``, ``repeat_of``)."""
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
    """A sampler (``inner``, NSGA-II) whose trials are only layouts to run.

    For a trial it first takes the candidates queued in this process (:meth:`push`) in order, dropping those
    ``propose`` skips (another worker claimed them meanwhile); then (``explore``) it samples as ``inner`` would
    (its relative sample, then each parameter that sample leaves out, in the order of ``distributions``) and
    hands the parameters to ``propose``; a proposal it skips is counted by ``note_skip`` and sampled again in the
    same trial, until one is run, ``note_skip`` returns a fallback row, or ``stop()``. With ``fallback`` the
    fallback row's candidate is proposed in the same trial (real trials: no trial is spent on a skip); without,
    the trial settles on no proposal and the caller queues the row (the predicted path's in-memory study).
    :meth:`take` gives what a trial settled on (None: Optuna gave it fixed parameters, a trial queued in the
    storage). Trials are told apart by Optuna's trial id (PostgreSQL can give two trials one number).
    """

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
    """The trial loop of a predicted backend for one :class:`StudyRun` (its budget, counts and skips).

    Attributes:
        writes: storage transactions this loop wrote (trials only; the study's own attributes are written
            when it is opened).
    """

    def __init__(self, run: StudyRun) -> None:
        self.study_run = run
        self.study = run.study
        self.shared = bool(run.cfg.store.storage)
        self.pending: list[FrozenTrial] = []
        self.writes = 0
        self._last_flush = time.monotonic()
        self._next_number = 0 if self.shared else run.next_number()

    def _mirror(self) -> optuna.Study:
        """The in-memory study the sampler runs on: the study's COMPLETE trials (parameters, values, the sampler's
        system attributes), then the queue (:attr:`CandidateQueue.first`)."""
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
        """Evaluate layouts until the run's budget is spent or the space ran out.

        Raises:
            KeyboardInterrupt: Ctrl-C (what was evaluated is written first).
        """
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
        """The proposal of these parameters (:meth:`StudyRun.resolve`); on a shared storage a layout another
        worker has claimed is a duplicate."""
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
        """Write the buffered trials (default storage): one transaction. A Ctrl-C during the write is held until the
        write and the buffer agree (then raised), so an interrupted run keeps every trial it reported finished."""
        if self.pending:
            batch = list(self.pending)
            with _sigint_deferred():
                self.writes += _optuna.add_finished_trials(self.study, batch)
                self.pending = []
                self._next_number += len(batch)
        self._last_flush = time.monotonic()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) for the block and deliver it after the block to the handler that was there before (Python's
    default raises KeyboardInterrupt; an ignored SIGINT stays ignored); outside the main thread (where no handler can be
    set) the block runs as it is."""
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
