"""`tune verify`: the checkpoint-once / load-many plan, both arms with a fake harness, the recipe block, the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import tuner.verify.loss_check as loss_check_mod
import tuner.verify.parity_check as parity_check_mod
from launch.exporters import validate_recipe
from launch.harness.spec import HarnessEnv, build_spec
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model
from tuner.cli import app
from tuner.verify.inputs import parse_layout_spec
from tuner.verify.loss_check import convergence_block, local_backend_factory, plan_verify, run_verify
from tuner.verify.parity_check import parity_backend_factory

pytestmark = pytest.mark.slow  # trial processes of the fake harness and studies

FAKE = str(Path(__file__).parents[1] / "launch_tests" / "fake_trial.py")
WL = Workload(seq_length=8192, global_batch_size=8)
runner = CliRunner()


@pytest.fixture(scope="module")
def m4():
    return slice_model(load_model("MiniMax-M2"), 4)


@pytest.fixture
def c4():
    return parse_gpus("4xH200")


def _fake_factory(timeout_s=30):
    return local_backend_factory(timeout_s=timeout_s, launcher=[sys.executable, FAKE], env=HarnessEnv())


CAND = Layout(world_size=4, tp=2, sequence_parallel=True, ep=2)
REF = Layout(world_size=4)


def test_plan_writes_the_checkpoint_once_and_loads_it_in_both_arms(m4, c4, tmp_path):
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=20)
    ref, cand = p.arms
    assert (ref.name, cand.name) == ("reference", "candidate")
    assert (
        ref.save_checkpoint
        == ref.load_checkpoint
        == cand.load_checkpoint
        == p.checkpoint_dir
        == str(tmp_path / "v" / "checkpoint")
    )
    assert cand.save_checkpoint is None and cand.fault is None
    o_ref, o_cand = ref.harness_options(p), cand.harness_options(p)
    # the same data, hyperparameters and starting weights; only the layout differs
    same = {k: v for k, v in o_ref.items() if k not in ("save_checkpoint", "pretrain_steps")}
    assert same == {k: v for k, v in o_cand.items() if k not in ("save_checkpoint", "pretrain_steps")}
    assert (
        o_ref["data_step_offset"] == o_cand["data_step_offset"] == 40
    )  # the measured steps read the rows after the warm start's
    assert (
        o_ref["data"] == "corpus"
        and len(o_ref["corpus_sha256"]) == 64
        and o_ref["lr"] == 1e-4
        and o_ref["pretrain_steps"] == 40
        and o_cand["pretrain_steps"] == 0
    )
    d = p.to_dict()
    assert d["checkpoint"] == {
        "dir": p.checkpoint_dir,
        "written_by": "reference",
        "loaded_by": ["reference", "candidate"],
    }
    # the arms' harness specs carry them
    spec = build_spec(m4, CAND, WL, env=HarnessEnv(), steps=20, options=o_cand)
    assert (
        spec.load_checkpoint == p.checkpoint_dir
        and spec.data == "corpus"
        and spec.lr == 1e-4
        and spec.lr_warmup_steps == 5
    )
    assert json.loads(spec.to_json())["corpus_sha256"] == p.corpus_sha256


def test_plan_rejects_bad_pairs(m4, c4, tmp_path):
    with pytest.raises(TunerError, match="same layout"):
        plan_verify(m4, c4, WL, REF, REF, out_dir=tmp_path)
    with pytest.raises(TunerError, match="for 8 GPUs"):
        plan_verify(m4, c4, WL, CAND, Layout(world_size=8), out_dir=tmp_path)
    with pytest.raises(InfeasibleLayout) as e:
        plan_verify(m4, c4, WL, CAND, Layout(world_size=4, ep=3), out_dir=tmp_path)
    assert "reference layout" in str(e.value.reason)
    with pytest.raises(TunerError, match="--steps"):
        plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path, steps=2)
    with pytest.raises(TunerError, match="--fault"):
        plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path, fault="typo")
    with pytest.raises(TunerError, match="--lr"):
        plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path, lr=0)
    with pytest.raises(TunerError, match="never reach the peak"):
        plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path, steps=20, lr_warmup_steps=100)


def test_parse_layout_spec():
    lay = parse_layout_spec("tp=2,pp=1,ep=2,mbs=1,recompute=full", 4)
    assert (lay.tp, lay.ep, lay.sequence_parallel, lay.recompute_method, lay.recompute_num_layers) == (
        2, 2, True, "uniform", 1,
    )
    assert parse_layout_spec("tp=1", 4) == Layout(world_size=4)
    assert parse_layout_spec("tp=2 sequence_parallel=false", 4).sequence_parallel is False
    for bad, msg in (
        ("", "key=value"), ("tp", "not key=value"), ("tp=x", "not an integer"), ("tq=2", "unknown layout keys"),
        ("tp=1,tp=2", "twice"), ("sequence_parallel=maybe", "true/false"), ("recompute=sometimes", "recompute"),
    ):
        with pytest.raises(TunerError, match=msg):
            parse_layout_spec(bad, 4)


def test_a_matching_pair_passes_and_the_checkpoint_is_removed(m4, c4, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=20)
    seen = []
    o = run_verify(p, _fake_factory(), on_arm=lambda a, s: seen.append((a, s)))
    assert o.result == "pass", o.summary()
    assert seen == [("reference", "start"), ("reference", "done"), ("candidate", "start"), ("candidate", "done")]
    assert (
        len(o.reference_losses) == len(o.candidate_losses) == 20 and o.reference_losses != o.candidate_losses
    )  # TP noise
    assert o.convergence.correlation > 0.999 and o.convergence.final_loss_difference < 0.03
    assert not Path(p.checkpoint_dir).exists()
    d = json.loads((tmp_path / "v" / "verify.json").read_text())
    assert d["result"] == "pass" and d["plan"]["candidate"]["label"] == CAND.label and len(d["candidate_losses"]) == 20
    assert (tmp_path / "v" / "losses.png").stat().st_size > 1000
    # each arm ran in its own folder, the candidate from the reference's checkpoint
    cspec = json.loads((tmp_path / "v" / "candidate" / "spec.json").read_text())
    rspec = json.loads((tmp_path / "v" / "reference" / "spec.json").read_text())
    assert cspec["load_checkpoint"] == rspec["save_checkpoint"] == p.checkpoint_dir and cspec["save_checkpoint"] is None


def test_keep_checkpoint_then_reuse_it_as_init_checkpoint(m4, c4, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=5)
    run_verify(p, _fake_factory(), keep_checkpoint=True)
    ck = Path(p.checkpoint_dir)
    assert (ck / "init.json").exists()
    p2 = plan_verify(
        m4, c4, WL, CAND, REF, out_dir=tmp_path / "v2", steps=5, init_checkpoint=ck, fault="embedding_shard_misplaced"
    )
    assert all(a.load_checkpoint == str(ck) and a.save_checkpoint is None and a.pretrain_steps == 0 for a in p2.arms)
    assert p2.warm_start_steps == 0 and p2.to_dict()["checkpoint"]["written_by"] == "the user"
    o = run_verify(p2, _fake_factory())
    assert o.result == "fail" and ck.exists()  # the user's checkpoint is never deleted
    with pytest.raises(TunerError, match="not a megatron-core distributed checkpoint"):
        plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v3", init_checkpoint=tmp_path)
    with pytest.raises(TunerError, match="--warm-start-steps"):
        plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v3", warm_start_steps=-1)


def test_negative_control_fails_and_names_the_metric(m4, c4, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=20, fault="sp_norm_grad_unreduced")
    o = run_verify(p, _fake_factory())
    assert o.result == "fail" and "final_loss" in o.convergence.failed_metrics
    blk = convergence_block(o)
    assert (
        blk["result"] == "fail"
        and "final_loss" in blk["convergence"]["failed_metrics"]
        and "final loss 4.5113 vs 3.7526" in blk["summary"]
    )


def test_a_fault_that_would_change_nothing_is_refused_before_any_run(m4, c4, tmp_path):
    p = plan_verify(
        m4, c4, WL, Layout(world_size=4, ep=2), REF, out_dir=tmp_path / "v", steps=5, fault="sp_norm_grad_unreduced"
    )
    with pytest.raises(InfeasibleLayout, match="TP > 1 with sequence parallelism"):
        run_verify(p, _fake_factory())


@pytest.mark.parametrize("mode,metric", [("nan", "non_finite"), ("missing", "missing_steps")])
def test_nan_or_missing_steps_fail(m4, c4, tmp_path, monkeypatch, mode, metric):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=10)
    base = _fake_factory()

    def factory(plan, arm):  # only the candidate arm misbehaves, when it runs
        b = base(plan, arm)
        if arm.name == "candidate":
            run = b.run

            def misbehaving(*a, **k):
                monkeypatch.setenv("FAKE_LOSS_MODE", mode)
                return run(*a, **k)

            b.run = misbehaving
        return b

    o = run_verify(p, factory)
    assert o.result == "fail" and metric in o.convergence.failed_metrics


def test_an_arm_that_crashes_is_an_error_not_a_verdict(m4, c4, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "crash")
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=5)
    o = run_verify(p, _fake_factory())
    assert o.result == "error" and o.convergence is None and "reference arm" in o.error
    assert convergence_block(o)["result"] == "error"
    assert json.loads((tmp_path / "v" / "verify.json").read_text())["result"] == "error"


def test_the_candidate_cannot_start_without_the_reference_checkpoint(m4, c4, tmp_path, monkeypatch):
    """If the reference arm did not write the checkpoint, the candidate must not train from other weights."""
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_verify(m4, c4, WL, CAND, REF, out_dir=tmp_path / "v", steps=5)
    from dataclasses import replace

    p2 = replace(p, arms=(p.arms[1],))  # the candidate alone
    o = run_verify(p2, _fake_factory())
    assert o.result == "error" and "candidate arm" in o.error


# ---- the command line ----


@pytest.fixture
def study(tmp_path):
    r = runner.invoke(
        app,
        [
            "--model", "MiniMax-M2", "--layers", "4", "--gpus", "4xH200", "--global-batch", "8", "--trials", "6",
            "--results-dir", str(tmp_path), "--study", "s", "--stack", "megatron",
        ],
    )
    assert r.exit_code == 0, r.output
    return tmp_path


def _patch_cli(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the study's 4 GPUs
    # the study's best predicted layout uses the flex dispatcher: a machine with DeepEP / HybridEP installed
    env = HarnessEnv(deep_ep=True, hybrid_ep=True)
    monkeypatch.setattr(
        loss_check_mod,
        "local_backend_factory",
        lambda timeout_s=900.0: local_backend_factory(timeout_s=timeout_s, launcher=[sys.executable, FAKE], env=env),
    )
    monkeypatch.setattr(
        parity_check_mod,
        "parity_backend_factory",
        lambda timeout_s=900.0: parity_backend_factory(timeout_s=timeout_s, launcher=[sys.executable, FAKE], env=env),
    )
    import launch.local_backend as lb

    monkeypatch.setattr(lb, "check_harness_dependencies", lambda what="": None)


def test_cli_verify_pass_stores_the_block_and_export_carries_it(study, monkeypatch):
    _patch_cli(monkeypatch)
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    out = study / "recipe.yaml"
    r = runner.invoke(
        app,
        [
            "verify", "--study", "s", "--results-dir", str(study), "--reference", "tp=1,pp=1,ep=1", "--steps", "8",
            "--out", str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "pass" in r.output and "correlation" in r.output
    rec = yaml.safe_load(out.read_text())
    validate_recipe(rec)
    # the loss check alone is not enough: gradient parity is still to run
    assert rec["correctness"]["result"] == "incomplete" and rec["correctness"]["convergence"]["steps"] == 8
    assert rec["correctness"]["convergence"]["result"] == "pass" and "gradient parity" in rec["correctness"]["note"]
    assert (
        rec["status"] == "predicted"
    )  # a model-backend study: predicted throughput, verified numerics do not make it measured
    p = runner.invoke(
        app, ["verify", "--study", "s", "--results-dir", str(study), "--reference", "tp=1,pp=1,ep=1", "--grad-parity"]
    )
    assert p.exit_code == 0 and "pass" in p.output, p.output
    e = runner.invoke(app, ["export", "--study", "s", "--results-dir", str(study)])
    cor = yaml.safe_load(e.output)["correctness"]
    assert (
        e.exit_code == 0
        and cor["result"] == "pass"
        and cor["grad_parity"]["result"] == "pass"
        and cor["convergence"]["result"] == "pass"
    )


def test_cli_verify_fail_exits_1_and_keeps_the_study_clean(study, monkeypatch):
    _patch_cli(monkeypatch)
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    r = runner.invoke(
        app,
        [
            "verify", "--study", "s", "--results-dir", str(study), "--reference", "tp=1", "--steps", "20", "--fault",
            "non_causal_attention",
        ],
    )
    assert r.exit_code == 1 and "fail" in r.output
    e = runner.invoke(app, ["export", "--study", "s", "--results-dir", str(study)])
    assert yaml.safe_load(e.output)["correctness"]["result"] == "not run"  # a negative control is not stored


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--reference", "tp=3"], "breaks rule"), (["--reference", "tq=1"], "unknown layout keys"),
        ([], "--reference is required"), (["--reference", "tp=1", "--trial", "999"], "not a finished trial"),
        (["--reference", "tp=1", "--steps", "1"], "--steps"),
        (["--reference", "tp=1", "--out", "/nonexistent_dir/r.yaml"], "does not exist"),
    ],
)
def test_cli_verify_bad_input_is_one_line(study, monkeypatch, args, msg):
    _patch_cli(monkeypatch)
    r = runner.invoke(app, ["verify", "--study", "s", "--results-dir", str(study), *args])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def test_cli_verify_without_the_gpu_extra_says_so(study, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "megatron.core") else real(name, *a)
    )
    r = runner.invoke(app, ["verify", "--study", "s", "--results-dir", str(study), "--reference", "tp=1"])
    assert r.exit_code == 2 and "gpu extra" in r.output and "Traceback" not in r.output


def test_cli_verify_a_given_candidate_layout(study, monkeypatch):
    _patch_cli(monkeypatch)
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    r = runner.invoke(
        app,
        [
            "verify", "--study", "s", "--results-dir", str(study), "--candidate", "tp=2,ep=2", "--reference", "tp=1",
            "--steps", "6", "--warm-start-steps", "3",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "candidate TP2 PP1 EP2" in r.output
    v = json.loads((study / "s" / "verify" / "layout-tp2-pp1-ep2-dp2" / "verify.json").read_text())
    assert v["result"] == "pass" and v["plan"]["warm_start_steps"] == 3
    r = runner.invoke(
        app,
        [
            "verify", "--study", "s", "--results-dir", str(study), "--candidate", "tp=2", "--trial", "0", "--reference",
            "tp=1",
        ],
    )
    assert r.exit_code == 2 and "not both" in r.output


def test_harness_spec_checks_the_verify_fields(m4):
    with pytest.raises(TunerError, match="needs save_checkpoint"):
        build_spec(m4, CAND, WL, env=HarnessEnv(), options={"pretrain_steps": 5})
    with pytest.raises(TunerError, match="unknown harness options"):
        build_spec(m4, CAND, WL, env=HarnessEnv(), options={"learning_rate": 1e-4})
    with pytest.raises(InfeasibleLayout, match="loads none"):
        build_spec(m4, CAND, WL, env=HarnessEnv(), options={"fault": "embedding_shard_misplaced"})
    with pytest.raises(InfeasibleLayout, match="TP > 1"):
        build_spec(
            m4,
            Layout(world_size=4, ep=2),
            WL,
            env=HarnessEnv(),
            options={"fault": "embedding_shard_misplaced", "load_checkpoint": "x"},
        )
    # under TE the mask fault builds TE's attention with no mask (launch/harness/build.py _patch_te_block)
    assert (
        build_spec(
            m4, CAND, WL, env=HarnessEnv(transformer_engine=True), options={"fault": "non_causal_attention"}
        ).fault
        == "non_causal_attention"
    )


def test_a_measured_trial_that_passes_is_exported_as_verified(tmp_path, monkeypatch):
    """A local-backend study (fake harness) measures trials; `tune verify --trial N` passes; the recipe is
    `verified`."""
    from launch.local_backend import LocalBackend
    from tuner.study import TuneConfig, prepare, run_study, trial_rows

    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    monkeypatch.setenv("FAKE_STEP_S", "0.02")
    monkeypatch.setenv("FAKE_REPORT_STEP_S", "2.0")  # a plausible step time for a 4-layer slice (MFU < 1)
    cfg = TuneConfig.from_dict(dict(
        model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, backend="local", trials=2, stack="megatron",
        results_dir=str(tmp_path), trial_steps=4, study="m", prune_margin=None,
    ))
    be = LocalBackend(
        trials_dir=tmp_path / "m" / "trials", num_gpus=4, steps=4, warmup_steps=2, timeout_s=30,
        launcher=[sys.executable, FAKE], env=HarnessEnv(), poll_s=0.02,
    )
    res = run_study(prepare(cfg), backend=be)
    row = next(r for r in trial_rows(res.study) if r.source == "measured" and r.layout != REF)
    _patch_cli(monkeypatch)
    out = tmp_path / "recipe.yaml"
    r = runner.invoke(
        app,
        [
            "verify", "--study", "m", "--results-dir", str(tmp_path), "--trial", str(row.trial), "--reference",
            "tp=1", "--steps", "6", "--warm-start-steps", "2", "--out", str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    rec = yaml.safe_load(out.read_text())
    validate_recipe(rec)
    assert rec["status"] == "measured" and rec["correctness"]["result"] == "incomplete"  # no gradient parity yet
    p = runner.invoke(
        app,
        [
            "verify", "--study", "m", "--results-dir", str(tmp_path), "--trial", str(row.trial), "--reference",
            "tp=1", "--grad-parity", "--out", str(out),
        ],
    )
    assert p.exit_code == 0, p.output
    rec = yaml.safe_load(out.read_text())
    validate_recipe(rec)
    assert (
        rec["status"] == "verified"
        and rec["result"]["tokens_per_s_per_gpu"] > 0
        and rec["correctness"]["result"] == "pass"
    )
    e = runner.invoke(app, ["export", "--study", "m", "--results-dir", str(tmp_path), "--trial", str(row.trial)])
    assert yaml.safe_load(e.output)["status"] == "verified"
    # a failed gradient parity (stored by a later check) makes it not verified, whatever the loss check said
    res.study.set_user_attr(f"verify-parity:{row.trial}", {"result": "fail", "summary": "failed relative_l2"})
    e = runner.invoke(app, ["export", "--study", "m", "--results-dir", str(tmp_path), "--trial", str(row.trial)])
    assert (
        yaml.safe_load(e.output)["status"] == "measured" and yaml.safe_load(e.output)["correctness"]["result"] == "fail"
    )


def test_cli_verify_refuses_before_any_arm_runs(study, monkeypatch):
    """A candidate that needs DeepEP / HybridEP, which this machine lacks: refused before the
    reference arm spends its GPU time, with what to do instead."""
    monkeypatch.setattr(loss_check_mod, "local_backend_factory", lambda timeout_s=900.0: _fake_factory(timeout_s))
    import launch.local_backend as lb

    monkeypatch.setattr(lb, "check_harness_dependencies", lambda what="": None)
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    args = [
        "verify", "--study", "s", "--results-dir", str(study), "--reference", "tp=1,pp=1,ep=1", "--steps", "8",
        "--candidate", "tp=1,pp=1,ep=4,dispatcher=flex+deepep",
    ]
    for visible in ("0,1", ""):  # fewer GPUs than the study's 4
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "needs 4 GPUs and this machine shows" in r.output, r.output
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "cannot run here" in r.output and ("needs DeepEP" in r.output or "needs HybridEP" in r.output)
    assert "reference: start" not in r.output and "Traceback" not in r.output
    assert not (study / "s" / "verify").exists() or not any((study / "s" / "verify").rglob("steps.jsonl"))


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--reference", "tp=1", "--grad-parity", "--noise-factor", "0"], "--noise-factor"),
        (["--reference", "tp=1", "--grad-parity", "--out", "/nonexistent_dir/r.yaml"], "does not exist"),
        (["--reference", "tp=1,pp=1,ep=1", "--grad-parity", "--candidate", "tp=1,pp=1,ep=1"], "same layout"),
    ],
)
def test_cli_grad_parity_bad_input_is_refused_before_any_gpu_work(study, monkeypatch, args, msg):
    _patch_cli(monkeypatch)
    r = runner.invoke(app, ["verify", "--study", "s", "--results-dir", str(study), *args])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output
    assert not list((study / "s").glob("verify/parity-*"))
