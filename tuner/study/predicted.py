"""Trials of a backend that measures nothing (``model``: the analytical estimate, milliseconds a layout).

Optuna's storage costs more than such a trial: through ``Study.optimize`` every parameter, attribute and state
change of a trial is a transaction of its own (732 for the 48 trials of the main job before this module, ~50 SQL
statements each trial; ``docs/benchmarks.md``). Here the sampler (the same NSGA-II, same seed) runs on an in-memory study,
Optuna's own ``InMemoryStorage`` through ``ask``/``tell``, which holds the study's finished trials and this run's
proposals; only evaluated layouts reach the study's storage, each written whole:

* the default storage (the study's own SQLite file, one ``tune`` process at a time): evaluated trials are
  written in batches, each batch one transaction (:func:`tuner.study._optuna.add_finished_trials`), at the latest
  every :data:`FLUSH_EVERY_S` seconds or :data:`FLUSH_EVERY` trials and when the run ends, Ctrl-C or error
  included: nothing finished is lost unless the process is killed (a killed run's predictions are recomputed in
  milliseconds when it is resumed);
* a shared storage (``--storage``): each evaluated layout is claimed as a RUNNING trial with its record (one
  write), checked against the other workers' trials (a read), and finished (one write), so two workers never
  both count a layout; a claim left RUNNING by a worker that stopped is ignored once it is older than the grace
  period (:attr:`TuneConfig.heartbeat_grace_s`) and failed by the next run.

Skipped proposals are never written.
"""

from __future__ import annotations

import contextlib
import datetime
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from cost_model.types import Estimate
from launch import TrialFailed
from specs.errors import InfeasibleLayout
from tuner.study import _optuna
from tuner.study.proposals import DUPLICATE, QUEUED_FALLBACK, QUEUED_FIRST, Proposal
from tuner.study.records import TrialRecord, claimed_elsewhere, failure_of, prediction_of, result_of, summary_of

if TYPE_CHECKING:
    from tuner.study.run import StudyRun

__all__ = ["FLUSH_EVERY", "FLUSH_EVERY_S", "PredictedTrials"]

#: Evaluated trials written to the default storage at least this often (trials, seconds).
FLUSH_EVERY = 256
FLUSH_EVERY_S = 2.0


class PredictedTrials:
    """The trial loop of a predicted backend for one :class:`StudyRun` (its budget, counts and skips).

    Attributes:
        writes: storage transactions this loop wrote (trials only; the study's own attributes are written
            when it is opened).
    """

    def __init__(self, run: StudyRun) -> None:
        self.study_run = run
        self.study = run.study
        self.shared = bool(run.cfg.storage)
        self.pending: list[FrozenTrial] = []
        self.writes = 0
        self._last_flush = time.monotonic()
        self._next_number = 0 if self.shared else run.next_number()

    def _mirror(self) -> optuna.Study:
        """The in-memory study the sampler runs on: the study's COMPLETE trials (parameters, values, the sampler's
        system attributes), then the queue (:attr:`CandidateQueue.first`)."""
        run = self.study_run
        mirror = optuna.create_study(directions=["maximize", "minimize"],
                                     sampler=optuna.samplers.NSGAIISampler(seed=run.cfg.seed, population_size=16))
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
                prop = run.resolve({p: trial.suggest_categorical(p, run.index.labels[p]) for p in run.index.params}, explain=False)
                if prop is not None and prop.skip is None and self.shared and claimed_elsewhere(
                        self.study.get_trials(deepcopy=False), None, prop.key, stale_before=self._stale_before()):
                    prop = Proposal(prop.params, prop.row, prop.layout, prop.key, DUPLICATE)
                if prop is None or prop.skip is not None or not run.reserve():
                    mirror.tell(trial, state=TrialState.PRUNED)
                    if prop is None or prop.skip is not None:
                        self._skipped(mirror)
                    continue
                self._evaluate(mirror, trial, prop)
                if len(self.pending) >= FLUSH_EVERY or time.monotonic() - self._last_flush > FLUSH_EVERY_S:
                    self.flush()
        finally:
            self.flush()

    def _skipped(self, mirror: optuna.Study) -> None:
        row = self.study_run.note_skip()
        if row is not None:
            mirror.enqueue_trial(self.study_run.index.params_of_row(row), user_attrs=TrialRecord(enqueued=QUEUED_FALLBACK).attrs())

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
                self._write(failed, TrialRecord(key=prop.key, enqueued=enqueued, error=f"{type(e).__name__}: {e}"[:2000]), TrialState.FAIL, None)
            raise
        else:
            pred = m.extra.get("estimate")  # the model backend's measurement is the estimate itself
            result = result_of(prop.layout, m, pred if isinstance(pred, Estimate) else run.predict(prop.layout), model=prep.model, cluster=prep.cluster)
            record = TrialRecord(key=prop.key, enqueued=enqueued, result=result, **summary_of(result))
            values = [m.tokens_per_s_per_gpu, m.peak_bytes / 2**30]
        frozen = mirror.tell(trial, values, state=state)
        if self._write(frozen, record, state, values):
            run.finished(outcome)
        else:  # another worker claimed the layout at the same moment, with a lower number: it counts there
            run.release()
            self._skipped(mirror)

    def _write(self, frozen: FrozenTrial, record: TrialRecord, state: TrialState, values: list[float] | None) -> bool:
        """Write one evaluated trial (buffered on the default storage); False when another worker's claim wins."""
        common: dict[str, Any] = dict(params=frozen.params, distributions=frozen.distributions, user_attrs=record.attrs(),
                                      system_attrs=frozen.system_attrs)
        if not self.shared:
            self.pending.append(optuna.trial.create_trial(state=state, values=values, **common))
            return True
        tid, number = _optuna.create_trial(self.study, optuna.trial.create_trial(state=TrialState.RUNNING, **common))
        self.writes += 1
        try:
            if claimed_elsewhere(self.study.get_trials(deepcopy=False), tid, record.key or "", stale_before=self._stale_before()):
                _optuna.set_trial_user_attr(self.study, tid, "skipped", DUPLICATE + " (claimed by another worker at the same moment)")
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
