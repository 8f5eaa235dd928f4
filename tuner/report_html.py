"""``results/<study>/report.html``: one self-contained page about a study, written from plotly figure specs and
the installed ``plotly.min.js`` (plotly's Python API is slow to import)."""

from __future__ import annotations

import html
import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cost_model.types import Estimate
from specs.errors import TunerError
from specs.layout import Layout
from specs.units import DEFAULT_MEMORY_HEADROOM
from tuner.plots import breakdown_figures, front_trend

if TYPE_CHECKING:
    from tuner.study.records import TrialRow

__all__ = ["NEAR_BEST", "ReportUnavailable", "plotly_bundle", "render_report", "study_report", "write_report"]

#: The default band of the "near the fastest" table: layouts within this fraction of the fastest tokens/s/GPU.
NEAR_BEST = 0.05


class ReportUnavailable(TunerError):
    """report.html cannot be written on this machine (plotly or its bundle is missing); the study is not affected."""


def plotly_bundle() -> str:
    """The installed plotly package's ``plotly.min.js`` (ReportUnavailable: plotly or its bundle is missing)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise ReportUnavailable("report.html needs the plotly package (pip install 'plotly>=5'; it is a dependency of "
                                "this project)")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ReportUnavailable(f"report.html: cannot read plotly's bundle {path} ({e.strerror or e})") from None


def _json(obj: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</`` sequence; NaN as null)."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":"), default=str).replace("</", "<\\/")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _split(lay: Layout) -> str:
    f, last = lay.num_layers_in_first_pipeline_stage, lay.num_layers_in_last_pipeline_stage
    return "even" if not (f or last) else f"{f}/{last}"


def _row(r: TrialRow) -> dict[str, Any]:
    """A trial row as the page's data: flat, JSON-safe, with its hover text."""
    lay = r.layout
    tps, peak, src = _num(r.tokens_per_s_per_gpu), _num(r.peak_gib), r.source
    out: dict[str, Any] = {
        "trial": r.trial, "label": lay.label, "recompute": lay.recompute_label, "offload": lay.offload_label,
        "dispatcher": lay.dispatcher.value, "pp": lay.pp, "vpp": lay.vpp, "mbs": lay.micro_batch_size,
        "split": _split(lay), "tps": tps, "peak": peak, "headroom": _num(r.headroom_gib), "step": _num(r.step_time_s),
        "source": src, "mfu": _num(r.mfu), "usd": _num(r.usd_per_million_tokens),
        "pred_tps": _num(r.pred_tokens_per_s_per_gpu), "pred_peak": _num(r.pred_peak_gib), "runs": r.runs,
    }
    lines = [f"<b>trial {out['trial']}</b>: {lay.label}",
             f"{lay.recompute_label}, offload {lay.offload_label}, {lay.dispatcher.value}, mbs {lay.micro_batch_size}, "
             f"split {out['split']}"]
    if tps is not None and peak is not None:
        lines.append(f"{tps:,.1f} tokens/s/GPU ({src}), peak {peak:.1f} GiB, headroom "
                     f"{out['headroom'] or float('nan'):.1f} GiB")
    if out["step"] is not None:
        lines.append(f"step {out['step']:.3f} s" + (f", {out['runs']} runs" if out["runs"] > 1 else ""))
    if src == "measured" and out["pred_tps"] is not None and tps:
        lines.append(f"predicted {out['pred_tps']:,.1f} tokens/s/GPU ({(out['pred_tps'] / tps - 1):+.1%} vs measured), "
                     f"{out['pred_peak'] or float('nan'):.1f} GiB")
    out["hover"] = "<br>".join(html.escape(x, quote=False).replace("&lt;b&gt;", "<b>").replace("&lt;/b&gt;",
                                                                                               "</b>") for x in lines)
    return out


def _near_best(rows: Sequence[dict[str, Any]], band: float) -> list[dict[str, Any]]:
    """Rows within ``band`` of the fastest, most headroom first (the page's script does the same)."""
    ok = [r for r in rows if r["tps"] is not None and r["peak"] is not None]
    if not ok:
        return []
    best = max(r["tps"] for r in ok)
    near = [r for r in ok if r["tps"] >= (1 - band) * best]
    return sorted(near, key=lambda r: (-(r["headroom"] if r["headroom"] is not None else -math.inf), -r["tps"]))


