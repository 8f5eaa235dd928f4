"""Charts of where a step's time and a GPU's memory go (predicted): stacked bars of one layout or a Pareto front, as
plotly figure specs (plain dicts, for ``tuner/report_html.py``) and PNGs (``tune estimate --plot``), and a step
timeline (:mod:`cost_model.timeline`) as a Gantt chart (``tune timeline --png``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cost_model.estimate import MEMORY_PARTS, TIME_PARTS
from cost_model.types import Estimate
from specs.units import GIB

#: One colour per part, shared by every chart (plotly and matplotlib take the same hex strings).
MEMORY_COLOURS = {
    "weights": "#1f77b4", "main_grads": "#aec7e8", "optimizer": "#ff7f0e", "activations": "#2ca02c",
    "logits": "#98df8a", "dispatcher_buffers": "#9467bd", "framework_overhead": "#c7c7c7",
}
TIME_COLOURS = {
    "compute": "#2ca02c", "recompute": "#ffbb33", "tp_comm": "#d62728", "cp_comm": "#ff9896", "ep_comm": "#8c1c13",
    "pp_bubble": "#e8e8e8", "pp_p2p": "#9467bd", "dp_comm": "#8c564b", "optimizer": "#bcbd22", "offload": "#17becf",
}
_PART_LABELS = {"main_grads": "main grads (fp32)", "dispatcher_buffers": "dispatcher buffers",
                "framework_overhead": "framework overhead", "tp_comm": "TP comm", "cp_comm": "CP comm",
                "ep_comm": "EP all-to-all", "pp_bubble": "pipeline bubble", "pp_p2p": "PP p2p", "dp_comm": "DP comm",
                "offload": "CPU offload"}


def _label(part: str) -> str:
    return _PART_LABELS.get(part, part)


def breakdown_figures(items: Sequence[tuple[str, Estimate]], *, title: str = "") -> tuple[dict[str, Any],
                                                                                          dict[str, Any]]:
    """(memory figure, time figure) as plotly figure specs: stacked bars of the memory parts (GiB per GPU, worst
    pipeline rank) and time parts (s per step), one bar per ``(x label, estimate)`` of ``items``, one trace per part
    (the parts add up to the peak and the step time)."""
    xs = [x for x, _ in items]
    mem = [{"type": "bar", "name": _label(p), "x": xs, "y": [e.memory[p] / GIB for _, e in items],
            "marker": {"color": MEMORY_COLOURS[p]},
            "hovertemplate": f"%{{x}}<br>{_label(p)}: %{{y:.2f}} GiB<extra></extra>",
            "meta": {"part": p}} for p in MEMORY_PARTS]
    tim = [{"type": "bar", "name": _label(p), "x": xs, "y": [e.time[p] for _, e in items],
            "marker": {"color": TIME_COLOURS[p]},
            "hovertemplate": f"%{{x}}<br>{_label(p)}: %{{y:.3f}} s<extra></extra>",
            "meta": {"part": p}} for p in TIME_PARTS]
    common = {"barmode": "stack", "legend": {"traceorder": "normal"}, "margin": {"t": 50, "b": 190},
              "xaxis": {"tickangle": -40}}
    sep = f" - {title}" if title else ""
    return (
        {"data": mem,
         "layout": {**common, "title": {"text": f"Memory per GPU, worst pipeline rank (predicted){sep}"},
                    "yaxis": {"title": {"text": "GiB"}}}},
        {"data": tim,
         "layout": {**common, "title": {"text": f"Step time by part (predicted){sep}"},
                    "yaxis": {"title": {"text": "seconds per step"}}}},
    )


def front_trend(items: Sequence[Estimate]) -> list[str]:
    """Sentences naming what changes most from the front's least-memory layout to its most-memory one (the items in that
    order): the memory part that grows most (GiB) and the time parts that shrink and grow most (seconds). Returns up to
    three sentences; empty for fewer than two layouts."""
    if len(items) < 2:
        return []
    a, b = items[0], items[-1]
    dm = {p: (b.memory[p] - a.memory[p]) / GIB for p in MEMORY_PARTS}
    dt = {p: b.time[p] - a.time[p] for p in TIME_PARTS}
    grow = max(dm, key=lambda p: dm[p])
    shrink = min(dt, key=lambda p: dt[p])
    up = max(dt, key=lambda p: dt[p])
    out = [f"From the front's least-memory layout ({a.layout.label}, {a.peak_gib:.1f} GiB) to its most-memory one "
           f"({b.layout.label}, {b.peak_gib:.1f} GiB), the memory part that grows most is {_label(grow)}: "
           f"{dm[grow]:+.1f} GiB."]
    if dt[shrink] < 0:
        out.append(f"The time part that shrinks most is {_label(shrink)}: {dt[shrink]:+.3f} s per step "
                   f"(step {a.step_time_s:.2f} s -> {b.step_time_s:.2f} s).")
    if dt[up] > 0:
        out.append(f"The time part that grows most is {_label(up)}: {dt[up]:+.3f} s per step.")
    return out


def check_image_path(option: str, path: Path, *, force: bool = False) -> None:
    """Refuse an image path matplotlib cannot write, before any work: empty, a folder, a missing folder, or a suffix
    that is not one of matplotlib's file types (``FigureCanvasBase.get_supported_filetypes``: png, pdf, svg, ...).
    Raises TunerError: naming ``option``, the path and what is accepted."""
    from matplotlib.backend_bases import FigureCanvasBase

    from specs.errors import TunerError
    from tuner.study.config import check_output_path

    kinds = sorted(FigureCanvasBase.get_supported_filetypes())
    if not str(path).strip() or path.is_dir():
        raise TunerError(f"{option} {str(path)!r}: give an image file name, e.g. chart.png (accepted types: "
                         f"{', '.join(kinds)})")
    check_output_path(option, path, force=force)  # a missing folder, a link, or a study's own file
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in kinds:
        raise TunerError(f"{option} {str(path)!r}: {('.' + suffix) if suffix else 'no file type'} is not an image type "
                         f"matplotlib writes; accepted: {', '.join(kinds)}")


def save_figure(fig: Any, path: Path, *, force: bool = False) -> None:
    """Draw ``fig`` in the file type of ``path``'s suffix and write it with :func:`specs.files.write_output`. Raises
    TunerError: as :func:`specs.files.write_output`."""
    import io

    from specs.files import write_output

    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".").lower() or "png")
    write_output(path, buf.getvalue(), force=force)


def plot_breakdown(path: Path, e: Estimate, *, title: str = "") -> None:
    """A PNG of one layout's two stacked bars: memory parts (GiB per GPU, worst pipeline rank, against the usable
    memory) and time parts (seconds per step). Raises OSError: the file cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (am, at) = plt.subplots(1, 2, figsize=(9, 5.2), dpi=120)
    for ax, parts, values, colours, unit in (
        (am, MEMORY_PARTS, [e.memory[p] / GIB for p in MEMORY_PARTS], MEMORY_COLOURS,
         "GiB per GPU (worst pipeline rank)"),
        (at, TIME_PARTS, [e.time[p] for p in TIME_PARTS], TIME_COLOURS, "seconds per step"),
    ):
        bottom = 0.0
        for p, v in zip(parts, values):
            if v > 0:
                ax.bar([0], [v], bottom=bottom, color=colours[p], edgecolor="white", linewidth=0.5,
                       label=f"{_label(p)}: {v:.2f}" if unit.startswith("GiB") else f"{_label(p)}: {v:.3f}")
                bottom += v
        ax.set_xticks([])
        ax.set_xlim(-0.8, 2.6)
        ax.set_ylabel(unit)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="center right", frameon=False)  # top of the stack first
        ax.grid(axis="y", alpha=0.3)
    am.axhline(e.usable_bytes / GIB, color="#555", ls="--", lw=0.8)
    am.text(0.45, e.usable_bytes / GIB, " usable", va="bottom", fontsize=7, color="#555")
    am.set_title(f"memory: {e.peak_gib:.1f} GiB", fontsize=9)
    at.set_title(f"step: {e.step_time_s:.2f} s, {e.tokens_per_s_per_gpu:,.0f} tokens/s/GPU", fontsize=9)
    fig.suptitle(f"{title or e.layout.label} (predicted)", fontsize=10)
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)


