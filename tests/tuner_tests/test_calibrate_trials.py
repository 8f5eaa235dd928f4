"""Calibration from real trials: `tune calibrate --study` on a study holding the committed H200
measurements (tests/fixtures/h200_minimax_slice.jsonl, megatron-core without Transformer Engine),
and the half/half split of benchmarks/bench_trial_calibration.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import yaml
from typer.testing import CliRunner

from cost_model.calibrate import Observation, fit_observations, predict_observations
from cost_model.calibration import DEFAULT_CALIBRATION, SHIPPED_CALIBRATION_FILE, load_calibration
from cost_model.specs import Workload, load_model, parse_gpus
from launch.harness.spec import slice_model
from search_spaces.layout import Layout
from tuner.cli import app
from tuner.study import TuneConfig, _resolved, model_spec_to_dict, prepare

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h200_minimax_slice.jsonl"
runner = CliRunner()


def _rows() -> list[dict]:
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines() if x.strip()]
    return [r for r in rows if r["status"] == "ok" and r["gpus"] == "4xH200"]


def _make_study(tmp_path: Path) -> tuple[str, Path]:
    """A study as `tune --backend local` leaves it: the study's inputs, and one COMPLETE trial per
    measured layout with ``user_attrs["result"]`` (source "measured", peak_gib = reserved)."""
    results = tmp_path / "results"
    cfg = TuneConfig(model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, backend="local", stack="megatron",
                     results_dir=str(results), study="h200-slice")
    prep = prepare(cfg)
    name = cfg.study_name(prep.model, prep.cluster)
    (results / name).mkdir(parents=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(study_name=name, storage=f"sqlite:///{(results / name / 'study.db').as_posix()}", directions=["maximize", "minimize"])
    st.set_user_attr("config", cfg.to_dict())
    st.set_user_attr("resolved", _resolved(prep))
    st.set_user_attr("model_spec", model_spec_to_dict(prep.model))
    st.set_user_attr("calibration", prep.calibration.to_dict())
    for r in _rows():
        lay = Layout.from_dict(r["layout"])
        res = {
            "layout": lay.to_dict(), "label": lay.label, "source": "measured",
            "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"], "peak_gib": r["peak_reserved_gib"],
            "step_time_s": r["step_time_s"], "step_times_s": r["step_times_s"], "losses": r["losses"],
            "peak_allocated_gib": r["peak_allocated_gib"], "step_time_cv": r["step_time_cv"], "notes": r["notes"],
            "pred_tokens_per_s_per_gpu": r["pred_tokens_per_s_per_gpu"], "pred_peak_gib": r["pred_peak_gib"], "pred_step_time_s": r["pred_step_time_s"],
        }
        st.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, values=[r["tokens_per_s_per_gpu"], r["peak_reserved_gib"]],
                                               user_attrs={"key": lay.key(), "result": res}))
    return name, results


def _observations(rows: list[dict]) -> list[Observation]:
    m, c = slice_model(load_model("MiniMax-M2"), 4), parse_gpus("4xH200")
    w = Workload(seq_length=8192, global_batch_size=8)
    return [Observation(model=m, cluster=c, workload=w, layout=Layout.from_dict(r["layout"]), step_time_s=r["step_time_s"],
                        peak_gib=r["peak_reserved_gib"], label=r["label"]) for r in rows]


def _errors(obs: list[Observation], cal) -> tuple[float, float]:
    step, peak = predict_observations(obs, cal)
    ms = np.array([o.step_time_s for o in obs])
    mp = np.array([o.peak_gib for o in obs])
    return float(np.median(np.abs(step / ms - 1))), float(np.median(np.abs(peak / mp - 1)))


def test_calibrate_study_fits_measured_trials_and_the_file_loads(tmp_path):
    shipped = SHIPPED_CALIBRATION_FILE.read_text()
    name, results = _make_study(tmp_path)
    out = tmp_path / "cal.yaml"
    r = runner.invoke(app, ["calibrate", "--study", name, "--results-dir", str(results), "--out", str(out), "--max-nfev", "40"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    prov = doc["provenance"]
    assert "no Transformer Engine" in prov["stack"] and "shipped calibration" in prov["caution"]
    assert prov["runs_fitted"] == 12 and "reserved" in prov["memory_target"]
    assert {"expert_gemm_overhead_s", "cuda_context_bytes"} <= set(doc["constants"])
    # The fitted file loads as a calibration and moves step time and peak memory toward the measurements.
    cal = load_calibration(out)
    obs = _observations(_rows())
    s0, p0 = _errors(obs, DEFAULT_CALIBRATION)
    s1, p1 = _errors(obs, cal)
    assert s0 > 0.4 and s1 < 0.5 * s0, (s0, s1)
    assert p0 > 0.1 and p1 < 0.05, (p0, p1)
    # ... and through the command line.
    base = ["estimate", "--model", "MiniMax-M2", "--gpus", "4xH200", "--global-batch", "8", "--ep", "4", "--json"]
    r0, r1 = runner.invoke(app, base), runner.invoke(app, base + ["--calibration", str(out)])
    assert r0.exit_code == 0 and r1.exit_code == 0, r1.output
    assert json.loads(r1.stdout)["step_time_s"] > 1.2 * json.loads(r0.stdout)["step_time_s"]
    # The shipped calibration is not touched.
    assert SHIPPED_CALIBRATION_FILE.read_text() == shipped and load_calibration(None) == DEFAULT_CALIBRATION


def test_calibrate_study_without_measured_trials_fails_cleanly(tmp_path):
    name, results = _make_study(tmp_path)
    st = optuna.load_study(study_name=name, storage=f"sqlite:///{(results / name / 'study.db').as_posix()}")
    st2 = optuna.create_study(study_name="empty", storage=f"sqlite:///{(results / name / 'study.db').as_posix()}")
    for k, v in st.user_attrs.items():
        st2.set_user_attr(k, v)
    r = runner.invoke(app, ["calibrate", "--study", "empty", "--storage", f"sqlite:///{(results / name / 'study.db').as_posix()}", "--out", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "no finished trial measured" in r.output


def test_half_split_out_of_sample():
    """The benchmark's split: fit on alternate layouts by predicted step time, judge on the others."""
    rows = _rows()
    obs = _observations(rows)
    pred, _ = predict_observations(obs, DEFAULT_CALIBRATION)
    order = sorted(range(len(rows)), key=lambda i: (pred[i], rows[i]["n"]))
    fit_half, judge_half = [obs[i] for i in order[0::2]], [obs[i] for i in order[1::2]]
    fit = fit_observations(fit_half, start=DEFAULT_CALIBRATION, max_nfev=60)
    assert fit.memory_fitted and fit.step is not None and "expert_gemm_overhead_s" in fit.step.fitted
    s0, p0 = _errors(judge_half, DEFAULT_CALIBRATION)
    s1, p1 = _errors(judge_half, fit.calibration)
    assert s1 < 0.15 < 0.4 < s0, (s0, s1)
    assert p1 < 0.05 < 0.1 < p0, (p0, p1)