def _trace(name: str, rs: Sequence[dict[str, Any]], marker: dict[str, Any], *, pred: bool = False,
           **kw: Any) -> dict[str, Any]:
    """A scatter trace of rows ``rs`` (their predictions with ``pred``), hovering their text."""
    x, y = ("pred_peak", "pred_tps") if pred else ("peak", "tps")
    return {"type": "scatter", "mode": "markers", "name": name, "x": [r[x] for r in rs], "y": [r[y] for r in rs],
            "text": [r["hover"] for r in rs], "customdata": [r["trial"] for r in rs],
            "hovertemplate": ("predicted for " if pred else "") + "%{text}<extra></extra>", "marker": marker, **kw}


def _front_figure(rows: Sequence[dict[str, Any]], front: Sequence[dict[str, Any]], usable_gib: float,
                  kind: str) -> dict[str, Any]:
    """The front's figure spec: every trial, the front, the fastest, measured trials' predictions."""
    pts = [r for r in rows if r["tps"] is not None and r["peak"] is not None]
    f = sorted(front, key=lambda r: r["peak"])
    data = [_trace("evaluated trials", pts, {"color": "#9aa5b1", "size": 7}),
            _trace("Pareto front", f, {"color": "#c0392b", "size": 9}, mode="lines+markers",
                   line={"shape": "hv", "color": "#c0392b"})]
    if front:
        b = max(front, key=lambda r: r["tps"])
        data.append(_trace(f"fastest: trial {b['trial']}", [b], {"symbol": "star", "size": 18, "color": "#f1c40f",
                                                                  "line": {"color": "#7b241c", "width": 1}}))
    meas = [r for r in pts if r["source"] == "measured" and r["pred_tps"] is not None and r["pred_peak"] is not None]
    if meas:
        data.append(_trace("prediction of a measured trial", meas,
                           {"symbol": "circle-open", "size": 9, "color": "#2471a3"}, pred=True))
    layout = {
        "title": {"text": f"Pareto front: tokens/s/GPU vs peak memory per GPU ({kind})"},
        "xaxis": {"title": {"text": f"peak memory per GPU, GiB ({kind})"}},
        "yaxis": {"title": {"text": f"tokens/s/GPU ({kind})"}},
        "hovermode": "closest", "legend": {"orientation": "h", "y": -0.18},
        "shapes": [{"type": "line", "x0": usable_gib, "x1": usable_gib, "yref": "paper", "y0": 0, "y1": 1,
                    "line": {"dash": "dash", "color": "#555", "width": 1}}],
        "annotations": [{"x": usable_gib, "y": 1, "yref": "paper", "text": f"usable {usable_gib:.0f} GiB",
                         "showarrow": False, "xanchor": "right", "font": {"size": 10}}],
        "margin": {"t": 50},
    }
    return {"data": data, "layout": layout}


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.2em;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
.banner{background:#fff4e5;border-left:4px solid #e67e22;padding:8px 12px;margin:12px 0}
.meta{color:#555;font-size:.92em}
table{border-collapse:collapse;font-size:.88em;margin:8px 0}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6}td{white-space:nowrap}td.l,th.l{text-align:left}tr.pick td{background:#eaf5ea;font-weight:600}
.filters label{margin-right:16px}.filters select,.filters input{margin-left:4px}
.fig{width:100%;height:560px}.figsm{width:100%;height:480px}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
"""

_SCRIPT = r"""
(function(){
  const D = JSON.parse(document.getElementById('report-data').textContent);
  const spec = id => JSON.parse(document.getElementById(id).textContent);
  const cfg = {responsive: true, displaylogo: false};
  const front0 = spec('fig-front-spec');
  Plotly.newPlot('fig-front', front0.data, front0.layout, cfg);
  for (const id of ['fig-memory', 'fig-time']) {
    const s = spec(id + '-spec'); Plotly.newPlot(id, s.data, s.layout, cfg);
  }
  const sel = id => document.getElementById(id);
  const fmt = (v, d) => (v === null || v === undefined) ? '-'
    : v.toLocaleString('en-US', {minimumFractionDigits: d, maximumFractionDigits: d});
  function pareto(rows) {
    const ok = rows.filter(r => r.tps !== null && r.peak !== null).sort((a, b) => a.peak - b.peak || b.tps - a.tps);
    const out = []; let best = -Infinity;
    for (const r of ok) { if (r.tps > best) { out.push(r); best = r.tps; } }
    return out;
  }
  function filtered() {
    const d = sel('f-dispatcher').value, rc = sel('f-recompute').value, pp = sel('f-pp').value;
    return D.rows.filter(r => (d === '' || r.dispatcher === d) && (rc === '' || r.recompute === rc)
                              && (pp === '' || String(r.pp) === pp));
  }
  function near(rows, band) {
    const ok = rows.filter(r => r.tps !== null && r.peak !== null);
    if (!ok.length) return [];
    const best = Math.max(...ok.map(r => r.tps));
    return ok.filter(r => r.tps >= (1 - band) * best)
             .sort((a, b) => ((b.headroom ?? -Infinity) - (a.headroom ?? -Infinity)) || (b.tps - a.tps));
  }
  function nearTable(rows, band) {
    const n = near(rows, band);
    const body = sel('near-body'); body.innerHTML = '';
    if (!n.length) {
      body.innerHTML = '<tr><td class="l" colspan="11">no trial left by the filters</td></tr>';
      sel('near-count').textContent = '0';
      sel('near-answer').textContent = 'none (no trial left by the filters)';
      return;
    }
    const best = Math.max(...n.map(r => r.tps));
    n.forEach((r, i) => {
      const tr = document.createElement('tr'); if (i === 0) tr.className = 'pick';
      const cells = [r.trial, r.label, r.recompute, r.dispatcher, r.mbs, r.split, fmt(r.tps, 1),
                     fmt(100 * (r.tps / best - 1), 1) + '%',
                     fmt(r.peak, 1), fmt(r.headroom, 1), r.source];
      cells.forEach((c, j) => {
        const td = document.createElement('td'); if ([1, 2, 3, 5, 10].includes(j)) td.className = 'l';
        td.textContent = c; tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    sel('near-count').textContent = n.length;
    sel('near-answer').textContent = 'trial ' + n[0].trial + ' (' + n[0].label + ', ' + n[0].recompute + ', ' +
      n[0].dispatcher +
      '): ' + fmt(n[0].headroom, 1) + ' GiB of headroom at ' + fmt(n[0].tps, 1) + ' tokens/s/GPU';
  }
  function update() {
    const rows = filtered();
    const band = Math.max(0, Math.min(100, parseFloat(sel('near-pct').value) || 0)) / 100;
    const f = pareto(rows);
    const fig = JSON.parse(JSON.stringify(front0));
    const pts = rows.filter(r => r.tps !== null && r.peak !== null);
    const put = (t, rs) => {
      t.x = rs.map(r => r.peak); t.y = rs.map(r => r.tps); t.text = rs.map(r => r.hover);
      t.customdata = rs.map(r => r.trial);
    };
    put(fig.data[0], pts); put(fig.data[1], f);
    if (fig.data.length > 2 && fig.data[2].name.startsWith('fastest')) {
      const b = f.length ? f.reduce((a, r) => r.tps > a.tps ? r : a) : null;
      put(fig.data[2], b ? [b] : []); fig.data[2].name = b ? 'fastest: trial ' + b.trial : 'fastest';
    }
    fig.data.forEach(t => {
      if (!t.name.startsWith('prediction')) return;
      const m = pts.filter(r => r.source === 'measured' && r.pred_tps !== null);
      t.x = m.map(r => r.pred_peak); t.y = m.map(r => r.pred_tps); t.text = m.map(r => r.hover);
      t.customdata = m.map(r => r.trial);
    });
    if (f.length) {
      const best = Math.max(...f.map(r => r.tps));
      fig.layout.shapes.push({type: 'rect', xref: 'paper', x0: 0, x1: 1, y0: (1 - band) * best, y1: best,
                              fillcolor: '#2ecc71', opacity: 0.12, line: {width: 0}});
    }
    Plotly.react('fig-front', fig.data, fig.layout, cfg);
    sel('shown').textContent = rows.length;
    nearTable(rows, band);
  }
  for (const id of ['f-dispatcher', 'f-recompute', 'f-pp', 'near-pct']) sel(id).addEventListener('input', update);
  // a link can preset the filters: report.html#dispatcher=alltoall&recompute=selective%20moe&pp=4&near=3
  const preset = new URLSearchParams(window.location.hash.slice(1));
  const keys = [['dispatcher', 'f-dispatcher'], ['recompute', 'f-recompute'], ['pp', 'f-pp'], ['near', 'near-pct']];
  for (const [key, id] of keys) {
    if (preset.has(key)) sel(id).value = preset.get(key);
  }
  update();
})();
"""


def _options(name: str, label: str, values: Sequence[Any]) -> str:
    opts = "".join(f'<option value="{html.escape(str(v))}">{html.escape(str(v))}</option>' for v in values)
    return f'<label>{html.escape(label)}<select id="{name}"><option value="">all</option>{opts}</select></label>'


def _table(head: Sequence[str], body: Sequence[Sequence[Any]], *, left: Sequence[int] = (), tbody_id: str = "",
           pick_first: bool = False) -> str:
    th = "".join(f'<th class="{"l" if i in left else ""}">{html.escape(h)}</th>' for i, h in enumerate(head))
    rows = []
    for k, row in enumerate(body):
        tds = "".join(f'<td class="{"l" if i in left else ""}">{html.escape(str(c))}</td>' for i, c in enumerate(row))
        rows.append(f'<tr class="{"pick" if pick_first and k == 0 else ""}">{tds}</tr>')
    tid = f' id="{tbody_id}"' if tbody_id else ""
    return f"<table><thead><tr>{th}</tr></thead><tbody{tid}>{''.join(rows)}</tbody></table>"


def _fmt(v: float | None, d: int) -> str:
    return "-" if v is None else f"{v:,.{d}f}"


def render_report(*, study: str, heading: str, rows: Sequence[TrialRow], front: Sequence[Mapping[str, Any]],
                  breakdowns: Mapping[int, Estimate], usable_gib: float, ties: Sequence[Mapping[str, Any]] = (),
                  ties_of: int | None = None, files: Mapping[str, str] | None = None, notes: Sequence[str] = (),
                  near_best: float = NEAR_BEST) -> str:
    """The page's HTML, plotly.js inline; ``breakdowns``: trial number -> estimate of each front layout."""
    data_rows = [_row(r) for r in rows]
    by_trial = {r["trial"]: r for r in data_rows}
    front_d = [by_trial[int(f["trial"])] for f in front if int(f["trial"]) in by_trial]
    sources = {r["source"] for r in data_rows}
    kind = ("predicted" if sources <= {"predicted"} else "measured" if sources <= {"measured"}
            else "predicted and measured")
    front_fig = _front_figure(data_rows, front_d, usable_gib, kind)
    by_memory = sorted((r for r in front_d if r["trial"] in breakdowns), key=lambda r: r["peak"])
    items = [(f"#{r['trial']} {r['label']}", breakdowns[r["trial"]]) for r in by_memory]
    mem_fig, time_fig = breakdown_figures(items, title="the front, least memory first")
    trend = front_trend([e for _, e in items])
    near = _near_best(data_rows, near_best)
    banner = ("Every number on this page is a prediction of the analytical model; nothing was measured."
              if kind == "predicted" else "Measured trials are marked measured; the breakdowns are always the "
              "analytical model's predictions.")
    fastest = max((r["tps"] for r in near), default=1.0)
    near_body = [(r["trial"], r["label"], r["recompute"], r["dispatcher"], r["mbs"], r["split"], _fmt(r["tps"], 1),
                  f"{(r['tps'] / fastest - 1) * 100:.1f}%", _fmt(r["peak"], 1), _fmt(r["headroom"], 1),
                  r["source"]) for r in near]
    n0 = near[0] if near else {}
    answer = (f"trial {n0['trial']} ({n0['label']}, {n0['recompute']}, {n0['dispatcher']}): "
              f"{_fmt(n0['headroom'], 1)} GiB of headroom at {_fmt(n0['tps'], 1)} tokens/s/GPU") if near else "-"
    front_body = _front_body(front_d, front)
    ties_html = _ties_html(ties, ties_of, sources)
    files_html = "<ul>" + "".join(f'<li><a href="{html.escape(p)}">{html.escape(n)}</a> '
                                  f'<code>{html.escape(p)}</code></li>' for n, p in (files or {}).items()) + "</ul>"
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(study)}: layout tuner report</title>",
        f"<style>{_CSS}</style>", f"<script>{plotly_bundle()}</script>", "</head><body>",
        f"<h1>{html.escape(study)}</h1>", f'<p class="meta">{html.escape(heading)}</p>',
        f'<p class="banner">{html.escape(banner)}</p>', *(f'<p class="meta">{html.escape(n)}</p>' for n in notes),
        '<h2 id="front">Pareto front</h2>',
        '<div class="filters">' + _options("f-dispatcher", "dispatcher", sorted({r["dispatcher"] for r in data_rows}))
        + _options("f-recompute", "recompute", sorted({r["recompute"] for r in data_rows}))
        + _options("f-pp", "PP", sorted({r["pp"] for r in data_rows})) + ' <span class="meta"><span '
                   f'id="shown">{len(data_rows)}</span> of {len(data_rows)} trials shown; '
        "the front is recomputed over the trials left; hover a point for its layout; a link can preset them: "
        "<code>report.html#dispatcher=alltoall&amp;pp=8&amp;near=3</code></span></div>",
        '<div id="fig-front" class="fig"></div>',
        '<h2 id="near">Near the fastest: most headroom first</h2>',
        '<p>Layouts within <input id="near-pct" type="number" min="0" max="100" step="0.5" '
        f'value="{near_best * 100:g}" style="width:4em">% of the fastest tokens/s/GPU (of the trials the filters '
        f'leave): <span id="near-count">{len(near)}</span>. Most headroom: <b '
        f'id="near-answer">{html.escape(answer)}</b>.</p>',
        _table(["trial", "layout", "recompute", "dispatcher", "mbs", "first/last", "tokens/s/GPU", "vs fastest",
                "peak GiB", "headroom GiB", "source"],
               near_body, left=(1, 2, 3, 5, 10), tbody_id="near-body", pick_first=True),
        '<h2 id="table">The front</h2>',
        "<p>90%: the interval of tokens/s/GPU (a prediction's from the model's error bars, docs/error_bars.md; a "
        "measurement's from the run-to-run spread); peak at most: the high end of the predicted peak; fit: fits, may "
        "not fit (a real trial tells) or ran.</p>",
        _table(["trial", "layout", "recompute", "offload", "dispatcher", "mbs", "first/last", "tokens/s/GPU", "90%",
                "MFU", "peak GiB", "peak at most", "fit", "step s", "source", "--pipeline-model-parallel-layout"],
               front_body, left=(1, 2, 3, 4, 6, 12, 14, 15)),
        '<h2 id="breakdown">Where the memory and the step go</h2>',
        "<p>Each front layout's predicted memory per GPU (worst pipeline rank) and step time, by part, least memory "
        "first. "
        + html.escape(" ".join(trend)) + "</p>",
        '<div id="fig-memory" class="figsm"></div>', '<div id="fig-time" class="figsm"></div>',
        '<h2 id="ties">Ties within measurement noise</h2>', ties_html, '<h2 id="files">Files</h2>', files_html,
        "<p class=\"meta\">Timelines of one predicted step (Chrome trace JSON, open in <a "
        "href=\"https://ui.perfetto.dev\">Perfetto</a> or chrome://tracing): <code>tune timeline --study "
        f"{html.escape(study)} --trial N</code>. The study in Optuna's dashboard: <code>optuna-dashboard "
        f"sqlite:///results/{html.escape(study)}/study.db</code>.</p>",
        '<script type="application/json" '
        f'id="report-data">{_json({"study": study, "rows": data_rows, "front": [r["trial"] for r in front_d]})}'
        '</script>',
        f'<script type="application/json" id="fig-front-spec">{_json(front_fig)}</script>',
        f'<script type="application/json" id="fig-memory-spec">{_json(mem_fig)}</script>',
        f'<script type="application/json" id="fig-time-spec">{_json(time_fig)}</script>',
        f"<script>{_SCRIPT}</script>", "</body></html>",
    ]
    return "\n".join(parts)


def _front_body(front_d: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """The front's table rows: ``front_d`` with :func:`tuner.report.front_rows`' intervals and fit."""
    bands = {int(f["trial"]): f for f in front}

    def band(t: int) -> str:
        f = bands.get(t, {})
        lo, hi = _num(f.get("tokens_per_s_per_gpu_low")), _num(f.get("tokens_per_s_per_gpu_high"))
        return "-" if lo is None or hi is None else f"{lo:,.0f}-{hi:,.0f}"

    front_body = [(r["trial"], r["label"], r["recompute"], r["offload"], r["dispatcher"], r["mbs"], r["split"],
                   _fmt(r["tps"], 1), band(r["trial"]),
                   _fmt(r["mfu"] * 100 if r["mfu"] is not None else None, 1) + "%", _fmt(r["peak"], 1),
                   _fmt(_num(bands.get(r["trial"], {}).get("peak_gib_high")), 1),
                   bands.get(r["trial"], {}).get("fit", ""), _fmt(r["step"], 3),
                   r["source"], bands.get(r["trial"], {}).get("pipeline_model_parallel_layout", "")) for r in front_d]
    return front_body


def _ties_html(ties: Sequence[Mapping[str, Any]], ties_of: int | None, sources: set[str]) -> str:
    """The ties section: the measured trials within noise of the fastest, or why there are none."""
    if ties:
        return (f"<p>Measured trials within their own noise of trial {ties_of} (2 standard errors of the difference of "
                "the median step times): their step times cannot rank them; choose on memory, or measure again.</p>"
                + _table(["trial", "layout", "tokens/s/GPU", "gap"],
                         [(t["trial"], t["label"], _fmt(float(t["tokens_per_s_per_gpu"]), 1),
                                                                     f"{-float(t['gap']):+.1%}") for t in ties],
                         left=(1,)))
    if "measured" in sources:
        return (f"<p>No measured trial is within the measurement noise of the fastest measured one (trial {ties_of})."
                "</p>")
    return "<p>No trial was measured (the model backend predicts); ties within measurement noise need real trials.</p>"


def write_report(path: Path, *, force: bool = False, **kwargs: Any) -> Path:
    """Write :func:`render_report` (same arguments) to ``path`` and return it."""
    from specs.files import write_output

    return write_output(path, render_report(**kwargs), force=force)


def study_report(path: Path, *, study: str, model: Any, cluster: Any, workload: Any, rows: list[TrialRow],
                 front: Sequence[Mapping[str, Any]], backend: str, calibration: Any = None,
                 memory_headroom: float = DEFAULT_MEMORY_HEADROOM, files: Mapping[str, Path] | None = None,
                 force: bool = False) -> Path:
    """Write a study's ``report.html`` and return its path."""
    import os

    from cost_model.calibration import DEFAULT_CALIBRATION
    from cost_model.estimate import estimate
    from specs.errors import InfeasibleLayout
    from specs.units import GIB
    from tuner.report import fastest_measured, measured_ties
    from tuner.study.config import run_options_for_backend

    cal = calibration if calibration is not None else DEFAULT_CALIBRATION
    opts = run_options_for_backend(backend)
    breakdowns: dict[int, Estimate] = {}
    for f in front:
        try:
            breakdowns[int(f["trial"])] = estimate(model, cluster, workload, f["layout"], calibration=cal,
                                                   memory_headroom=memory_headroom, options=opts)
        # a layout the estimate refuses (a study of another version): no breakdown
        except (InfeasibleLayout, TunerError):
            continue
    best = fastest_measured(rows)
    ties = measured_ties(rows, best.trial) if best else []
    rel = {name: os.path.relpath(p, path.parent) for name, p in (files or {}).items()}
    heading = (f"{model.name} on {cluster.label} ({cluster.num_gpus} GPUs, {cluster.gpu.hbm_bytes / GIB:.1f} GiB "
               f"each), seq {workload.seq_length:,}, global batch {workload.global_batch_size}, "
               f"{workload.precision.value}; backend {backend}; {len(rows):,} layouts evaluated")
    return write_report(path, force=force, study=study, heading=heading, rows=rows, front=front, breakdowns=breakdowns,
                        usable_gib=cluster.gpu.hbm_bytes * (1 - memory_headroom) / GIB, ties=ties,
                        ties_of=best.trial if best else None, files=rel)
