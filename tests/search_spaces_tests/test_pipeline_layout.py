"""Pipeline splits and the ``--pipeline-model-parallel-layout`` string (search_spaces/pipeline.py)."""

from __future__ import annotations

import itertools

import pytest

from search_spaces.pipeline import (
    emit_layout_string,
    layer_counts_from_string,
    parse_layout_string,
    stage_layer_counts,
)
from specs.errors import InfeasibleLayout

SEED_STRING = "Et|(tt|)*30tL"
SEED_COUNTS = [[1, 2, 2, 2]] + [[2, 2, 2, 2]] * 6 + [[2, 2, 2, 1]]


# --------------------------------------------------------------------------- stage_layer_counts


def test_seed_split_counts() -> None:
    counts = stage_layer_counts(62, 8, 4, 7, 7)
    assert counts == SEED_COUNTS
    assert [sum(r) for r in counts] == [7, 8, 8, 8, 8, 8, 8, 7]


def test_even_split() -> None:
    assert stage_layer_counts(62, 2, 1) == [[31], [31]]
    assert stage_layer_counts(64, 8, 4) == [[2, 2, 2, 2]] * 8
    assert stage_layer_counts(62, 1, 2) == [[31, 31]]


def test_one_sided_uneven_split() -> None:
    # Only first given: the last rank is a normal middle-sized rank.
    assert stage_layer_counts(62, 8, 4, 6, 0) == [[0, 2, 2, 2]] + [[2, 2, 2, 2]] * 7
    assert stage_layer_counts(62, 8, 1, 0, 6) == [[8]] * 7 + [[6]]


def test_pp2_both_given_uses_smallest_middle_size() -> None:
    # 31 + 31: m = 32 (smallest multiple of vpp 2 >= 31), chunk 16, one layer short at each end.
    assert stage_layer_counts(62, 2, 2, 31, 31) == [[15, 16], [16, 15]]
    assert stage_layer_counts(62, 2, 4, 32, 30) == [[8, 8, 8, 8], [8, 8, 8, 6]]
    assert stage_layer_counts(62, 2, 1, 32, 30) == [[32], [30]]


def test_empty_chunk_allowed() -> None:
    # Deficit equal to a whole chunk leaves rank 0's first chunk empty ("E|...").
    assert stage_layer_counts(60, 8, 4, 6, 6) == [[0, 2, 2, 2]] + [[2, 2, 2, 2]] * 6 + [[2, 2, 2, 0]]
    assert emit_layout_string(60, 8, 4, 6, 6).startswith("E|")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((62, 3, 1), "num_layers (62) is not a multiple of pp (3)"), ((64, 8, 3), "8 layers per pipeline rank"),
        ((62, 8, 1, 9, 9), "44 layers"), ((62, 8, 4, 5, 7), "first (5)"), ((62, 1, 1, 7, 0), "pp is 1"),
        ((62, 2, 4, 30, 30), "must equal num_layers (62)"), ((62, 8, 1, 0, 13), "last (13)"),
        ((62, 8, 4, 3, 3), "first (3)"),
    ],
)
def test_infeasible_splits(args: tuple[int, ...], needle: str) -> None:
    with pytest.raises(InfeasibleLayout) as exc:
        stage_layer_counts(*args)
    assert exc.value.rule_id == "pipeline_split"
    assert needle in exc.value.reason


# --------------------------------------------------------------------------- emit


def test_seed_string_exact() -> None:
    assert emit_layout_string(62, 8, 4, 7, 7) == SEED_STRING


def test_even_pp2_string_exact() -> None:
    assert emit_layout_string(62, 2, 1) == "Et*31|t*31L"


def test_emit_other_shapes() -> None:
    assert emit_layout_string(62, 2, 2, 31, 31, mtp_num_layers=3) == "Et*15|(t*16|)*2t*15m*3L"
    assert emit_layout_string(62, 1, 1) == "Et*62L"
    assert emit_layout_string(64, 8, 4) == "Ett|(tt|)*30ttL"
    assert emit_layout_string(62, 16, 1, 2, 0) == "Ett|(t*4|)*14t*4L"


# --------------------------------------------------------------------------- parse


