"""`tune rl` through typer's CliRunner on a root app that mounts the sub-app (as tuner/cli.py will)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import cost_model.rl.plan as plan_mod
from cost_model.rl.engine import LatencyTable
from tuner.cli_rl import rl_app

ROOT = Path(__file__).resolve().parents[2]
app = typer.Typer()
app.add_typer(rl_app, name="rl")


@app.command()
def other() -> None:  # a second command so typer keeps "rl" as a sub-command
    pass


@pytest.fixture(autouse=True)
def synthetic_engines(monkeypatch, request):
    if request.node.get_closest_marker("real_engine"):
        return  # the test exercises the aiconfigurator path itself

    def latency(job, shape):
        return LatencyTable.from_functions(lambda n, c: (8e-3 + 2e-5 * n) / shape.gpus**0.5, lambda t: 2e-5 * t / shape.gpus, max_ctx=job.max_total_len)

    monkeypatch.setattr(plan_mod, "default_latency", latency)
    monkeypatch.setattr(plan_mod.enumerate_plans, "__kwdefaults__", {**plan_mod.enumerate_plans.__kwdefaults__, "latency": latency})
    monkeypatch.setattr(plan_mod.evaluate, "__kwdefaults__", {**plan_mod.evaluate.__kwdefaults__, "latency": latency})


JOB = ["--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--prompt-len", "256", "--response-len", "4096", "--prompts-per-step", "16", "--generations-per-prompt", "16"]


def test_tune_rl_ranks_plans_as_json(tmp_path):
    out = tmp_path / "recipe.yaml"
    r = CliRunner().invoke(app, ["rl", *JOB, "--async-steps", "1", "--json", "--export", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    steps = [p["predicted"]["step_time_s"] for p in d["plans"]]
    assert steps == sorted(steps) and d["front_by_staleness"][0]["async_steps"] == 0
    assert "prediction" in d["note"]
    assert "policy:" in out.read_text()


def test_tune_rl_out_writes_the_framework_launch_through_the_registry(tmp_path):
    import stat

    import yaml

    r = CliRunner().invoke(app, ["rl", *JOB, "--top", "1", "--json", "--out", str(tmp_path / "nemo")])
    assert r.exit_code == 0, r.output
    f = tmp_path / "nemo" / "nemo_rl_grpo.yaml"
    assert json.loads(r.stdout)["written"] == [str(f)]
    cfg = yaml.safe_load(f.read_text())
    assert cfg["cluster"] == {"gpus_per_node": 8, "num_nodes": 4} and "PREDICTED" in f.read_text()
    r = CliRunner().invoke(app, ["rl", *JOB, "--framework", "slime", "--top", "1", "--out", str(tmp_path / "slime")])
    assert r.exit_code == 0, r.output
    s = tmp_path / "slime" / "run_slime_rl.sh"
    assert stat.S_IMODE(s.stat().st_mode) == 0o755 and s.read_text().startswith("#!/usr/bin/env bash\n") and "wrote the best plan's slime launch" in r.stdout


def test_tune_rl_table_labels_predictions():
    r = CliRunner().invoke(app, ["rl", *JOB, "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "prediction" in r.stdout and "Front" in r.stdout


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # more rollout GPUs than the cluster holds (the trainer needs a node), or not whole nodes
        (["--no-colocated", "--rollout-gpus", "64"], "--rollout-gpus 64: 4x8xH100 has 32 GPUs and the trainer needs at least one node; accepted: a multiple of 8 from 8 to 24"),
        (["--no-colocated", "--rollout-gpus", "12"], "--rollout-gpus 12: rollout GPUs are whole nodes; accepted: a multiple of 8 from 8 to 24"),
        # an engine TP that does not tile nodes (an engine divides a node or is whole nodes), or exceeds the cluster
        (["--engine-tp", "3"], "--engine-tp 3: an engine's GPUs must divide a node's 8 GPUs or be whole nodes of 4x8xH100; accepted: 1, 2, 4, 8 or a multiple of 8 up to 32"),
        (["--engine-tp", "64"], "--engine-tp 64: an engine's GPUs must divide"),
        # a response longer than the maximum sequence
        (["--max-seq-len", "4000"], "--response-len 4,096 is not shorter than --max-seq-len 4,000: a response must leave room for its prompt"),
        (["--trainer-layout", "megatron:tp=x"], "--trainer-layout 'megatron:tp=x': cannot read 'tp=x'; accepted keys: tp, cp, ep, pp, vpp"),
        (["--trainer-backend", "fsdp"], "--trainer-backend 'fsdp': accepted megatron, automodel or all"),
    ],
)
def test_bad_input_is_one_red_line_exit_2(extra, needle):
    r = CliRunner().invoke(app, ["rl", *JOB, *extra])
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and r.stdout == ""


@pytest.mark.real_engine
def test_a_model_aiconfigurator_has_no_data_for_names_what_it_has(tmp_path, monkeypatch):
    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path / "cache"))
    own = tmp_path / "MyMoE"
    own.mkdir()
    (own / "config.json").write_text((ROOT / "specs" / "data" / "models" / "Qwen3-30B-A3B.json").read_text())
    r = CliRunner().invoke(app, ["rl", "--model", str(own), *JOB[2:], "--top", "1"])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert "--model 'MyMoE': aiconfigurator 0.12.0 has no engine data for it; supported: MiniMax-M3, MiniMax-M2, Qwen3-235B-A22B, Qwen3-30B-A3B" in msg


@pytest.mark.real_engine
def test_missing_aiconfigurator_names_the_extra(tmp_path, monkeypatch):
    import cost_model.rl.engine as eng

    real = eng.importlib.import_module

    def no_aiconfigurator(name, *a, **k):
        if name.startswith("aiconfigurator"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path))  # an empty cache: nothing to fall back on
    monkeypatch.setattr(eng.importlib, "import_module", no_aiconfigurator)
    monkeypatch.setattr(eng, "_systems_with_data", lambda engine: None)
    eng._handle.cache_clear()
    try:
        r = CliRunner().invoke(app, ["rl", *JOB, "--top", "1"])
    finally:
        eng._handle.cache_clear()
    assert r.exit_code == 2, r.output
    assert "pip install 'megatron-layout-tuner[rl]' (aiconfigurator==0.12.0)" in " ".join(r.stderr.split())


def test_validate_names_missing_columns_exit_2(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("source,model,gpu\nx,Qwen3-30B-A3B,H100\n")
    r = CliRunner().invoke(app, ["rl", "validate", "--data", str(f)])
    assert r.exit_code == 2
    msg = " ".join(r.stderr.split())
    assert f"--data '{f}': missing columns framework, num_gpus" in msg and "a runs table has source, framework" in msg


def test_unknown_model_names_what_is_known():
    r = CliRunner().invoke(app, ["rl", "--model", "Nope-1B", "--gpus", "2x8xH100"])
    assert r.exit_code == 2 and "Known presets" in r.stderr and "Qwen3-32B" in r.stderr


def test_validate_reports_rows_and_names_bad_ones(tmp_path):
    text = (ROOT / "benchmarks" / "data" / "rl_runs.csv").read_text().splitlines()
    keep = [text[0]] + [line for line in text[1:] if "Qwen3-30B-A3B,H100" in line][:2]
    keep.append(keep[1].replace("vllm:tp=", "vllm:tp=zz"))
    f = tmp_path / "runs.csv"
    f.write_text("\n".join(keep) + "\n")
    r = CliRunner().invoke(app, ["rl", "validate", "--data", str(f), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["rows"]) == 2 and d["summary"]["step"]["n"] == 2
    assert [u for u in d["unreadable"]] == ["line 4: rollout_layout 'vllm:tp=zz4,ep=1,pp=1,gpu_memory_utilization=0.6,enforce_eager=0': cannot read 'tp=zz4'; accepted keys: tp, ep, pp, dp, gpu_memory_utilization, enforce_eager, max_num_seqs"]
    # the table form names it on stderr, the good rows still print
    r = CliRunner().invoke(app, ["rl", "validate", "--data", str(f)])
    assert r.exit_code == 0 and "not predicted: line 4: rollout_layout" in " ".join(r.stderr.split()) and "Qwen3-30B-A3B" in r.stdout


def test_calibrate_from_a_nemo_rl_log(tmp_path):
    out = tmp_path / "cal.yaml"
    r = CliRunner().invoke(app, [
        "rl", "calibrate", "--log", str(ROOT / "tests" / "fixtures" / "rl_logs" / "nemo_rl_grpo_sync.log"),
        "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--rollout-gpus", "32", "--colocated",
        "--rollout-layout", "vllm:tp=2,ep=1,pp=1", "--trainer-layout", "megatron:tp=1,cp=1,ep=8,pp=1,vpp=1",
        "--prompt-len", "256", "--response-len", "4096", "--prompts-per-step", "16", "--generations-per-prompt", "16", "--json", "--out", str(out),
    ])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["predicted_after"]["generation_s"] == pytest.approx(d["measured"]["generation_s"], rel=1e-6)
    assert "rl_calibration" in out.read_text()
    r2 = CliRunner().invoke(app, ["rl", *JOB, "--calibration", str(out), "--json", "--top", "1"])
    assert r2.exit_code == 0 and "calibrated from" in json.loads(r2.stdout)["calibration"]


def test_fp8_generation_and_training_reach_the_recipe(tmp_path):
    import yaml

    r = CliRunner().invoke(app, ["rl", *JOB, "--top", "1", "--generation-precision", "fp8", "--training-precision", "fp8_blockwise",
                                 "--trainer-backend", "megatron", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "nemo_rl_grpo.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    assert cfg["policy"]["megatron_cfg"]["fp8_cfg"] == {"enabled": True, "fp8": "e4m3", "fp8_recipe": "blockwise", "fp8_param": False}
    assert "fp8 weights" in text and "(fp8_blockwise)" in text  # the header says what was predicted
    r = CliRunner().invoke(app, ["rl", *JOB, "--training-precision", "fp4x"])
    assert r.exit_code == 2 and "--training-precision 'fp4x': accepted bf16, fp8" in " ".join(r.stderr.split())
