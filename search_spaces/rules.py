"""Megatron-core's validity rules, vectorised over a :class:`LayoutTable`.

Each rule is a pure function over numpy columns (``True`` = passes) plus a one-layout explanation naming the values and
what would be accepted. Sources are megatron-core at slime's pin ``1dcf0daf`` (core 0.16.0rc0) unless a rule says
otherwise (``shared/notes/megatron_rules.md`` §1-5); a few are the tuner's own canonical forms, and say so. Rules that
depend on the megatron-core release or the cluster's fabric read a :class:`RuleEnv` (none: what every release and fabric
accept). A rule is added in :mod:`search_spaces.rule_checks` with :func:`~search_spaces.rule_base.rule`; its docstring
is its description.

Usage::

    ok, first_failures = check_table(table, model, workload, env=RuleEnv.of(cluster, options))
    problems = check_layout(layout, model, workload)   # [(rule_id, reason), ...]"""

from __future__ import annotations

import numpy as np

from search_spaces import rule_checks, rule_options  # noqa: F401  (register the rules)
from search_spaces.rule_base import (
    DEFAULT_RULE_ENV,
    MOE_RECOMPUTE_MODULES,
    POLICY_RULES,
    REGISTERED,
    BoolArray,
    Rule,
    RuleEnv,
    applicable_recompute_modules,
)
from search_spaces.rule_checks import FLEX_BACKEND_SINCE as FLEX_BACKEND_SINCE
from search_spaces.rule_checks import TP_ABOVE_QUERY_GROUPS_SINCE as TP_ABOVE_QUERY_GROUPS_SINCE
from search_spaces.rule_checks import layout_warnings
from specs import ModelSpec, Workload
from specs.layout import Layout, LayoutTable

__all__ = [
    "DEFAULT_RULE_ENV", "Rule", "RuleEnv", "RULES", "RULE_IDS", "MOE_RECOMPUTE_MODULES", "POLICY_RULES", "check_table",
    "check_layout", "run_option_problems", "applicable_recompute_modules", "layout_warnings"]


#: Every rule, in the order they are checked (:func:`search_spaces.rule_base.rule` registers each with its check).
#: Rules over the parallel sizes come first so that the enumeration can apply them before crossing in the rest.
RULES: tuple[Rule, ...] = tuple(REGISTERED)

#: Rule ids in check order.
RULE_IDS: tuple[str, ...] = tuple(r.id for r in RULES)
assert len(set(RULE_IDS)) == len(RULE_IDS)


def check_table(table: LayoutTable, model: ModelSpec, workload: Workload,
                env: RuleEnv = DEFAULT_RULE_ENV) -> tuple[BoolArray, dict[str, int]]:
    """Check every row of ``table`` against :data:`RULES` (``env``: release and network of the environment-dependent
    rules): ``(ok, first_failures)``, a bool array (True = valid) and, per rule id in check order, the rows whose first
    failing rule it is (``sum(first_failures.values()) + ok.sum() == len(table)``)."""
    alive = np.ones(len(table), dtype=np.bool_)
    counts: dict[str, int] = {}
    for rule in RULES:
        ok = rule.check(table, model, workload, env)
        counts[rule.id] = int(np.count_nonzero(alive & ~ok))
        alive &= ok
    return alive, counts


def check_layout(layout: Layout, model: ModelSpec, workload: Workload,
                 env: RuleEnv = DEFAULT_RULE_ENV) -> list[tuple[str, str]]:
    """Every rule ``layout`` breaks (``env``: release and network of the environment-dependent rules), with its reason:
    ``[(rule_id, reason), ...]`` in check order; empty when the layout is valid."""
    table = LayoutTable.from_layouts([layout])
    return [(rule.id, rule.explain(layout, model, workload, env))
            for rule in RULES
            if not bool(rule.check(table, model, workload, env)[0])]


def run_option_problems(model: ModelSpec, workload: Workload, env: RuleEnv) -> list[tuple[str, str]]:
    """The rules that read no layout column (``columns`` empty: the run options alone break them) and that ``env``
    breaks for ``model``: then no layout can run.

    Returns: ``[(rule_id, reason), ...]`` in check order; empty when the options leave layouts to search."""
    probe = Layout(world_size=1)
    table = LayoutTable.from_layouts([probe])
    return [(rule.id, rule.explain(probe, model, workload, env)) for rule in RULES
            if not rule.columns and not bool(rule.check(table, model, workload, env)[0])]
