"""A study's finished trials as typed rows (tuner.study.trial_rows): confirmation runs folded, bad results refused."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from specs.errors import TunerError
from specs.layout import Layout
from tuner.study import TrialRow, trial_rows

LAY = Layout(world_size=8, tp=2, sequence_parallel=True)


def _result(tps: float, peak: float, headroom: float, step: float) -> dict:
    return {"layout": LAY.to_dict(), "source": "measured", "tokens_per_s_per_gpu": tps, "peak_gib": peak,
            "headroom_gib": headroom, "step_time_s": step, "mfu": 0.4, "usd_per_million_tokens": 2.0,
            "step_times_s": [step, step], "log_path": "/logs/0"}


def _study(*trials: tuple[TrialState, dict]) -> optuna.Study:
    st = optuna.create_study(study_name="s")
    for state, attrs in trials:
        st.add_trial(create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None, user_attrs=attrs))
    return st


def test_confirmation_runs_fold_into_the_trial_they_repeat():
    st = _study(
        (TrialState.COMPLETE, {"key": LAY.key(), "result": _result(100.0, 50.0, 90.0, 2.0)}),
        (TrialState.COMPLETE, {"repeat_of": 0, "result": _result(200.0, 60.0, 80.0, 1.0)}),
        (TrialState.FAIL, {"repeat_of": 0, "failure": {"kind": "oom", "memory_reached_gib": 150.0}}),
        (TrialState.COMPLETE, {"result": {"source": "predicted"}}),  # no layout: not a row
    )
    (row,) = trial_rows(st)
    assert isinstance(row, TrialRow) and row.layout == LAY and row.key == LAY.key() and row.trial == 0
    mean = 2 / (1 / 100.0 + 1 / 200.0)  # the runs' tokens over their time
    assert row.runs == 2 and row.runs_tokens_per_s_per_gpu == (100.0, 200.0)
    assert row.tokens_per_s_per_gpu == pytest.approx(mean) and row.step_time_s == 1.5
    assert (row.peak_gib, row.headroom_gib) == (60.0, 80.0)  # the highest run's peak, the lowest headroom
    assert row.mfu == pytest.approx(0.4 * mean / 100.0) and row.usd_per_million_tokens == pytest.approx(200.0 / mean)
    assert [(f.trial, f.kind, f.memory_reached_gib) for f in row.runs_failed] == [(2, "oom", 150.0)]
    assert row.step_times_s == (2.0, 2.0) and math.isnan(row.pred_peak_gib)  # the first run's; none predicted
    m = row.measurement()
    assert m is not None and m.layout == LAY and m.peak_bytes == 60.0 * 2**30 and m.log_path == "/logs/0"


def test_a_result_that_cannot_be_read_names_its_trial():
    bad = {**_result(100.0, 50.0, 90.0, 2.0), "layout": {"world_size": 8, "tensor_parallel": 2}}
    with pytest.raises(TunerError, match=r"study 's', trial 0: its result cannot be read \(unknown layout keys"):
        trial_rows(_study((TrialState.COMPLETE, {"result": bad})))
