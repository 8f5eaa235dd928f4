"""The study machinery with fake backends: failures are outcomes, interrupts keep finished trials."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from cost_model.estimate import estimate
from launch.base import FailureKind, Measurement, TrialBackend, TrialFailed
from specs.errors import TunerError
from tuner.pareto import pareto_mask
from tuner.study import CandidateIndex, TuneConfig, prepare, run_study, trial_rows

pytestmark = pytest.mark.slow  # whole studies on SQLite, some of them with worker processes


@pytest.fixture(scope="module")
def prep():
    return prepare(TuneConfig.from_dict(dict(model="Mixtral-8x7B", gpus="16xH100", seq_length=4096,
                                             global_batch_size=64)))


class FlakyBackend(TrialBackend):
    """Measures every third layout as out of memory and the rest at 1000 tokens/s."""

    name = "fake"
    source = "measured"

    def __init__(self, interrupt_after: int | None = None) -> None:
        self.calls = 0
        self.interrupt_after = interrupt_after

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        if self.calls % 3 == 0:
            raise TrialFailed(FailureKind.oom, "CUDA out of memory (fake)", log_path="/tmp/x.log")
        return Measurement(
            layout=layout, source="measured", tokens_per_s_per_gpu=1000.0 + self.calls, peak_bytes=50 * 2**30,
            step_times_s=(1.0, 1.1),
        )


def _cfg(prep, tmp_path, **kw):
    import dataclasses

    return dataclasses.replace(prep, config=TuneConfig.from_dict(dict(results_dir=str(tmp_path), **kw), prep.config))


def test_failures_are_outcomes(prep, tmp_path):
    p = _cfg(prep, tmp_path, trials=9, study="flaky")
    res = run_study(p, backend=FlakyBackend())
    states = [t.state for t in res.study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) >= 2
    failed = [t for t in res.study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.user_attrs["failure"]["kind"] == "oom" for t in failed)
    assert not [t for t in res.study.trials if "skipped" in t.user_attrs]  # every trial is a layout the policy picked
    rows = trial_rows(res.study)
    assert rows and all(r.source == "measured" for r in rows)
    assert all(r.pred_tokens_per_s_per_gpu > 0 for r in rows)  # predicted vs measured kept side by side


def test_interrupt_keeps_finished_trials(prep, tmp_path):
    p = _cfg(prep, tmp_path, trials=10, study="intr")
    with pytest.raises(KeyboardInterrupt):
        run_study(p, backend=FlakyBackend(interrupt_after=4))
    st = optuna.load_study(study_name="intr", storage=f"sqlite:///{tmp_path / 'intr' / 'study.db'}")
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 2
    # resuming goes on and does not repeat a layout
    res = run_study(p, backend=FlakyBackend())
    keys = [t.user_attrs["key"] for t in res.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(keys) == len(set(keys)) > len(done)


def test_enqueued_first_trials_are_the_predicted_front(prep, tmp_path):
    p = _cfg(prep, tmp_path, trials=8, study="front")
    res = run_study(p)
    est = prep.estimates
    best_row = int(np.flatnonzero(prep.fits)[np.argmax(est.tokens_per_s_per_gpu[prep.fits])])
    best = prep.enumeration.valid.row(best_row)
    rows = trial_rows(res.study)
    assert best.key() in {r.key for r in rows}  # the table's fastest candidate is evaluated first
    # ... and its trial records the single-layout estimate (the simulated pipeline), as tune estimate prints it
    one = estimate(
        prep.model, prep.cluster, prep.workload, best, calibration=prep.calibration, memory_headroom=p.headroom
    )
    got = next(r for r in rows if r.key == best.key())
    assert got.tokens_per_s_per_gpu == got.pred_tokens_per_s_per_gpu == one.tokens_per_s_per_gpu
    assert got.peak_gib == pytest.approx(one.peak_gib)
    assert all(r.source == "predicted" for r in rows)
    # the flat copies Optuna's dashboard shows, and the objectives' names
    t = next(t for t in res.study.trials if t.user_attrs.get("key") == best.key())
    assert t.user_attrs["result"]["pred_step_time_s"] == one.step_time_s
    assert (t.user_attrs["label"], t.user_attrs["source"], t.user_attrs["tokens_per_s_per_gpu"]) == (
        best.label,
        "predicted",
        one.tokens_per_s_per_gpu,
    )
    assert t.user_attrs["peak_gib"] == pytest.approx(one.peak_gib)
    assert res.study.metric_names == ["tokens_per_s_per_gpu", "peak_gib"]


def test_candidate_index_round_trip(prep):
    idx = CandidateIndex(prep.enumeration.valid, prep.fits)
    fit_rows = np.flatnonzero(prep.fits)
    rng = np.random.default_rng(0)
    for row in rng.choice(fit_rows, size=min(50, len(fit_rows)), replace=False):
        params = idx.params_of_row(int(row))
        assert idx.find_fitting(params) == int(row)
        assert idx.build(params) == prep.enumeration.valid.row(int(row))
    not_fit = np.flatnonzero(~prep.fits)
    if len(not_fit):
        assert idx.find_fitting(idx.params_of_row(int(not_fit[0]))) is None


def test_pareto_mask():
    thr = np.array([10.0, 9.0, 8.0, 10.0, 7.0])
    mem = np.array([5.0, 4.0, 6.0, 5.0, 1.0])
    assert pareto_mask(thr, mem).tolist() == [True, True, False, False, True]


def test_no_valid_layout_message(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("tp: [3]\n")  # 32 heads are not divisible by 3
    with pytest.raises(TunerError, match="no layout of the search space is valid") as e:
        prepare(
            TuneConfig.from_dict(dict(model="Mixtral-8x7B", gpus="16xH100", seq_length=4096, global_batch_size=64,
                                      space=str(space)))
        )
    assert "heads_div_tp" in str(e.value) or "world_div_tp_pp_cp" in str(e.value)


# ---- one process per study; resumes must not change what was searched or measured ----


def test_a_second_run_of_a_running_study_is_refused(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app
    from tuner.study.storage import StudyLock as _StudyLock

    args = [
        "--model", "MiniMax-M2", "--layers", "4", "--gpus", "64xH200", "--trials", "4", "--results-dir", str(tmp_path),
        "--study", "busy",
    ]
    lock = _StudyLock(tmp_path / "busy", "busy")  # as if another tune process were running it
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "being run by another tune process" in r.output and "Traceback" not in r.output, (
        r.output
    )
    lock.release()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output


def test_resume_with_another_space_is_refused_before_anything_is_written(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    args = [
        "--model", "MiniMax-M2", "--layers", "4", "--gpus", "16xH200", "--trials", "4", "--results-dir", str(tmp_path),
        "--study", "sp",
    ]
    assert CliRunner().invoke(app, args).exit_code == 0
    before = (tmp_path / "sp" / "config.yaml").read_text()
    space = tmp_path / "space.yaml"
    space.write_text(
        (Path(__file__).parents[2] / "search_spaces/default_space.yaml")
        .read_text()
        .replace("use_precision_aware_optimizer: [true]", "use_precision_aware_optimizer: [false]")
    )
    r = CliRunner().invoke(app, args + ["--space", str(space)])
    assert (
        r.exit_code == 2 and "searched over another space" in r.output and "use_precision_aware_optimizer" in r.output
    ), r.output
    assert (tmp_path / "sp" / "config.yaml").read_text() == before
    assert CliRunner().invoke(app, args + ["--trials", "6"]).exit_code == 0  # the same inputs resume it


def test_resume_after_the_model_config_was_edited_is_refused(tmp_path):
    """The same --model folder with its config.json changed since the study ran: refused, naming what differs."""
    import json

    from typer.testing import CliRunner

    import specs
    from tuner.cli import app

    folder = tmp_path / "oss"
    folder.mkdir()
    cfg = json.loads((Path(specs.__file__).parent / "data" / "models" / "GPT-OSS-120B.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg))
    args = [
        "--model", str(folder), "--gpus", "16xH100", "--layers", "2", "--trials", "3", "--results-dir",
        str(tmp_path / "r"), "--study", "oss",
    ]
    assert CliRunner().invoke(app, args).exit_code == 0
    before = (tmp_path / "r" / "oss" / "config.yaml").read_text()
    (folder / "config.json").write_text(json.dumps({**cfg, "swiglu_limit": 3.0}))
    r = CliRunner().invoke(app, args)
    assert (
        r.exit_code == 2 and "another definition of model" in r.output and "activation_func_clamp_value" in r.output
    ), r.output
    assert (tmp_path / "r" / "oss" / "config.yaml").read_text() == before
    (folder / "config.json").write_text(json.dumps(cfg))
    assert CliRunner().invoke(app, args + ["--trials", "4"]).exit_code == 0  # restored: it resumes
    # the same config.json without a _source (its source is then the path it was read from), by another path: the same
    # model
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "_source"}))
    for path, n in ((folder, "5"), (folder / "." / "config.json", "6")):
        r = CliRunner().invoke(app, [args[0], str(path), *args[2:], "--trials", n])
        assert r.exit_code == 0, r.output
    # a study made before a ModelSpec field existed resumes when the model has that field's default
    import optuna

    mm = [
        "--model", "MiniMax-M2", "--layers", "2", "--gpus", "8xH200", "--trials", "2", "--results-dir",
        str(tmp_path / "r"), "--study", "mm",
    ]
    assert CliRunner().invoke(app, mm).exit_code == 0
    st = optuna.load_study(study_name="mm", storage=f"sqlite:///{tmp_path / 'r' / 'mm' / 'study.db'}")
    st.set_user_attr(
        "model_spec",
        {k: v for k, v in st.user_attrs["model_spec"].items() if k not in ("softmax_type", "add_bias_linear")},
    )
    assert CliRunner().invoke(app, mm + ["--trials", "3"]).exit_code == 0
    # a GPT-OSS study recorded before YaRN's export-only fields existed resumes although GPT-OSS's values are not the
    # defaults
    st = optuna.load_study(study_name="oss", storage=f"sqlite:///{tmp_path / 'r' / 'oss' / 'study.db'}")
    st.set_user_attr(
        "model_spec",
        {
            k: v
            for k, v in st.user_attrs["model_spec"].items()
            if not k.startswith("rope_scaling_")
            or k in ("rope_scaling_type", "rope_scaling_factor", "rope_scaling_mscale", "rope_scaling_mscale_all_dim")
        },
    )
    r = CliRunner().invoke(app, [args[0], str(folder), *args[2:], "--trials", "7"])
    assert r.exit_code == 0, r.output
    # but a recorded one that differs is a change
    st.set_user_attr("model_spec", {**st.user_attrs["model_spec"], "rope_scaling_beta_fast": 16.0})
    r = CliRunner().invoke(app, [args[0], str(folder), *args[2:], "--trials", "8"])
    assert r.exit_code == 2 and "rope_scaling_beta_fast" in r.output, r.output


@pytest.mark.parametrize(
    "path_name, expect", [("[bold]x", "bold-x"), (".json", "json"), ("ü", "model"), ("my model v2", "my-model-v2")]
)
def test_default_study_names_obey_the_study_name_rule(path_name, expect):
    from specs import load_model, parse_gpus
    from tuner.study.config import _STUDY_NAME_RE

    m = load_model("MiniMax-M2")
    import dataclasses

    m = dataclasses.replace(m, name=path_name)  # load_model names a config.json by its folder (or the file's stem)
    name = TuneConfig.from_dict(dict(model="x", gpus="8xH200")).study_name(m, parse_gpus("8xH200"))
    assert _STUDY_NAME_RE.match(name) and name.startswith(expect + "-8xH200"), name
    sliced = dataclasses.replace(m, name=path_name + "[4 layers]")
    assert (
        TuneConfig.from_dict(dict(model="x", gpus="8xH200", layers=4))
        .study_name(sliced, parse_gpus("8xH200"))
        .startswith(expect + "-L4-8xH200")
    )


def test_an_unexpected_error_is_not_retried_forever_but_an_interrupted_layout_is(prep, tmp_path):
    class Broken(FlakyBackend):
        def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
            raise RuntimeError("a bug in a backend")

    p = _cfg(prep, tmp_path, trials=4, study="bug")
    with pytest.raises(RuntimeError):
        run_study(p, backend=Broken())
    st = optuna.load_study(study_name="bug", storage=f"sqlite:///{tmp_path / 'bug' / 'study.db'}")
    (failed,) = st.trials
    assert failed.state == optuna.trial.TrialState.FAIL and "interrupted" not in failed.user_attrs
    res = run_study(p, backend=FlakyBackend())  # the resumed run goes on past that layout
    keys = [t.user_attrs["key"] for t in res.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert keys and failed.user_attrs["key"] not in keys

    p = _cfg(prep, tmp_path, trials=4, study="ki")
    with pytest.raises(KeyboardInterrupt):
        run_study(p, backend=FlakyBackend(interrupt_after=0))
    st = optuna.load_study(study_name="ki", storage=f"sqlite:///{tmp_path / 'ki' / 'study.db'}")
    (cut,) = st.trials
    assert cut.user_attrs["interrupted"] == "cut off by Ctrl-C"
    res = run_study(p, backend=FlakyBackend())
    keys = [t.user_attrs["key"] for t in res.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert cut.user_attrs["key"] in keys


def test_an_interrupted_layout_skipped_elsewhere_as_a_duplicate_is_still_run_again(prep, tmp_path):
    p = _cfg(prep, tmp_path, trials=4, study="dup")
    with pytest.raises(KeyboardInterrupt):
        run_study(p, backend=FlakyBackend(interrupt_after=0))
    st = optuna.load_study(study_name="dup", storage=f"sqlite:///{tmp_path / 'dup' / 'study.db'}")
    (cut,) = st.trials
    # another worker (or thread) picked the same layout meanwhile and skipped it as a duplicate of the cut trial
    st.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED,
            params=cut.params,
            distributions=cut.distributions,
            user_attrs={"key": cut.user_attrs["key"], "skipped": "duplicate: this layout was already evaluated"},
        )
    )
    res = run_study(p, backend=FlakyBackend())
    keys = [t.user_attrs["key"] for t in res.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert cut.user_attrs["key"] in keys


# ---- the trial budget means layouts (--trials N evaluates N layouts, or says why fewer) ----

SEVEN = """\
tp: [1, 2, 4, 8]
pp: [1, 2]
vpp: [1]
cp: [1]
ep: [1]
etp: [1]
micro_batch_size: [1, 2]
recompute:
  - {granularity: none}
