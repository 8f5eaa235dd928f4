"""Megatron's validity rules, pipeline layout strings and the search space (its enumeration).

Builds on :mod:`specs` only (the layout types live there)."""

from __future__ import annotations

from search_spaces.pipeline import emit_layout_string, layer_counts_from_string, parse_layout_string, stage_layer_counts
from search_spaces.rules import RULES, check_layout, check_table
from search_spaces.space import Enumeration, SearchSpace, enumerate_layouts

__all__ = [
    "Enumeration", "RULES", "SearchSpace", "check_layout", "check_table", "emit_layout_string", "enumerate_layouts",
    "layer_counts_from_string", "parse_layout_string", "stage_layer_counts"]
