"""`tune verify --component optimizer` and `--grad-parity` through their Python API with the fake programs, and the
device driver (benchmarks/h200_te.py) end to end with them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.harness.spec import HarnessEnv
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model
from tuner.verify.component import plan_component_test, run_component_test
from tuner.verify.inputs import checkpoint_model_reasons
from tuner.verify.loss_check import plan_verify
from tuner.verify.parity_check import parity_backend_factory, plan_grad_parity, run_grad_parity

pytestmark = pytest.mark.slow  # trial processes of the fake harness and the device driver

ROOT = Path(__file__).parents[2]
FAKE = str(ROOT / "tests" / "launch_tests" / "fake_trial.py")
FAKE_COMPONENT = [sys.executable, str(ROOT / "tests" / "launch_tests" / "fake_component.py")]
TE = HarnessEnv(transformer_engine=True)
WL = Workload(seq_length=4096, global_batch_size=8)
REF = Layout(world_size=1)
MBS2 = REF.replace(micro_batch_size=2)


@pytest.fixture(scope="module")
def m1():
    return slice_model(load_model("MiniMax-M2"), 1).replace(num_experts=64, name="MiniMax-M2[1 layers, 64 experts]")


@pytest.fixture
def c1():
    return parse_gpus("1xH200")


def _factory():
    return parity_backend_factory(timeout_s=30, launcher=[sys.executable, FAKE], env=TE)


# ---- component test


def test_component_test_refuses_without_te_before_any_gpu_work(tmp_path):
    with pytest.raises(TunerError, match="needs Transformer Engine"):
        plan_component_test(out_dir=tmp_path, env=HarnessEnv(), check_machine=False)
    with pytest.raises(TunerError, match="--moments"):
        plan_component_test(out_dir=tmp_path, env=TE, moments=("fp16",), check_machine=False)
    assert not (tmp_path / "component_spec.json").exists()


def test_component_test_with_the_fake_program_passes_and_gives_the_seed_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_COMPONENT_MODE", "pass")
    plan = plan_component_test(out_dir=tmp_path, env=TE, check_machine=False, max_experts=128)
    o = run_component_test(plan, launcher=FAKE_COMPONENT, timeout_s=30)
    assert o.result == "pass" and o.experts == 128
    e = o.entry()
    assert e["result"] == "pass" and "128 of its 512 experts" in e["shape"] and e["gpu"] == "H200"
    saved = json.loads((tmp_path / "component.json").read_text())
    assert (
        saved["entry"]["detail"] == e["detail"]
        and json.loads((tmp_path / "component_spec.json").read_text())["max_experts"] == 128
    )


@pytest.mark.parametrize(
    "mode, result",
    [
        ("control_passes", "fail"), ("bitwise", "fail"), ("offload_fails", "fail"), ("crash", "error"),
        ("no_default", "error"),
    ],
)
def test_component_test_fails_or_errors(tmp_path, monkeypatch, mode, result):
    monkeypatch.setenv("FAKE_COMPONENT_MODE", mode)
    o = run_component_test(
        plan_component_test(out_dir=tmp_path, env=TE, check_machine=False), launcher=FAKE_COMPONENT, timeout_s=30
    )
    assert o.result == result
    if result == "error":
        assert o.error and o.entry()["result"] == "error"


# ---- gradient parity


def _ckpt(m1, c1, tmp_path, monkeypatch):
    """A checkpoint written by the fake harness (a convergence check's reference arm, kept)."""
    from tuner.verify.loss_check import local_backend_factory, run_verify

    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_verify(
        m1, c1, WL, MBS2, REF, out_dir=tmp_path / "conv", steps=6, warm_start_steps=2, fault="norm_grad_scaled"
    )
    o = run_verify(
        p, local_backend_factory(timeout_s=30, launcher=[sys.executable, FAKE], env=TE), keep_checkpoint=True
    )
    assert o.result == "pass"  # the loss check does not see the scaled norm gradient
    return Path(p.checkpoint_dir)


def test_parity_passes_for_a_layout_pair_and_reuses_the_reference(m1, c1, tmp_path, monkeypatch):
    ck = _ckpt(m1, c1, tmp_path, monkeypatch)
    p = plan_grad_parity(
        m1, c1, WL, MBS2, REF, out_dir=tmp_path / "p1", init_checkpoint=ck, reference_dir=tmp_path / "ref",
        data_step_offset=2,
    )
    o = run_grad_parity(p, _factory())
    assert (
        o.result == "pass" and o.reused == () and set(o.arm_seconds) == {"reference", "reference_repeat", "candidate"}
    )
    assert (
        o.thresholds.noise_rel_l2 > 0
        and o.thresholds.rel_l2 >= 1.6e-2
        and "two runs of the reference" in o.thresholds.source
    )
    blk = o.block(gpu="H200")
    assert blk["result"] == "pass" and "mbs 2" in blk["candidate"] and blk["worst_tensors"]
    assert not Path(
        p.arms[2].dump_dir
    ).exists()  # the candidate's dump is removed; the reference's are kept for the next pair
    # the scaled-gradient fault on the same pair fails (the loss check above passed), reusing the reference's two runs
    p2 = plan_grad_parity(
        m1, c1, WL, MBS2, REF, out_dir=tmp_path / "p2", init_checkpoint=ck, reference_dir=tmp_path / "ref",
        data_step_offset=2, fault="norm_grad_scaled",
    )
    o2 = run_grad_parity(p2, _factory())
    assert (
        o2.result == "fail"
        and o2.reused == ("reference", "reference_repeat")
        and o2.parity.failed_metrics == ("relative_l2",)
    )
    assert o2.parity.worst_tensors(1)[0].name == "decoder.layers.0.self_attention.q_layernorm.weight"
    saved = json.loads((tmp_path / "p2" / "parity.json").read_text())
    assert saved["result"] == "fail" and saved["parity"]["worst"][0]["name"].endswith("q_layernorm.weight")
    # and the mask fault fails on every tensor
    o3 = run_grad_parity(
        plan_grad_parity(
            m1, c1, WL, REF, REF, out_dir=tmp_path / "p3", init_checkpoint=ck, reference_dir=tmp_path / "ref",
            data_step_offset=2, fault="non_causal_attention",
        ),
        _factory(),
    )
    assert o3.result == "fail" and {"relative_l2", "cosine"} <= set(o3.parity.failed_metrics)


@pytest.mark.parametrize(
    "mode, metric", [("nan", "non_finite"), ("missing", "missing_tensor"), ("shape", "shape_mismatch")]
)
def test_parity_fails_on_nan_missing_or_reshaped_gradients(m1, c1, tmp_path, monkeypatch, mode, metric):
    ck = _ckpt(m1, c1, tmp_path, monkeypatch)
    ref = tmp_path / "ref"
    run_grad_parity(
        plan_grad_parity(
            m1, c1, WL, MBS2, REF, out_dir=tmp_path / "a", init_checkpoint=ck, reference_dir=ref, data_step_offset=2
        ),
        _factory(),
    )
    monkeypatch.setenv("FAKE_GRAD_MODE", mode)  # only the candidate runs now: the reference's dumps are reused
    o = run_grad_parity(
        plan_grad_parity(
            m1, c1, WL, MBS2, REF, out_dir=tmp_path / "b", init_checkpoint=ck, reference_dir=ref, data_step_offset=2
        ),
        _factory(),
    )
    assert o.result == "fail" and metric in o.parity.failed_metrics


def test_parity_refusals_before_any_run(m1, c1, tmp_path, monkeypatch):
    ck = _ckpt(m1, c1, tmp_path, monkeypatch)
    other = slice_model(load_model("MiniMax-M2"), 1)  # 256 experts: another model than the checkpoint's
    with pytest.raises(TunerError, match="another model"):
        plan_grad_parity(other, c1, WL, MBS2, REF, out_dir=tmp_path / "x", init_checkpoint=ck)
    assert checkpoint_model_reasons(ck, m1) == []
    with pytest.raises(TunerError, match="another model"):
        plan_verify(
            other,
            c1,
            Workload(seq_length=4096, global_batch_size=8),
            MBS2,
            REF,
            out_dir=tmp_path / "v",
            init_checkpoint=ck,
        )
    with pytest.raises(TunerError, match="same layout"):
        plan_grad_parity(m1, c1, WL, REF, REF, out_dir=tmp_path / "x")
    with pytest.raises(TunerError, match="for 2 GPUs"):
        plan_grad_parity(m1, c1, WL, Layout(world_size=2, ep=2), REF, out_dir=tmp_path / "x")
    with pytest.raises(TunerError, match="not a megatron-core distributed checkpoint"):
        plan_grad_parity(m1, c1, WL, MBS2, REF, out_dir=tmp_path / "x", init_checkpoint=tmp_path)
    # a pair this machine cannot run (moe_act recompute without TE's grouped GEMM): refused before the reference runs
    cand = REF.replace(recompute_granularity="selective", recompute_modules=("moe_act",))
    p = plan_grad_parity(m1, c1, WL, cand, REF, out_dir=tmp_path / "y", init_checkpoint=ck)
    with pytest.raises(InfeasibleLayout, match="moe_act"):
        run_grad_parity(p, parity_backend_factory(timeout_s=30, launcher=[sys.executable, FAKE], env=HarnessEnv()))
    assert not (tmp_path / "y" / "runs").exists()


def test_without_a_checkpoint_the_reference_writes_the_seed_weights(m1, c1, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_MODE", "ok")
    p = plan_grad_parity(m1, c1, WL, MBS2, REF, out_dir=tmp_path)
    assert p.arms[0].save_checkpoint == p.checkpoint_dir and p.arms[1].save_checkpoint is None
    o = run_grad_parity(p, _factory())
    assert o.result == "pass" and (Path(p.checkpoint_dir) / "model.json").exists()


# ---- the device driver, end to end with the fakes


def _driver(tmp_path, **env):
    e = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "H200_TE_LAUNCHER": f"{sys.executable} {FAKE}",
        "H200_TE_COMPONENT_LAUNCHER": " ".join(FAKE_COMPONENT),
        "H200_TE_FAKE_TE": "1",
        "FAKE_STEP_S": "0.001",
        "FAKE_TRIAL_MODE": "ok",
        "PYTHONPATH": str(ROOT),
        **env,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "h200_te.py")], env=e, capture_output=True, text=True, timeout=500
    )


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_device_driver_skips_what_does_not_fit_and_resumes_in_the_next_call(tmp_path):
    r = _driver(
        tmp_path, PART="probe,component,parity", BUDGET_S="180"
    )  # the component test is planned at 200 s: it does not fit
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert [x["id"] for x in _lines(out / "probe.jsonl")] == ["probe-first"]
    assert _lines(out / "component.jsonl") == [
        {"id": "component", "status": "skipped", "reason": _lines(out / "component.jsonl")[0]["reason"]}
    ]
    par = {x["id"]: x for x in _lines(out / "parity.jsonl")}
    assert par["conv-fault-norm-grad-scaled"]["result"] == "pass"  # the loss check passes on the pair ...
    assert par["par-fault-norm-grad-scaled"]["result"] == "fail"  # ... that gradient parity fails
    assert (
        par["par-mbs2"]["result"] == "pass"
        and par["par-allgather"]["result"] == "pass"
        and par["par-fault-non-causal"]["result"] == "fail"
    )
    assert par["par-mbs2"]["reused"] == ["reference", "reference_repeat"]
    state = json.loads((tmp_path / "work" / "state.json").read_text())
    assert "component" not in state["done"] and "par-mbs2" in state["done"] and state["calls"] == 1
    # the next call (a fresh $OUT) runs only what is left
    for f in out.iterdir():
        f.unlink()
    r = _driver(tmp_path, PART="probe,component,parity", BUDGET_S="5000")
    assert r.returncode == 0, r.stderr
    assert (
        _lines(out / "component.jsonl")[-1]["result"] == "pass"
        and not (out / "parity.jsonl").exists()
        and not (out / "probe.jsonl").exists()
    )
    assert json.loads((tmp_path / "work" / "state.json").read_text())["calls"] == 2
    assert len(list(out.iterdir())) <= 8 and "end of call 2" in (out / "driver.log").read_text()