optimizer_offload_fraction: [0.0]
dispatcher: [alltoall]
pipeline_split: {even: true, max_stage_deficit: 0}
"""


def _small(tmp_path, **kw):
    """MiniMax-M2 cut to 4 layers on 4 H200: 8,776 candidates, prepared in ~0.1 s."""
    base = dict(
        model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, stack="megatron", results_dir=str(tmp_path),
        study="s",
    )
    base.update(kw)
    return prepare(TuneConfig.from_dict(base))


def _seven(tmp_path, **kw):
    """Llama-3.1-8B on 8 H100 in a tiny space: 14 valid layouts, 7 predicted to fit in 60% of HBM."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    space = tmp_path / "seven.yaml"
    space.write_text(SEVEN)
    base = dict(
        model="Llama-3.1-8B", gpus="8xH100", global_batch_size=16, space=str(space), stack="megatron",
        memory_headroom=0.4, results_dir=str(tmp_path), study="seven",
    )
    base.update(kw)
    return prepare(TuneConfig.from_dict(base))


def _keys(study, state=optuna.trial.TrialState.COMPLETE):
    return [t.user_attrs["key"] for t in study.trials if t.state == state]


def test_trials_counts_evaluated_layouts_not_sampled_proposals(tmp_path):
    res = run_study(_small(tmp_path, trials=40))
    keys = _keys(res.study)
    assert res.evaluated_now == 40 and len(keys) == len(set(keys)) == 40 and res.budget_note is None
    assert res.skipped_now > 0  # the sampler did propose layouts that break a rule or do not fit: they cost nothing
    assert len(res.study.trials) == 40  # and are not written
    again = run_study(_small(tmp_path, trials=10))  # a resumed run: 10 more, none repeated
    keys = _keys(again.study)
    assert again.evaluated_now == 10 and len(keys) == len(set(keys)) == 50


