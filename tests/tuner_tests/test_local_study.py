"""The study with real-trial backends: the local backend with a fake trial program, pruning, failures, --layers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from typer.testing import CliRunner

from launch.harness.spec import HarnessEnv
from launch.local_backend import LocalBackend
from specs.errors import TunerError
from tuner.cli import app
from tuner.study import TuneConfig, prepare, run_study, trial_rows

pytestmark = pytest.mark.slow  # studies of real trials: processes of the fake harness

FAKE = str(Path(__file__).parents[1] / "launch_tests" / "fake_trial.py")


#: A calibration these tests keep whatever the shipped one becomes (the shipped file of 2026-12-03, second refit): which
#: layouts a study tries first, and so which it prunes, follows the calibration's ranking.
PINNED_CALIBRATION = str(Path(__file__).parents[1] / "fixtures" / "calibration_pinned_2026-12-03b.yaml")


def _cfg(tmp_path, **kw):
    base = dict(
        model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, backend="local", trials=6, policy="queue",
        stack="megatron", results_dir=str(tmp_path), trial_steps=6, study="s", calibration=PINNED_CALIBRATION,
    )
    base.update(kw)
    return TuneConfig.from_dict(base)


def _backend(tmp_path, steps=6):
    return LocalBackend(
        trials_dir=tmp_path / "s" / "trials", num_gpus=4, steps=steps, warmup_steps=2, timeout_s=30,
        launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02,
    )


#: The fake reports each step 1000 times longer than it sleeps: the study sees steps of seconds, and a trial
#: of 6 steps sleeps a few hundredths of a second in all.
QUICK = "1000"


@pytest.fixture
def one_fast(monkeypatch):
    """Only allgather layouts without recompute step fast (reported 2 s); the others report 15 s: pruned where a
    study prunes. A test that prunes sets FAKE_TAIL, so that the trial to be stopped is still running when
    the pruner reads its 5th step."""
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_REPORT_SCALE", QUICK)
    monkeypatch.setenv("FAKE_STEP_S", "0.015")
    monkeypatch.setenv("FAKE_FAST_IF", "dispatcher=allgather,recompute_granularity=none")
    monkeypatch.setenv("FAKE_FAST_STEP_S", "0.002")


def _slow_tp(mp: pytest.MonkeyPatch) -> None:
    """TP 1 layouts report steps of 2 s, TP 2 and TP 4 of 15 s: 7x slower, so they are pruned where a study prunes."""
    mp.setenv("FAKE_TRIAL_MODE", "ok")
    mp.setenv("FAKE_REPORT_SCALE", QUICK)
    mp.setenv("FAKE_STEP_S_TP1", "0.002")
    mp.setenv("FAKE_STEP_S_TP2", "0.015")
    mp.setenv("FAKE_STEP_S_TP4", "0.015")


@pytest.fixture
def slow_tp(monkeypatch):
    _slow_tp(monkeypatch)


def _slow_tp_study(tmp_path_factory, steps=6, **kw):
    """A study of real trials (the layouts of ``slow_tp``, no pruning) run once for the tests of this module that only
    read what it recorded: its folder and the RunResult."""
    root = tmp_path_factory.mktemp("study")
    with pytest.MonkeyPatch.context() as mp:
        _slow_tp(mp)
        prep = prepare(_cfg(root, prune_margin=None, **kw))
        return root, prep, run_study(prep, backend=_backend(root, steps=steps))


@pytest.fixture(scope="module")
def measured_study(tmp_path_factory):
    """--trials 6 of 6 steps, the default recalibration."""
    return _slow_tp_study(tmp_path_factory)


@pytest.fixture(scope="module")
def recalibrated_study(tmp_path_factory):
    """--recalibrate-after 2: --trials 7 of 4 steps, refitted after every 2 measured trials."""
    return _slow_tp_study(tmp_path_factory, steps=4, trials=7, recalibrate_after=2)


def test_layers_slices_the_model_and_names_the_study(tmp_path):
    prep = prepare(_cfg(tmp_path, study=None, backend="model"))
    assert prep.model.num_layers == 4 and prep.model.hidden_size == 3072
    assert (
        prep.config.study_name(prep.model, prep.cluster) == "MiniMax-M2-L4-4xH200-s8192-gbs8-megatron"
    )  # --stack megatron


def test_measured_trials_land_in_the_study(measured_study):
    _, _, res = measured_study
    rows = trial_rows(res.study)
    assert res.evaluated_now >= 3 and rows
    for r in rows:
        assert r.source == "measured" and r.tokens_per_s_per_gpu > 0 and r.peak_gib == 90.0
        assert r.pred_tokens_per_s_per_gpu > 0 and r.pred_peak_gib > 0 and r.step_times_s and r.log_path
        assert Path(r.log_path, "steps.jsonl").exists()
    # nothing the harness cannot run here (flex without DeepEP) was enqueued
    assert all("flex" not in r.layout.dispatcher.value for r in rows)


def test_pruning_saves_time(tmp_path, one_fast, monkeypatch):
    # the first layout tried is the fast one (allgather, no recompute); the 3 after it are slow
    full = run_study(prepare(_cfg(tmp_path / "a", prune_margin=None, trials=4)), backend=_backend(tmp_path / "a"))
    # the slow layouts' steps after the 5th (where the pruner can first stop them: 3 warm-up, half of the 6 trial
    # steps, + 2 measured) take 1 s: a pruned trial is stopped within that second, however far the step reader
    # lags on a loaded machine
    monkeypatch.setenv("FAKE_TAIL", "5:1")
    pruned = run_study(prepare(_cfg(tmp_path / "b", prune_margin=0.25, trials=4)), backend=_backend(tmp_path / "b"))
    assert full.pruned_now == 0 and pruned.pruned_now >= 1
    assert full.evaluated_now == 4 and pruned.evaluated_now + pruned.pruned_now == 4  # both tried 4 layouts
    p = [t for t in pruned.study.trials if "pruned" in t.user_attrs]
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in p)
    info = p[0].user_attrs["pruned"]
    assert "below the best so far" in info["reason"] and len(info["step_times_s"]) >= 4
    assert (info["layout"]["dispatcher"], info["layout"]["recompute_granularity"]) != ("allgather", "none")
    assert "pred_tokens_per_s_per_gpu" in info
    # of the same 4 layouts' budget, the pruned ones stopped before their 6 steps: the time pruning saves
    assert all(len(t.user_attrs["pruned"]["step_times_s"]) < 6 for t in p)


def test_failures_are_recorded_and_the_study_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "oom")
    res = run_study(prepare(_cfg(tmp_path, trials=3)), backend=_backend(tmp_path))
    failed = [t for t in res.study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) >= 2 and res.failed_now == len(failed)
    f = failed[0].user_attrs["failure"]
    assert f["kind"] == "oom" and f["memory_reached_gib"] == 150.0 and "pred_peak_gib" in f


def test_a_failed_trial_is_the_tools_line_on_stderr(tmp_path):
    """What a user sees: the tool's line naming the failed trial, its layout and the error; neither Optuna's line (its
    ``[W <date>] Trial 0 failed with parameters: {...}``, over 300 columns) nor a traceback (a separate process, so
    that Optuna's own stderr handler writes to a real stream)."""
    import os
    import subprocess

    code = (
        "import sys; from pathlib import Path; from test_local_study import _cfg, _backend; from tuner.study import "
        "prepare, run_study;"
        "run_study(prepare(_cfg(Path(sys.argv[1]), trials=2)), backend=_backend(Path(sys.argv[1])))"
    )
    root = Path(__file__).parents[2]
    env = {
        **os.environ,
        "FAKE_TRIAL_MODE": "crash",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(root)]),
    }
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120, cwd=root
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert re.search(r"^trial 0 \(TP\d.*\) failed: crash", p.stderr, re.M), p.stderr
    assert "[W " not in p.stderr and "failed with" not in p.stderr and "Traceback" not in p.stderr


