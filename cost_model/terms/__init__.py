"""The cost model's terms: small pure functions, each one memory or time term of the estimate.

Every term takes the :class:`~cost_model.terms.context.TableContext` of a table of layouts (and the terms it builds on)
and returns an array of shape ``(n,)``, ``(n, 1)`` or ``(n, K)`` (per pipeline-rank class), its docstring giving the
formula, shapes, units and source; :func:`cost_model.estimate.estimate_table` composes them (``docs/cost_model.md`` has
the table of terms). Terms call each other through their modules (``compute.gemm_efficiency(...)``), so that replacing
one term (``benchmarks/mutate_terms.py``) changes every use of it."""

from __future__ import annotations

__all__ = ["TERM_MODULES"]

#: The modules whose public functions are terms (``benchmarks/mutate_terms.py`` perturbs each).
TERM_MODULES = (
    "cost_model.terms.params", "cost_model.terms.state", "cost_model.terms.activations", "cost_model.terms.memory",
    "cost_model.terms.schedule", "cost_model.terms.compute", "cost_model.terms.comm", "cost_model.terms.recompute",
    "cost_model.terms.optimizer", "cost_model.terms.lora")