def test_parse_seed_string() -> None:
    stages = parse_layout_string(SEED_STRING, 8)
    assert len(stages) == 32
    assert stages[0] == ["E", "t"]
    assert stages[1:31] == [["t", "t"]] * 30
    assert stages[31] == ["t", "L"]
    counts = layer_counts_from_string(SEED_STRING, 8, 62)
    assert counts == SEED_COUNTS
    assert counts[0] == [1, 2, 2, 2] and sum(counts[0]) == 7 and sum(counts[7]) == 7
    assert all(sum(r) == 8 for r in counts[1:7])


def test_parse_deepseek_doc_example() -> None:
    text = "Et*3|(tt|)*29,m|L"
    stages = parse_layout_string(text, 16)
    assert len(stages) == 32
    assert stages[0] == ["E", "t", "t", "t"] and stages[30] == ["m"] and stages[31] == ["L"]
    counts = layer_counts_from_string(text, 16, 61, mtp_num_layers=1)
    assert counts[0] == [3, 2]
    assert counts[14] == [2, 0] and counts[15] == [2, 0]  # m and L stages hold no decoder layer
    assert sum(map(sum, counts)) == 61


@pytest.mark.parametrize(
    ("text", "pp", "layers", "mtp", "stages"),
    [
        ("Et*3|(tt|)*6tmL", 2, 16, 1, 8), ("Et*3|(tt|)*6mL", 2, 15, 1, 8), ("Et*7|t*7mL", 2, 14, 1, 2),
        ("Et*2|(tt|)*5t|tmL", 4, 14, 1, 8),
    ],
)
def test_parse_megatron_examples(text: str, pp: int, layers: int, mtp: int, stages: int) -> None:
    assert len(parse_layout_string(text, pp)) == stages
    counts = layer_counts_from_string(text, pp, layers, mtp)
    assert sum(map(sum, counts)) == layers


def test_round_trip() -> None:
    for layers, pp, vpp, (first, last), mtp in itertools.product(
        (24, 61, 62, 94), (1, 2, 4, 8, 16), (1, 2, 4), [(0, 0), (7, 7), (0, 6), (31, 31), (3, 4), (14, 0)], (0, 1, 3)
    ):
        try:
            expected = stage_layer_counts(layers, pp, vpp, first, last)
        except InfeasibleLayout:
            continue
        text = emit_layout_string(layers, pp, vpp, first, last, mtp)
        assert layer_counts_from_string(text, pp, layers, mtp) == expected, text


@pytest.mark.parametrize("text", ["E||t|L", "Et|(tt|)*29|L"])
def test_an_empty_stage_is_refused(text: str) -> None:
    """Megatron's docs call ``E||t|L`` legal, but runs with an empty stage error or deadlock (NVIDIA/Megatron-LM
    issue 1852, whose example is the second string); stages with only E, m or L are fine."""
    pp = 2 if text.startswith("E||") else 16
    with pytest.raises(InfeasibleLayout, match="is empty"):
        layer_counts_from_string(text, pp, 1 if pp == 2 else 59)


@pytest.mark.parametrize(
    ("text", "mtp", "needle"),
    [
        ("Et*31| t*31L", 0, "invalid characters ' '"), ("E((t|)*2)*15L", 0, "nested parentheses"),
        ("Et*31|t*31", 0, "exactly one E and one L"),
        ("Et*31|t*30L", 0, "has 61 decoder layers t, the model has num_layers 62"),
        ("Et*31|t*31|L", 0, "3 stage(s), which is not a multiple of pp (2)"), ("(Et*31|t*31L)", 0, "followed by '*n'"),
        ("Et*31x|t*31L", 0, "invalid characters 'x'"), ("L|Et*31|t*31|", 0, "first layer must be the embedding E"),
        ("Et*31|t*31mL", 0, "has 1 MTP layers m, the model has mtp_num_layers 0"),
        ("Et*30m|t*32L", 1, "decoder layers t must come before the MTP layers m"),
        ("|Et*31|t*31|L", 0, "E must be in stage 0"),
        ("Et*31|t*31m||L", 1, "MTP layers must be in the last vpp stage of a rank"),
        ("Et*31|t*31m|m|L", 2, "holds 1 of the 2 MTP layers"),
    ],
)
def test_malformed_strings(text: str, mtp: int, needle: str) -> None:
    with pytest.raises(InfeasibleLayout) as exc:
        layer_counts_from_string(text, 2, 62, mtp)
    assert exc.value.rule_id == "pipeline_layout"
    assert needle in exc.value.reason
    assert text in exc.value.reason