def test_a_space_of_seven_candidates_evaluates_seven_and_says_it_ran_out(tmp_path):
    p = _seven(tmp_path, trials=20)
    assert p.n_fit == 7 and p.n_valid == 14
    res = run_study(p)
    keys = _keys(res.study)
    assert res.evaluated_now == 7 and len(set(keys)) == 7
    assert (
        "the space ran out" in res.budget_note
        and "all 7 candidates" in res.budget_note
        and "7 of the 20" in res.budget_note
    )
    res = run_study(p)  # nothing left
    assert res.evaluated_now == 0 and "0 of the 20" in res.budget_note and len(_keys(res.study)) == 7
    # with real trials (Study.optimize): the same budget, the fallback to the next unevaluated candidate, the same stop
    p = _seven(tmp_path / "m", trials=20, study="m", policy="queue")
    res = run_study(p, backend=FlakyBackend())
    tried = [t.user_attrs["key"] for t in res.study.trials if "result" in t.user_attrs or "failure" in t.user_attrs]
    assert (
        res.evaluated_now + res.failed_now == 7
        and len(set(tried)) == len(tried) == 7
        and "the space ran out" in res.budget_note
    )
    assert res.study.trials[-1].state == optuna.trial.TrialState.PRUNED  # it stopped on a skip, not on a trial it ran
    # no skipped proposal is a trial: the 7 layouts it ran, and the one trial that found the space ran out
    assert [t.number for t in res.study.trials if "skipped" in t.user_attrs] == [7] and len(res.study.trials) == 8
    with pytest.raises(StopIteration):  # and left no queued trial behind
        next(t for t in res.study.trials if t.state == optuna.trial.TrialState.WAITING)