def test_device_driver_sweep_rows_record_what_ran_and_final_keeps_room_for_the_probe(tmp_path):
    # planned 40 s and 90 s: the first fits in the budget of 125 s beside the 50 s probe, the second does not
    r = _driver(tmp_path, PART="sweep,probe_last", SWEEP_ONLY="mm-base,mem-mm-offload-0.5", BUDGET_S="125", FINAL="1")
    assert r.returncode == 0, r.stderr
    ok, skipped = _lines(tmp_path / "out" / "sweep.jsonl")
    assert (
        ok["id"] == "mm-base"
        and ok["status"] == "ok"
        and ok["layout"]["micro_batch_size"] == 1
        and "step_times_s" in ok
        and ok["options"]
    )
    assert skipped["id"] == "mem-mm-offload-0.5" and skipped["status"] == "skipped" and "budget" in skipped["reason"]
    assert [x["id"] for x in _lines(tmp_path / "out" / "probe.jsonl")] == ["probe-last"]


# ---- the command line: tune verify --component optimizer


def _cli_component(monkeypatch):
    import tuner.verify.component as verify_mod

    real_plan, real_run = verify_mod.plan_component_test, verify_mod.run_component_test
    monkeypatch.setattr(verify_mod, "plan_component_test", lambda **kw: real_plan(**kw, env=TE, check_machine=False))
    monkeypatch.setattr(
        verify_mod,
        "run_component_test",
        lambda plan, timeout_s=900.0: real_run(plan, launcher=FAKE_COMPONENT, timeout_s=timeout_s),
    )


