"""The run loop: one ``tune`` run of a study (:class:`StudyRun`).

Real trials run under ``Study.optimize`` with :class:`tuner.study.predicted.CandidateSampler` (queued candidates,
then NSGA-II's; a skipped proposal is never a trial) or, under ``--trial-policy gain``,
:class:`tuner.study.policy_trials.PolicyTrials`; predictions run through :class:`tuner.study.predicted.PredictedTrials`.
"""

from __future__ import annotations

import datetime
import logging
import signal
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import optuna
from optuna.trial import TrialState

from cost_model.estimate import estimate
from cost_model.types import Estimate
from launch import BackendSettings, StepReporter, TrialBackend, TrialFailed, TrialStopped, get_backend
from launch.base import FailureKind
from search_spaces.rules import check_layout
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from tuner.study import _optuna
from tuner.study.candidates import CandidateIndex, CandidateQueue
from tuner.study.config import DEFAULT_TRIALS, check_budget, n_trials, trial_env_dict, trial_warmup_steps
from tuner.study.confirm import MAX_CONFIRM_ROUNDS, enqueue_round
from tuner.study.policy_trials import POLICY_BEST_ATTR, PolicyTrials
from tuner.study.predicted import CandidateSampler, PredictedTrials, Queued
from tuner.study.prepare import Prepared
from tuner.study.proposals import CLAIM_RACE, DUPLICATE, FALLBACK_AFTER_SKIPS, QUEUED_FALLBACK, QUEUED_FIRST, Proposal
from tuner.study.records import (
    TrialRecord,
    best_measured,
    claimed_elsewhere,
    evaluated_keys,
    failure_of,
    implausible,
    prediction_of,
    pruned_of,
    result_of,
    summary_of,
)

if TYPE_CHECKING:
    from launch.harness.pruner import StepTimePruner
from tuner.study.storage import Heartbeat, StudyLock, is_own_store, open_study

__all__ = ["FALLBACK_AFTER_SKIPS", "POLICY_BEST_ATTR", "Proposal", "StudyRun", "TuneResult", "run_study"]

log = logging.getLogger("tuner.study")


@dataclass(slots=True)
class TuneResult:
    """What a run of a study did (``run_study``); the study itself holds every trial."""

    prepared: Prepared
    study: optuna.Study
    study_name: str
    storage: str
    out_dir: Path
    evaluated_now: int
    skipped_now: int
    """Proposals skipped in this run (none cost a trial)."""
    backend: str
    pruned_now: int = 0
    failed_now: int = 0
    confirmed_now: int = 0
    confirm_note: str | None = None
    """Why the confirmation asked for did not run, if it did not."""
    budget_note: str | None = None
    """Why this run evaluated fewer layouts than ``--trials`` asked for, if it did."""
    stop_note: str | None = None
    """The gain policy's reason to stop, with the trials and GPU-hours it spent."""
    gpu_hours_now: float = 0.0


@dataclass(slots=True)
class _Counts:
    evaluated: int = 0
    skipped: int = 0
    pruned: int = 0
    failed: int = 0
    confirmed: int = 0


