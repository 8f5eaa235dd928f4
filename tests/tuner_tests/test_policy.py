"""The trial policy (tuner.study.policy.GainPolicy): its belief, its choice, its stopping rule, its budget; and a study
of real trials run under it (a measured backend that returns a fixed truth)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from launch import Measurement, TrialBackend
from specs import Layout
from tuner.cli import app
from tuner.study import TrialRecord, TrialRow, TuneConfig, open_storage, prepare, run_study, trial_rows
from tuner.study.policy import GainPolicy, PolicyParams


def _policy(predicted, *, codes=None, peak=None, **kw):
    n = len(predicted)
    params = PolicyParams(**{"sigma": 0.1, "run_sigma": 0.02, "startup_s": 100.0, "steps": 10, **kw})
    return GainPolicy(
        predicted=np.asarray(predicted, float),
        step_time_s=np.full(n, 1.0),
        peak_bytes=np.asarray(peak if peak is not None else [50e9] * n, float),
        codes=np.asarray(codes if codes is not None else [[i] for i in range(n)], dtype=np.int64),
        hbm_bytes=100e9,
        gpus=8,
        params=params,
    )


def test_first_pick_is_the_fastest_that_fits():
    p = _policy([100, 120, 110], peak=[50e9, 150e9, 50e9])  # 120 is predicted 1.5x over the GPU
    assert p.p_fit[1] < 1e-6 and p.next().index == 2


def test_a_measurement_moves_its_neighbours_and_not_strangers():
    # layouts 0 and 1 share every dimension but one; 2 differs in all three
    p = _policy([100, 100, 100], codes=[[0, 0, 0], [0, 0, 1], [1, 1, 1]], shared=0.0)
    p.observe(0, 80.0, gpu_hours=0.5)
    mean, sd = p.posterior()
    assert mean[0] == pytest.approx(math.log(0.8), abs=0.02)
    assert mean[1] < -0.05 and abs(mean[2]) < abs(mean[1])  # the neighbour is pulled down more than the stranger
    assert sd[0] < sd[1] < sd[2]


def test_a_shared_error_recalibrates_every_candidate():
    p = _policy([100, 100], codes=[[0], [1]], shared=1.0)
    p.observe(0, 80.0, gpu_hours=0.5)
    mean, _ = p.posterior()
    assert mean[1] == pytest.approx(mean[0], rel=1e-6)


def test_stops_when_nothing_untried_may_beat_the_best():
    p = _policy([100, 60, 55], sigma=0.05)
    assert p.next().index == 0
    p.observe(0, 100.0, gpu_hours=0.5)
    d = p.next()
    assert d.index is None and "no untried layout may beat the best by more than 2%" in d.reason


def test_keeps_measuring_while_an_untried_layout_may_win():
    p = _policy([100, 98, 60], sigma=0.1)
    p.observe(0, 100.0, gpu_hours=0.5)
    assert p.next().index == 1


def test_close_measured_layouts_are_run_again_up_to_max_runs():
    p = _policy([100, 100], sigma=0.05, run_sigma=0.05, codes=[[0], [1]], max_runs=2)
    p.observe(0, 100.0, gpu_hours=0.5)
    p.observe(1, 101.0, gpu_hours=0.5)
    d = p.next()
    assert d.repeat and d.index in (0, 1)  # a 1% gap under a 5% run-to-run spread: run one again
    for _ in range(3):
        p.observe(d.index, 100.5, gpu_hours=0.5)
        d = p.next()
        if d.index is None:
            break
        assert d.repeat and p.runs[d.index] < 2
    assert d.index is None and p.runs.max() <= 2


def test_budget_stops_before_a_trial_that_would_overrun_it():
    p = _policy([100, 99, 98], gpu_hours=0.1)  # a trial: (100 s + 10 x 1 s) x 8 GPUs = 0.24 GPU-hours
    d = p.next()
    assert d.index is None and "GPU-hour budget" in d.reason and "0.2" in d.reason


def test_trials_cap():
    p = _policy([100, 99, 98], max_trials=1)
    p.observe(0, 100.0, gpu_hours=0.1)
    assert "trials allowed" in p.next().reason


def test_only_own_trials_count_against_the_budgets():
    p = _policy([100, 99, 98, 97], max_trials=2, gpu_hours=1.0)
    p.take(0)  # picked, then run by another worker: pending here until observed, but not this run's trial
    p.observe(0, 100.0, gpu_hours=0.9, own=False)
    p.observe(1, 99.0, gpu_hours=0.9, own=False)
    assert (p.trials, p.run_trials, p.run_gpu_hours) == (2, 0, 0.0) and p.runs[:2].tolist() == [1, 1]
    p.take(2)
    assert p.next(in_flight=1).index == 3  # learnt from the others' trials, one of its own two left
    assert "trials allowed" in p.next(in_flight=2).reason


def test_a_failed_layout_is_not_picked_again():
    p = _policy([100, 90])
    p.observe(0, None, gpu_hours=0.1, failed=True)
    assert p.next().index == 1


def test_measured_startup_replaces_the_prior():
    p = _policy([100])
    assert float(p.trial_gpu_hours(0)) == pytest.approx((100 + 10) * 8 / 3600)
    p.observe(0, 100.0, gpu_hours=0.1, startup_s=20.0)
    assert float(p.trial_gpu_hours(0)) == pytest.approx((20 + 10) * 8 / 3600)


# ---- slice trials ----------------------------------------------------------------------------------------------


def _sliced(predicted, *, slice_sigma=0.05, **kw):
    n = len(predicted)
    p = _policy(predicted, **kw)
    p.slice_step_time_s, p.slice_gpus, p.slice_sigma = np.full(n, 0.25), np.full(n, 8.0), np.full(n, slice_sigma)
    return p


def test_a_slice_narrows_the_layout_and_its_neighbours_less_than_a_full_trial():
    codes = [[0, 0, 0], [0, 0, 1], [1, 1, 1]]
    full, part = _sliced([100] * 3, codes=codes, shared=0.0), _sliced([100] * 3, codes=codes, shared=0.0)
    prior = full.posterior()[1]
    full.observe(0, 90.0, gpu_hours=0.5)
    part.observe_slice(0, 0.9, gpu_hours=0.05)
    (m_full, sd_full), (m_part, sd_part) = full.posterior(), part.posterior()
    assert np.all(sd_full[:2] < sd_part[:2]) and np.all(sd_part[:2] < prior[:2])
    assert m_part[0] == pytest.approx(m_full[0], abs=0.03) and m_part[0] < -0.05  # the same evidence, less sure
    assert part.runs.sum() == 0 and part.slices == 1 and part.sliced[0]


def test_a_slice_costs_less_than_a_full_trial():
    p = _sliced([100, 90])
    assert np.all(p.slice_gpu_hours(slice(None)) < p.trial_gpu_hours(slice(None)))


def test_the_answer_is_always_measured_in_full():
    """Slices that say an untried layout is fast make it worth a full trial, never the answer; the stop names a
    layout measured in full."""
    truth = np.array([1.0, 1.3, 1.0, 0.9, 1.25])
    p = _sliced([100, 95, 99, 98, 97], sigma=0.2, run_sigma=0.01, slice_sigma=0.02)
    p.params = dataclasses.replace(p.params, slice_startup_s=1.0)
    kinds = []
    for _ in range(30):
        d = p.next()
        if d.index is None:
            break
        kinds.append("slice" if d.slice else "full")
        if d.slice:
            p.observe_slice(d.index, float(truth[d.index]), gpu_hours=float(p.slice_gpu_hours(d.index)))
        else:
            p.observe(
                d.index, float(p.predicted[d.index] * truth[d.index]), gpu_hours=float(p.trial_gpu_hours(d.index))
            )
        inc = p.incumbent()
        assert inc is None or p.runs[inc] > 0
    assert kinds[0] == "full" and "slice" in kinds and d.index is None
    assert p.incumbent() == 1 and p.runs[1] > 0  # the fastest, found by its slice, then measured in full


# ---- a study under the policy -----------------------------------------------------------------------------------


class _Truth(TrialBackend):
    """A measured backend whose truth is the prediction times a factor that depends on TP (TP 1 is 10% faster than
    predicted, the rest 10% slower); each trial 'runs' 100 s."""

    name = "truth"
    source = "measured"

    def __init__(self) -> None:
        from cost_model.estimate import estimate

        self._estimate = estimate
        self.runs = 0

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
        self.runs += 1
        e = self._estimate(model, cluster, workload, layout)
        tps = e.tokens_per_s_per_gpu * (1.1 if layout.tp == 1 else 0.9)
        step = e.step_time_s * e.tokens_per_s_per_gpu / tps
        return Measurement(
            layout=layout,
            source="measured",
            tokens_per_s_per_gpu=tps,
            peak_bytes=e.peak_bytes,
            step_times_s=(step,) * 4,
            extra={"wall_s": 100.0},
        )


SPACE = (
    "tp: [1, 2, 4]\npp: [1]\nvpp: [1]\ncp: [1]\nep: [1, 2]\netp: [1]\nmicro_batch_size: [1, 2]\n"
    "recompute:\n  - {granularity: none}\n  - {granularity: full, method: uniform, num_layers: [1]}\n"
    "optimizer_offload_fraction: [0.0]\ndispatcher: [alltoall]\npipeline_split: {even: true, max_stage_deficit: 0}\n"
)


def _cfg(tmp_path, **kw):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    base = dict(
        model="Qwen3-30B-A3B", gpus="8xH100", layers=4, global_batch_size=16, backend="command", trials=30,
        stack="megatron", results_dir=str(tmp_path), trial_steps=4, study="p", prune_margin=None, space=str(space),
    )
    base.update(kw)
    return TuneConfig.from_dict(base)


def test_a_study_under_the_policy_stops_itself_and_counts_gpu_hours(tmp_path):
    prep = prepare(_cfg(tmp_path))
    backend = _Truth()
    res = run_study(prep, backend=backend)
    assert res.stop_note is not None and res.stop_note.startswith(f"stopped after {backend.runs} trials")
    assert backend.runs < 30 and res.gpu_hours_now == pytest.approx(backend.runs * 100 * 8 / 3600)
    rows = trial_rows(res.study)
    best = max(rows, key=lambda r: r.tokens_per_s_per_gpu)
    assert best.layout.tp == 1
    ran = [TrialRecord.of(t).gpu_hours for t in res.study.trials if t.number in {r.trial for r in rows}]
    assert ran and all(h is not None and h > 0 for h in ran)


def test_the_users_launch_is_measured_first_under_the_policy(tmp_path):
    """`tune --from`: the launch (TP 4, surely slower here, so never the policy's own pick) is trial 0, measured."""

    launch = Layout.from_dict(
        {"world_size": 8, "tp": 4, "pp": 1, "ep": 2, "micro_batch_size": 1, "sequence_parallel": True}
    )
    prep = prepare(_cfg(tmp_path, baseline=launch.to_dict()))
    assert prep.baseline_row is not None
    res = run_study(prep, backend=_Truth())
    rows = sorted(trial_rows(res.study), key=lambda r: r.trial)
    first = rows[0]
    assert first.trial == 0 and first.source == "measured"
    assert (first.layout.tp, first.layout.ep, first.layout.micro_batch_size) == (4, 2, 1)
    assert (
        sum(
            1
            for r in rows
            if (r.layout.tp, r.layout.ep, r.layout.micro_batch_size) == (4, 2, 1)
            and r.layout.recompute_granularity.value == "none"
        )
        == 1
    )  # not measured twice
    from tuner.cli._from import compare_line
    from tuner.report import front_rows

    best = front_rows([max(rows, key=lambda r: r.tokens_per_s_per_gpu)], prep.model)[0]
    line = compare_line(prep, best, rows)  # the launch's measurement, not its prediction, against the measured best
    assert line.startswith(f"your launch (trial 0): {first.tokens_per_s_per_gpu:,.1f} tokens/s/GPU measured"), line
    assert f"{best['tokens_per_s_per_gpu'] / first.tokens_per_s_per_gpu - 1:+.0%}" in line


def test_a_study_under_the_policy_keeps_to_its_gpu_hours(tmp_path):
    backend = _Truth()
    res = run_study(prepare(_cfg(tmp_path, gpu_hours=1.0)), backend=backend)
    assert res.gpu_hours_now <= 1.0 + 1e-9 and "budget" in (res.stop_note or "")


class _OtherWorker(_Truth):
    """As :class:`_Truth`; during each of its trials another worker on the shared storage measures a contender of the
    lowest predicted throughput, 10% slower than predicted, in 5 GPU-hours."""

    def __init__(self, prep, storage) -> None:
        from tuner.study.candidates import CandidateIndex

        super().__init__()
        self.prep, self.storage, self.study = prep, storage, None
        self.index = CandidateIndex(prep.enumeration.valid, prep.fits)
        rows = np.flatnonzero(prep.contenders)
        self.left = [int(r) for r in rows[np.argsort(-prep.estimates.tokens_per_s_per_gpu[rows])]]

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
        import optuna

        row = self.left.pop()
        lay = self.prep.enumeration.valid.row(row)
        tps = float(self.prep.estimates.tokens_per_s_per_gpu[row]) * 0.9
        result = {"source": "measured", "tokens_per_s_per_gpu": tps, "peak_gib": 10.0}
        self.study = self.study or optuna.load_study(study_name="p", storage=open_storage(self.storage))
        self.study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, values=[tps, 10.0], params=self.index.params_of_row(row),
            distributions=self.index.distributions(), user_attrs={"key": lay.key(), "result": result, "gpu_hours": 5.0},
        ))
        return super().run(layout, model=model, cluster=cluster, workload=workload)


