"""Layouts in words, in the seed recipe's style: the ``layout.summary`` sentence and the pipeline-layout note."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from launch.exporters._flags import _max_tokens_per_gpu, _pipeline_layout_string
from specs import ModelSpec, Workload
from specs.layout import Layout, RecomputeGranularity

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def _expand_layout(s: str) -> list[str]:
    """Stages of a ``--pipeline-model-parallel-layout`` string (Megatron's
    ``PipelineParallelLayerLayout.parse_str_to_list`` grammar)."""
    s = s.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return s.split("|")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _and(parts: Sequence[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _stage_content(stage: str) -> str:
    parts: list[str] = []
    for ch in dict.fromkeys(stage):  # order of first appearance
        n = stage.count(ch)
        parts.append(
            {"E": "the embedding", "L": "the loss"}.get(ch)
            or (_plural(n, "layer") if ch == "t" else _plural(n, "MTP layer"))
        )
    return _and(parts) or "nothing"


def _ranks_phrase(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + _and([str(r) for r in ranks])


def _rank_layers(stages: Sequence[str], pp: int) -> list[int]:
    counts = [0] * pp
    for i, st in enumerate(stages):
        counts[i % pp] += st.count("t")
    return counts


def _layout_note(pls: str, layout: Layout, model: ModelSpec) -> str:
    """The seed's explanation of a layout string, e.g. "cuts the 62 layers into 32 virtual stages, ..."."""
    stages = _expand_layout(pls)
    n, pp = len(stages), layout.pp
    vpp = n // pp
    what = f"the {model.num_layers} layers"
    if model.mtp_num_layers:
        what += f" and {_plural(model.mtp_num_layers, 'MTP layer')}"
    head = f"`--pipeline-model-parallel-layout '{pls}'` cuts {what} into "
    head += f"{n} virtual stages, {vpp} per pipeline rank: " if vpp > 1 else f"{n} pipeline stages, one per rank: "
    runs: list[list[Any]] = []  # [content, first index, count]
    for i, st in enumerate(stages):
        if runs and runs[-1][0] == st:
            runs[-1][2] += 1
        else:
            runs.append([st, i, 1])
    if len(runs) == 3 and runs[0][2] == 1 and runs[2][2] == 1:
        k = runs[1][2]
        k_words = "one" if k == 1 else str(k)
        body = (
            f"the first holds {_stage_content(runs[0][0])}, the last {_stage_content(runs[2][0])}, "
            f"and the {k_words} in between {_stage_content(runs[1][0])}{'' if k == 1 else ' each'}"
        )
    else:
        parts = []
        for content, i, c in runs:
            if c == 1:
                parts.append(f"stage {i} holds {_stage_content(content)}")
            else:
                parts.append(f"stages {i}-{i + c - 1} hold {_stage_content(content)} each")
        body = "; ".join(parts)
    counts = _rank_layers(stages, pp)
    groups: dict[int, list[int]] = {}
    for r, c in enumerate(counts):
        groups.setdefault(c, []).append(r)
    if len(groups) == 1:
        tail = f"so every rank holds {_plural(counts[0], 'layer')}"
    else:
        major = max(groups, key=lambda c: (len(groups[c]), c))
        if len(groups[major]) == 1:
            tail = "so " + _and([f"{_ranks_phrase([r])} holds {_plural(c, 'layer')}" for r, c in enumerate(counts)])
        else:
            minor = [(c, rs) for c, rs in groups.items() if c != major]
            bits = []
            for j, (c, rs) in enumerate(minor):
                verb = "holds" if len(rs) == 1 else "hold"
                bits.append(f"{_ranks_phrase(rs)} {verb} {c} layers" if j == 0 else f"{_ranks_phrase(rs)} {c}")
            tail = "so " + _and([*bits, f"the others {major}"])
    return f"{head}{body}, {tail}."


def _pp_phrase(layout: Layout, model: ModelSpec, pls: str | None) -> str:
    if pls is None:
        return f"PP {layout.pp}"
    counts = _rank_layers(_expand_layout(pls), layout.pp)
    if len(set(counts)) == 1:
        return f"PP {layout.pp}"
    first, last, mid = counts[0], counts[-1], counts[1:-1]
    if mid and len(set(mid)) > 1:
        return f"PP {layout.pp} (layers per stage {', '.join(map(str, counts))})"
    others = f", the others {mid[0]}" if mid else ""
    if first == last:
        return f"PP {layout.pp} (first and last stage {first} layers{others})"
    if mid and first == mid[0]:
        return f"PP {layout.pp} (last stage {last} layers{others})"
    if mid and last == mid[0]:
        return f"PP {layout.pp} (first stage {first} layers{others})"
    return f"PP {layout.pp} (first stage {first} layers, last stage {last}{others})"


def _every_weight_note(workload: Workload, framework: str) -> list[str]:
    """A header sentence for a format whose launch has no LoRA arguments (``framework``'s): with ``--task lora`` it
    trains every weight; none for another task."""
    if workload.task != "lora":
        return []
    return [f"Priced for --task lora, but {framework} has no LoRA: this trains every weight, with more memory than "
            "predicted; `tune export --format bridge` writes Megatron-Bridge's LoRA (peft)."]


def _summary(layout: Layout, model: ModelSpec, workload: Workload, pls: str | None = None) -> str:
    """One sentence in the seed's style (``layout.summary``)."""
    if pls is None:
        pls = _pipeline_layout_string(layout, model)
    tp = f"TP {layout.tp}" + (" with sequence parallelism" if layout.sequence_parallel and layout.tp > 1 else "")
    degrees = [tp, _pp_phrase(layout, model, pls)]
    if layout.vpp > 1:
        degrees.append(f"VPP {layout.vpp}")
    degrees.append(f"CP {layout.cp}")
    if model.is_moe:
        degrees += [f"EP {layout.ep}", f"ETP {layout.etp}"]
    degrees.append(f"DP {layout.dp}")
    mbs = layout.micro_batch_size
    rows = f"{_WORDS.get(mbs, str(mbs))} {workload.seq_length:,}-token row{'' if mbs == 1 else 's'} per microbatch"
    if layout.cp > 1:
        rows += f" ({_max_tokens_per_gpu(layout, workload):,} tokens per GPU)"
    g = layout.recompute_granularity
    if g == RecomputeGranularity.full:
        rec = f"full recompute ({layout.recompute_method.value}, {_plural(layout.recompute_num_layers, 'layer')})"
    elif g == RecomputeGranularity.selective:
        rec = f"selective recompute ({', '.join(layout.recompute_modules or ('core_attn',))})"
    else:
        rec = "no recompute"
    opt = "distributed optimizer" if layout.use_distributed_optimizer else "non-distributed optimizer"
    if layout.use_precision_aware_optimizer:
        opt = "precision-aware " + opt
    low = [n for n, d in (("exp_avg", layout.exp_avg_dtype), ("exp_avg_sq", layout.exp_avg_sq_dtype)) if d != "fp32"]
    if low:
        opt += f" with bf16 {' and '.join(low)}"
    if layout.optimizer_offload_fraction > 0:
        overlap = ", overlapped copies" if layout.overlap_cpu_optimizer_d2h_h2d else ""
        off = f"CPU optimizer offload (fraction {float(layout.optimizer_offload_fraction)}{overlap})"
    else:
        off = "no offload"
    parts = [", ".join(degrees), rows, rec, opt, off]
    if model.is_moe:
        d = layout.dispatcher
        parts.append(f"flex dispatcher with {d.traits.library}" if d.is_flex else f"{d.value} dispatcher")
    return "; ".join(parts)