@pytest.mark.parametrize("policy", ["queue", "gain"])
def test_real_trials_in_a_space_of_one_candidate_run_it_once(tmp_path, policy):
    """No parameter to suggest: the sampler is never asked for one, and the trial still takes the queued candidate."""
    one = (
        SEVEN.replace("tp: [1, 2, 4, 8]", "tp: [8]")
        .replace("pp: [1, 2]", "pp: [1]")
        .replace("micro_batch_size: [1, 2]", "micro_batch_size: [1]")
    )
    (tmp_path / "one.yaml").write_text(one)
    p = prepare(
        TuneConfig.from_dict(dict(
            model="Llama-3.1-8B", gpus="8xH100", global_batch_size=16, space=str(tmp_path / "one.yaml"),
            stack="megatron", memory_headroom=0.4, results_dir=str(tmp_path), study="one", trials=3, policy=policy,
        ))
    )
    assert p.n_fit == 1
    res = run_study(p, backend=FlakyBackend())
    assert res.evaluated_now == 1 and res.study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert [t.user_attrs.get("skipped", "") for t in res.study.trials[1:]] in (
        [],
        [res.budget_note],
    )  # at most the one that ran out


def test_the_cli_says_when_the_space_ran_out(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    space = tmp_path / "seven.yaml"
    space.write_text(SEVEN)
    r = CliRunner().invoke(
        app,
        [
            "--model", "Llama-3.1-8B", "--gpus", "8xH100", "--global-batch", "16", "--space", str(space), "--stack",
            "megatron", "--memory-headroom", "0.4", "--trials", "20", "--results-dir", str(tmp_path), "--study",
            "seven",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (
        "7 layouts evaluated in total (7 now)" in r.output
        and "the space ran out" in r.output
        and "7 of the 20" in r.output
    )


class Concurrent(TrialBackend):
    """Measures every layout in 0.3 s, several at once (threads of --parallel-trials); every fifth runs out of
    memory."""

    name = "concurrent"
    source = "measured"

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.calls = 0

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):
        import time

        with self.lock:
            self.calls += 1
            n = self.calls
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.3)
            if n % 5 == 0:
                raise TrialFailed(FailureKind.oom, "CUDA out of memory (fake)")
            return Measurement(
                layout=layout, source="measured", tokens_per_s_per_gpu=1000.0 + n, peak_bytes=50 * 2**30,
                step_times_s=(1.0,),
            )
        finally:
            with self.lock:
                self.running -= 1


def test_parallel_trials_in_threads_spend_the_budget_exactly_once(tmp_path):
    """--parallel-trials runs trials in Optuna's threads: the budget, the counts and the claims are shared state."""
    p = _small(
        tmp_path, trials=16, backend="ray", parallel_trials=4, prune_margin=None, recalibrate_after=0, policy="queue"
    )
    b = Concurrent()
    res = run_study(p, backend=b)
    assert b.most >= 2  # trials did run at once
    tried = [t for t in res.study.trials if "result" in t.user_attrs or "failure" in t.user_attrs]
    keys = [t.user_attrs["key"] for t in tried]
    assert b.calls == len(tried) == 16 and len(set(keys)) == 16
    assert res.evaluated_now + res.failed_now == 16 and res.failed_now == sum(
        1 for t in tried if "failure" in t.user_attrs
    )
    assert not [
        t for t in res.study.trials if t.state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    ]
    # the other trials are no skipped proposals: a thread lost a claim, or started when the budget was spent
    others = [t.user_attrs.get("skipped", "") for t in res.study.trials if t not in tried]
    assert all(s.endswith("at the same moment)") or s.startswith("not run: this run's") for s in others), others


# ---- storage writes of a predicted trial (the main job's trials: item 7) ----


def test_a_predicted_trial_costs_at_most_two_storage_writes(tmp_path):
    from write_counter import count_storage_writes

    started = {}

    def on_trial(done, total, w):
        if done == 0:
            started["calls"], started["tx"] = w.n_calls, w.transactions

    with count_storage_writes() as w:
        res = run_study(_small(tmp_path, trials=12), on_trial=lambda d, t: on_trial(d, t, w))
    assert res.evaluated_now == 12
    assert (
        1 <= started["tx"] <= 10
    )  # opening a new study: the study, its directions, its six attributes, its metric names
    # the default storage (one process): the 12 trials are written in one transaction, through no storage method
    assert (w.n_calls - started["calls"], w.transactions - started["tx"]) == (0, 1)
    with count_storage_writes() as w:
        run_study(_small(tmp_path, trials=12), on_trial=lambda d, t: on_trial(d, t, w))
    assert started["tx"] == 0  # a resumed study with the same inputs: its attributes are not written again
    # a shared storage (--storage): each trial is claimed (one write) and finished (one write)
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    with count_storage_writes() as w:
        res = run_study(
            _small(tmp_path, trials=12, storage=shared, study="shared"), on_trial=lambda d, t: on_trial(d, t, w)
        )
    assert res.evaluated_now == 12
    assert (
        w.transactions - started["tx"] == 24
        and w.calls["_create_new_trial"] == 12
        and w.calls["set_trial_state_values"] == 12
    )
    assert len(trial_rows(optuna.load_study(study_name="shared", storage=shared))) == 12


def test_ctrl_c_in_a_predicted_run_loses_no_finished_trial(tmp_path):
    class Interrupting(TrialBackend):
        name = "predicted-fake"
        source = "predicted"

        def __init__(self) -> None:
            from launch.model_backend import ModelBackend

            self.inner = ModelBackend()
            self.calls = 0

        def run(self, layout, **kw):
            self.calls += 1
            if self.calls == 6:
                raise KeyboardInterrupt
            return self.inner.run(layout, **kw)

    p = _small(tmp_path, trials=12)
    with pytest.raises(KeyboardInterrupt):
        run_study(p, backend=Interrupting())
    st = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    assert len(trial_rows(st)) == 5  # the five finished before Ctrl-C were written on the way out
    res = run_study(p)
    assert res.evaluated_now == 12 and len(set(_keys(res.study))) == 17


def test_candidate_index_codes_match_the_sorting_reference(prep):
    """The index's lookup tables give the codes np.unique / categories() give (the labels stored studies were made
    with)."""
    from specs.layout import categories
    from tuner.study import DIMENSIONS

    valid = prep.enumeration.valid
    idx = CandidateIndex(valid, prep.fits)
    n = len(valid)
    for dim, cols in DIMENSIONS.items():
        key = np.zeros(n, dtype=np.int64)
        for c in cols:
            col = valid[c]
            inv = categories(col)[1] if col.dtype.kind == "U" else np.unique(col, return_inverse=True)[1].reshape(-1)
            key = key * (int(inv.max()) + 1) + inv
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        assert np.array_equal(idx.codes[dim], inv.reshape(-1)) and idx.rep_row[dim] == [int(i) for i in first], dim


def test_a_predicted_claim_left_running_by_a_dead_worker_is_failed_and_its_layout_evaluated(tmp_path):
    """With --storage and the model backend a trial is RUNNING for milliseconds (its claim); one RUNNING for longer
    than the grace period belongs to a worker that stopped: the next run fails it and evaluates the layout."""
    import datetime

    first = run_study(_small(tmp_path / "a", trials=1))
    (t0,) = first.study.trials  # the layout a run evaluates first
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    p = _small(tmp_path / "b", trials=1, storage=shared, study="shared")
    st = optuna.create_study(study_name="shared", storage=shared, directions=["maximize", "minimize"])
    claim = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING,
        params=t0.params,
        distributions=t0.distributions,
        user_attrs={"key": t0.user_attrs["key"]},
    )
    claim.datetime_start = datetime.datetime.now() - datetime.timedelta(hours=1)  # the dead worker's claim, an hour old
    st.add_trial(claim)
    res = run_study(p)
    dead, done = res.study.trials
    assert (
        dead.state == optuna.trial.TrialState.FAIL
        and "left RUNNING by a worker that stopped" in dead.user_attrs["interrupted"]
    )
    assert (
        done.state == optuna.trial.TrialState.COMPLETE
        and done.user_attrs["key"] == t0.user_attrs["key"]
        and res.evaluated_now == 1
    )