def test_workers_on_a_shared_storage_count_only_their_own_trials(tmp_path):
    """The policy learns from every worker's trials; --trials and --gpu-hours count this worker's."""
    storage = f"journal:{tmp_path / 'shared.log'}"
    prep = prepare(_cfg(tmp_path, trials=3, gpu_hours=10.0, storage=storage))
    backend = _OtherWorker(prep, storage)
    res = run_study(prep, backend=backend)
    assert backend.runs == 3 and res.evaluated_now + res.confirmed_now == 3
    assert res.stop_note is not None and res.stop_note.startswith("stopped after 3 trials (0.667 GPU-hours)")
    assert "the 3 trials allowed (--trials) are spent" in res.stop_note
    assert sum("result" in t.user_attrs for t in res.study.trials) == 6  # and the other worker's three


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--gpu-hours", "0"], "--gpu-hours must be a positive number"),
        (["--gpu-hours", "-3"], "--gpu-hours must be a positive number"),
        (["--gpu-hours", "nan"], "--gpu-hours must be a positive number"), (["--gpu-hours", "abc"], "--gpu-hours"),
        (["--gpu-hours", "5", "--backend", "model"], "budget of real trials"),
        (["--stop-gain", "0.05"], "stop real trials"),
        (["--gpu-hours", "5", "--backend", "command", "--trial-policy", "queue"], "drive the gain policy"),
        (["--confirm-runs", "2", "--backend", "command"], "belong to --trial-policy queue"),
        (["--stop-confidence", "0.8", "--backend", "model"], "stop real trials"),
        (["--stop-confidence", "1", "--backend", "command"], "--stop-confidence must be a fraction strictly"),
        (["--stop-confidence", "0", "--backend", "command"], "--stop-confidence must be a fraction"),
    ],
)
def test_bad_budget_and_stopping_inputs_are_refused(tmp_path, args, msg):
    r = CliRunner().invoke(app, ["--model", "Qwen3-30B-A3B", "--gpus", "8xH100", "--results-dir", str(tmp_path), *args])
    assert r.exit_code == 2 and msg in r.output, r.output
    assert not any(tmp_path.iterdir())  # refused before anything is written


