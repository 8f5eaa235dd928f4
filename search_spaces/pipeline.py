"""Pipeline splits and Megatron's ``--pipeline-model-parallel-layout`` string.

A *split* says how many decoder layers each pipeline rank holds in each virtual chunk, in Megatron's terms
``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``; it is handed to Megatron as a layout
string, which has none of the flags' divisibility limits (``Et|(tt|)*30tL`` puts 7 layers on the first rank at VPP 4).
Stage order is Megatron's execution order, VPP-major: stage ``vpp_rank * pp + pp_rank``
(``megatron/core/transformer/pipeline_parallel_layer_layout.py``)."""

from __future__ import annotations

import re
from functools import lru_cache

from specs.errors import InfeasibleLayout

#: Rule id of :class:`InfeasibleLayout` raised for an impossible split.
SPLIT_RULE_ID = "pipeline_split"
#: Rule id of :class:`InfeasibleLayout` raised for a malformed or invalid layout string.
LAYOUT_RULE_ID = "pipeline_layout"

#: Layer symbols of the layout grammar: embedding, decoder ("transformer"), MTP, loss
#: (``char2layer_type`` in ``PipelineParallelLayerLayout.parse_str_to_list``).
LAYER_SYMBOLS = ("E", "t", "m", "L")

_GROUP_RE = re.compile(r"\(([^)]+)\)\*(\d+)")
_CHAR_RE = re.compile(r"(.)\*(\d+)")
_GRAMMAR_CHARS = frozenset("EtmL|()*,0123456789")


def stage_layer_counts(num_layers: int, pp: int, vpp: int, first: int = 0, last: int = 0) -> list[list[int]]:
    """Decoder layers per pipeline rank and virtual chunk, ``counts[pp_rank][vpp_rank]`` (``pp`` lists of ``vpp`` ints
    summing to ``num_layers``, MTP excluded).

    Even split (``first == last == 0``): ``num_layers / (pp * vpp)`` per chunk (``TransformerConfig.__post_init__`` /
    ``validate_args``). Uneven: ``first`` (``last``) is rank 0's (rank ``pp - 1``'s) layers over all its chunks, as
    Megatron's ``num_layers_in_first/last_pipeline_stage`` (0: a middle-sized rank). Middle ranks hold ``m`` layers,
    chunk ``c = m / vpp``; rank 0's chunks are ``[c - d_f, c, ..., c]`` (deficit ``d_f = m - first`` next to the
    embedding), the last rank's ``[c, ..., c, c - d_l]``; a chunk may be empty. With ``pp == 2`` and both given, ``m``
    is the smallest multiple of ``vpp`` not below ``max(first, last)``.

    Raises InfeasibleLayout: (``pipeline_split``) a size not positive, layers that do not divide, ``pp == 1`` with
    first/last set, or a deficit negative or larger than a chunk."""
    return [list(r) for r in _stage_layer_counts(num_layers, pp, vpp, first, last)]