def test_a_study_from_before_a_constant_was_named_resumes_but_another_value_is_refused(tmp_path):
    # A study recorded before a formerly inline constant became a Calibration field lacks that key: it resumes
    # when the field keeps the base value (the formula is unchanged); a stored value that differs is refused.
    from tuner.study import open_storage

    p = prepare(TuneConfig.from_dict(dict(model="MiniMax-M2", gpus="64xH200", trials=3, results_dir=str(tmp_path),
                                          study="old")))
    run_study(p)
    url = f"sqlite:///{tmp_path}/old/study.db"
    study = optuna.load_study(study_name="old", storage=open_storage(url))
    cal = dict(study.user_attrs["calibration"])
    cal.pop("base_process_groups")
    study.set_user_attr("calibration", cal)
    run_study(_cfg(p, tmp_path, trials=4))  # resumes
    cal["hbm_efficiency"] = cal["hbm_efficiency"] * 0.5
    study.set_user_attr("calibration", cal)
    with pytest.raises(TunerError, match="hbm_efficiency"):
        run_study(_cfg(p, tmp_path, trials=5))


def test_gpt_oss_commands_follow_the_studys_megatron_core(tmp_path):
    """GPT-OSS's YaRN needs megatron-core 0.19's --yarn-* flags: the main job's files and `tune export` of a study made
    with
    --megatron-core 0.18 use plain RoPE and say why; with the default (0.19) they carry the YaRN and ask for 0.19."""
    from typer.testing import CliRunner

    from tuner.cli import app

    for release, pos in (("0.18", "rope"), (None, "yarn")):
        name = f"oss{release or ''}"
        args = [
            "--model",
            "GPT-OSS-120B",
            "--gpus",
            "16xH100",
            "--layers",
            "2",
            "--trials",
            "3",
            "--results-dir",
            str(tmp_path / "r"),
            "--study",
            name,
            *(["--megatron-core", release] if release else []),
        ]
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        folder = tmp_path / "r" / name
        assert f"--position-embedding-type {pos}" in " ".join((folder / "megatron_args.sh").read_text().split())
        recipe = (folder / "recipe.yaml").read_text()
        assert ("megatron_core: '>=0.19.0'" in recipe) == (pos == "yarn") and (
            ("not the model's YaRN" in " ".join(recipe.replace("''", "'").split())) == (pos == "rope")
        )
        r = CliRunner().invoke(
            app, ["export", "--study", name, "--results-dir", str(tmp_path / "r"), "--format", "megatron"]
        )
        assert r.exit_code == 0 and f"position-embedding-type {pos}" in " ".join(r.output.split()), r.output


