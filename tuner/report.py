"""What a tuning run writes and prints: Pareto CSV and plot, exported recipe and run commands."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from cost_model.estimate import estimate
from cost_model.uncertainty import Z90, ErrorBars
from search_spaces.pipeline import emit_layout_string
from specs import Cluster, ModelSpec, Workload
from specs.files import write_output
from specs.layout import Layout
from specs.units import DEFAULT_MEMORY_HEADROOM
from tuner.pareto import pareto_mask

if TYPE_CHECKING:
    from tuner.study.records import TrialRow

#: The study attribute holding the trial the main job named best (``export``, ``timeline``, ``verify`` default to it).
BEST_TRIAL_ATTR = "best_trial"

__all__ = ["BEST_TRIAL_ATTR", "pick_best", "pick_trial_row", "front_rows", "measured_ties", "between_run_noise",
           "ties_note", "runs_note", "runs_summary", "fastest_measured", "long_label", "write_pareto_csv", "plot_front",
           "front_figure", "export_context", "export_files", "pipeline_layout_of", "FRONT_COLUMNS"]

FRONT_COLUMNS = (
    "fit", "trial", "source", "label", "recompute", "offload", "dispatcher", "micro_batch_size", "layer_split",
    "pipeline_model_parallel_layout", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_low", "tokens_per_s_per_gpu_high",
    "mfu", "usd_per_million_tokens", "peak_gib", "peak_gib_low", "peak_gib_high", "headroom_gib", "step_time_s", "runs",
)


def pipeline_layout_of(layout: Layout, model: ModelSpec) -> str:
    """The ``--pipeline-model-parallel-layout`` string of a layout ('' when pp == 1)."""
    if layout.pp == 1:
        return ""
    return emit_layout_string(model.num_layers, layout.pp, layout.vpp, layout.num_layers_in_first_pipeline_stage,
                              layout.num_layers_in_last_pipeline_stage, model.mtp_num_layers)


def pick_trial_row(study_name: str, rows: list[TrialRow], model: ModelSpec, trial: int | None, purpose: str,
                   best: int | None = None) -> TrialRow:
    """The finished trial ``trial`` of ``rows``; when None, ``best`` if finished, else the fastest."""
    from specs.errors import TunerError

    if trial is None and best is not None and any(r.trial == best for r in rows):
        trial = best
    if trial is None:
        front = front_rows(rows, model)
        if not front:
            raise TunerError(f"study {study_name!r} has no finished trial to {purpose}")
        return next(r for r in rows if r.trial == front[0]["trial"])
    match = [r for r in rows if r.trial == trial]
    if not match:
        done = sorted(r.trial for r in rows)
        more = " ..." if len(done) > 20 else ""
        raise TunerError(f"--trial {trial}: not a finished trial of {study_name!r}; finished trials: {done[:20]}{more}")
    return match[0]


def _intervals(r: TrialRow, bars: ErrorBars | None, hbm_gib: float | None) -> dict[str, Any]:
    """A trial's 90% intervals and fit: a prediction's from the error bars, a measurement's from its runs."""
    from tuner.study.policy import RUN_SIGMA  # measured: its mean times exp(+-Z90 * RUN_SIGMA / sqrt(runs))

    tps, peak, nan = r.tokens_per_s_per_gpu, r.peak_gib, float("nan")
    if r.source == "measured":
        k = math.exp(Z90 * RUN_SIGMA / math.sqrt(max(r.runs, 1)))
        (lo, hi), (mlo, mhi), fit = (tps / k, tps * k), (peak, peak), "ran"
    elif bars is None:
        (lo, hi), (mlo, mhi), fit = (nan, nan), (nan, nan), ""
    else:
        (lo, hi), (mlo, mhi) = bars.throughput_interval(tps), bars.memory_interval(peak)
        fit = "" if hbm_gib is None else "fits" if mhi <= hbm_gib else "may not fit"
    return {"tokens_per_s_per_gpu_low": lo, "tokens_per_s_per_gpu_high": hi, "peak_gib_low": mlo, "peak_gib_high": mhi,
            "fit": fit}


