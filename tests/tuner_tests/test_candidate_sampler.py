"""The model backend's sampler (tuner.study.predicted.CandidateSampler): skipped proposals are drawn again inside one
trial, never become trials, and the layouts evaluated are the ones NSGA-II gives with a pruned trial per skip."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner.study.predicted import CandidateSampler, memo_parents
from tuner.study.proposals import Proposal

optuna.logging.set_verbosity(optuna.logging.WARNING)

DISTS = {"a": CategoricalDistribution(list("abcdefgh")), "b": CategoricalDistribution(["0", "1", "2", "3"])}
N = 20


def _runnable(params: dict[str, str], seen: set[tuple[str, str]]) -> bool:
    return (ord(params["a"]) + int(params["b"])) % 3 != 0 and (params["a"], params["b"]) not in seen


def _values(params: dict[str, str]) -> list[float]:
    return [float(ord(params["a"]) * (1 + int(params["b"]))), float((ord(params["a"]) * 7 + int(params["b"]) * 5) % 11)]


def _with_pruned_trials() -> tuple[list[tuple[str, str]], int]:
    """The loop before CandidateSampler: every skipped proposal a PRUNED trial."""
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.NSGAIISampler(seed=3, population_size=4)
    )
    seen: set[tuple[str, str]] = set()
    order: list[tuple[str, str]] = []
    while len(order) < N:
        t = study.ask()
        params = {p: t.suggest_categorical(p, d.choices) for p, d in DISTS.items()}
        if not _runnable(params, seen):
            study.tell(t, state=TrialState.PRUNED)
            continue
        seen.add((params["a"], params["b"]))
        order.append((params["a"], params["b"]))
        study.tell(t, _values(params))
    return order, len(study.trials)


def test_skipped_proposals_are_no_trials_and_the_evaluated_layouts_are_the_same():
    seen: set[tuple[str, str]] = set()
    skips = []

    def propose(params: dict[str, str], repeat: bool = False) -> Proposal | None:
        return Proposal(params, 0, None, "", None) if _runnable(params, seen) else None  # type: ignore[arg-type]

    sampler = CandidateSampler(
        memo_parents(optuna.samplers.NSGAIISampler(seed=3, population_size=4)),
        dict(DISTS),
        propose,
        lambda: skips.append(1),
        lambda: False,
    )
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    order: list[tuple[str, str]] = []
    for _ in range(N):
        t = study.ask()
        params = {p: t.suggest_categorical(p, d.choices) for p, d in DISTS.items()}
        sampled = sampler.take(t.number)
        assert sampled is not None and sampled.proposal is not None and sampled.proposal.params == params
        seen.add((params["a"], params["b"]))
        order.append((params["a"], params["b"]))
        study.tell(t, _values(params))
    before, trials_before = _with_pruned_trials()
    assert order == before
    assert len(study.trials) == N and trials_before == N + len(skips) > N
    assert {t.system_attrs["NSGAIISampler:generation"] for t in study.trials} == {
        0,
        1,
        2,
        3,
        4,
    }  # Optuna's key, 5 generations