def test_cli_component_test_passes_prints_the_arms_and_stores_the_entry(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tuner.cli import app

    runner = CliRunner()
    r = runner.invoke(
        app,
        ["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "3", "--results-dir", str(tmp_path), "--study", "c"],
    )
    assert r.exit_code == 0, r.output
    _cli_component(monkeypatch)
    monkeypatch.setenv("FAKE_COMPONENT_MODE", "pass")
    r = runner.invoke(
        app,
        ["verify", "--component", "optimizer", "--study", "c", "--results-dir", str(tmp_path), "--max-experts", "32"],
    )
    assert r.exit_code == 0, r.output
    assert "control_remainders_dropped" in r.output and "failed as expected" in r.output and "pass" in r.output
    e = runner.invoke(app, ["export", "--study", "c", "--results-dir", str(tmp_path)])
    import yaml

    cor = yaml.safe_load(e.output)["correctness"]
    assert (
        cor["component_tests"][0]["result"] == "pass" and cor["result"] == "incomplete"
    )  # no convergence check nor parity
    monkeypatch.setenv("FAKE_COMPONENT_MODE", "control_passes")
    f = runner.invoke(app, ["verify", "--component", "optimizer", "--results-dir", str(tmp_path)])
    assert f.exit_code == 1 and "hyperparameter" in f.output


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--component", "router"], "accepted optimizer"),
        (["--component", "optimizer", "--component-steps", "0,3"], "--component-steps"),
        (["--component", "optimizer", "--component-steps", "a"], "--component-steps"),
        (["--component", "optimizer", "--moments", "fp16"], "--moments"),
        (["--component", "optimizer", "--grad-parity"], "not both"),
        (["--component", "optimizer"], "needs Transformer Engine"),  # CI has no TE: refused before any GPU work
    ],
)
def test_cli_component_bad_input_is_one_line(tmp_path, args, msg):
    from typer.testing import CliRunner

    from tuner.cli import app

    r = CliRunner().invoke(app, ["verify", *args, "--results-dir", str(tmp_path)])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "component-test").exists()


def test_device_driver_sweep_only_runs_the_named_cases_in_order(tmp_path):
    r = _driver(tmp_path, PART="sweep", SWEEP_ONLY="mm-sel-moe,mm-base", BUDGET_S="5000")
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in _lines(tmp_path / "out" / "sweep.jsonl")] == ["mm-sel-moe", "mm-base"]
    bad = _driver(tmp_path, PART="sweep", SWEEP_ONLY="mm-nope")
    assert bad.returncode != 0 and "mm-nope" in bad.stderr and "accepted" in bad.stderr