def test_a_budget_smaller_than_one_trial_names_the_cheapest(tmp_path):
    with pytest.raises(Exception, match=r"--gpu-hours 0.001: one trial of the quickest candidate is predicted to cost"):
        run_study(prepare(_cfg(tmp_path, gpu_hours=0.001)), backend=_Truth())


class _Pruning(_Truth):
    """As :class:`_Truth`, but a layout without EP is stopped by the pruner after four steps."""

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
        from launch import TrialStopped

        m = super().run(layout, model=model, cluster=cluster, workload=workload)
        if layout.ep == 1:
            raise TrialStopped(
                "slower than the best", step_times_s=m.step_times_s, tokens_per_s_per_gpu=[m.tokens_per_s_per_gpu] * 4,
                wall_s=50.0,
            )
        return m


def test_a_pruned_trial_is_fed_back_as_its_steps_median(tmp_path):
    res = run_study(prepare(_cfg(tmp_path)), backend=_Pruning())
    assert res.pruned_now >= 1 and res.stop_note is not None  # the policy read the pruned steps and went on to its stop
    best = res.study.user_attrs["policy_best_trial"]
    assert next(r for r in trial_rows(res.study) if r.trial == best).layout.ep > 1


def test_a_refused_budget_leaves_no_study(tmp_path):
    with pytest.raises(Exception, match="--gpu-hours"):
        run_study(prepare(_cfg(tmp_path, gpu_hours=0.001)), backend=_Truth())
    assert not (tmp_path / "p").exists()