#: Gantt colours of the trace's event categories (:mod:`cost_model.timeline`).
_GANTT = {"forward": "#6baed6", "backward": "#2171b5", "hidden": "#bdbdbd",
          **{k: v for k, v in TIME_COLOURS.items() if k != "pp_bubble"}}
_GANTT_LABELS = {"forward": "forward (F<micro-batch>)", "backward": "backward (B<micro-batch>)",
                 "hidden": "communication hidden behind compute"}


def plot_timelines(path: Path, traces: Sequence[dict[str, Any]], *, titles: Sequence[str] | None = None,
                   force: bool = False) -> None:
    """A PNG Gantt chart of step traces (:func:`cost_model.timeline.step_trace`), one panel each on a common time axis:
    per pipeline rank its forward / backward chunks and the same time by part. Raises OSError: the file cannot be
    written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from cost_model.timeline import HIDDEN_TID, P2P_TID, PARTS_TID

    n = len(traces)
    ranks = [max(e["pid"] for e in t["traceEvents"] if e["ph"] == "X") + 1 for t in traces]
    fig, axes = plt.subplots(n, 1, figsize=(14, 1.2 + 0.62 * sum(ranks) + 0.9 * n), dpi=110, squeeze=False,
                             gridspec_kw={"height_ratios": [max(r, 1) for r in ranks]})
    end = max(max(e["ts"] + e["dur"] for e in t["traceEvents"] if e["ph"] == "X") for t in traces) / 1e6
    seen: set[str] = set()
    for k, (trace, ax) in enumerate(zip(traces, axes[:, 0])):
        od = trace.get("otherData", {})
        pp = ranks[k]
        yt, yl = [], []
        # one collection per lane and part: thousands of events
        bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for e in trace["traceEvents"]:
            if e["ph"] != "X" or e["tid"] in (HIDDEN_TID, P2P_TID):
                continue
            row = (pp - 1 - e["pid"]) * 3 + (1 if e["tid"] == PARTS_TID else 2)
            cat = e["cat"]
            seen.add(cat)
            x0, w = e["ts"] / 1e6, e["dur"] / 1e6
            bars.setdefault((row, cat), []).append((x0, w))
            if cat in ("forward", "backward") and w > end / 220:
                ax.text(x0 + w / 2, row, str(e["args"]["microbatch"]), ha="center", va="center", fontsize=5,
                        color="white" if cat == "backward" else "black")
        for (row, cat), spans in bars.items():
            ax.broken_barh(spans, (row - 0.42, 0.84), facecolors=_GANTT.get(cat, "#777"),
                           edgecolor="white" if cat in ("forward", "backward") else "none", linewidth=0.3)
        for r in range(pp):
            base = (pp - 1 - r) * 3
            yt += [base + 2, base + 1]
            yl += [f"PP rank {r}: F/B", "by part"]
        ax.set_yticks(yt)
        ax.set_yticklabels(yl, fontsize=7)
        ax.set_ylim(0.3, 3 * pp + 0.1)
        ax.set_xlim(0, end * 1.01)
        ax.grid(axis="x", alpha=0.3)
        step, bub = od.get("step_time_s", 0.0), od.get("bubble_fraction", 0.0)
        head = titles[k] if titles else (f"{od.get('layout', '')}, {od.get('recompute', '')}, "
                                         f"{od.get('dispatcher', '')}, mbs {od.get('micro_batch_size', '')}")
        parts = od.get("time_parts_s", {})  # the step by part, largest first: what the lanes add up to
        by_part = "; ".join(f"{_label(p)} {v:.2f} s" for p,
                            v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.005)
        ax.set_title(f"{head}: step {step:.2f} s, pipeline bubble {bub:.1%} of the step, "
                     f"{od.get('tokens_per_s_per_gpu', 0.0):,.0f} tokens/s/GPU ({od.get('source', 'predicted')})"
                     + (f"\n{by_part}" if by_part else ""),
                     fontsize=8.5, loc="left")
    axes[-1, 0].set_xlabel("seconds from the step's start")
    order = ["forward", "backward", "compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "dp_comm",
             "optimizer", "offload"]
    names = {"tp_comm": "TP comm (exposed)", "cp_comm": "CP comm (exposed)", "ep_comm": "EP all-to-all (exposed)",
             "pp_p2p": "PP p2p (exposed)", "dp_comm": "DP grad reduce-scatter + param all-gather",
             "optimizer": "optimizer step", "offload": "CPU optimizer offload"}
    handles = [Patch(color=_GANTT[c], label=_GANTT_LABELS.get(c, names.get(c, c))) for c in order if c in seen]
    fig.legend(handles=handles, loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if n > 1 else 0.09, 1, 1))
    try:
        save_figure(fig, path, force=force)
    finally:
        plt.close(fig)
