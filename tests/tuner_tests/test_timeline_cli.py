"""``tune timeline`` (a predicted step as a Chrome trace, from flags or a study's trial, beside a measured trial's
torch.profiler trace) and ``tune estimate --plot``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_model.timeline import check_trace, trace_bubble_fraction, trace_step_seconds
from launch.base import BackendSettings
from launch.harness.spec import HarnessEnv
from launch.local_backend import LocalBackend
from specs.errors import TunerError
from tuner.cli import app
from tuner.study import TuneConfig, prepare, run_study, trial_rows

pytestmark = pytest.mark.slow  # studies and trial processes of the fake harness

runner = CliRunner()
FAKE = str(Path(__file__).parents[1] / "launch_tests" / "fake_trial.py")
SEED = [
    "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "4", "--ep", "8", "--recompute",
    "full", "--first-stage-layers", "7", "--last-stage-layers", "7",
]


def test_timeline_of_a_layout_from_flags(tmp_path):
    out, png = tmp_path / "seed.json", tmp_path / "seed.png"
    r = runner.invoke(app, ["timeline", *SEED, "--out", str(out), "--png", str(png)])
    assert r.exit_code == 0, r.output
    trace = json.loads(out.read_text())
    assert check_trace(trace) == []
    e = json.loads(runner.invoke(app, ["estimate", *SEED, "--json"]).output)
    assert trace_step_seconds(trace) == pytest.approx(e["step_time_s"], rel=1e-12)
    assert trace_bubble_fraction(trace) == pytest.approx(e["time_s"]["pp_bubble"] / e["step_time_s"], rel=1e-9)
    assert f"pipeline bubble {trace_bubble_fraction(trace):.1%}" in r.output and "predicted" in r.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_timeline_refuses_what_it_cannot_draw(tmp_path):
    r = runner.invoke(app, ["timeline", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "4", "--ep", "8"])
    assert r.exit_code == 2 and "pipeline_split" in r.output
    r = runner.invoke(app, ["timeline", *SEED, "--trial", "3"])
    assert r.exit_code == 2 and "--trial needs --study" in r.output
    r = runner.invoke(app, ["timeline", "--study", "x", "--tp", "2", "--results-dir", str(tmp_path)])
    assert r.exit_code == 2 and "leave out the layout flags" in r.output


def test_estimate_plot_writes_the_breakdown(tmp_path):
    png = tmp_path / "b.png"
    r = runner.invoke(app, ["estimate", *SEED, "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def _recorded_step_s(st, trial):
    """The predicted step time (s) trial ``trial`` of study ``st`` recorded."""
    return st.trials[trial].user_attrs["result"]["pred_step_time_s"]


def test_timeline_of_a_predicted_trial(tmp_path):
    r = runner.invoke(
        app,
        ["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "6", "--results-dir", str(tmp_path), "--study", "p"],
    )
    assert r.exit_code == 0, r.output
    import optuna

    st = optuna.load_study(study_name="p", storage=f"sqlite:///{tmp_path / 'p' / 'study.db'}")
    row = trial_rows(st)[-1]
    r = runner.invoke(app, ["timeline", "--study", "p", "--trial", str(row.trial), "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    trace = json.loads((tmp_path / "p" / f"timeline_trial{row.trial}.json").read_text())
    assert trace_step_seconds(trace) == pytest.approx(_recorded_step_s(st, row.trial), rel=1e-12)
    assert trace["otherData"]["trial"] == row.trial and trace["otherData"]["layout"] == row.layout.label
    assert "measured trace" not in r.output


def test_local_backend_passes_the_profile_step():
    b = LocalBackend.from_settings(BackendSettings(num_gpus=4, profile_step=3))
    assert b.harness_options == {"profile_step": 3}
    assert LocalBackend.from_settings(BackendSettings(num_gpus=4)).harness_options == {}


def test_profile_step_is_checked():
    with pytest.raises(TunerError, match="--trial-profile-step must be a step from 1 to --trial-steps"):
        prepare(
            TuneConfig.from_dict(dict(
                model="MiniMax-M2", gpus="4xH200", layers=4, backend="local", trial_steps=6, trial_profile_step=7
            ))
        )
    with pytest.raises(TunerError, match="--trial-profile-step is for --backend local"):
        prepare(TuneConfig.from_dict(dict(model="MiniMax-M2", gpus="64xH200", trial_profile_step=2)))


def test_measured_trial_s_profile_and_its_prediction_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    cfg = TuneConfig.from_dict(dict(
        model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, backend="local", trials=2, stack="megatron",
        results_dir=str(tmp_path), trial_steps=6, study="s", prune_margin=None, trial_profile_step=2,
    ))
    prep = prepare(cfg)
    backend = LocalBackend(
        trials_dir=tmp_path / "s" / "trials",
        num_gpus=4,
        steps=6,
        warmup_steps=2,
        timeout_s=30,
        launcher=[sys.executable, FAKE],
        env=HarnessEnv(),
        poll_s=0.02,
        harness_options={"profile_step": 2},
    )
    run_study(prep, backend=backend)
    import optuna

    st = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    row = next(r for r in trial_rows(st) if r.source == "measured")
    tdir = Path(row.log_path)
    measured = sorted(tdir.glob("profile_step2_pp*.json"))
    lay = row.layout
    assert len(measured) == lay.pp
    assert any('"profiled": true' in line for line in (tdir / "steps.jsonl").read_text().splitlines())
    r = runner.invoke(app, ["timeline", "--study", "s", "--trial", str(row.trial), "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    predicted = tdir / f"timeline_trial{row.trial}.json"
    assert f"predicted trace: {predicted}" in r.output
    for p in measured:
        assert f"measured trace (torch.profiler, one step of the trial): {p}" in r.output
    trace = json.loads(predicted.read_text())
    assert trace["otherData"]["measured_traces"] == [str(p) for p in measured]
    assert trace["otherData"]["trial_source"] == "measured" and trace["otherData"]["source"] == "predicted"
    assert trace_step_seconds(trace) == pytest.approx(_recorded_step_s(st, row.trial), rel=1e-12)


def test_two_timelines_on_one_time_axis(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a trace without --out would go
    seed = tmp_path / "seed.json"
    assert runner.invoke(app, ["timeline", *SEED, "--out", str(seed)]).exit_code == 0
    other = [
        "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "8", "--cp", "2", "--ep", "8",
        "--dispatcher", "flex+deepep", "--first-stage-layers", "7", "--last-stage-layers", "7",
    ]
    png = tmp_path / "both.png"
    r = runner.invoke(
        app, ["timeline", *other, "--out", str(tmp_path / "best.json"), "--png", str(png), "--compare", str(seed)]
    )
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = runner.invoke(app, ["timeline", *other, "--compare", str(seed)])
    assert r.exit_code == 2 and "--compare draws into the --png chart" in r.output
    (tmp_path / "junk.json").write_text('{"traceEvents": []}')
    r = runner.invoke(app, ["timeline", *other, "--png", str(png), "--compare", str(tmp_path / "junk.json")])
    assert r.exit_code == 2 and "not a trace written by tune timeline" in r.output
    assert not list(tmp_path.glob("timeline_*.json"))  # refused before the trace was written
    # the network's rules apply as in tune estimate: DeepEP across two nodes of EFA is refused, on InfiniBand it is
    # drawn
    wide = [
        "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "2", "--ep", "16", "--dispatcher",
        "flex+deepep", "--out", str(tmp_path / "wide.json"),
    ]
    r = runner.invoke(app, ["timeline", *wide])
    assert r.exit_code == 2 and "dispatcher_fabric" in r.output
    assert runner.invoke(app, ["timeline", *wide, "--network", "ib-ndr"]).exit_code == 0
    r = runner.invoke(app, ["timeline", *other, "--png", str(tmp_path / "x.txt")])
    assert r.exit_code == 2 and "accepted: " in r.output and "png" in r.output


@pytest.mark.parametrize(
    "name,msg", [("x.txt", "not an image type"), ("", "give an image file name"), ("nosuch/x.png", "does not exist")]
)
def test_estimate_plot_path_is_checked_before_the_estimate(tmp_path, monkeypatch, name, msg):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["estimate", *SEED, "--plot", name])
    assert r.exit_code == 2 and msg in r.output and "internal error" not in r.output, r.output