def test_the_default_trial_of_export_is_the_main_jobs_best(tmp_path):
    from tuner.report import pick_trial_row

    rows = [
        TrialRow(trial=0, tokens_per_s_per_gpu=10.0, peak_gib=1.0, layout=Layout(world_size=8)),
        TrialRow(trial=1, tokens_per_s_per_gpu=20.0, peak_gib=2.0, layout=Layout(world_size=8)),
    ]
    from specs import load_model

    assert pick_trial_row("s", rows, load_model("Llama-3.1-8B"), None, "export", best=0).trial == 0


def test_the_best_is_one_that_fits_when_it_can():
    from tuner.report import pick_best

    def row(trial, tps, peak, fit, headroom):
        return {
            "trial": trial,
            "tokens_per_s_per_gpu": tps,
            "peak_gib": peak,
            "fit": fit,
            "headroom_gib": headroom,
            "layout": Layout(world_size=8, micro_batch_size=trial + 1),
        }

    over = row(0, 120.0, 99.0, "may not fit", -19.0)
    inside = row(1, 100.0, 70.0, "may not fit", 10.0)
    assert pick_best([over, inside])[0]["trial"] == 1  # nothing surely fits: the one whose prediction fits
    assert pick_best([over, inside, row(2, 90.0, 50.0, "fits", 30.0)])[0]["trial"] == 2
    tied, other = row(3, 100.5, 60.0, "fits", 20.0), row(4, 100.0, 55.0, "fits", 25.0)
    best, ties = pick_best([tied, other])
    assert best["trial"] == 4 and [t["trial"] for t in ties] == [3]  # within 1%: the least memory


