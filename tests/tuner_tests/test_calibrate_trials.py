"""Calibration from real trials: `tune calibrate --study` on a study holding the committed H200
measurements (tests/fixtures/h200_minimax_slice.jsonl, megatron-core without Transformer Engine),
the half/half split of benchmarks/bench_trial_calibration.py, and its extrapolation mode (fit on
the 1- and 2-GPU sweeps, judge on the 4-GPU rows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from typer.testing import CliRunner

from benchmarks import bench_trial_calibration
from cost_model.calibrate import Observation, fit_observations, predict_observations
from cost_model.calibration import DEFAULT_CALIBRATION, SHIPPED_CALIBRATION_FILE, load_calibration
from specs import Workload, load_model, parse_gpus
from specs.layout import Layout
from specs.model import slice_model
from tuner.cli import app
from tuner.study import TuneConfig, model_spec_to_dict, prepare
from tuner.study.storage import resolved as _resolved

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h200_minimax_slice.jsonl"
SWEEPS = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_x2_2026-11-29"
runner = CliRunner()


def _rows() -> list[dict]:
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines() if x.strip()]
    return [r for r in rows if r["status"] == "ok" and r["gpus"] == "4xH200"]


def _make_study(tmp_path: Path) -> tuple[str, Path]:
    """A study as `tune --backend local` leaves it: the study's inputs, and one COMPLETE trial per
    measured layout with ``user_attrs["result"]`` (source "measured", peak_gib = reserved)."""
    results = tmp_path / "results"
    cfg = TuneConfig.from_dict(dict(
        model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, backend="local", stack="megatron",
        results_dir=str(results), study="h200-slice",
    ))
    prep = prepare(cfg)
    name = cfg.study_name(prep.model, prep.cluster)
    (results / name).mkdir(parents=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(
        study_name=name,
        storage=f"sqlite:///{(results / name / 'study.db').as_posix()}",
        directions=["maximize", "minimize"],
    )
    st.set_user_attr("config", cfg.to_dict())
    st.set_user_attr("resolved", _resolved(prep))
    st.set_user_attr("model_spec", model_spec_to_dict(prep.model))
    st.set_user_attr("calibration", prep.calibration.to_dict())
    for r in _rows():
        lay = Layout.from_dict(r["layout"])
        res = {
            "layout": lay.to_dict(),
            "label": lay.label,
            "source": "measured",
            "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
            "peak_gib": r["peak_reserved_gib"],
            "step_time_s": r["step_time_s"],
            "step_times_s": r["step_times_s"],
            "losses": r["losses"],
            "peak_allocated_gib": r["peak_allocated_gib"],
            "step_time_cv": r["step_time_cv"],
            "notes": r["notes"],
            "pred_tokens_per_s_per_gpu": r["pred_tokens_per_s_per_gpu"],
            "pred_peak_gib": r["pred_peak_gib"],
            "pred_step_time_s": r["pred_step_time_s"],
        }
        st.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE,
                values=[r["tokens_per_s_per_gpu"], r["peak_reserved_gib"]],
                user_attrs={"key": lay.key(), "result": res},
            )
        )
    return name, results


def _observations(rows: list[dict]) -> list[Observation]:
    m, c = slice_model(load_model("MiniMax-M2"), 4), parse_gpus("4xH200")
    w = Workload(seq_length=8192, global_batch_size=8)
    return [
        Observation(
            model=m, cluster=c, workload=w, layout=Layout.from_dict(r["layout"]), step_time_s=r["step_time_s"],
            peak_gib=r["peak_reserved_gib"], label=r["label"],
        )
        for r in rows
    ]


def _errors(obs: list[Observation], cal) -> tuple[float, float]:
    step, peak = predict_observations(obs, cal)
    ms = np.array([o.step_time_s for o in obs])
    mp = np.array([o.peak_gib for o in obs])
    return float(np.median(np.abs(step / ms - 1))), float(np.median(np.abs(peak / mp - 1)))


@pytest.mark.slow
def test_calibrate_study_fits_measured_trials_and_the_file_loads(tmp_path):
    shipped = SHIPPED_CALIBRATION_FILE.read_text()
    name, results = _make_study(tmp_path)
    out = tmp_path / "cal.yaml"
    r = runner.invoke(
        app, ["calibrate", "--study", name, "--results-dir", str(results), "--out", str(out), "--max-nfev", "40"]
    )
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
    assert p1 < 0.05 and p1 < 0.5 * p0, (p0, p1)  # the shipped calibration's p0 follows its refits (9.6% on 2026-12-03)
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
    r = runner.invoke(
        app,
        [
            "calibrate", "--study", "empty", "--storage", f"sqlite:///{(results / name / 'study.db').as_posix()}",
            "--out", str(tmp_path / "x.yaml"),
        ],
    )
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


def test_bench_extrapolation_fits_small_slices_and_judges_4gpu(capsys):
    """The benchmark's --fit-data/--judge-data mode on the committed files: row counts, each row as the harness
    ran it (the 1-GPU layouts were listed with precision-aware Adam on, which runs off without TE), and the fit."""
    with pytest.raises(SystemExit):
        bench_trial_calibration.main(["--fit-data", str(FIXTURE)])  # --judge-data missing
    assert "go together" in capsys.readouterr().err
    args = [
        "--fit-data", str(SWEEPS / "sweep_l2_2gpu.jsonl"), str(SWEEPS / "sweep_l1_1gpu_local.jsonl"), "--judge-data",
        str(FIXTURE), "--judge-gpus", "4xH200", "--max-nfev", "60", "--json",
    ]
    assert bench_trial_calibration.main(args) == 0
    r = json.loads(capsys.readouterr().out)
    fit_files, judge_files = r["data"]["fit"], r["data"]["judge"]
    assert [(f["rows"], f["kinds"], f["skipped"]) for f in fit_files] == [
        (11, "11 2xH200 2-layer", {"not finished (crash)": 1}),
        (3, "3 1xH200 1-layer", {}),
    ]
    assert [(f["rows"], f["kinds"], f["skipped"]) for f in judge_files] == [
        (12, "12 4xH200 4-layer", {"not finished (timeout)": 1, "other GPUs (2xH200)": 3})
    ]
    assert len(r["sets"]["fit"]) == 14 and len(r["sets"]["judge"]) == 12
    changed = r["harness_layout_changed"]
    assert (
        len(changed["fit"]) == 3 and all(x.startswith("1xH200 L1 ") for x in changed["fit"]) and changed["judge"] == []
    )
    fit, judge = r["scores"]["fit"], r["scores"]["judge"]
    # With the mapping the shipped calibration's 1-GPU peaks are ~5% under reserved (listed as run: ~13% under).
    one_gpu = [x for x in fit["before"]["rows"] if x["label"].startswith("1xH200")]
    assert len(one_gpu) == 3 and all(abs(x["pred_peak_gib"] / x["reserved_gib"] - 1) < 0.08 for x in one_gpu), one_gpu
    assert fit["after"]["step_median"] < 0.5 * fit["before"]["step_median"], (
        fit["before"]["step_median"],
        fit["after"]["step_median"],
    )
    assert judge["after"]["step_median"] < 0.15 < 0.4 < judge["before"]["step_median"]
    assert (
        judge["after"]["peak_reserved_median"] < 0.05
        and judge["after"]["peak_reserved_median"] < 0.5 * judge["before"]["peak_reserved_median"]
    )


def test_bench_refuses_bad_rows_and_overlapping_sets(tmp_path, capsys):
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines() if x.strip()]
    garbage = tmp_path / "g.jsonl"
    garbage.write_text(json.dumps(rows[0]) + "\nnot json\n")
    assert bench_trial_calibration.main(["--fit-data", str(garbage), "--judge-data", str(FIXTURE)]) == 2
    assert "g.jsonl: line 2: not JSON" in capsys.readouterr().err
    # the same rows on both sides would be judged in-sample
    assert bench_trial_calibration.main(["--fit-data", str(FIXTURE), "--judge-data", str(FIXTURE)]) == 2
    assert "in both the fit and the judge set" in capsys.readouterr().err
    # rows that cannot be predicted are skipped with the reason, not fitted
    bad = [dict(rows[0], step_time_s=-1.0), dict(rows[1], layout=dict(rows[1]["layout"], tp=3)), dict(rows[2], n="x")]
    f = tmp_path / "bad.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in bad + rows[3:]))
    kept, skipped = bench_trial_calibration.read_data_rows(f, ["4xH200"])
    assert skipped["no valid step time"] == 1 and skipped["breaks rule world_div_tp_pp_cp"] == 1
    assert any(k.startswith("malformed") for k in skipped) and all(r["n"] not in (0, 1, 2) for r in kept)
