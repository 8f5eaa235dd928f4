"""The RL step model: how generation, log-probs, training, refit and the switch add up.

Colocated (one after the other on every GPU)::

    T = generation + log-prob + training + refit + switch + overhead

Split, synchronous (K = 0)::

    T = generation + log-prob + training + refit + overhead

Split with K >= 1 steps of asynchrony (NeMo-RL ``max_trajectory_age_steps = K``, slime ``train_async.py``)::

    T = max(generation, log-prob + training) + refit + overhead

The refit stays exposed (NeMo-RL's ``weight_sync`` timer is inside ``total_step_time``); ``generation`` is then the
steady-state time per step of the engines (:mod:`rl.plan` queues K + 1 steps of requests and divides)."""

from __future__ import annotations

from dataclasses import dataclass

from specs.errors import TunerError

__all__ = ["StepParts", "compose_step"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepParts:
    """Predicted parts of one RL step (seconds) and how they combine."""

    generation_s: float
    logprob_s: float
    training_s: float
    refit_s: float
    switch_s: float
    overhead_s: float
    colocated: bool
    async_steps: int

    @property
    def step_time_s(self) -> float:
        """The step time (s), by the formula of the module docstring."""
        train_side = self.logprob_s + self.training_s
        if self.colocated:
            return self.generation_s + train_side + self.refit_s + self.switch_s + self.overhead_s
        if self.async_steps == 0:
            return self.generation_s + train_side + self.refit_s + self.overhead_s
        return max(self.generation_s, train_side) + self.refit_s + self.overhead_s

    @property
    def bound(self) -> str:
        """Which side sets the step time: ``generation``, ``training`` or ``serial`` (K = 0 / colocated)."""
        if self.colocated or self.async_steps == 0:
            return "serial"
        return "generation" if self.generation_s >= self.logprob_s + self.training_s else "training"


def compose_step(*, generation_s: float, logprob_s: float, training_s: float, refit_s: float, switch_s: float,
                 overhead_s: float, colocated: bool, async_steps: int) -> StepParts:
    """Build :class:`StepParts` (``switch_s`` counts only when colocated).

    Raises TunerError: a colocated plan with asynchrony (the same GPUs cannot generate and train at once; NeMo-RL's
    async GRPO requires ``colocated.enabled: false``)."""
    if colocated and async_steps:
        raise TunerError(f"--async-steps {async_steps} needs non-colocated generation (NeMo-RL and slime run async "
                         "GRPO on separate GPUs)")
    return StepParts(generation_s=generation_s, logprob_s=logprob_s, training_s=training_s, refit_s=refit_s,
                     switch_s=switch_s if colocated else 0.0, overhead_s=overhead_s, colocated=colocated,
                     async_steps=async_steps)
