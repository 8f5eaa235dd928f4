"""Measured trials that the best one cannot be told apart from (tuner.report.measured_ties)."""

from __future__ import annotations

import math
from dataclasses import replace

from specs.layout import Layout
from tuner.cli import _front
from tuner.report import measured_ties
from tuner.study import TrialRow

# The search of 2026-11-30 on 2 x H200 (benchmarks/results/h200_x2_2026-11-30/step_times_search20.jsonl):
# post-warm-up step times (s) of trial 2 (reported best) and trial 0 (none/allgather, 2.1% slower)
BEST = [0.97, 0.95, 0.94, 1.01, 1.00, 0.99, 0.96, 0.94, 0.95, 0.92]
NONE_AG = [0.98, 0.93, 0.98, 0.98, 0.99, 0.92, 0.97, 0.95, 0.90, 1.04]


def _row(trial, times, source="measured", **lay):
    layout = Layout(world_size=2, ep=2, micro_batch_size=2, **lay)
    med = sorted(times)[len(times) // 2] if times else 1.0
    return TrialRow(trial=trial, source=source, layout=layout, step_times_s=tuple(times),
                    tokens_per_s_per_gpu=65536 / 2 / med, peak_gib=100.0)


def test_a_trial_within_noise_ties_and_a_slow_one_does_not():
    rows = [
        _row(2, BEST),
        _row(0, NONE_AG, dispatcher="allgather"),
        _row(4, [1.10 * t for t in BEST]),
        _row(5, [1.0, 1.0]),  # too few steps to say
        _row(6, BEST, source="predicted"),
    ]
    ties = measured_ties(rows, 2)
    assert [t["trial"] for t in ties] == [0]
    t = ties[0]
    assert 0 < t["gap"] < t["threshold"] < 0.10 and "allgather" in t["label"] and "mbs 2" in t["label"]


def test_threshold_is_two_standard_errors_of_the_medians():
    a = [1.0, 1.1, 0.9, 1.0, 1.1, 0.9, 1.0, 1.1, 0.9]
    mean = sum(a) / len(a)
    sd = math.sqrt(sum((x - mean) ** 2 for x in a) / (len(a) - 1))
    se = math.sqrt(math.pi / 2) * sd / mean / 3.0
    rows = [_row(0, a), _row(1, [x * (1 + 2 * math.sqrt(2) * se * 0.9) for x in a])]
    (t,) = measured_ties(rows, 0)
    assert math.isclose(t["threshold"], 2 * math.sqrt(2) * se, rel_tol=1e-9)
    rows[1] = _row(1, [x * (1 + 2 * math.sqrt(2) * se * 1.2) for x in a])
    assert measured_ties(rows, 0) == []


def test_no_ties_for_a_predicted_best_or_steady_trials():
    assert measured_ties([_row(0, BEST, source="predicted"), _row(1, NONE_AG)], 0) == []
    steady = [1.0] * 10
    assert measured_ties([_row(0, steady), _row(1, [1.01] * 10)], 0) == []  # no noise: 1% apart is a difference


def test_tune_prints_the_ties(capsys, monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(_front, "out", Console(width=400, highlight=False))
    rows = [_row(2, BEST), _row(0, NONE_AG)]
    _front.print_ties(rows, {"trial": 2, "source": "measured"})
    text = capsys.readouterr().out
    assert "within measurement noise of trial 2" in text and "trial 0 (TP1 PP1 EP2 DP2, none, alltoall, mbs 2)" in text
    _front.print_ties([_row(2, BEST), _row(4, [1.10 * t for t in BEST])], {"trial": 2, "source": "measured"})
    assert capsys.readouterr().out == ""


def test_the_recipe_names_the_tied_trials():
    from launch import exporters as export
    from specs import Workload, load_model, parse_gpus
    from specs.model import slice_model
    from tuner.report import ties_note

    rows = [_row(2, BEST), _row(0, NONE_AG, dispatcher="allgather"), _row(4, [1.10 * t for t in BEST])]
    notes = ties_note(rows, 2)
    assert (
        len(notes) == 1
        and "trial 0 (TP1 PP1 EP2 DP2, none, allgather, mbs 2, -2.0%)" in notes[0]
        and "trial 4" not in notes[0]
    )
    assert ties_note(rows, 4) == []  # 10% slower than its nearest: nothing ties with it
    lay = rows[0].layout
    rec = export.recipe_dict(
        slice_model(load_model("MiniMax-M2"), 2),
        parse_gpus("2xH200"),
        Workload(seq_length=8192, global_batch_size=8),
        lay,
        extra_notes=notes,
    )
    export.validate_recipe(rec)
    assert notes[0] in rec["notes"]


def test_foreign_step_times_are_left_out_not_fatal():
    def read(trial, times, tps=65536 / 2 / 0.96):
        return TrialRow.of(trial, "", {"layout": Layout(world_size=2, ep=2).to_dict(), "source": "measured",
                                       "step_times_s": times, "tokens_per_s_per_gpu": tps, "peak_gib": 100.0})

    rows = [_row(2, BEST), read(0, [None, "x", True, *NONE_AG]),  # the valid ones still count
            read(1, 0.97),  # not a list: no ties for it
            read(3, [None, "x", float("nan")]), read(5, NONE_AG, float("nan"))]
    assert [t["trial"] for t in measured_ties(rows, 2)] == [0]


def test_an_exact_tie_prints_no_signed_zero(capsys, monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(_front, "out", Console(width=400, highlight=False))
    rows = [_row(2, BEST), _row(0, BEST, dispatcher="allgather")]
    (t,) = measured_ties(rows, 2)
    assert t["gap"] == 0.0 and str(t["gap"]) == "0.0"
    _front.print_ties(rows, {"trial": 2, "source": "measured"})
    assert "-0.0%" not in capsys.readouterr().out


def test_a_mixed_study_is_judged_against_its_fastest_measured_trial(capsys, monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(_front, "out", Console(width=400, highlight=False))
    rows = [replace(_row(9, BEST, source="predicted"), tokens_per_s_per_gpu=9e5), _row(2, BEST), _row(0, NONE_AG)]
    _front.print_ties(rows, {"trial": 9, "source": "predicted"})
    assert "within measurement noise of trial 2" in capsys.readouterr().out


def _pred(trial, tps, peak=100.0, headroom=math.nan, **lay):
    return TrialRow(trial=trial, source="predicted", layout=Layout(world_size=2, ep=2, micro_batch_size=2, **lay),
                    tokens_per_s_per_gpu=tps, peak_gib=peak, headroom_gib=headroom)


def test_predicted_layouts_within_one_percent_of_a_predicted_best_are_named():
    from tuner.report import PREDICTED_TIE, predicted_ties, predicted_ties_text, ties_note

    rows = [
        _pred(0, 1000.0),
        _pred(1, 995.0, 80.0, dispatcher="allgather"),
        _pred(2, 1000.0 * (1 - PREDICTED_TIE) - 0.01),
        _pred(3, 999.0),
        _row(4, BEST),
    ]
    assert [(t.trial, round(gap, 4)) for t, gap in predicted_ties(rows, 0)] == [
        (3, 0.001),
        (1, 0.005),
    ]  # not 2 (just over), not 4 (measured)
    text = predicted_ties_text(rows, 0)
    assert text is not None and text.startswith("predicted within 1% of trial 0: trial 3 (")
    assert "trial 1 (TP1 PP1 EP2 DP2, none, allgather, mbs 2): 995.0 tokens/s/GPU (-0.5%), peak 80.0 GiB" in text
    assert predicted_ties(rows, 4) == [] and predicted_ties_text([_pred(0, 1000.0), _pred(1, 900.0)], 0) is None
    (note,) = ties_note(rows, 0)
    assert note.startswith("Predicted within 1% of trial 0") and note.endswith("real trials.")


def test_a_predicted_near_tie_that_does_not_fit_is_left_out_and_counted():
    from tuner.report import predicted_ties_text

    over = _pred(1, 999.0, 146.7, -6.3, dispatcher="allgather")  # 146.7 GiB on a 140.4 GiB GPU
    rows = [_pred(0, 1000.0), over, _pred(2, 998.0, 90.0, 50.4, recompute_granularity="selective")]
    text = predicted_ties_text(rows, 0)
    assert text is not None and "trial 1" not in text and "trial 2 (" in text
    assert "(1 more within 1% is predicted not to fit the GPU, left out)" in text
    assert predicted_ties_text(rows[:2], 0) is None  # only a layout that does not fit: no near-tie to choose


def test_between_run_noise_is_the_pooled_spread_of_the_confirmed_layouts():
    from tuner.report import between_run_noise

    a, b = _row(0, BEST), _row(1, NONE_AG)
    assert between_run_noise([a, b]) is None  # nothing measured twice
    a = replace(a, runs_tokens_per_s_per_gpu=(90.0, 110.0))  # SD/mean 14.14%, 1 degree of freedom
    b = replace(b, runs_tokens_per_s_per_gpu=(100.0, 100.0, 100.0))  # 0%, 2 degrees of freedom
    pred = replace(_row(2, BEST, source="predicted"), runs_tokens_per_s_per_gpu=(1.0, 2.0))  # not measured: left out
    sd_a = math.sqrt(200.0) / 100.0
    assert math.isclose(between_run_noise([a, b, pred]), math.sqrt(sd_a**2 / 3.0), rel_tol=1e-12)


def test_a_single_run_ties_within_the_spread_between_runs_the_study_measured(capsys, monkeypatch):
    """2026-12-04: eight runs of one layout on the lent H200 spread 10% while each run's steps were steady (CV 2-8%):
    a layout measured once 8% below the best is not told apart from it once the study has seen that spread."""
    from rich.console import Console

    from tuner.report import ties_note

    steady = [1.0, 1.01, 0.99, 1.0, 1.01, 0.99, 1.0, 1.01, 0.99, 1.0]
    rows = [_row(0, steady), _row(1, [1.08 * t for t in steady], dispatcher="allgather")]
    assert measured_ties(rows, 0) == []  # within-run noise only: 8% apart is a difference
    assert ties_note(rows, 0) == []
    tps = rows[0].tokens_per_s_per_gpu
    rows[0] = replace(rows[0], runs_tokens_per_s_per_gpu=(tps * 0.9, tps, tps * 1.1))  # confirmation runs: SD 10%
    (t,) = measured_ties(rows, 0)
    assert t["trial"] == 1 and math.isclose(t["threshold"], 2 * math.sqrt(0.1**2 / 3 + 0.1**2), rel_tol=1e-9)
    # 33% slower: still a difference
    rows[1] = replace(rows[1], step_times_s=tuple(1.5 * x for x in steady), tokens_per_s_per_gpu=tps / 1.5)
    assert measured_ties(rows, 0) == []
    rows[1] = replace(rows[1], step_times_s=tuple(1.08 * x for x in steady), tokens_per_s_per_gpu=tps / 1.08)
    (note,) = ties_note(rows, 0)
    assert "counting the 10.0% spread between runs of one layout" in note and "trial 1 (" in note
    monkeypatch.setattr(_front, "out", Console(width=400, highlight=False))
    _front.print_ties(rows, {"trial": 0, "source": "measured"})
    assert "with the 10.0% spread between runs of one layout this study measured" in capsys.readouterr().out