def test_interrupt_keeps_finished_trials_and_resumes(tmp_path, slow_tp):
    class Interrupting(LocalBackend):
        calls = 0

        def run(self, layout, **kw):
            Interrupting.calls += 1
            if Interrupting.calls == 3:
                raise KeyboardInterrupt
            return super().run(layout, **kw)

    b = Interrupting(
        trials_dir=tmp_path / "s" / "trials", num_gpus=4, steps=4, launcher=[sys.executable, FAKE], env=HarnessEnv(),
        poll_s=0.02,
    )
    with pytest.raises(KeyboardInterrupt):
        run_study(prepare(_cfg(tmp_path, prune_margin=None)), backend=b)
    st = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s/study.db")
    assert len(trial_rows(st)) == 2
    (cut,) = [t for t in st.trials if t.state == optuna.trial.TrialState.FAIL]
    res = run_study(prepare(_cfg(tmp_path, prune_margin=None)), backend=_backend(tmp_path, steps=4))
    keys = [r.key for r in trial_rows(res.study)]
    assert len(keys) == len(set(keys)) > 2
    # the layout that was being measured when the run was interrupted is measured on resume
    assert cut.user_attrs["key"] in keys


def test_cli_layers_and_local_gpu_count(tmp_path, monkeypatch):
    r = CliRunner().invoke(
        app, ["--model", "MiniMax-M2", "--layers", "0", "--gpus", "4xH200", "--results-dir", str(tmp_path)]
    )
    assert r.exit_code == 2 and "--layers" in r.output
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    r = CliRunner().invoke(
        app,
        [
            "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--backend", "local",
            "--results-dir", str(tmp_path),
        ],
    )
    assert r.exit_code == 2 and "this machine's 2 GPUs" in r.output and "--gpus 2xH200" in r.output