def front_rows(rows: list[TrialRow], model: ModelSpec, bars: ErrorBars | None = None,
               hbm_gib: float | None = None) -> list[dict[str, Any]]:
    """The Pareto-optimal trials, fastest first, as table rows with their 90% intervals and fit."""
    if not rows:
        return []
    keep = pareto_mask(np.array([r.tokens_per_s_per_gpu for r in rows]), np.array([r.peak_gib for r in rows]))
    out = []
    for r in sorted((r for r, k in zip(rows, keep) if k), key=lambda r: -r.tokens_per_s_per_gpu):
        lay = r.layout
        first, last = lay.num_layers_in_first_pipeline_stage, lay.num_layers_in_last_pipeline_stage
        out.append({
            "trial": r.trial, "source": r.source, "label": lay.label,
            "recompute": lay.recompute_label, "offload": lay.offload_label, "dispatcher": lay.dispatcher.value,
            "micro_batch_size": lay.micro_batch_size,
            "layer_split": "even" if not (first or last) else f"first {first}, last {last}",
            "pipeline_model_parallel_layout": pipeline_layout_of(lay, model),
            "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "mfu": r.mfu,
            "usd_per_million_tokens": r.usd_per_million_tokens, "peak_gib": r.peak_gib,
            "headroom_gib": r.headroom_gib, "step_time_s": r.step_time_s, "runs": r.runs, "layout": lay,
            **_intervals(r, bars, hbm_gib),
        })
    return out


def pick_best(front: list[dict[str, Any]], tie: float = 0.01) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the recommended row of a front, the other rows within ``tie`` of it); (None, []) for an empty front. Among
    rows that ran or surely fit (else whose peak fits, else any) within ``tie`` of the fastest: the least peak memory,
    then the fewest GPUs per replica, then the layout's key."""
    pool = ([r for r in front if r.get("fit") != "may not fit"]
            or [r for r in front if float(r.get("headroom_gib", -1.0)) >= 0] or list(front))
    if not pool:
        return None, []
    top = max(float(r["tokens_per_s_per_gpu"]) for r in pool)
    near = [r for r in pool if float(r["tokens_per_s_per_gpu"]) >= top * (1 - tie)]
    lay_key = lambda r: (float(r["peak_gib"]), r["layout"].tp * r["layout"].pp * r["layout"].cp, r["layout"].key())  # noqa: E731
    near.sort(key=lay_key)
    return near[0], near[1:]


def long_label(row: TrialRow) -> str:
    """A row's layout, recompute, dispatcher, micro-batch: ``TP1 PP1 EP2 DP2, sel. core_attn, allgather, mbs 2``."""
    lay = row.layout
    return f"{lay.label}, {lay.recompute_label}, {lay.dispatcher.value}, mbs {lay.micro_batch_size}"


#: Standard errors of the difference under which two measured trials count as tied (about 95% two-sided).
TIE_Z = 2.0


def _positive(v: Any) -> TypeGuard[int | float]:
    """A positive finite number (not a bool): what a step time or a throughput read from a study may be used as."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _mean_rel_sd(xs: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation / mean) of at least two numbers."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) / mean


def _runs(r: TrialRow) -> list[float]:
    """The throughputs (tokens/s/GPU) of a row's confirmation runs (``runs_tokens_per_s_per_gpu``), valid ones only."""
    return [x for x in r.runs_tokens_per_s_per_gpu if _positive(x)]


