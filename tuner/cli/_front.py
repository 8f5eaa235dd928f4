"""The Pareto table and the measured ties, as ``tune`` and ``tune pareto`` print them."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from tuner.cli._common import out

__all__ = ["print_front", "print_ties", "table_rows"]


def table_rows(front: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The rows of ``front`` the table prints: the first ``top`` (all when ``top`` <= 0)."""
    return front if top <= 0 else front[:top]


def print_front(front: list[dict[str, Any]], top: int, title: str, more_hint: str = "`tune pareto --top 0`") -> None:
    """The Pareto table (its ``trial`` column numbers the points of ``pareto.png``); then how many rows were left out.

    Args:
        front: rows of :func:`tuner.report.front_rows`, fastest first.
        top: rows to print (0 = all).
        title: the table's title.
        more_hint: where the rest is, e.g. ``tune pareto --study NAME --top 0`` (shell-quoted).
    """
    t = Table(title=title, title_justify="left", show_lines=False)
    for col, just in [
        ("trial", "right"), ("layout", "left"), ("recompute", "left"), ("offload", "left"), ("dispatcher", "left"),
        ("mbs", "right"), ("first/last", "left"), ("tokens/s/GPU", "right"), ("MFU (6N)", "right"), ("$/1M tok", "right"),
        ("peak GiB", "right"), ("headroom GiB", "right"), ("source", "left"),
    ]:
        t.add_column(col, justify=just, no_wrap=True)
    for r in table_rows(front, top):
        lay = r["layout"]
        split = "even" if r["layer_split"] == "even" else f"{lay.num_layers_in_first_pipeline_stage}/{lay.num_layers_in_last_pipeline_stage}"
        t.add_row(
            str(r["trial"]), r["label"], r["recompute"].replace("selective ", "sel. ").replace("+", ","), "none" if r["offload"] == "none" else r["offload"].replace("optimizer ", "optim "),
            r["dispatcher"], str(r["micro_batch_size"]), split,
            f"{r['tokens_per_s_per_gpu']:,.1f}", f"{r['mfu']:.1%}", f"{r['usd_per_million_tokens']:.2f}",
            f"{r['peak_gib']:.1f}", f"{r['headroom_gib']:.1f}", r["source"],
        )
    out.print(t)
    if top > 0 and len(front) > top:
        out.print(f"  ({len(front) - top} more on the front: see pareto.csv or {escape(more_hint)})", soft_wrap=True)


def print_ties(rows: list[dict[str, Any]], best: dict[str, Any]) -> None:
    """Say which measured trials the best one cannot be told apart from (tuner.report.measured_ties), after the
    runs of the layouts measured more than once (--confirm-runs)."""
    from tuner.report import TIE_Z, between_run_noise, fastest_measured, long_label, measured_ties, runs_summary

    for r in sorted(rows, key=lambda r: -float(r.get("tokens_per_s_per_gpu") or 0)):
        text = runs_summary(r)
        if text is not None:
            warn = "[bold red]" if r.get("runs_failed") else ""
            out.print(f"  {warn}confirmed{'[/]' if warn else ''}: trial {r['trial']} ({escape(long_label(r))}): "
                      f"{r['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU over {escape(text)}")
    if best.get("source") != "measured":  # a study that mixes sources: against its fastest measured trial
        best = fastest_measured(rows)
        if best is None:
            return
    ties = measured_ties(rows, best["trial"])
    if not ties:
        return
    listed = "; ".join(f"trial {t['trial']} ({t['label']}): {t['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU, {0.0 - t['gap']:+.1%}" for t in ties[:5])
    more = f"; and {len(ties) - 5} more" if len(ties) > 5 else ""
    spread = between_run_noise(rows)
    basis = ("the median step times" if spread is None
             else f"the runs, with the {spread:.1%} spread between runs of one layout this study measured")
    caveat = ("runs of one layout can differ by more than their own noise (docs/measurements.md), so treat them as equally "
              "fast and choose on memory, or re-measure them (--confirm-runs)." if spread is None
              else "treat them as equally fast and choose on memory, or give them more runs (--confirm-runs).")
    out.print(
        f"  [yellow]within measurement noise of trial {best['trial']}[/] ({TIE_Z:g} standard errors of the difference of {basis}): "
        f"{escape(listed)}{more}. Their step times cannot rank these layouts; {caveat}"
    )