# ---- study semantics: what a re-run does, what the default name holds, the global batch ----


def test_a_config_is_stored_as_one_flat_mapping_and_read_back_into_its_groups():
    flat = dict(model="MiniMax-M2", gpus="64xH200", seq_length=4096, backend="local", trial_steps=12, stack="megatron",
                seed=3, layers=4, network="ib-ndr", storage="postgresql://tuner:secret@db/tune")
    cfg = TuneConfig.from_dict(flat)
    assert (cfg.workload.seq_length, cfg.search.backend, cfg.trial.trial_steps, cfg.run.stack, cfg.store.seed,
            cfg.job.layers, cfg.cluster.network) == (4096, "local", 12, "megatron", 3, 4, "ib-ndr")
    stored = cfg.to_dict()  # config.yaml's and the study's "config": every option once, by its own name
    assert not any(isinstance(v, dict) for k, v in stored.items() if k != "run_flags")
    assert stored["storage"] == "postgresql://tuner@db/tune"  # the password is never stored
    assert TuneConfig.from_dict(stored) == TuneConfig.from_dict({**flat, "storage": stored["storage"]})
    assert TuneConfig.from_dict({"seed": 5}, cfg).to_dict() == {**stored, "seed": 5}  # a group's field replaced
    with pytest.raises(TypeError, match="no option seq_len"):
        TuneConfig.from_dict({**flat, "seq_len": 4096})