def test_an_out_of_memory_lowers_the_chance_to_fit_of_the_bigger_layouts():
    p = _policy([100, 99, 98], peak=[98e9, 99e9, 60e9], memory_sigma=0.05, memory_shared=0.5)
    before = p.p_fit.copy()
    p.observe(0, None, gpu_hours=0.1, failed=True, out_of_memory=True)
    assert p.p_fit[0] == 0.0
    assert p.p_fit[1] < before[1] - 0.1  # the model under-predicts memory on this job: 99 GB is likely over too
    assert p.p_fit[2] == pytest.approx(before[2], abs=1e-3)  # far from the edge either way


def test_a_measured_peak_under_the_prediction_raises_the_chance_to_fit():
    p = _policy([100, 99], peak=[90e9, 101e9], memory_sigma=0.05, memory_shared=0.5)
    before = p.p_fit[1]
    p.observe(0, 100.0, gpu_hours=0.1, peak_bytes=81e9)  # 10% under its prediction
    assert p.p_fit[0] == 1.0 and p.p_fit[1] > before + 0.2
    q = _policy([100, 99], peak=[90e9, 101e9], memory_sigma=0.05, memory_shared=0.5)
    q.observe(0, None, gpu_hours=0.1, failed=True)  # a crash says nothing about memory
    assert q.p_fit[1] == pytest.approx(before)


class _OomOnMbs2(_Truth):
    """As :class:`_Truth`, but a micro-batch of 2 runs out of memory in its first step."""

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
        from launch import FailureKind, TrialFailed

        if layout.micro_batch_size == 2:
            raise TrialFailed(FailureKind.oom, "CUDA out of memory", memory_reached_bytes=80e9)
        return super().run(layout, model=model, cluster=cluster, workload=workload)


def test_the_study_feeds_measured_peaks_and_out_of_memory_to_the_policy(tmp_path, monkeypatch):
    from cost_model.estimate import estimate
    from tuner.study import policy as policy_mod

    seen: list[tuple[int, float | None, bool]] = []
    observe = policy_mod.GainPolicy.observe

    def spy(self, index, tps, **kw):
        seen.append((index, kw.get("peak_bytes"), kw.get("out_of_memory", False)))
        return observe(self, index, tps, **kw)

    monkeypatch.setattr(policy_mod.GainPolicy, "observe", spy)
    prep = prepare(_cfg(tmp_path, trials=6))
    res = run_study(prep, backend=_OomOnMbs2())
    rows = {r.trial: r for r in trial_rows(res.study)}
    assert any(oom for _, _, oom in seen) and any(p is not None for _, p, _ in seen)
    for r in rows.values():
        if r.source == "measured":  # its peak, in bytes, as the backend measured it (stored in GiB)
            lay = r.layout
            want = estimate(prep.model, prep.cluster, prep.workload, lay).peak_bytes
            assert any(p is not None and p == pytest.approx(want, rel=1e-3) for _, p, _ in seen)