@lru_cache(maxsize=4096)
def _stage_layer_counts(num_layers: int, pp: int, vpp: int, first: int, last: int) -> tuple[tuple[int, ...], ...]:
    def fail(reason: str) -> InfeasibleLayout:
        return InfeasibleLayout(SPLIT_RULE_ID, reason)

    if num_layers < 1 or pp < 1 or vpp < 1:
        raise fail(f"num_layers ({num_layers}), pp ({pp}) and vpp ({vpp}) must all be >= 1")
    if first < 0 or last < 0:
        raise fail(f"first ({first}) and last ({last}) must be >= 0 (0 = a middle-sized rank)")
    if first == 0 and last == 0:
        if num_layers % pp:
            raise fail(f"even split: num_layers ({num_layers}) is not a multiple of pp ({pp})")
        per_rank = num_layers // pp
        if per_rank % vpp:
            raise fail(f"even split: {per_rank} layers per pipeline rank (num_layers {num_layers} / pp {pp}) "
                       f"is not a multiple of vpp ({vpp}); use an uneven split (first/last) instead")
        return tuple((per_rank // vpp,) * vpp for _ in range(pp))
    if pp == 1:
        raise fail(f"pp is 1, so first ({first}) and last ({last}) must be 0 (slime: they must be unset)")

    if pp == 2 and first and last:
        if first + last != num_layers:
            raise fail(f"pp 2: first ({first}) + last ({last}) = {first + last} must equal num_layers ({num_layers})")
        m = -(-max(first, last) // vpp) * vpp
    else:
        given = [v for v in (first, last) if v]
        n_mid = pp - len(given)
        rest = num_layers - sum(given)
        if rest <= 0:
            raise fail(f"first ({first}) + last ({last}) leaves {rest} layers of num_layers ({num_layers}) "
                       f"for the other {n_mid} pipeline ranks")
        if rest % n_mid:
            raise fail(f"the {rest} layers left by first ({first}) and last ({last}) do not divide evenly over the "
                       f"other {n_mid} pipeline ranks (num_layers {num_layers}, pp {pp})")
        m = rest // n_mid
    if m % vpp:
        raise fail(f"a middle pipeline rank holds {m} layers (num_layers {num_layers}, pp {pp}, first {first}, "
                   f"last {last}), which is not a multiple of vpp ({vpp})")
    c = m // vpp
    d_f = m - first if first else 0
    d_l = m - last if last else 0
    for name, val, d in (("first", first, d_f), ("last", last, d_l)):
        if not 0 <= d <= c:
            raise fail(f"{name} ({val}) must lie between {m - c} and {m}: with {m} layers on a middle rank and "
                       f"vpp {vpp} a chunk holds {c} layers, and the {name} rank may lack at most one chunk's worth "
                       f"(deficit {d})")
    rows: list[tuple[int, ...]] = []
    for rank in range(pp):
        chunks = [c] * vpp
        if rank == 0:
            chunks[0] -= d_f
        if rank == pp - 1:
            chunks[-1] -= d_l
        rows.append(tuple(chunks))
    assert sum(map(sum, rows)) == num_layers, (rows, num_layers)
    return tuple(rows)


def _compress_stage(symbols: str) -> str:
    """Run-length code one stage: a run of 3 or more equal symbols becomes ``x*n``."""
    out: list[str] = []
    i = 0
    while i < len(symbols):
        j = i
        while j < len(symbols) and symbols[j] == symbols[i]:
            j += 1
        n = j - i
        out.append(f"{symbols[i]}*{n}" if n >= 3 else symbols[i] * n)
        i = j
    return "".join(out)


def emit_layout_string(num_layers: int, pp: int, vpp: int, first: int = 0, last: int = 0,
                       mtp_num_layers: int = 0) -> str:
    """The compressed ``--pipeline-model-parallel-layout`` string of a split (``first`` / ``last`` as in
    :func:`stage_layer_counts`; ``mtp_num_layers`` placed in the last stage before ``L``).

    Stages in execution order (VPP-major); stage 0 starts with ``E``, the last ends with ``L``. Inside a stage a run of
    3 or more equal symbols becomes ``x*n``; ``k >= 2`` equal consecutive stages other than the final one become
    ``(S|)*k``. The result parses back with Megatron's ``PipelineParallelLayerLayout.parse_str_to_list``
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``). Example: 62 layers, pp 8, vpp 4, first 7, last 7
    gives ``Et|(tt|)*30tL``.

    Raises InfeasibleLayout: (``pipeline_split``) an impossible split, or (``pipeline_layout``) a negative
    ``mtp_num_layers``."""
    if mtp_num_layers < 0:
        raise InfeasibleLayout(LAYOUT_RULE_ID, f"mtp_num_layers ({mtp_num_layers}) must be >= 0")
    counts = _stage_layer_counts(num_layers, pp, vpp, first, last)
    stages: list[str] = []
    for v in range(vpp):
        for p in range(pp):
            stages.append("t" * counts[p][v])
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp_num_layers + "L"
    coded = [_compress_stage(s) for s in stages]

    parts: list[str] = []
    body, final = coded[:-1], coded[-1]
    i = 0
    while i < len(body):
        j = i
        while j < len(body) and body[j] == body[i]:
            j += 1
        k = j - i
        parts.append(f"({body[i]}|)*{k}" if k >= 2 else f"{body[i]}|")
        i = j
    parts.append(final)
    return "".join(parts)


def _syntax_error(text: str, reason: str) -> InfeasibleLayout:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return InfeasibleLayout(LAYOUT_RULE_ID, f"pipeline layout {shown!r}: {reason}")


def parse_layout_string(text: str, pp: int) -> list[list[str]]:
    """Parse a layout string (e.g. ``Et*3|(tt|)*29,m|L``) into its stages in execution order (VPP-major), each a list of
    symbols, as Megatron does.

    Mirrors ``PipelineParallelLayerLayout.parse_str_to_list`` and the stage-count check of its ``__init__``
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``): commas dropped, ``(...)*n`` groups expanded, then
    ``x*n``, then split on ``|``. Only ``E t m L | ( ) * , 0-9``: no whitespace, no nested parentheses, every group
    followed by ``*n``. An empty stage is allowed.

    Raises InfeasibleLayout: (``pipeline_layout``) a syntax error, or a stage count that is not a multiple of ``pp``."""
    if not isinstance(text, str) or not text:
        raise _syntax_error(str(text), "must be a non-empty string")
    if pp < 1:
        raise _syntax_error(text, f"pp ({pp}) must be >= 1")
    bad = sorted({ch for ch in text if ch not in _GRAMMAR_CHARS}, key=text.index)
    if bad:
        shown = ", ".join(repr(ch) for ch in bad)
        raise _syntax_error(text,
                            f"invalid characters {shown} at position {text.index(bad[0])}; only E, t, m, L, '|', "
                            "'(...)*n', 'x*n' and ',' are allowed, with no whitespace")
    depth = 0
    for pos, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > 1:
                raise _syntax_error(text, f"nested parentheses at position {pos} are not allowed")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise _syntax_error(text, f"')' at position {pos} has no matching '('")
    if depth:
        raise _syntax_error(text, "a '(' is never closed")
    flat = text.replace(",", "")
    flat = _GROUP_RE.sub(lambda mt: mt.group(1) * int(mt.group(2)), flat)
    if "(" in flat or ")" in flat:
        raise _syntax_error(text, "every '(...)' group must be non-empty and followed by '*n' with n a number")
    flat = _CHAR_RE.sub(lambda mt: mt.group(1) * int(mt.group(2)), flat)
    leftover = sorted({ch for ch in flat if ch not in "EtmL|"})
    if leftover:
        raise _syntax_error(
            text, f"stray {', '.join(repr(c) for c in leftover)}: a repeat count must follow a symbol as 'x*n'")
    stages = [list(s) for s in flat.split("|")]
    if len(stages) % pp:
        raise _syntax_error(
            text, f"it has {len(stages)} stage(s), which is not a multiple of pp ({pp}); stages = pp * vpp")
    return stages


def layer_counts_from_string(text: str, pp: int, num_layers: int, mtp_num_layers: int = 0) -> list[list[int]]:
    """Parse and validate a layout string: decoder layers (``t``) per rank and chunk, as :func:`stage_layer_counts`.

    Mirrors ``PipelineParallelLayerLayout.validate_layer_layout``
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``): one ``E``, first in execution order, and one
    ``L``, last; ``count(t) == num_layers``; ``count(m) == mtp_num_layers``; no ``t`` after the first ``m``; ``m`` only
    in the last virtual stage of a rank, which holds all of them. Beyond Megatron's check: no stage may be empty
    (NVIDIA/Megatron-LM issue 1852: such a run errors or deadlocks), and ``E`` must be in stage 0 and ``L`` in the last
    (``get_model`` in ``megatron/training/training.py`` builds them there whatever the string says).

    Raises InfeasibleLayout: (``pipeline_layout``) a syntax error or a broken rule, naming the rule and the numbers."""
    stages = parse_layout_string(text, pp)
    vpp = len(stages) // pp
    flat = [s for stage in stages for s in stage]

    def fail(reason: str) -> InfeasibleLayout:
        return _syntax_error(text, reason)

    n_e, n_t, n_m, n_l = (flat.count(s) for s in LAYER_SYMBOLS)
    if n_e != 1 or n_l != 1:
        raise fail(f"needs exactly one E and one L, found {n_e} E and {n_l} L")
    if flat[0] != "E":
        raise fail(f"the first layer must be the embedding E, found {flat[0]!r}")
    if flat[-1] != "L":
        raise fail(f"the last layer must be the loss L, found {flat[-1]!r}")
    if "E" not in stages[0]:
        raise fail("E must be in stage 0 (Megatron builds the embedding on the first stage)")
    if "L" not in stages[-1]:
        raise fail("L must be in the last stage (Megatron builds the output layer on the last stage)")
    if n_t != num_layers:
        raise fail(f"has {n_t} decoder layers t, the model has num_layers {num_layers}")
    if n_m != mtp_num_layers:
        raise fail(f"has {n_m} MTP layers m, the model has mtp_num_layers {mtp_num_layers}")
    if n_m:
        first_m = flat.index("m")
        if "t" in flat[first_m:]:
            raise fail("decoder layers t must come before the MTP layers m")
    for p in range(pp):
        for v in range(vpp):
            stage = stages[v * pp + p]
            if "m" not in stage:
                continue
            if v != vpp - 1:
                raise fail(f"m in pp rank {p}, vpp stage {v}: MTP layers must be in the last vpp stage of a rank")
            if stage.count("m") != mtp_num_layers:
                raise fail(f"pp rank {p}'s last stage holds {stage.count('m')} of the {mtp_num_layers} MTP layers; "
                           "all of them must be in the same stage")
    for i, stage in enumerate(stages):
        if not stage:
            raise fail(
                f"stage {i} is empty: Megatron's parser accepts an empty stage (its docs: 'E||t|L'), but such runs "
                "error or deadlock (NVIDIA/Megatron-LM issue 1852, open: 'Et|(tt|)*29|L' fails); give every stage a "
                "layer (a stage with only E, m or L is fine: Megatron's own DeepSeek example 'Et*3|(tt|)*29,m|L')")
    return [[stages[v * pp + p].count("t") for v in range(vpp)] for p in range(pp)]
