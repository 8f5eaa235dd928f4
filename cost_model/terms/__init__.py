"""The cost model's terms: small pure functions, each one memory or time term of the estimate.

Every term takes the :class:`~cost_model.terms.context.TableContext` of a table of layouts (and the terms it builds on,
as arguments) and returns a numpy array of shape ``(n,)`` per layout, ``(n, 1)`` per layout as a column, or ``(n, K)``
per layout and pipeline-rank class. Each docstring gives the formula, the shapes and units, and its source.
:func:`cost_model.estimate.estimate_table` composes them.

Modules (``docs/cost_model.md`` has the table of terms):

- :mod:`~cost_model.terms.context`: the table's derived quantities (sizes, ranks, masks, peaks);
- :mod:`~cost_model.terms.ranks`: pipeline-rank classes;
- :mod:`~cost_model.terms.params`: parameters per GPU;
- :mod:`~cost_model.terms.state`: weights, main gradients, optimizer states (bytes);
- :mod:`~cost_model.terms.activations`: per-layer activations by part, and what recompute keeps;
- :mod:`~cost_model.terms.memory`: in-flight activations, logits, dispatcher buffers, overhead;
- :mod:`~cost_model.terms.schedule`: in-flight micro-batches, pipeline bubble, pipeline p2p;
- :mod:`~cost_model.terms.compute`: FLOPs and compute time per layer;
- :mod:`~cost_model.terms.comm`: TP / CP / EP / DP communication;
- :mod:`~cost_model.terms.recompute`: recompute time;
- :mod:`~cost_model.terms.optimizer`: the optimizer step and CPU offload.

Convention: terms call each other through their modules (``compute.gemm_efficiency(...)``,
never ``from cost_model.terms.compute import gemm_efficiency``), so that replacing one term
(``benchmarks/mutate_terms.py``) changes every use of it.
"""

from __future__ import annotations

__all__ = ["TERM_MODULES"]

#: The modules whose public functions are terms (``benchmarks/mutate_terms.py`` perturbs each).
TERM_MODULES = (
    "cost_model.terms.params",
    "cost_model.terms.state",
    "cost_model.terms.activations",
    "cost_model.terms.memory",
    "cost_model.terms.schedule",
    "cost_model.terms.compute",
    "cost_model.terms.comm",
    "cost_model.terms.recompute",
    "cost_model.terms.optimizer",
)
