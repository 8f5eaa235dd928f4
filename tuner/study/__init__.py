"""The Optuna study over the pruned candidates, and what a tuning run produces.

Data flow (shared/design/ARCHITECTURE.md): enumerate the search space, check Megatron's rules, estimate every
valid layout with the analytical model, drop those that do not fit, then let an Optuna study evaluate layouts
through a backend: the predicted Pareto front and the fastest predicted candidates are enqueued first
(``enqueue_trial``), the sampler explores the rest, and no layout is evaluated twice (also across re-runs of the
same study, and across workers sharing its storage).

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

from typing import Any

from tuner.study import confirm as _confirm
from tuner.study import records as _records
from tuner.study import storage as _storage
from tuner.study.candidates import DIMENSIONS, MAX_ENQUEUED, CandidateIndex, CandidateQueue
from tuner.study.candidates import _label as _label
from tuner.study.candidates import _split_label as _split_label
from tuner.study.candidates import _spread as _spread
from tuner.study.config import _STUDY_NAME_RE as _STUDY_NAME_RE
from tuner.study.config import (
    DEFAULT_TRIALS,
    MAX_TRIALS,
    STACKS,
    TuneConfig,
    harness_without_te,
    run_options_for_backend,
    trial_env_dict,
    trial_warmup_steps,
)
from tuner.study.config import _check_storage_syntax as _check_storage_syntax
from tuner.study.config import _mask as _mask
from tuner.study.config import _validate_config as _validate_config
from tuner.study.confirm import MAX_CONFIRM_ROUNDS, MAX_FINALISTS
from tuner.study.prepare import Prepared, prepare
from tuner.study.prepare import _no_fit_message as _no_fit_message
from tuner.study.records import TrialRecord, trial_rows
from tuner.study.run import StudyRun, TuneResult, run_study
from tuner.study.run import _run_study as _run_study
from tuner.study.storage import model_spec_from_dict, model_spec_to_dict, open_storage

__all__ = [
    "DEFAULT_TRIALS",
    "DIMENSIONS",
    "MAX_CONFIRM_ROUNDS",
    "MAX_ENQUEUED",
    "MAX_FINALISTS",
    "MAX_TRIALS",
    "STACKS",
    "CandidateIndex",
    "CandidateQueue",
    "Prepared",
    "StudyRun",
    "TrialRecord",
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


# Names earlier versions of this module defined, under those names (callers import them from here).
_finalists = _confirm.finalists
_settled = _records.is_settled
_StudyLock = _storage.StudyLock
_check_study_config = _storage.check_study_config
_open_study = _storage.open_study
_quiet_optuna = _storage.quiet_optuna
_resolved = _storage.resolved
_storage_url = _storage.storage_url


def _best_measured(study: Any) -> float | None:
    """Highest measured tokens/s/GPU among the study's finished trials; None if none was measured (earlier name)."""
    return _records.best_measured(study.get_trials(deepcopy=False))