@pytest.mark.parametrize(("kw", "suffix"), [
    ({}, ""), ({"network": "efa-v3"}, ""), ({"megatron_core": "0.19"}, ""),  # the defaults add nothing
    ({"network": "ib-ndr"}, "-ib-ndr"), ({"stack": "megatron"}, "-megatron"), ({"megatron_core": "0.15"}, "-mc0.15"),
    ({"precision": "fp8"}, "-fp8"), ({"network_gbps": 1600.0}, "-1600gbps"), ({"backend": "local"}, "-local"),
    ({"network": "ib-ndr", "stack": "megatron", "megatron_core": "0.13"}, "-ib-ndr-megatron-mc0.13"),
    ({"task": "lora"}, "-lora"), ({"task": "lora", "lora_rank": 16}, "-lora16"),
    ({"task": "lora", "lora_rank": 16, "lora_target_modules": ("linear_qkv",)}, "-lora16-qkv"),
    ({"task": "lora", "lora_rank": 16, "lora_target_modules": ("linear_fc1", "linear_fc2")}, "-lora16-fc1+fc2"),
])  # fmt: skip
def test_the_default_study_name_holds_what_makes_the_space_differ(kw, suffix):
    from specs import load_model, parse_gpus
    from tuner.study.config import _STUDY_NAME_RE

    cluster = parse_gpus("64xH200", network=kw.get("network"), require_network=True)
    name = TuneConfig.from_dict(dict(model="MiniMax-M2", gpus="64xH200", **kw)).study_name(load_model("MiniMax-M2"),
                                                                                            cluster)
    assert name == "MiniMax-M2-8x8xH200-s8192-gbs128" + suffix and _STUDY_NAME_RE.fullmatch(name)  # --study takes it


