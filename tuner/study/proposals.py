"""What a run proposes to evaluate, and the reasons it records for queued and skipped layouts (shared by
:mod:`tuner.study.run` and :mod:`tuner.study.predicted`)."""

from __future__ import annotations

from dataclasses import dataclass

from specs.layout import Layout

__all__ = ["CLAIM_RACE", "DUPLICATE", "FALLBACK_AFTER_SKIPS", "QUEUED_FALLBACK", "QUEUED_FIRST", "Proposal"]

#: Proposals skipped in a row after which the fastest predicted candidate not yet evaluated is queued instead of
#: sampling on; when there is none left the run stops and says the space ran out.
FALLBACK_AFTER_SKIPS = 32
#: What a queued candidate's ``enqueued`` record says.
QUEUED_FIRST = "predicted front / fastest predicted"
DUPLICATE = "duplicate: this layout was already evaluated (or is being run) in this study"
#: Why a trial is skipped when its layout, free when it was proposed, was claimed by another trial at the same moment.
CLAIM_RACE = f"{DUPLICATE} (claimed by another worker or thread at the same moment)"
QUEUED_FALLBACK = (f"next unevaluated candidate (fastest predicted; the sampler proposed {FALLBACK_AFTER_SKIPS} "
                   "skipped layouts in a row)")


@dataclass(frozen=True, slots=True)
class Proposal:
    """A layout proposed for evaluation (by the queue or the sampler) and whether it is run."""

    params: dict[str, str]
    """Its Optuna parameters (labels of :class:`CandidateIndex`)."""
    row: int | None
    """Its row of the valid table; None if the combination breaks a rule or is predicted not to fit."""
    layout: Layout
    key: str
    skip: str | None
    """Why it is not run (recorded as the trial's ``skipped``); None: run it."""