class StudyRun:
    """One run of a study; :meth:`run` it once. ``on_trial`` is called with (0, total) when trials start, then with
    (done, total) after every evaluated layout; ``backend`` overrides ``--backend`` (tests).

    Optuna calls :meth:`objective` and :meth:`after_trial` from ``--parallel-trials`` threads: the attributes under
    "shared" are read and written only with ``self._lock`` held; storage calls are made without it, except the claim
    of a layout and the queue's refill.
    """

    def __init__(self, prep: Prepared, *, on_trial: Callable[[int, int], None] | None = None,
                 backend: TrialBackend | None = None) -> None:
        cfg = prep.config
        self.prep = prep
        self.cfg = cfg
        self.name = cfg.study_name(prep.model, prep.cluster)
        self.out_dir = Path(cfg.store.results_dir) / self.name
        self.on_trial = on_trial
        self.n_trials = n_trials(cfg)
        self._given_backend = backend
        self.heartbeat = Heartbeat(interval_s=cfg.trial.heartbeat_interval_s, grace_s=cfg.trial.heartbeat_grace_s)
        # set up by run()
        self.backend: TrialBackend
        self.study: optuna.Study
        self.storage_url = ""
        self.index: CandidateIndex
        self.queue: CandidateQueue
        self.sampler: CandidateSampler
        """Real trials: the study's sampler, which holds this process's queued candidates."""
        self.pruner: StepTimePruner | None = None
        # shared (self._lock)
        self._lock = threading.Lock()
        self._counts = _Counts()
        self._seen: set[str] = set()
        """Layouts evaluated in the study when the run started, and those this run took since."""
        self._refused: set[str] = set()
        """Layouts the backend refused during this run."""
        self._mine: set[int] = set()
        """Numbers of the trials this process runs (other workers may share the storage)."""
        self._started = 0
        """Search layouts this run started: the budget of ``--trials``."""
        self._skips_in_a_row = 0
        self._done = 0
        self._total = self.n_trials
        self._confirming = False
        self._exhausted: str | None = None
        self._confirm_note: str | None = None
        self._stop_note: str | None = None
        self._gpu_hours = 0.0

    # ---- the run ---------------------------------------------------------------------------------------

    def run(self) -> TuneResult:
        """Open the study, evaluate layouts, confirm the finalists; Ctrl-C keeps the finished trials."""
        self.backend = self._open_backend()
        report_only = self._open()
        # Ctrl-C with trials running in worker threads (--parallel-trials): Optuna waits for them, so tell the
        # backend to stop them (each kills its processes and frees its placement group) before it waits.
        # SIGTERM (a scheduler's stop, `kill`) as Ctrl-C: the trials stop, a resumed run runs their layouts again
        old_handlers: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            old_handlers = {s: signal.signal(s, self._on_sigint) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.on_trial:
                self.on_trial(0, self._total)  # the study is open and its queue set: trials start now
            if report_only is None or self.n_trials:
                self._evaluate()
        except KeyboardInterrupt:
            self.backend.cancel()
            self._settle()  # Optuna does not wait for its worker threads: let them record their trials
            raise
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            self.backend.close()
        with self._lock:
            c = self._counts
            short = report_only or (self._exhausted if self._started < self.n_trials else None)
            return TuneResult(
                prepared=self.prep, study=self.study, study_name=self.name, storage=self.storage_url,
                out_dir=self.out_dir, evaluated_now=c.evaluated, skipped_now=c.skipped, backend=self.backend.name,
                pruned_now=c.pruned, failed_now=c.failed, confirmed_now=c.confirmed, confirm_note=self._confirm_note,
                budget_note=short, stop_note=self._stop_note, gpu_hours_now=self._gpu_hours,
            )

    def _open_backend(self) -> TrialBackend:
        """The backend of ``--backend`` (or the one given), checked to have the GPUs of ``--gpus``."""
        prep, cfg = self.prep, self.cfg
        t = cfg.trial
        backend = self._given_backend or get_backend(cfg.search.backend, BackendSettings(
            calibration=prep.calibration, memory_headroom=prep.headroom, options=prep.options,
            trials_dir=self.out_dir / "trials", num_gpus=prep.cluster.num_gpus, steps=t.trial_steps,
            warmup_steps=trial_warmup_steps(cfg), timeout_s=t.trial_timeout_s, command_template=t.command_template,
            megatron_core=prep.options.megatron_core, address=t.ray_address, gpus_per_node=prep.cluster.gpus_per_node,
            extra_env=trial_env_dict(t.trial_env), profile_step=t.trial_profile_step))
        n = backend.cluster_gpus()
        if n is not None and n < prep.cluster.num_gpus:
            backend.close()
            raise TunerError(
                f"--backend ray: the Ray cluster has {n:g} GPUs and --gpus asks for {prep.cluster.num_gpus}; connect "
                "to a bigger cluster (--ray-address auto on one of its nodes) or tune a slice that fits (--layers N "
                "with --gpus for what the cluster has)"
            )
        return backend

    def _open(self) -> str | None:
        """Open the study and set up the run; why it only shows the study, if so (:meth:`_held_note`)."""
        prep, cfg, backend = self.prep, self.cfg, self.backend
        heartbeat = self.heartbeat if (cfg.store.storage and backend.measured) else None
        try:
            if backend.measured:
                check_budget(prep)  # before the study is opened: a refused run leaves no study behind
            self.study, self.storage_url = open_study(cfg, prep, self.name, self.out_dir, heartbeat=heartbeat)
        except BaseException:
            backend.close()  # a Ray instance this run started must not outlive a refused study
            raise
        if cfg.trial.prune_margin is not None and backend.measured:  # real trials' step times
            from launch.harness.pruner import StepTimePruner

            self.pruner = StepTimePruner(warmup_steps=trial_warmup_steps(cfg), margin=cfg.trial.prune_margin)
        self.index = CandidateIndex(prep.enumeration.valid, prep.fits)
        trials = self.study.get_trials(deepcopy=False)
        self._seen = evaluated_keys(trials)
        report_only = self._held_note(sum(1 for t in trials if t.state.is_finished()))
        waiting = [t for t in trials if t.state == TrialState.WAITING] if backend.measured else []
        self._fail_leftovers(trials)
        self.queue = CandidateQueue(prep, self.index, backend, seen=self._seen, n_trials=self.n_trials,
                                    queued_already=len(waiting), recalibrate_after=cfg.trial.recalibrate_after,
                                    parallel=cfg.trial.parallel_trials)
        if backend.measured:
            # trials only for layouts to run: queued candidates and the sampler's proposals are checked before a trial
            # holds them
            self.sampler = CandidateSampler(
                self.study.sampler, dict(self.index.distributions()), self._propose, self.note_skip,
                self._sampling_stopped,
                fallback=lambda row: Queued(self.index.params_of_row(row),
                                            TrialRecord(enqueued=QUEUED_FALLBACK).attrs()),
                explore=cfg.trial.policy != "gain")
            self.study.sampler = self.sampler
        # confirmation runs left queued by an interrupted run go first (Optuna runs the oldest queued trial first);
        # they do not count against --trials
        self._total = self.n_trials + sum(1 for t in waiting if TrialRecord.of(t).repeat_of is not None)
        return report_only

    def _held_note(self, held: int) -> str | None:
        """A study that holds ``held`` trials, re-run without ``--trials`` or ``--resume``, gets only the launch
        (``--from``) if new: sets that budget and returns the note (None: a run)."""
        prep, cfg = self.prep, self.cfg
        if not held or cfg.search.trials is not None or cfg.store.resume:
            return None
        row = prep.baseline_row
        launch_new = (row is not None and bool(prep.fits[row])
                      and prep.enumeration.valid.row(row).key() not in self._seen)
        self.n_trials = 1 if launch_new else 0
        added = "your launch's layout added, no other" if launch_new else "shown as they are, none added"
        return (f"study {self.name!r} already holds {held} trials: {added}; --trials N evaluates N more layouts, "
                f"--resume continues it ({DEFAULT_TRIALS} more)")

    def _evaluate(self) -> None:
        """Evaluate layouts: real trials (gain policy, or the queue then confirmation), or predictions."""
        if not self.backend.measured:
            PredictedTrials(self).run()
        elif self.cfg.trial.policy == "gain":
            stop = PolicyTrials(self).run()
            with self._lock:
                self._stop_note = stop
        else:
            self._search_measured()
            if self.cfg.trial.confirm_runs:
                self._confirm()

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.backend.cancel()
        raise KeyboardInterrupt

    def _fail_leftovers(self, trials: Sequence[optuna.trial.FrozenTrial]) -> None:
        """Fail the RUNNING trials no worker runs any more, marked ``interrupted``: all on the default storage, with
        ``--storage`` predicted ones older than the grace period (real trials: Optuna's heartbeat)."""
        running = [t for t in trials if t.state == TrialState.RUNNING]
        if self.cfg.store.storage:
            if self.backend.measured:
                return
            stale = datetime.datetime.now() - datetime.timedelta(seconds=self.heartbeat.grace_s)
            running = [t for t in running if t.datetime_start is not None and t.datetime_start < stale]
            why = ("left RUNNING by a worker that stopped (a predicted trial takes milliseconds; this one was RUNNING "
                   f"for over {self.heartbeat.grace_s} s)")
        else:
            why = "left running by an interrupted run"
        for t in running:
            self._fail(_optuna.trial_id_of(t), why)

    def _fail(self, trial_id: int, why: str) -> None:
        try:
            _optuna.set_trial_user_attr(self.study, trial_id, "interrupted", why)
            _optuna.set_trial_state(self.study, trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # finished meanwhile (another worker)

    def _settle(self, wait_s: float = 60.0) -> None:
        """After an interrupt: wait up to ``wait_s`` for this process's trials to end, then fail them."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                mine = set(self._mine)
            running = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                       if t.number in mine]
            if not running:
                return
            if time.monotonic() > deadline:
                for t in running:
                    self._fail(_optuna.trial_id_of(t), "still running after the interrupt")
                return
            time.sleep(0.2)

    # ---- what every trial goes through (both paths) ---------------------------------------------------------

    def resolve(self, params: dict[str, str], *, repeat: bool = False, explain: bool = True) -> Proposal | None:
        """The proposal of these parameters: its layout, and why it is skipped (None: run it): evaluated before
        (not for a confirmation run, ``repeat``), breaks a rule or is predicted not to fit, refused by the backend.
        Not a claim: see :meth:`claim` (real trials) and :class:`tuner.study.predicted.PredictedTrials` (predictions).
        Without ``explain`` a combination that is no candidate is not built or checked: None (the predicted path
        records no skipped proposal, and most proposals of a large space are such combinations)."""
        row = self.index.find_fitting(params)
        if row is None and not explain:
            return None
        lay = self.prep.enumeration.valid.row(row) if row is not None else self.index.build(params)
        key = lay.key()
        with self._lock:
            dup, refused = key in self._seen, key in self._refused
        if dup and not repeat:
            return Proposal(params, row, lay, key, DUPLICATE)
        if row is None:
            broken = check_layout(lay, self.prep.model, self.prep.workload)
            return Proposal(params, None, lay, key,
                            "; ".join(f"[{r}] {m}" for r, m in broken) if broken else "predicted not to fit in memory")
        why = ("refused by the backend earlier in this run" if refused
               else self.backend.refusal(lay, self.prep.model, self.prep.workload))
        return Proposal(params, row, lay, key, why)

    def _propose(self, params: dict[str, str], repeat: bool) -> Proposal | None:
        """Real trials: :meth:`resolve`, and a layout another worker's trial holds is a duplicate."""
        prop = self.resolve(params, repeat=repeat, explain=False)
        if (prop is not None and prop.skip is None and not repeat and self.cfg.store.storage
                and claimed_elsewhere(self.study.get_trials(deepcopy=False), None, prop.key)):
            return Proposal(prop.params, prop.row, prop.layout, prop.key, DUPLICATE)
        return prop

    def _sampling_stopped(self) -> bool:
        """Real trials: the budget is spent, the space ran out, or the run confirms."""
        with self._lock:
            return self._confirming or self._started >= self.n_trials or self._exhausted is not None

    def claim(self, key: str, trial_id: int) -> bool:
        """Take the layout for trial ``trial_id``; False when the study has it (:func:`claimed_elsewhere`)."""
        with self._lock:
            if key in self._seen:
                return False
            if self.cfg.store.storage and claimed_elsewhere(self.study.get_trials(deepcopy=False), trial_id, key):
                return False
            self._seen.add(key)
            return True

    def take(self, key: str) -> None:
        """Mark the layout as this run's (the predicted path claims in the storage itself)."""
        with self._lock:
            self._seen.add(key)

    def refuse(self, key: str) -> None:
        """The backend refused the layout when it was run (``InfeasibleLayout``): never proposed again this run."""
        with self._lock:
            self._refused.add(key)

    def note_skip(self) -> int | None:
        """Count a skip; after :data:`FALLBACK_AFTER_SKIPS` in a row the fallback row to queue, or None."""
        with self._lock:
            self._counts.skipped += 1
            self._skips_in_a_row += 1
            if self._skips_in_a_row < FALLBACK_AFTER_SKIPS:
                return None
            self._skips_in_a_row = 0
            if self.cfg.store.storage:  # what the other workers evaluated meanwhile
                self._seen |= evaluated_keys(self.study.get_trials(deepcopy=False))
            row = self.queue.next_unevaluated(self._seen | self._refused)
            if row is None:
                self._exhausted = (
                    f"the space ran out: all {self.prep.n_fit:,} candidates (valid and predicted to fit) have been "
                    "evaluated in this study, are being run by other workers or cannot be run by the "
                    f"{self.backend.name} backend here; this run evaluated {self._started} of the {self.n_trials} "
                    "layouts --trials asked for"
                )
            return row

    def budget_left(self) -> bool:
        """Search layouts remain to be started, and the space has not run out."""
        with self._lock:
            return self._started < self.n_trials and self._exhausted is None

    def reserve(self) -> bool:
        """Take one search layout of the budget; False if all are taken (by this run's other trials)."""
        with self._lock:
            if self._started >= self.n_trials:
                return False
            self._started += 1
            self._skips_in_a_row = 0
            return True

    def release(self) -> None:
        """Give back a layout of the budget (its trial turned out to be a skip)."""
        with self._lock:
            self._started -= 1

    def finished(self, outcome: str, *, progress: bool = True) -> None:
        """Count a layout's outcome (a :class:`_Counts` field) and (``progress``) move the progress on."""
        with self._lock:
            setattr(self._counts, outcome, getattr(self._counts, outcome) + 1)
            if not progress:
                return
            self._done += 1
            done, total = self._done, self._total
        if self.on_trial:
            self.on_trial(done, total)

    def predict(self, layout: Layout) -> Estimate:
        """The estimate a trial records (``tune estimate``'s, with this study's calibration and options)."""
        return estimate(self.prep.model, self.prep.cluster, self.prep.workload, layout,
                        calibration=self.prep.calibration, memory_headroom=self.prep.headroom,
                        options=self.prep.options)

    def has_seen(self, key: str) -> bool:
        """The layout was evaluated in the study when the run started, or taken by this run since."""
        with self._lock:
            return key in self._seen

    def own_trials(self) -> set[int]:
        """Numbers of the trials this run ran (or runs): what its budgets count."""
        with self._lock:
            return set(self._mine)

    def optimize(self, n_trials: int, *, n_jobs: int = 1) -> None:
        """Run ``n_trials`` real trials in ``n_jobs`` threads; the progress's total grows to hold them."""
        with self._lock:
            self._total = max(self._total, self._done + n_trials)
        self.study.optimize(self.objective, n_trials=n_trials, callbacks=[self.after_trial], catch=(TrialFailed,),
                            gc_after_trial=False, n_jobs=n_jobs)

    def next_number(self) -> int:
        """(Default storage) the number the next trial will get."""
        return len(self.study.get_trials(deepcopy=False))

    # ---- real trials: Study.optimize on the study's storage -------------------------------------------------

    def _search_measured(self) -> None:
        if self.cfg.store.storage:
            # a stopped worker's stale trial is failed, and its layout queued, before this run queues its own first
            # layouts: the retry runs ahead of them and is recorded as the retry (Optuna's ``fail_stale_trials``, which
            # ``Study.optimize`` runs again before each trial; a no-op on a storage without the heartbeat)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(self.study)
        for row in self.queue.first:
            self.sampler.push(self.index.params_of_row(row), TrialRecord(enqueued=QUEUED_FIRST).attrs())
        n_jobs = self.cfg.trial.parallel_trials  # > 1 only for a backend reading --parallel-trials (_validate_config)
        # Optuna stops when this run's budget is spent or the space ran out (study.stop in after_trial / objective);
        # a layout of the budget given back after the stop (a refusal at run time) takes one more round
        while self.budget_left():
            self.study.optimize(self.objective, n_trials=None, callbacks=[self.after_trial], catch=(TrialFailed,),
                                gc_after_trial=False, n_jobs=n_jobs)

    def _confirm(self) -> None:
        """``--confirm-runs``: rounds of :func:`tuner.study.confirm.enqueue_round`, one trial at a time."""
        for _ in range(MAX_CONFIRM_ROUNDS):
            rnd = enqueue_round(self.study, self.cfg.trial.confirm_runs)
            if rnd.note:
                with self._lock:
                    self._confirm_note = rnd.note
                return
            if not rnd.todo:
                return
            with self._lock:
                self._confirming = True
                self._total = self._done + rnd.todo
                done, total = self._done, self._total
            if self.on_trial:
                self.on_trial(done, total)
            self.study.optimize(self.objective, n_trials=rnd.todo, callbacks=[self.after_trial], catch=(TrialFailed,),
                                gc_after_trial=False, n_jobs=1)

    def objective(self, trial: optuna.Trial) -> tuple[float, float]:
        """Optuna's objective for real trials: (tokens/s/GPU, peak GiB per GPU); a skip or prune raises ``TrialPruned``,
        a failure :class:`TrialFailed` (FAIL); Ctrl-C and unexpected errors FAIL and propagate."""
        try:
            return self._objective(trial)
        except KeyboardInterrupt:
            TrialRecord.write(trial, interrupted="cut off by Ctrl-C")  # a resumed run evaluates this layout again
            raise
        except (optuna.TrialPruned, TrialFailed):
            raise
        except Exception as e:
            TrialRecord.write(trial, error=f"{type(e).__name__}: {e}"[:2000])
            raise

    def _objective(self, trial: optuna.Trial) -> tuple[float, float]:
        with self._lock:
            self._mine.add(trial.number)
            confirming = self._confirming
        rec = TrialRecord.of(trial)
        repeat_of = rec.repeat_of  # a confirmation run of that trial's layout (--confirm-runs)
        if confirming and repeat_of is None:
            # another worker took a queued confirmation run, so Optuna sampled a new layout: not a search now
            TrialRecord.write(trial, skipped="sampled during the confirmation phase (its queued runs were taken by "
                                             "another worker)")
            raise optuna.TrialPruned("not a confirmation run")
        params = {p: trial.suggest_categorical(p, self.index.labels[p]) for p in self.index.params}
        # None: Optuna gave the trial fixed parameters (queued in the storage)
        sampled = self.sampler.take(trial._trial_id)
        if sampled is None:
            prop = self.resolve(params, repeat=repeat_of is not None)
        elif sampled.proposal is None:
            self._nothing_to_run(trial)
        else:
            prop = sampled.proposal
            if sampled.attrs:
                TrialRecord.write(trial, **sampled.attrs)
                repeat_of = sampled.attrs.get("repeat_of")
        assert prop is not None
        TrialRecord.write(trial, key=prop.key)
        if rec.retried and rec.intermediate_tokens_per_s_per_gpu is not None:
            TrialRecord.write(trial, intermediate_tokens_per_s_per_gpu=[])  # not the dead run's steps
        if prop.skip is not None:
            self._skip(trial, prop.skip)
        if repeat_of is None:
            if not self.reserve():
                trial.study.stop()
                TrialRecord.write(trial, skipped=f"not run: this run's {self.n_trials} layouts (--trials) were started "
                                                 "by its other trials")
                raise optuna.TrialPruned("budget spent")
            if not self.claim(prop.key, trial._trial_id):
                self.release()
                self._skip(trial, DUPLICATE if sampled is None else CLAIM_RACE)
        assert prop.row is not None
        predicted = self.predict(prop.layout)
        pred = prediction_of(predicted)
        t0 = time.monotonic()
        try:
            m = self.backend.run(prop.layout, model=self.prep.model, cluster=self.prep.cluster,
                                 workload=self.prep.workload, reporter=self._reporter(trial, repeat_of),
                                 trial_number=trial.number)
        except TrialFailed as e:
            failure = failure_of(prop.layout, e, pred)
            TrialRecord.write(trial, failure=failure, gpu_hours=self._spend(e.wall_s, t0), **summary_of(failure))
            self.finished("failed", progress=False)
            _say_failed(trial.number, failure)
            raise
        except TrialStopped as e:
            pruned = pruned_of(prop.layout, e, pred)
            TrialRecord.write(trial, pruned=pruned, gpu_hours=self._spend(e.wall_s, t0), **summary_of(pruned))
            self.finished("pruned", progress=False)
            raise optuna.TrialPruned(e.reason) from None
        except InfeasibleLayout as e:
            if repeat_of is None:
                self.release()
            self.refuse(prop.key)
            self._skip(trial, str(e))
        wall = m.extra.get("wall_s")
        gpu_hours = self._spend(wall, t0)
        result = result_of(prop.layout, m, predicted, model=self.prep.model, cluster=self.prep.cluster,
                           task=self.prep.workload.task)
        if m.step_times_s:
            # the steps a trial ran, warm-up included, at its median step: the rest of its wall time is start-up
            ran = max(len(m.step_times_s), self.cfg.trial.trial_steps) * float(np.median(m.step_times_s))
            result["startup_s"] = max(gpu_hours * 3600 / self.prep.cluster.num_gpus - ran, 0.0)
        why = implausible(result, None if self.prep.bars is None else self.prep.bars.throughput)
        if why is not None:  # kept, marked, and out of the front and the best: a FAIL with its numbers
            bad = TrialFailed(FailureKind.implausible, why, m.log_path)
            failure = {**failure_of(prop.layout, bad, pred), "result": result}
            TrialRecord.write(trial, failure=failure, gpu_hours=gpu_hours, **summary_of(failure))
            self.finished("failed", progress=False)
            _say_failed(trial.number, failure)
            raise bad
        TrialRecord.write(trial, result=result, gpu_hours=gpu_hours, **summary_of(result))
        self.finished("confirmed" if repeat_of is not None else "evaluated", progress=False)
        return m.tokens_per_s_per_gpu, m.peak_bytes / 2**30

    def _spend(self, wall_s: float | None, t0: float) -> float:
        """GPU-hours of a trial that ran ``wall_s`` seconds (None: since ``t0`` on this clock), counted to this run."""
        wall = wall_s if wall_s is not None else time.monotonic() - t0
        gh = wall * self.prep.cluster.num_gpus / 3600.0
        with self._lock:
            self._gpu_hours += gh
        return gh

    def _skip(self, trial: optuna.Trial, why: str) -> NoReturn:
        """Record the trial as skipped and end it (``TrialPruned``); queue the fallback if it is due."""
        TrialRecord.write(trial, skipped=why)
        row = self.note_skip()
        if row is not None:
            self.sampler.push(self.index.params_of_row(row), TrialRecord(enqueued=QUEUED_FALLBACK).attrs())
        elif not self.budget_left():
            trial.study.stop()  # the space ran out
        raise optuna.TrialPruned(why)

    def _nothing_to_run(self, trial: optuna.Trial) -> NoReturn:
        """The sampler found no layout: record why, end the trial, stop when the budget or space is spent."""
        with self._lock:
            why = self._exhausted or (f"not run: this run's {self.n_trials} layouts (--trials) were started by its "
                                      "other trials"
                                      if self._started >= self.n_trials else None)
        if why is not None:
            trial.study.stop()
        TrialRecord.write(trial, skipped=why or CLAIM_RACE)
        raise optuna.TrialPruned(why or CLAIM_RACE)

    def _reporter(self, trial: optuna.Trial, repeat_of: int | None) -> StepReporter:
        """What the backend calls after each measured step: record the throughputs, and ask the pruner."""

        def report(tps: Sequence[float]) -> str | None:
            TrialRecord.write(trial, intermediate_tokens_per_s_per_gpu=[float(x) for x in tps])
            if self.pruner is None or repeat_of is not None:  # a confirmation run is measured to the end
                return None
            return self.pruner.decide(list(tps), best_measured(self.study.get_trials(deepcopy=False)))

        return report

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna's callback: move the progress, refill a lazy queue, stop when the budget or space is spent."""
        rec = TrialRecord.of(trial)
        counted = rec.skipped is None
        with self._lock:
            if counted:
                self._done += 1
            done, total, confirming = self._done, self._total, self._confirming
            spent = self._started >= self.n_trials or self._exhausted is not None
            if (self.cfg.trial.policy == "queue" and self.queue.lazy and not confirming and not spent
                    and not self.sampler.queue and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
                # no new search trial is queued once the budget is spent (nor while confirming)
                self.queue.recalibrate(study)
                row = self.queue.pop_rest(self._seen)
                if row is not None:
                    self.sampler.push(self.index.params_of_row(row), TrialRecord(enqueued=self.queue.label).attrs())
        if spent and not confirming:
            study.stop()
        if counted and self.on_trial:
            self.on_trial(done, total)


def _say_failed(number: int, failure: dict[str, Any]) -> None:
    """Log one warning, wrapped at 80 columns, for a failed trial: its number, layout and why."""
    log.warning(textwrap.fill(f"trial {number} ({failure['label']}) failed: {failure['message']}", width=80,
                              subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))


def run_study(prep: Prepared, *, on_trial: Callable[[int, int], None] | None = None,
              backend: TrialBackend | None = None) -> TuneResult:
    """Create or resume the study and evaluate ``--trials`` layouts (:class:`StudyRun`, same arguments); with the
    default storage (the study's own SQLite file) under :class:`StudyLock`, one process at a time.

    Raises:
        TunerError: as :meth:`StudyRun.run`, or another ``tune`` process runs the study in its default storage.
    """
    run = StudyRun(prep, on_trial=on_trial, backend=backend)
    if prep.config.store.storage and not is_own_store(prep.config, run.out_dir):
        return run.run()
    out_dir = run.out_dir
    created = not out_dir.exists()
    lock = StudyLock(out_dir, run.name)
    try:
        return run.run()
    finally:
        lock.release()  # the file stays (removing it could let two runs lock two files), unless the study was refused
        if created and [p.name for p in out_dir.iterdir()] == [lock.path.name]:
            try:
                lock.path.unlink()
                out_dir.rmdir()
            except OSError:
                pass
