"""The Optuna study over the pruned candidates, and what a tuning run produces.

Data flow (shared/design/ARCHITECTURE.md): enumerate the search space, check Megatron's rules, estimate every
valid layout with the analytical model, drop those that do not fit, then let an Optuna study evaluate layouts
through a backend: the predicted Pareto front and the fastest predicted candidates are proposed first, the
sampler explores the rest, proposing only candidates not yet evaluated, and no layout is evaluated twice (also
across re-runs of the same study, and across workers sharing its storage).

Modules, one responsibility each:

* :mod:`~tuner.study.config`: :class:`TuneConfig` and its validation;
* :mod:`~tuner.study.prepare`: enumerate, check, estimate, prune (:func:`prepare`);
* :mod:`~tuner.study.storage`: open the storage (heartbeat for shared ones), one process per default SQLite file,
  a resumed study's inputs checked;
* :mod:`~tuner.study.candidates`: layouts as Optuna parameters (:class:`CandidateIndex`) and the queue;
* :mod:`~tuner.study.records`: what a trial records (:class:`TrialRecord`) and the reads built on it
  (:func:`trial_rows`);
* :mod:`~tuner.study.confirm`: confirmation runs of the finalists;
* :mod:`~tuner.study.run`: the run loop (:class:`StudyRun`, :func:`run_study`), real trials under ``Study.optimize``;
* :mod:`~tuner.study.predicted`: the trial loop of a backend that only predicts;
* :mod:`~tuner.study._optuna`: every use of Optuna's private API (written against Optuna 5.1.0, checked against 5.0.0).
"""

from __future__ import annotations

from tuner.study.candidates import DIMENSIONS, MAX_ENQUEUED, CandidateIndex, CandidateQueue
from tuner.study.config import (
    DEFAULT_TRIALS,
    STACKS,
    TuneConfig,
    harness_without_te,
    run_options_for_backend,
    trial_env_dict,
    trial_warmup_steps,
)
from tuner.study.config import _mask as _mask
from tuner.study.config import _validate_config as _validate_config
from tuner.study.confirm import MAX_CONFIRM_ROUNDS, MAX_FINALISTS
from tuner.study.prepare import Prepared, prepare
from tuner.study.records import TrialRecord, TrialRow, trial_rows
from tuner.study.run import StudyRun, TuneResult, run_study
from tuner.study.storage import model_spec_from_dict, model_spec_to_dict, open_storage

__all__ = [
    "DEFAULT_TRIALS",
    "DIMENSIONS",
    "MAX_CONFIRM_ROUNDS",
    "MAX_ENQUEUED",
    "MAX_FINALISTS",
    "STACKS",
    "CandidateIndex",
    "CandidateQueue",
    "Prepared",
    "StudyRun",
    "TrialRecord",
    "TrialRow",
    "TuneConfig",
    "TuneResult",
    "harness_without_te",
    "model_spec_from_dict",
    "model_spec_to_dict",
    "open_storage",
    "prepare",
    "run_options_for_backend",
    "run_study",
    "trial_env_dict",
    "trial_rows",
    "trial_warmup_steps",
]