def test_rerunning_shows_the_study_and_adds_trials_only_when_asked(tmp_path):
    first = run_study(_seven(tmp_path, trials=3))
    assert first.evaluated_now == 3 and first.budget_note is None
    again = run_study(_seven(tmp_path))  # the same command without --trials
    assert again.evaluated_now == 0 and len(_keys(again.study)) == 3
    assert (
        "already holds 3 trials: shown as they are, none added; --trials N evaluates N more layouts, --resume"
        in again.budget_note
    )
    more = run_study(_seven(tmp_path, trials=2))
    assert more.evaluated_now == 2 and len(_keys(more.study)) == 5
    resumed = run_study(_seven(tmp_path, resume=True))  # the default budget: the 2 layouts the space has left
    assert resumed.evaluated_now == 2 and len(_keys(resumed.study)) == 7 and "the space ran out" in resumed.budget_note


def test_global_batch_notes(tmp_path):
    from tuner.study.prepare import global_batch_notes

    assert global_batch_notes(128, 64, 8, 1) == []  # the seed: 16 micro-batches per DP rank
    (few_rows,) = global_batch_notes(128, 1024, 16, 1)  # DeepSeek-V3's default batch on 1,024 GPUs
    assert few_rows.startswith("--global-batch 128 is fewer rows than GPUs (1,024)") and "at least 8 GPUs" in few_rows
    (one_mb,) = global_batch_notes(128, 128, 64, 2)
    assert one_mb.startswith(
        "the predicted fastest layout runs one micro-batch per step on each of its 64 data-parallel ranks"
    )
    assert len(global_batch_notes(16, 64, 16, 1)) == 2
    assert any(
        n.startswith("--global-batch 16 is fewer rows than GPUs (64)")
        for n in _seven(tmp_path, gpus="64xH100").enumeration.notes
    )
