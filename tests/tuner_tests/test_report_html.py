"""results/<study>/report.html: its structure (no browser in CI: the page is parsed), its answers and its breakdowns."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from cost_model.estimate import estimate
from tuner.cli import app
from tuner.study import trial_rows

pytestmark = pytest.mark.slow  # a study of its own (module fixture)

runner = CliRunner()


class _Page(HTMLParser):
    """Scripts (attributes, text), selects and their options, elements by id."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.selects: dict[str, list[str]] = {}
        self.text_of: dict[str, str] = {}
        self.links: list[str] = []
        self._script: dict[str, str | None] | None = None
        self._buf: list[str] = []
        self._select: str | None = None
        self._id: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self._script, self._buf = a, []
        elif tag == "select":
            self._select = a.get("id")
            self.selects[self._select or ""] = []
        elif tag == "option" and self._select is not None:
            self.selects[self._select].append(a.get("value") or "")
        elif tag in ("link", "img", "iframe"):
            self.links.append(a.get("href") or a.get("src") or "")
        elif tag == "a":
            self.links.append(a.get("href") or "")
        if tag not in ("script", "option", "br", "meta", "input"):
            self._id.append(a.get("id"))

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._buf)))
            self._script = None
        elif tag == "select":
            self._select = None
        if tag not in ("script", "option", "br", "meta", "input") and self._id:
            self._id.pop()

    def handle_data(self, data):
        if self._script is not None:
            self._buf.append(data)
        for i in self._id:
            if i:
                self.text_of[i] = self.text_of.get(i, "") + data


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    r = runner.invoke(
        app,
        ["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "16", "--results-dir", str(d), "--study", "rep"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    out = d / "rep"
    assert f"Results in {out}/:" in r.output and "report.html" in r.output  # listed with the other files
    p = _Page()
    p.feed((out / "report.html").read_text(encoding="utf-8"))
    st = optuna.load_study(study_name="rep", storage=f"sqlite:///{out / 'study.db'}")
    return p, out, st


def _json_script(p: _Page, sid: str):
    return json.loads(next(text for a, text in p.scripts if a.get("id") == sid))


def test_the_page_is_self_contained(page):
    p, out, _ = page
    assert all("src" not in a for a, _ in p.scripts)  # every script inline: no network
    assert any("plotly.js v" in text[:200] for _, text in p.scripts)  # the bundle itself
    assert not [u for u in p.links if u.startswith("http") and "perfetto" not in u]
    for u in p.links:  # the study's files, linked relative to the page
        if not u.startswith("http"):
            assert (out / u).is_file(), u
    assert {"recipe.yaml", "pareto.csv", "run_slime.sh", "megatron_args.sh", "config.yaml"} <= {
        Path(u).name for u in p.links
    }


def test_every_trial_is_on_the_page_with_its_numbers(page):
    p, _, st = page
    rows = trial_rows(st)
    data = _json_script(p, "report-data")
    assert sorted(r["trial"] for r in data["rows"]) == sorted(r.trial for r in rows)
    by = {r.trial: r for r in rows}
    for r in data["rows"]:
        assert r["tps"] == pytest.approx(by[r["trial"]].tokens_per_s_per_gpu) and r["peak"] == pytest.approx(
            by[r["trial"]].peak_gib
        )
        assert f"trial {r['trial']}" in r["hover"] and r["label"] in r["hover"]
    fig = _json_script(p, "fig-front-spec")
    assert fig["data"][0]["name"] == "evaluated trials" and sorted(fig["data"][0]["customdata"]) == sorted(by)
    assert fig["data"][1]["name"] == "Pareto front" and set(fig["data"][1]["customdata"]) == set(data["front"])
    # the fastest on the front: of trials equally fast, the one with less memory (the other is not Pareto-optimal)
    fastest = max(rows, key=lambda r: (r.tokens_per_s_per_gpu, -r.peak_gib))
    assert fig["data"][2]["name"] == f"fastest: trial {fastest.trial}"


def test_the_filters_list_the_study_s_values(page):
    p, _, st = page
    lays = [r.layout for r in trial_rows(st)]
    assert p.selects["f-dispatcher"] == ["", *sorted({x.dispatcher.value for x in lays})]
    assert p.selects["f-recompute"] == ["", *sorted({x.recompute_label for x in lays})]
    assert p.selects["f-pp"] == ["", *[str(v) for v in sorted({x.pp for x in lays})]]


def test_the_layout_with_the_most_headroom_within_5_percent(page):
    p, _, st = page
    rows = trial_rows(st)
    best = max(r.tokens_per_s_per_gpu for r in rows)
    near = [r for r in rows if r.tokens_per_s_per_gpu >= 0.95 * best]
    pick = max(near, key=lambda r: r.headroom_gib)
    assert p.text_of["near-answer"].startswith(f"trial {pick.trial} ({pick.layout.label}")
    assert f"{pick.headroom_gib:.1f} GiB of headroom" in p.text_of["near-answer"]
    assert p.text_of["near-count"] == str(len(near))
    body = p.text_of["near-body"]  # every one of them is listed (no silent cut)
    assert body.count("predicted") + body.count("measured") == len(near)


def test_the_breakdowns_add_up_to_each_front_layout_s_estimate(page):
    p, _, st = page
    rows = {r.trial: r for r in trial_rows(st)}
    data = _json_script(p, "report-data")
    mem, tim = _json_script(p, "fig-memory-spec"), _json_script(p, "fig-time-spec")
    assert mem["layout"]["barmode"] == tim["layout"]["barmode"] == "stack"
    xs = mem["data"][0]["x"]
    trials = [int(x.split()[0][1:]) for x in xs]
    assert set(trials) == set(data["front"])
    peaks = [rows[t].peak_gib for t in trials]
    assert peaks == sorted(peaks)  # the front, least memory first
    from specs import Workload, load_model, parse_gpus

    m, c, w = load_model("MiniMax-M2"), parse_gpus("64xH200"), Workload(seq_length=8192, global_batch_size=128)
    for i, t in enumerate(trials):
        e = estimate(m, c, w, rows[t].layout)
        assert sum(tr["y"][i] for tr in mem["data"]) == pytest.approx(e.peak_gib, rel=1e-9)
        assert sum(tr["y"][i] for tr in tim["data"]) == pytest.approx(e.step_time_s, rel=1e-9)
        assert e.step_time_s == pytest.approx(rows[t].step_time_s, rel=1e-12)  # the trial recorded the same estimate
    assert {tr["meta"]["part"] for tr in tim["data"]} >= {"compute", "recompute", "pp_bubble", "ep_comm"}


def test_tune_report_rewrites_the_page(page, tmp_path):
    _, out, _ = page
    target = tmp_path / "again.html"
    r = runner.invoke(app, ["report", "--study", "rep", "--results-dir", str(out.parent), "--out", str(target)])
    assert r.exit_code == 0, r.output
    again = _Page()
    again.feed(target.read_text(encoding="utf-8"))
    assert _json_script(again, "report-data")["front"] == _json_script(page[0], "report-data")["front"]
    r = runner.invoke(app, ["report", "--study", "nope", "--results-dir", str(out.parent)])
    assert r.exit_code == 2 and "no study database" in r.output


def test_the_main_job_without_plotly_writes_everything_else_and_says_so(tmp_path, monkeypatch):
    """An environment without plotly (an install from before it became a dependency): the study, the front and the
    recipe files are written, the page is left out with a note, exit 0."""
    import importlib.util

    from typer.testing import CliRunner

    from tuner.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    r = CliRunner().invoke(
        app,
        [
            "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--trials", "3",
            "--stack", "megatron", "--results-dir", str(tmp_path), "--study", "np",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "report.html was not written" in r.output and "pip install 'plotly>=5'" in r.output
    assert (tmp_path / "np" / "recipe.yaml").exists() and not (tmp_path / "np" / "report.html").exists()
    again = CliRunner().invoke(app, ["report", "--study", "np", "--results-dir", str(tmp_path)])
    assert again.exit_code == 2 and "plotly" in again.output  # asked for explicitly, it is an error
