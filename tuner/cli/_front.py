"""The Pareto table and the measured ties, as ``tune`` and ``tune pareto`` print them."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from rich.console import JustifyMethod
from rich.markup import escape

from specs.console import TrimmedTable
from tuner.cli._common import out, print_command, say

if TYPE_CHECKING:
    from tuner.study.records import TrialRow


def table_rows(front: list[dict[str, Any]], top: int, keep: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``front`` the table prints: the first ``top`` (all when ``top`` <= 0), the last of them replaced by
    trial ``keep`` (the best layout) when it is on the front further down."""
    if top <= 0 or len(front) <= top:
        return front
    rows = front[:top]
    kept = [r for r in front[top:] if r["trial"] == keep]
    return rows[:-1] + kept[:1] if kept else rows


def print_front(front: list[dict[str, Any]], top: int, title: str, more_hint: str = "tune pareto --top 0",
                best_trial: int | None = None) -> None:
    """The Pareto table (rows of :func:`tuner.report.front_rows`, fastest first; the first ``top``, 0 = all, with
    ``best_trial`` among them, in ``top`` lines) in seven columns that fit 80, a row's dispatcher and offload under its
    layout where they are not the best's; then how many rows were left out and ``more_hint``, the
    command that shows them. The other columns are in ``pareto.csv`` and ``report.html``."""
    out.print(title)  # not the table's title: rich wraps a title to the table's width
    t = TrimmedTable(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    columns: list[tuple[str, JustifyMethod]] = [("trial", "right"), ("layout", "left"), ("recompute", "left"),
                                                ("mbs", "right"), ("tok/s", "right"), ("90%", "right"),
                                                ("peak GiB", "right")]
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold", no_wrap=col in ("trial", "layout"))
    shown = list(table_rows(front, top, best_trial))
    best = next((r for r in front if r["trial"] == best_trial), front[0] if front else None)
    while top > 0 and len(shown) > 1 and sum(1 + bool(_differences(r, best)) for r in shown) > top:
        shown.pop(max(i for i, r in enumerate(shown) if r is not best))  # ``top`` lines at most, the best among them
    for r in shown:
        tags = _differences(r, best)
        rec = _short_recompute(r["recompute"])
        star = "*" if r.get("fit") == "may not fit" else " "
        lo, hi = r.get("tokens_per_s_per_gpu_low"), r.get("tokens_per_s_per_gpu_high")
        band = f"{lo:,.0f}-{hi:,.0f}" if isinstance(lo, float) and lo == lo else ""
        layout = r["label"] + (f"\n  {', '.join(tags)}" if tags else "")  # a second line: what sets it apart
        t.add_row(str(r["trial"]), layout, rec, str(r["micro_batch_size"]), f"{r['tokens_per_s_per_gpu']:,.0f}", band,
                  f"{r['peak_gib']:.1f}{star}")
    out.print(t)
    if len(front) > len(shown):
        out.print(f"{len(front) - len(shown)} more on the front:")
        print_command(*shlex.split(more_hint))


def _differences(row: dict[str, Any], best: dict[str, Any] | None) -> list[str]:
    """What tells ``row`` apart from ``best`` beyond the table's columns, each where it is not the best's: its
    dispatcher (``alltoall``) and optimizer offload (``offload 0.5``, ``no offload``)."""
    if best is None:
        return []
    tags = [row["dispatcher"]] if row["dispatcher"] != best["dispatcher"] else []
    if row["offload"] != best["offload"]:
        tags.append("no offload" if row["offload"] == "none" else row["offload"].replace("optimizer", "offload"))
    return tags


#: The recompute modules (specs.layout.RECOMPUTE_MODULES) as the Pareto table names them; pareto.csv has the full names.
_SHORT_MODULES = {"core_attn": "attn", "moe_act": "act", "layernorm": "ln", "mla_up_proj": "mla",
                  "shared_experts": "shexp"}


def _short_recompute(label: str) -> str:
    """``full uniform 1`` -> ``full u1``, ``full block 2`` -> ``full b2``, ``selective moe_act+layernorm+core_attn`` ->
    ``act+ln+attn`` (its modules, short: :data:`_SHORT_MODULES`)."""
    if label.startswith("selective "):
        return "+".join(_SHORT_MODULES.get(m, m) for m in label.removeprefix("selective ").split("+"))
    return label.replace("full uniform ", "full u").replace("full block ", "full b")


def print_ties(rows: list[TrialRow], best: dict[str, Any]) -> None:
    """Say which measured trials the best one cannot be told apart from (tuner.report.measured_ties), after the
    runs of the layouts measured more than once (--confirm-runs)."""
    from tuner.report import TIE_Z, between_run_noise, fastest_measured, long_label, measured_ties, runs_summary

    for r in sorted(rows, key=lambda r: -r.tokens_per_s_per_gpu):
        text = runs_summary(r)
        if text is not None:
            warn = "[bold red]" if r.runs_failed else ""
            say(f"{warn}confirmed{'[/]' if warn else ''}: trial {r.trial} ({escape(long_label(r))}): "
                f"{r.tokens_per_s_per_gpu:,.1f} tokens/s/GPU over {escape(text)}", hang=2, console=out)
    trial = best["trial"]
    if best.get("source") != "measured":  # a study that mixes sources: against its fastest measured trial
        measured = fastest_measured(rows)
        if measured is None:
            return
        trial = measured.trial
    ties = measured_ties(rows, trial)
    if not ties:
        return
    listed = "; ".join(f"trial {t['trial']} ({t['label']}): {t['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU, "
                       f"{0.0 - t['gap']:+.1%}" for t in ties[:5])
    more = f"; and {len(ties) - 5} more" if len(ties) > 5 else ""
    spread = between_run_noise(rows)
    basis = ("the median step times" if spread is None
             else f"the runs, with the {spread:.1%} spread between runs of one layout this study measured")
    caveat = ("runs of one layout can differ by more than their own noise (docs/measurements.md), so treat them as "
              "equally fast and choose on memory, or re-measure them (--confirm-runs)." if spread is None
              else "treat them as equally fast and choose on memory, or give them more runs (--confirm-runs).")
    say(f"[yellow]within measurement noise of trial {trial}[/] ({TIE_Z:g} standard errors of the difference "
        f"of {basis}): {escape(listed)}{more}. Their step times cannot rank these layouts; {caveat}", hang=2,
        console=out)
