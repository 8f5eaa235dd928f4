"""Real trials under the gain policy (:class:`tuner.study.policy.GainPolicy`): rounds of up to ``--parallel-trials``
picks run through ``Study.optimize``, every finished trial fed back; the user's launch (``tune --from``) first."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import numpy as np
from optuna.trial import TrialState

from tuner.study.config import policy_params, trial_warmup_steps
from tuner.study.policy import Decision, GainPolicy, fmt_gpu_hours
from tuner.study.records import TrialRecord

if TYPE_CHECKING:
    from tuner.study.run import StudyRun

__all__ = ["POLICY_BEST_ATTR", "PolicyTrials"]

#: The study attribute holding the trial the gain policy's stop named best: the measured layout of highest posterior
#: mean throughput (its runs and its neighbours' measurements together, not its own noisy mean alone).
POLICY_BEST_ATTR = "policy_best_trial"


class PolicyTrials:
    """The trial loop of real trials under the gain policy, over the study's contenders."""

    def __init__(self, run: StudyRun) -> None:
        self.study_run = run
        prep = run.prep
        self.rows = np.flatnonzero(prep.contenders)
        """Row of the valid table of each of the policy's candidates."""
        self.pos = {int(r): i for i, r in enumerate(self.rows)}
        est = prep.estimates
        self.policy = GainPolicy(
            predicted=est.tokens_per_s_per_gpu[self.rows], step_time_s=est.step_time_s[self.rows],
            peak_bytes=est.peak_bytes[self.rows],
            codes=np.stack([run.index.codes[d][self.rows] for d in run.index.params]
                           or [np.zeros(len(self.rows), dtype=np.int64)], axis=1),
            hbm_bytes=prep.cluster.gpu.hbm_bytes, gpus=prep.cluster.num_gpus, params=policy_params(prep, run.n_trials))
        self.observed: set[int] = set()
        """Numbers of the trials fed to the policy (or found to be none of its candidates)."""
        self.first_of: dict[int, int] = {}
        """The number of each measured candidate's first trial (a repeat names it)."""

    def run(self) -> str:
        """Pick, run and feed back until the policy stops; the stop statement (:meth:`stop_statement`)."""
        run, prep, policy = self.study_run, self.study_run.prep, self.policy
        n_jobs = run.cfg.trial.parallel_trials if run.backend.parallel_trials else 1
        self.feed()  # earlier runs' trials: learnt from, not counted
        self._run_launch_first()
        while True:
            self.feed()
            picks: list[Decision] = []
            stop: str | None = None
            while len(picks) < n_jobs:
                d = policy.next(in_flight=len(picks))
                if d.index is None:
                    if not picks:
                        stop = self.stop_statement(d.reason)
                        inc = policy.incumbent()
                        if inc is not None and inc in self.first_of:
                            run.study.set_user_attr(POLICY_BEST_ATTR, self.first_of[inc])
                    break
                row = int(self.rows[d.index])
                lay = prep.enumeration.valid.row(row)
                if not d.repeat and (run.has_seen(lay.key())
                                     or run.backend.refusal(lay, prep.model, prep.workload) is not None):
                    # evaluated elsewhere, or this backend cannot run it: never picked again
                    policy.failed[d.index] = True
                    continue
                policy.take(d.index)
                attrs = TrialRecord(enqueued="policy: run again" if d.repeat else "policy: expected gain per GPU-hour",
                                    repeat_of=self.first_of.get(d.index) if d.repeat else None).attrs()
                run.sampler.push(run.index.params_of_row(row), attrs, repeat=d.repeat)
                picks.append(d)
            # with any pick a trial queued in the storage (a stale trial's retry) took the place of
            todo = len(run.sampler.queue)
            if not todo:
                if stop is not None:
                    return stop
                continue
            # a pick stays pending until its trial is fed back: one another worker runs is not picked again meanwhile
            run.optimize(todo, n_jobs=min(n_jobs, todo))

    def _run_launch_first(self) -> None:
        """Measure the user's launch (``tune --from``) first, unless the study has it."""
        run, prep = self.study_run, self.study_run.prep
        row = prep.baseline_row
        if row is None or not prep.fits[row]:
            return
        lay = prep.enumeration.valid.row(row)
        if run.has_seen(lay.key()) or run.backend.refusal(lay, prep.model, prep.workload) is not None:
            return
        run.sampler.push(run.index.params_of_row(row), TrialRecord(enqueued="your launch (--from)").attrs())
        run.optimize(1)

    def feed(self) -> None:
        """Feed the policy every unseen finished trial; only this run's count against its budgets."""
        run, policy = self.study_run, self.policy
        mine = run.own_trials()
        for t in run.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            if t.number in self.observed:
                continue
            r = TrialRecord.of(t)
            if r.skipped is not None or r.interrupted is not None:
                continue
            row = run.index.find_fitting({k: str(v) for k, v in t.params.items()})
            i = self.pos.get(row) if row is not None else None
            self.observed.add(t.number)
            if i is None:
                continue
            if r.repeat_of is None:
                self.first_of.setdefault(i, t.number)
            gh = float(r.gpu_hours or 0.0)
            own = t.number in mine
            if r.result and r.result.get("source") == "measured":
                peak = r.result.get("peak_gib")
                policy.observe(i, float(r.result["tokens_per_s_per_gpu"]), gpu_hours=gh,
                               startup_s=r.result.get("startup_s"),
                               peak_bytes=float(peak) * 2**30 if peak is not None else None, own=own)
            elif r.pruned and r.pruned.get("tokens_per_s_per_gpu"):
                steps = [float(x) for x in r.pruned["tokens_per_s_per_gpu"]]  # every step, warm-up included
                timed = steps[trial_warmup_steps(run.cfg):] or steps
                policy.observe(i, statistics.median(timed), gpu_hours=gh, pruned=True, own=own)
            else:
                policy.observe(i, None, gpu_hours=gh, failed=True,
                               out_of_memory=bool(r.failure and r.failure.get("kind") == "oom"), own=own)

    def stop_statement(self, reason: str) -> str:
        """One line: how many trials and GPU-hours this run spent, which trial is best, and why the policy stopped."""
        policy = self.policy
        inc = policy.incumbent()
        best = f"trial {self.first_of[inc]}" if inc is not None and inc in self.first_of else "no measured trial"
        n = policy.run_trials
        return (f"stopped after {n} trial{'s' if n != 1 else ''} ({fmt_gpu_hours(policy.run_gpu_hours)} GPU-hours); "
                f"best: {best}; " + reason.replace("the best", best if inc is not None else "the best"))