def test_pareto_shows_predicted_vs_measured(measured_study):
    root, _, _ = measured_study
    r = CliRunner().invoke(app, ["pareto", "--study", "s", "--results-dir", str(root)])
    assert r.exit_code == 0, r.output
    assert "Predicted vs measured, every real trial (tokens/s/GPU; peak GiB)" in r.output
    header = next(ln for ln in r.output.splitlines() if ln.lstrip().startswith("trial") and "outcome" in ln)
    assert header.split()[:5] == ["trial", "layout", "outcome", "predicted", "measured"]


def test_pareto_lists_pruned_and_failed_trials(tmp_path, one_fast, monkeypatch):
    monkeypatch.setenv("FAKE_TAIL", "5:1")  # the slow layouts' steps after the 5th take 1 s: stopped by the pruner
    run_study(prepare(_cfg(tmp_path, prune_margin=0.25, trials=4)), backend=_backend(tmp_path))
    monkeypatch.setenv("FAKE_TRIAL_MODE", "oom")
    run_study(prepare(_cfg(tmp_path, prune_margin=0.25, trials=2)), backend=_backend(tmp_path))
    r = CliRunner().invoke(app, ["pareto", "--study", "s", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "every real trial" in r.output and "pruned" in r.output and "oom" in r.output and "150.0" in r.output


def test_a_study_keeps_its_slice(tmp_path):
    from specs.errors import TunerError

    run_study(prepare(_cfg(tmp_path, backend="model", trials=2)), backend=None)
    with pytest.raises(TunerError, match="--layers 4 decoder layers"):
        run_study(prepare(_cfg(tmp_path, backend="model", trials=2, layers=2)))


def test_recalibrates_as_it_goes_and_reranks_the_queue(recalibrated_study):
    """--recalibrate-after 2: after every 2 measured trials the constants are refitted to the measurements and
    the rest of the queue is re-ranked by the refitted prediction; every refit is recorded in the study."""
    _, prep, res = recalibrated_study
    recs = res.study.user_attrs.get("recalibrations")
    assert recs and [r["after_measured_trials"] for r in recs][:2] == [2, 4]
    assert all("error" not in r for r in recs), recs
    shipped = prep.calibration.to_dict()
    assert any(recs[0]["constants"][k] != shipped[k] for k in shipped)  # the fit moved some constant
    assert recs[0]["step_median_abs_error"] is not None and len(recs[0]["next"]) >= 1
    later = [t for t in res.study.trials if "after recalibration" in str(t.user_attrs.get("enqueued", ""))]
    assert later, "no trial came from the re-ranked queue"
    keys = [r.key for r in trial_rows(res.study)]
    assert len(keys) == len(set(keys))


def test_recalibrate_after_zero_keeps_the_fixed_queue(tmp_path, slow_tp):
    res = run_study(
        prepare(_cfg(tmp_path, prune_margin=None, trials=4, recalibrate_after=0)), backend=_backend(tmp_path, steps=4)
    )
    assert "recalibrations" not in res.study.user_attrs
    assert not [t for t in res.study.trials if "after recalibration" in str(t.user_attrs.get("enqueued", ""))]


def test_pareto_lists_the_refits(recalibrated_study):
    root, _, _ = recalibrated_study
    r = CliRunner().invoke(app, ["pareto", "--study", "s", "--results-dir", str(root)])
    assert r.exit_code == 0 and "refit after 2 measured trials: step-time median error" in r.output


def test_real_trials_without_te_predict_the_optimizer_that_runs(tmp_path):
    """Without TE the harness runs the precision-aware optimizer off: the study predicts (and exports) that."""
    local = prepare(_cfg(tmp_path))
    model = prepare(_cfg(tmp_path, backend="model", study="m"))
    assert not any(
        local.enumeration.valid.row(i).use_precision_aware_optimizer for i in range(len(local.enumeration.valid))
    )
    assert any("precision-aware optimizer is off" in n for n in local.enumeration.notes)
    assert all(
        model.enumeration.valid.row(i).use_precision_aware_optimizer for i in range(0, len(model.enumeration.valid), 97)
    )


def test_confirm_runs_remeasure_the_finalists_interleaved_and_report_the_mean(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_STEP_S", "0.01")
    monkeypatch.setenv("FAKE_REPORT_STEP_S", "2.0")  # every layout the same plausible step time: the finalists tie
    res = run_study(prepare(_cfg(tmp_path, prune_margin=None, trials=4, confirm_runs=2)), backend=_backend(tmp_path))
    rows = trial_rows(res.study)
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys))  # a confirmation run is not a row of its own
    confirmed = [r for r in rows if r.runs == 3]
    assert 2 <= len(confirmed) <= 4 and res.confirmed_now == 2 * len(confirmed)
    for r in confirmed:
        runs = r.runs_tokens_per_s_per_gpu
        assert len(runs) == 3 and r.tokens_per_s_per_gpu == pytest.approx(3 / sum(1 / x for x in runs))
    # interleaved: A B C A B C, each run of a layout in a log folder of its own
    reps = [t for t in res.study.trials if "repeat_of" in t.user_attrs]
    order = [t.user_attrs["repeat_of"] for t in sorted(reps, key=lambda t: t.number)]
    n = len(confirmed)
    assert order[:n] == order[n:] and len(set(order[:n])) == n
    assert all(Path((t.user_attrs["result"])["log_path"]).name == str(t.number) for t in reps)
    # the CLI lists them and the recipe says its throughput is a mean
    csv_path = tmp_path / "front.csv"
    r = CliRunner().invoke(app, ["pareto", "--study", "s", "--results-dir", str(tmp_path), "--csv", str(csv_path)])
    assert r.exit_code == 0 and "confirmed: trial" in r.output and "over 3 runs" in r.output
    import csv

    assert {int(x["runs"]) for x in csv.DictReader(csv_path.open())} <= {
        1,
        3,
    } and "runs" in csv_path.read_text().splitlines()[0]
    r = CliRunner().invoke(
        app, ["export", "--study", "s", "--results-dir", str(tmp_path), "--trial", str(confirmed[0].trial)]
    )
    assert r.exit_code == 0 and "Measured more than once (--confirm-runs): 3 runs" in r.output


def test_confirm_runs_need_real_trials(tmp_path):
    with pytest.raises(TunerError, match="--confirm-runs re-measures real trials"):
        prepare(_cfg(tmp_path, backend="model", confirm_runs=1))


@pytest.mark.parametrize("backend", ["local", "ray", "command"])
def test_lora_is_refused_with_real_trials_which_train_every_weight(backend):
    from tuner.study import _validate_config

    with pytest.raises(TunerError, match=f"--task lora: the trials of --backend {backend} would train every weight.*"
                                         "use --backend model"):
        _validate_config(TuneConfig.from_dict(dict(model="m", gpus="8xH100", task="lora", backend=backend)))
    # sft is pretraining's step at the packed length (specs.Workload.task): the harness measures it as it is
    _validate_config(TuneConfig.from_dict(dict(model="m", gpus="8xH100", task="sft", backend=backend)))
    r = CliRunner().invoke(app, ["--model", "Llama-3.1-8B", "--gpus", "8xH100", "--task", "lora", "--backend", backend])
    assert r.exit_code == 2 and "--task lora" in r.output and "Traceback" not in r.output


def test_confirmation_waits_for_queued_search_trials(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_STEP_S", "0.01")
    monkeypatch.setenv("FAKE_REPORT_STEP_S", "2.0")
    prep = prepare(_cfg(tmp_path, prune_margin=None, trials=1, confirm_runs=1))
    res = run_study(prep, backend=_backend(tmp_path))  # one measured trial; the lazy queue holds none after the last
    assert res.confirmed_now == 1 and not res.confirm_note
    # layouts queued by an earlier run that this run's --trials does not reach: confirmation would run behind them
    from tuner.study import CandidateIndex

    st = res.study
    index = CandidateIndex(prep.enumeration.valid, prep.fits)
    done = {r.key for r in trial_rows(st)}
    fresh = [
        int(i)
        for i in np.flatnonzero(prep.fits)
        if prep.enumeration.valid.row(int(i)).key() not in done
        and "flex" not in prep.enumeration.valid.row(int(i)).dispatcher.value
    ][:3]
    for i in fresh:
        st.enqueue_trial(index.params_of_row(i), user_attrs={"enqueued": "left over"})
    res = run_study(prep, backend=_backend(tmp_path))  # evaluates one of them (--trials 1), two stay queued
    assert (
        res.evaluated_now == 1
        and res.confirmed_now == 0
        and "2 queued layouts of the search are still waiting" in res.confirm_note
    )


def _raising_at(tmp_path, call: int, exc: BaseException) -> LocalBackend:
    """The local backend with the fake trial program, raising ``exc`` instead of its ``call``-th run."""

    class Raising(LocalBackend):
        calls = 0

        def run(self, layout, **kw):
            self.calls += 1
            if self.calls == call:
                raise exc
            return super().run(layout, **kw)

    return Raising(
        trials_dir=tmp_path / "s" / "trials", num_gpus=4, steps=6, warmup_steps=2, timeout_s=30,
        launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02,
    )


def test_a_failed_confirmation_run_is_reported_and_confirmation_tops_up(tmp_path, monkeypatch):
    from launch.base import FailureKind, TrialFailed
    from tuner.report import runs_note

    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_STEP_S", "0.01")
    monkeypatch.setenv("FAKE_REPORT_STEP_S", "2.0")

    # the first confirmation run (the second run of all) runs out of memory
    b = _raising_at(
        tmp_path,
        2,
        TrialFailed(FailureKind.oom, "CUDA out of memory (fake)", str(tmp_path), memory_reached_bytes=150 * 2**30),
    )
    prep = prepare(_cfg(tmp_path, prune_margin=None, trials=1, confirm_runs=2))
    res = run_study(prep, backend=b)
    (row,) = [r for r in trial_rows(res.study) if r.trial == 0]
    assert row.runs == 2 and [f.kind for f in row.runs_failed] == ["oom"]
    (note,) = runs_note(row)
    assert "ran out of memory at 150.0 GiB" in note and "check its log" in note
    r = CliRunner().invoke(app, ["pareto", "--study", "s", "--results-dir", str(tmp_path)])
    assert "ran out of memory" in r.output
    # the same command again: trial 0 already has its 2 confirmation runs (one failed), so none is added for it
    res = run_study(prep, backend=_backend(tmp_path))
    assert sum(1 for t in res.study.trials if t.user_attrs.get("repeat_of") == 0) == 2


def test_an_interrupted_confirmation_is_completed_on_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_STEP_S", "0.01")
    monkeypatch.setenv("FAKE_REPORT_STEP_S", "2.0")

    b = _raising_at(tmp_path, 3, KeyboardInterrupt())  # Ctrl-C during the second confirmation run
    prep = prepare(_cfg(tmp_path, prune_margin=None, trials=1, confirm_runs=2))
    with pytest.raises(KeyboardInterrupt):
        run_study(prep, backend=b)
    res = run_study(prep, backend=_backend(tmp_path))
    done = [
        t
        for t in res.study.trials
        if t.user_attrs.get("repeat_of") == 0 and t.state == optuna.trial.TrialState.COMPLETE
    ]
    assert (
        len(done) == 2 and res.evaluated_now == 1
    )  # the cut run made up, and the resumed search still had its one trial


def test_the_confirmation_phase_runs_no_search_trial_when_another_worker_took_a_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_STEP_S", "0.01")
    monkeypatch.setenv("FAKE_REPORT_STEP_S", "2.0")

    class OtherWorker(LocalBackend):
        calls = 0

        def run(self, layout, **kw):
            self.calls += 1
            if self.calls == 2:  # during the first confirmation run, "another worker" takes the queued second one
                other = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s/study.db")
                taken = other.ask()
                assert taken.user_attrs.get("repeat_of") == 0
                other.tell(taken, state=optuna.trial.TrialState.FAIL)
            return super().run(layout, **kw)

    b = OtherWorker(
        trials_dir=tmp_path / "s" / "trials", num_gpus=4, steps=6, warmup_steps=2, timeout_s=30,
        launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02,
    )
    res = run_study(prepare(_cfg(tmp_path, prune_margin=None, trials=1, confirm_runs=2)), backend=b)
    assert res.evaluated_now == 1 and res.confirmed_now == 1 and b.calls == 2  # the sampled stand-in was not measured
    (stand_in,) = [t for t in res.study.trials if "confirmation phase" in str(t.user_attrs.get("skipped", ""))]
    assert stand_in.state == optuna.trial.TrialState.PRUNED and stand_in.number == max(
        t.number for t in res.study.trials
    )