def pooled_spread(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """(spread, degrees of freedom) between repeated measurements, pooled over the groups of at least two:
    ``sqrt(sum((k_i - 1) * sd_i**2) / sum(k_i - 1))``, ``sd_i`` the relative sample standard deviation of group i's
    ``k_i`` values (one-way ANOVA's pooled variance). The spread is a fraction; None when no group has two values."""
    groups = [g for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    num = sum((len(g) - 1) * _mean_rel_sd(list(g))[1] ** 2 for g in groups)
    spread = math.sqrt(num / dof) if dof else None
    return (spread if spread is not None and math.isfinite(spread) else None), dof


def between_run_noise(rows: list[TrialRow]) -> float | None:
    """:func:`pooled_spread` of the measured rows' run throughputs (a fraction), or None."""
    return pooled_spread([_runs(r) if r.source == "measured" else [] for r in rows])[0]


def fastest_measured(rows: list[TrialRow]) -> TrialRow | None:
    """The measured row with the highest (finite, positive) ``tokens_per_s_per_gpu``, or None."""
    measured = [r for r in rows if r.source == "measured" and _positive(r.tokens_per_s_per_gpu)]
    return max(measured, key=lambda r: r.tokens_per_s_per_gpu) if measured else None


def measured_ties(rows: list[TrialRow], best_trial: int, z: float = TIE_Z) -> list[dict[str, Any]]:
    """Measured trials within the trials' own noise of trial ``best_trial``, smallest ``gap`` first (fractions of
    the best's tokens/s/GPU; empty unless it is measured with at least 3 steps).

    A median step time's relative standard error is ``sqrt(pi / 2) * CV / sqrt(n)``; ``b`` ties with ``a`` when
    ``(tps_a - tps_b) / tps_a <= z * sqrt(se_a**2 + se_b**2)``. A layout run k times has the standard error of its
    runs' mean, at least the study's pooled spread between runs / sqrt(k) (:func:`between_run_noise`; a 10% SD over
    eight runs, ``benchmarks/results/h200_te_2026-12-04``).
    """
    pooled = between_run_noise(rows) or 0.0

    def rel_se(r: TrialRow) -> float | None:  # None: not a measured, positive throughput
        if r.source != "measured" or not _positive(r.tokens_per_s_per_gpu):
            return None
        t = [x for x in r.step_times_s if _positive(x)]
        if len(t) < 3:
            return None
        within = math.sqrt(math.pi / 2.0) * _mean_rel_sd(t)[1] / math.sqrt(len(t))
        runs = _runs(r)
        if len(runs) < 2:
            return max(within, pooled)
        # confirmed (--confirm-runs): the standard error of the mean of the runs, which sees the drift between runs
        between = _mean_rel_sd(runs)[1] / math.sqrt(len(runs))
        return max(between, within / math.sqrt(len(runs)), pooled / math.sqrt(len(runs)))

    best = next((r for r in rows if r.trial == best_trial), None)
    se_a = rel_se(best) if best else None
    if best is None or se_a is None:
        return []
    a, out = best.tokens_per_s_per_gpu, []
    for r in rows:
        se_b, b = rel_se(r), r.tokens_per_s_per_gpu
        if r is best or se_b is None:
            continue
        gap = round((a - b) / a, 6) + 0.0  # + 0.0: an exact tie is 0.0, not -0.0
        thr = z * math.sqrt(se_a**2 + se_b**2)
        if abs(gap) <= thr:
            out.append({"trial": r.trial, "label": long_label(r), "tokens_per_s_per_gpu": b, "gap": gap,
                        "threshold": thr})
    return sorted(out, key=lambda d: d["gap"])


#: Predicted throughputs within this fraction of the best's are not told apart by the model (held-out median error
#: 6-15%, ``benchmarks/results/2026-12-04_kfold_validation``, mostly shared by a layout's neighbours).
PREDICTED_TIE = 0.01


def predicted_ties(rows: list[TrialRow], best_trial: int,
                   within: float = PREDICTED_TIE) -> list[tuple[TrialRow, float]]:
    """Predicted trials within ``within`` of predicted trial ``best_trial``, each with its gap."""
    best = next((r for r in rows if r.trial == best_trial), None)
    if best is None or best.source != "predicted" or not _positive(best.tokens_per_s_per_gpu):
        return []
    top = best.tokens_per_s_per_gpu
    out = []
    for r in rows:
        v = r.tokens_per_s_per_gpu
        if r.trial == best_trial or r.source != "predicted" or not _positive(v):
            continue
        gap = (top - v) / top
        if abs(gap) <= within:
            out.append((r, gap))
    return sorted(out, key=lambda t: t[1])


def predicted_ties_text(rows: list[TrialRow], best_trial: int) -> str | None:
    """One sentence naming the fitting predicted trials within :data:`PREDICTED_TIE`, or None."""
    ties = predicted_ties(rows, best_trial)
    fit = [(t, gap) for t, gap in ties if not t.headroom_gib < 0]
    over = len(ties) - len(fit)
    if not fit:
        return None
    listed = "; ".join(f"trial {t.trial} ({long_label(t)}): {t.tokens_per_s_per_gpu:,.1f} tokens/s/GPU "
                       f"({0.0 - gap:+.1%}), peak {t.peak_gib:.1f} GiB" for t, gap in fit[:3])
    listed += f"; and {len(fit) - 3} more" if len(fit) > 3 else ""
    if over:
        verb = "is" if over == 1 else "are"
        listed += f" ({over} more within {PREDICTED_TIE:.0%} {verb} predicted not to fit the GPU, left out)"
    return (f"predicted within {PREDICTED_TIE:.0%} of trial {best_trial}: {listed}. The model cannot order layouts "
            "this close (held out by model, its median error on NVIDIA's published runs is 6-15%, docs/validation.md): "
            "choose on memory, or measure them with real trials")


def ties_note(rows: list[TrialRow], trial: int) -> list[str]:
    """A recipe note naming the trials tied with ``trial`` (measured or predicted), or ``[]``."""
    pred = predicted_ties_text(rows, trial)
    if pred is not None:
        return [pred[0].upper() + pred[1:] + "."]
    ties = measured_ties(rows, trial)
    if not ties:
        return []
    listed = ", ".join(f"trial {t['trial']} ({t['label']}, {0.0 - t['gap']:+.1%})" for t in ties[:5])
    listed += f" and {len(ties) - 5} more" if len(ties) > 5 else ""
    spread = between_run_noise(rows)
    if spread is None:
        return [f"Measured within the trials' own noise ({TIE_Z:g} standard errors of the difference of the median "
                f"step times) of {listed}: the trials cannot rank these layouts, and runs of one layout can differ "
                "by more."]
    return [f"Measured within noise ({TIE_Z:g} standard errors of the difference, counting the {spread:.1%} spread "
            f"between runs of one layout that this study measured) of {listed}: the trials cannot rank these layouts."]


def runs_summary(row: TrialRow) -> str | None:
    """``3 runs: 37,065, 41,577, 39,100 tokens/s/GPU (SD 5.8%); ...`` for confirmed rows, else None."""
    runs, failed = row.runs_tokens_per_s_per_gpu, row.runs_failed
    if len(runs) < 2 and not failed:
        return None
    parts = []
    if len(runs) >= 2:
        each = ", ".join(f"{x:,.0f}" for x in runs)
        parts.append(f"{len(runs)} runs: {each} tokens/s/GPU (SD {_mean_rel_sd(runs)[1]:.1%})")
    else:
        parts.append("1 run")
    for f in failed:
        kind = {"oom": "ran out of memory", "timeout": "timed out", "crash": "crashed"}.get(
            str(f.kind), f"failed ({f.kind})")
        mem = f.memory_reached_gib
        at = f" at {mem:.1f} GiB" if isinstance(mem, (int, float)) and math.isfinite(mem) else ""
        parts.append(f"confirmation run (trial {f.trial}) {kind}{at}")
    return "; ".join(parts)


def runs_note(row: TrialRow) -> list[str]:
    """A recipe note on a row's confirmation runs (``--confirm-runs``) and any that failed, else ``[]``."""
    text = runs_summary(row)
    if text is None:
        return []
    note = f"Measured more than once (--confirm-runs): {text}."
    if len(row.runs_tokens_per_s_per_gpu) >= 2:
        note += " tokens_per_s_per_gpu is their tokens over their time; peak memory the highest run's."
    if row.runs_failed:
        note += " A run of this same layout failed: check its log before training on it."
    return [note]


def write_pareto_csv(path: Path, front: list[dict[str, Any]], *, label: str = "", force: bool = False) -> None:
    """One row per Pareto-optimal trial; the ``source`` column says predicted or measured."""
    fh = io.StringIO(newline="")
    w = csv.writer(fh)
    w.writerow(FRONT_COLUMNS)
    for r in front:
        w.writerow([r[c] if not isinstance(r[c], float) else f"{r[c]:.6g}" for c in FRONT_COLUMNS])
    write_output(path, fh.getvalue(), label=label, force=force)


#: Leader-line lengths (points) and directions (degrees; up-left first: the region above and left of a
#: Pareto front holds no evaluated trial, by the front's definition) tried for a trial-number label.
_LABEL_RADII = (11, 16, 22, 29, 37, 46, 56, 67, 79, 92, 106, 121, 137, 154, 172, 192, 214, 238)
_LABEL_ANGLES = (135, 112, 157, 90, 180, 67, 202, 45, 225, 22, 247, 0, 270, 337, 292, 315)
_MARKER_PT = 30  # scatter size (points**2) of a front point
_TRIAL_PT = 12  # ... of an evaluated trial


def _place_labels(ax: Any, points: list[tuple[float, float]], texts: list[str],
                  avoid: Sequence[tuple[float, float, float]],
                  *, lines: Sequence[Any] = (), bold: int | None = 0) -> list[Any]:
    """Annotate ``points`` with ``texts`` at the first offset (:data:`_LABEL_RADII` x :data:`_LABEL_ANGLES`) inside
    the axes that meets no placed label, marker of ``avoid`` or line of ``lines``, else the least-overlapping one."""
    from matplotlib import patheffects
    from matplotlib.text import Text

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes_box = ax.get_window_extent(renderer)
    px = fig.dpi / 72
    markers = [_square(ax.transData.transform((x, y)), math.sqrt(size) / 2 * px + 1) for x, y, size in avoid]
    for line in lines:  # the line's path, sampled every ~3 px, as boxes of its width
        path = line.get_transform().transform_path(line.get_path())
        pts = path.vertices
        for a, b in zip(pts[:-1], pts[1:]):
            n = max(1, int(math.hypot(*(b - a)) / 3))
            markers += [_square(a + (b - a) * i / n, line.get_linewidth() * px / 2 + 1) for i in range(n + 1)]
    placed: list[Any] = []
    out = []
    for k, (xy, text) in enumerate(zip(points, texts)):
        ann = ax.annotate(text, xy, xytext=(0, 0), textcoords="offset points", fontsize=7, ha="center", va="center",
                          fontweight="bold" if k == bold else "normal", color="#7b241c", zorder=5,
                          path_effects=[patheffects.withStroke(linewidth=2.5, foreground="white")],
                          arrowprops={"arrowstyle": "-", "color": "#7b241c", "lw": 0.5, "shrinkA": 0, "shrinkB": 2.5})
        best, best_cost = None, math.inf
        for radius in _LABEL_RADII:
            for angle in _LABEL_ANGLES:
                off = (radius * math.cos(math.radians(angle)), radius * math.sin(math.radians(angle)))
                ann.xyann = off
                ann.update_positions(renderer)
                box = Text.get_window_extent(ann, renderer).padded(2)
                a = axes_box
                inside = a.x0 <= box.x0 <= box.x1 <= a.x1 and a.y0 <= box.y0 <= box.y1 <= a.y1
                cost = sum(_overlap(box, b) for b in (*placed, *markers)) + (0.0 if inside else 1e9)
                if cost == 0:
                    best, best_cost = off, 0.0
                    break
                if cost < best_cost:
                    best, best_cost = off, cost
            if best_cost == 0:
                break
        ann.xyann = best
        ann.update_positions(renderer)
        placed.append(Text.get_window_extent(ann, renderer).padded(2))
        out.append(ann)
    return out


def _square(center: Any, half: float) -> Any:
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(center[0] - half, center[1] - half, center[0] + half, center[1] + half)


def _overlap(a: Any, b: Any) -> float:
    """Area (px**2) two boxes share."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def front_figure(rows: list[TrialRow], front: list[dict[str, Any]], title: str, usable_gib: float,
                 labelled: list[dict[str, Any]] | None = None) -> tuple[Any, list[Any]]:
    """(figure, trial-number labels) of :func:`plot_front`: every trial, the ``front``, ``usable_gib`` dashed, the
    trial numbers of ``labelled`` (default: the first 15 of ``front``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labelled = front[:15] if labelled is None else labelled
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=120)
    src = {r.source for r in rows}
    ax.scatter([r.peak_gib for r in rows], [r.tokens_per_s_per_gpu for r in rows], s=_TRIAL_PT, c="#9aa5b1",
               label="evaluated trials", zorder=2)
    fx = [r["peak_gib"] for r in front]
    fy = [r["tokens_per_s_per_gpu"] for r in front]
    (stairs,) = ax.step(fx[::-1], fy[::-1], where="post", color="#c0392b", lw=1.2, zorder=3)
    ax.scatter(fx, fy, s=_MARKER_PT, c="#c0392b", label="Pareto front", zorder=4)
    if front:
        ax.scatter(fx[:1], fy[:1], s=110, marker="*", c="#f1c40f", edgecolors="#7b241c", linewidths=0.6, zorder=4,
                   label=f"fastest: trial {front[0]['trial']}")
    ax.axvline(usable_gib, color="#555", ls="--", lw=0.8, label=f"usable memory ({usable_gib:.0f} GiB)")
    kind = "predicted" if src <= {"predicted"} else "measured" if src <= {"measured"} else "predicted and measured"
    ax.set_xlabel(f"peak memory per GPU, GiB ({kind})")
    ax.set_ylabel(f"tokens/s/GPU ({kind})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, zorder=0)
    if labelled:
        ax.plot([], [], ls="none", marker="$12$", ms=9, c="#7b241c", label="trial number (the table's trial column)")
    ax.legend(fontsize=8, loc="lower right")
    # Room for the labels above and left of the front (where no trial lies), then freeze the layout:
    # labels are placed in display coordinates, so nothing may move the axes afterwards.
    xs = [r.peak_gib for r in rows] + [usable_gib]
    ys = [r.tokens_per_s_per_gpu for r in rows]
    if ys:
        dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or max(ys) or 1.0
        ax.set_xlim(min(xs) - 0.12 * dx, max(xs) + 0.04 * dx)
        ax.set_ylim(min(ys) - 0.06 * dy, max(ys) + 0.16 * dy)
    fig.tight_layout()
    ax.set_autoscale_on(False)
    avoid = [(x, y, _MARKER_PT) for x, y in zip(fx, fy)] + [(x, y, _TRIAL_PT) for x, y in zip(xs, ys)]
    bold = 0 if labelled and front and labelled[0]["trial"] == front[0]["trial"] else None
    anns = _place_labels(ax, [(r["peak_gib"], r["tokens_per_s_per_gpu"]) for r in labelled],
                         [str(r["trial"]) for r in labelled], avoid=avoid, lines=[stairs], bold=bold)
    return fig, anns


def plot_front(path: Path, rows: list[TrialRow], front: list[dict[str, Any]], title: str, usable_gib: float,
               labelled: list[dict[str, Any]] | None = None, *, force: bool = False) -> None:
    """The PNG of :func:`front_figure`."""
    import matplotlib.pyplot as plt

    from tuner.plots import save_figure

    fig, _ = front_figure(rows, front, title, usable_gib, labelled)
    try:
        save_figure(fig, path, force=force)
    finally:
        plt.close(fig)


def export_context(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, *, study: str = "",
                   calibration: Any = None, memory_headroom: float = DEFAULT_MEMORY_HEADROOM, measurement: Any = None,
                   correctness: Any = None, notes: Sequence[str] = (), megatron_core: str | None = None,
                   options: Any = None, stack: str = "", user_args: Sequence[str] = (), bridge_yaml: str = "") -> Any:
    """The :class:`launch.exporters.ExportContext` of ``layout`` with its estimate, the model as the commands for
    ``megatron_core`` build it (:func:`launch.exporters._flags.model_for_release`; a note when that differs).
    ``measurement``, ``correctness`` (``tune verify``), ``calibration`` and ``options``: None for none or the
    shipped ones; ``user_args`` and ``bridge_yaml`` from ``tune --from``."""
    from launch.exporters import ExportContext
    from launch.exporters._flags import model_for_release

    kw: dict[str, Any] = {"memory_headroom": memory_headroom}
    if calibration is not None:
        kw["calibration"] = calibration
    if options is not None:
        kw["options"] = options
    est = estimate(model, cluster, workload, layout, **kw)
    exported, why = model_for_release(model, megatron_core)
    return ExportContext(model=exported, cluster=cluster, workload=workload, layout=layout, study=study, estimate=est,
                         measurement=measurement, correctness=correctness, notes=(*notes, *((why,) if why else ())),
                         options=options, stack=stack, user_args=tuple(user_args), bridge_yaml=bridge_yaml)


def export_files(out_dir: Path, model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout,
                 **context: Any) -> dict[str, Path]:
    """Write every format the main job exports for ``layout``; the paths by format name."""
    from launch.exporters import main_job_exporters

    ctx = export_context(model, cluster, workload, layout, **context)
    rendered = [(e, e.render(ctx)) for e in main_job_exporters() if e.in_main_job(ctx)]
    # the study folder's own files: replace whatever was there (a link itself, not its target)
    return {e.name: e.save(text, out_dir / e.file_name, force=True) for e, text in rendered}
