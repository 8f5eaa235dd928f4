"""Confirmation runs (``--confirm-runs N``): after the search, the fastest measured layout and those within its
trials' noise are measured N more times each, interleaved; this module chooses them and queues the runs
(:class:`tuner.study.run.StudyRun` runs them)."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tuner.study.records import TrialRecord, trial_rows

__all__ = ["MAX_CONFIRM_ROUNDS", "MAX_FINALISTS", "ConfirmRound", "enqueue_round", "finalists"]

#: Layouts a confirmation re-measures at most: the fastest measured one and up to three within its noise.
MAX_FINALISTS = 4
#: Rounds of confirmation: after a round the finalists are chosen again (the best by mean may be a layout
#: measured once, and ties widen with the spread between runs), and any short of runs topped up.
MAX_CONFIRM_ROUNDS = 3


def finalists(study: optuna.Study) -> list[int]:
    """Trial numbers to confirm: the fastest measured layout, then those within its trials' noise (fastest first)."""
    from tuner.report import fastest_measured, measured_ties

    rows = trial_rows(study)
    best = fastest_measured(rows)
    if best is None:
        return []
    return [best.trial] + [t["trial"] for t in measured_ties(rows, best.trial)][: MAX_FINALISTS - 1]


@dataclass(frozen=True, slots=True)
class ConfirmRound:
    """What :func:`enqueue_round` queued."""

    todo: int
    """Trials now waiting in the study (the confirmation runs queued, and any queued before)."""
    note: str | None = None
    """Why confirmation cannot run now (None: it can, or nothing is left to confirm)."""


def enqueue_round(study: optuna.Study, runs: int) -> ConfirmRound:
    """Queue one round: bring each finalist to ``runs`` confirmation runs (those it has count), interleaved so that
    a drift of the machine reaches them alike; nothing while search trials are queued (the note says so)."""
    chosen = finalists(study)
    trials = study.get_trials(deepcopy=False)
    queued = [t for t in trials if t.state == TrialState.WAITING and TrialRecord.of(t).repeat_of is None]
    if chosen and queued:
        return ConfirmRound(0, f"confirmation not run: {len(queued)} queued layouts of the search are still waiting; "
                               "re-run the same command (with more --trials) to run them, then confirm")
    have: dict[int, int] = {}
    for t in trials:
        r = TrialRecord.of(t)
        if r.repeat_of is not None and not (t.state == TrialState.FAIL and r.interrupted):
            have[int(r.repeat_of)] = have.get(int(r.repeat_of), 0) + 1
    by_number = {t.number: t for t in trials}
    need = {n: runs - have.get(n, 0) for n in chosen if runs - have.get(n, 0) > 0}
    if not need:
        return ConfirmRound(0)
    for k in range(max(need.values())):
        for n in chosen:
            if need.get(n, 0) > k:
                study.enqueue_trial(by_number[n].params, user_attrs=TrialRecord(
                    repeat_of=n, enqueued=f"confirmation run {have.get(n, 0) + k + 1} of {runs} of trial {n}").attrs())
    return ConfirmRound(len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))))
