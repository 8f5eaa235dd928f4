"""`tune rl` through typer's CliRunner on a root app that mounts the sub-app (as tuner/cli.py will)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import rl.plan as plan_mod
from rl.cli import rl_app
from rl.engine import LatencyTable

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
        return LatencyTable.from_functions(
            lambda n, c: (8e-3 + 2e-5 * n) / shape.gpus**0.5, lambda t: 2e-5 * t / shape.gpus, max_ctx=job.max_total_len
        )

    monkeypatch.setattr(plan_mod, "default_latency", latency)
    monkeypatch.setattr(
        plan_mod.enumerate_plans, "__kwdefaults__", {**plan_mod.enumerate_plans.__kwdefaults__, "latency": latency}
    )
    for f in (plan_mod.evaluate, plan_mod.evaluate_layouts):
        monkeypatch.setattr(f, "__kwdefaults__", {**f.__kwdefaults__, "latency": latency})


JOB = [
    "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--prompt-len", "256", "--response-len", "4096",
    "--prompts-per-step", "16", "--generations-per-prompt", "16",
]


def test_tune_rl_ranks_plans_as_json(tmp_path):
    out = tmp_path / "recipe.yaml"
    r = CliRunner().invoke(app, ["rl", *JOB, "--async-steps", "1", "--json", "--export", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    steps = [p["predicted"]["step_time_s"] for p in d["plans"]]
    assert steps == sorted(steps) and d["fastest_per_async_depth"][0]["async_steps"] == 0
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
    assert (
        stat.S_IMODE(s.stat().st_mode) == 0o755
        and s.read_text().startswith("#!/usr/bin/env bash\n")
        and "wrote the recommended plan's slime launch" in r.stdout
    )


def test_tune_rl_labels_predictions_and_its_plan_counts_add_up():
    """Every number is labelled a prediction; the plans set aside and the evaluated ones add up to the plans
    considered; splits without a trainer layout are counted apart, as splits (--verbose names them)."""
    import re

    r = CliRunner().invoke(app, ["rl", *JOB, "--top", "3", "--verbose"])
    assert r.exit_code == 0, r.output
    line = " ".join(r.stdout.split())
    assert (
        "prediction" in line
        and "Fastest plan per rollout-GPU count (every count, not a Pareto front)" in line
        and "Front" not in line
    )
    m = re.search(
        r"Plans considered: ([\d,]+); evaluated: ([\d,]+); set aside: (.*?)(; splits not tried: .*?)? Fastest", line
    )
    assert m, line
    considered, evaluated = (int(x.replace(",", "")) for x in m.groups()[:2])
    aside = sum(int(n) for n in re.findall(r"\((\d+)\)", m.group(3)))
    assert considered == evaluated + aside and evaluated > 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # more rollout GPUs than the cluster holds (the trainer needs a node), or not whole nodes
        (
            ["--no-colocated", "--rollout-gpus", "64"],
            "--rollout-gpus 64: 4x8xH100 has 32 GPUs and the trainer needs at least one node; accepted: a multiple of "
            "8 from 8 to 24",
        ),
        (
            ["--no-colocated", "--rollout-gpus", "12"],
            "--rollout-gpus 12: rollout GPUs are whole nodes; accepted: a multiple of 8 from 8 to 24",
        ),
        # an engine TP that does not tile nodes (an engine divides a node or is whole nodes), or exceeds the cluster
        (
            ["--engine-tp", "3"],
            "--engine-tp 3: an engine's GPUs must divide a node's 8 GPUs or be whole nodes of 4x8xH100; accepted: 1, "
            "2, 4, 8 or a multiple of 8 up to 32",
        ),
        (["--engine-tp", "64"], "--engine-tp 64: an engine's GPUs must divide"),
        # a response longer than the maximum sequence
        (
            ["--max-seq-len", "4000"],
            "--response-len 4,096 is not shorter than --max-seq-len 4,000: a response must leave room for its prompt",
        ),
        (
            ["--trainer-layout", "megatron:tp=x"],
            "--trainer-layout 'megatron:tp=x': cannot read 'tp=x'; accepted keys: tp, cp, ep, pp, vpp",
        ),
        (["--trainer-backend", "fsdp"], "--trainer-backend 'fsdp': accepted megatron, automodel or all"),
    ],
)
def test_bad_input_is_one_red_line_exit_2(extra, needle):
    r = CliRunner().invoke(app, ["rl", *JOB, *extra])
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and r.stdout == ""


#: The job of the adversarial report: every bad option below is refused up front, before a rollout is simulated.
MINIMAX = ["--model", "MiniMax-M2", "--gpus", "8x8xH200"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # crashed (exit 1, "internal error") before
        (["--max-num-seqs", "0"], "--max-num-seqs 0: must be at least 1"),
        (["--max-num-seqs", "-1"], "--max-num-seqs -1: must be at least 1"),
        (
            ["--engine-ep", "0"],
            "--engine-ep 0: must be at least 1 (1 = experts tensor-parallel); accepted: 1, 2, 4, 8, 16, 24, 32, 40, "
            "48, 56, 64",
        ),
        (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization nan: must be in (0, 1]"),
        # accepted with exit 0 before
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: must be in (0, 1]"),
        (["--async-steps", "-1"], "--async-steps -1: accepted 0..8"),
        (["--top", "-1"], "--top -1: must be at least 1"),
        (["--top", "0"], "--top 0: must be at least 1"),
        (
            ["--logprob-passes", "0"],
            "--logprob-passes 0: accepted 1 (the policy's log-probs for the importance ratio) or 2 (and the "
            "reference's for KL)",
        ),
        (["--mean-prompt-len", "3000"], "--mean-prompt-len 3000: must be above 0 and at most --prompt-len 2,048"),
        # ran for minutes before
        (["--async-steps", "100"], "--async-steps 100: accepted 0..8"),
        # named the wrong option, or only "no RL plan fits", before
        (["--mean-prompt-len", "-1"], "--mean-prompt-len -1: must be above 0 and at most --prompt-len 2,048"),
        (["--mean-prompt-len", "nan"], "--mean-prompt-len nan: must be above 0"),
        (["--mean-response-len", "7000"], "--mean-response-len 7000: must be above 0 and below --response-len 6,144"),
        (
            ["--engine-ep", "3"],
            "--engine-ep 3: an engine's experts are sharded over its GPUs, which divide a node's 8 GPUs or are whole "
            "nodes tiling the rollout GPUs (256 experts); accepted: 1, 2, 4, 8, 16, 24",
        ),
        (
            ["--engine-tp", "8", "--engine-ep", "3"],
            "with --engine-tp 8, EP divides it or is a multiple of it; accepted: 1, 2, 4, 8, 16, 24",
        ),
        (
            ["--no-colocated", "--rollout-gpus", "16", "--engine-ep", "32"],
            "--engine-ep 32: an engine's experts are sharded",
        ),
        (["--gpu-memory-utilization", "-0.5"], "--gpu-memory-utilization -0.5: must be in (0, 1]"),
        (
            ["--trainer-layout", "megatron:tp=3"],
            "--trainer-layout 'megatron:tp=3': fits no trainer size this search tries (64, 56, 48, 40, 32, 24, 16, 8 "
            "GPUs); "
            "trainer layout megatron:tp=3,cp=1,ep=1,pp=1,vpp=1 on 64 GPUs breaks a Megatron rule",
        ),
        (
            ["--trainer-layout", "megatron:tp=3"],
            "query_groups_tp: num_query_groups (8) must be a multiple or a divisor of tp (3)",
        ),
        (
            ["--train-global-batch", "-2"],
            "--train-global-batch -2: must be 0 (all of a step) or a divisor of prompts x generations = 512",
        ),
        (
            ["--max-seq-len", "-1"],
            "--max-seq-len -1: must be 0 (prompt + response) or longer than --response-len 6,144",
        ),
        (["--prompt-len", "0"], "--prompt-len 0: must be at least 1"),
    ],
)
def test_bad_search_option_is_refused_up_front_exit_2(extra, needle, monkeypatch):
    def no_simulation(*a, **k):
        raise AssertionError("simulated before the options were checked")

    monkeypatch.setattr(plan_mod, "simulate_rollout", no_simulation)
    r = CliRunner().invoke(app, ["rl", *MINIMAX, *extra])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert needle in msg, msg
    assert msg.startswith("error:") and msg.count("error:") == 1 and r.stdout == ""
    assert "Traceback" not in r.output and "internal error" not in r.output


def test_calibrate_refuses_an_async_depth_out_of_range():
    r = CliRunner().invoke(
        app,
        [
            "rl", "calibrate", "--log", str(ROOT / "tests" / "fixtures" / "rl_logs" / "nemo_rl_grpo_sync.log"),
            "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--rollout-gpus", "16", "--async-steps", "9",
            "--rollout-layout", "vllm:tp=2,ep=1,pp=1", "--trainer-layout", "megatron:tp=1,cp=1,ep=8,pp=1,vpp=1",
        ],
    )
    assert (
        r.exit_code == 2
        and "--async-steps 9: accepted 0..8" in " ".join(r.stderr.split())
        and "Traceback" not in r.output
    )


def test_engine_ep_of_a_dense_model_is_1():
    r = CliRunner().invoke(app, ["rl", "--model", "Qwen3-32B", "--gpus", "2x8xH100", "--engine-ep", "8"])
    assert r.exit_code == 2 and "--engine-ep 8: Qwen3-32B is dense (no experts to shard); accepted: 1" in " ".join(
        r.stderr.split()
    )


def test_the_deepest_accepted_sweep_and_good_options_still_plan():
    r = CliRunner().invoke(
        app,
        [
            "rl", *JOB, "--no-colocated", "--async-steps", "8", "--prompts-per-step", "2", "--engine-tp", "8",
            "--engine-ep", "8", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "256", "--enforce-eager", "--top",
            "1", "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [p["async_steps"] for p in d["fastest_per_async_depth"]] == list(range(9))
    assert d["plans"][0]["rollout_layout"] == "vllm:tp=8,ep=8,pp=1" and d["plans"][0]["gpu_memory_utilization"] == 0.9


@pytest.mark.real_engine
def test_a_model_aiconfigurator_has_no_data_for_names_what_it_has(tmp_path, monkeypatch):
    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path / "cache"))
    own = tmp_path / "MyMoE"
    own.mkdir()
    (own / "config.json").write_text((ROOT / "specs" / "data" / "models" / "Qwen3-30B-A3B.json").read_text())
    r = CliRunner().invoke(app, ["rl", "--model", str(own), *JOB[2:], "--top", "1"])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert (
        "--model 'MyMoE': aiconfigurator 0.12.0 has no engine data for it; supported: MiniMax-M3, MiniMax-M2, "
        "Qwen3-235B-A22B, Qwen3-30B-A3B" in msg
    )


@pytest.mark.real_engine
def test_missing_aiconfigurator_names_the_extra(tmp_path, monkeypatch):
    import rl.engine as eng

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
    assert [u for u in d["unreadable"]] == [
        "line 4: rollout_layout 'vllm:tp=zz4,ep=1,pp=1,gpu_memory_utilization=0.6,enforce_eager=0': cannot read "
        "'tp=zz4'; accepted keys: tp, ep, pp, dp, gpu_memory_utilization, enforce_eager, max_num_seqs"
    ]
    # the table form names it on stderr, the good rows still print
    r = CliRunner().invoke(app, ["rl", "validate", "--data", str(f)])
    assert (
        r.exit_code == 0
        and "not predicted: line 4: rollout_layout" in " ".join(r.stderr.split())
        and "Qwen3-30B-A3B" in r.stdout
    )


def test_calibrate_from_a_nemo_rl_log(tmp_path):
    out = tmp_path / "cal.yaml"
    r = CliRunner().invoke(
        app,
        [
            "rl", "calibrate", "--log", str(ROOT / "tests" / "fixtures" / "rl_logs" / "nemo_rl_grpo_sync.log"),
            "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--rollout-gpus", "32", "--colocated", "--rollout-layout",
            "vllm:tp=2,ep=1,pp=1", "--trainer-layout", "megatron:tp=1,cp=1,ep=8,pp=1,vpp=1", "--prompt-len", "256",
            "--response-len", "4096", "--prompts-per-step", "16", "--generations-per-prompt", "16", "--json", "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["predicted_after"]["generation_s"] == pytest.approx(d["measured"]["generation_s"], rel=1e-6)
    assert "rl_calibration" in out.read_text()
    r2 = CliRunner().invoke(app, ["rl", *JOB, "--calibration", str(out), "--json", "--top", "1"])
    assert r2.exit_code == 0 and "calibrated from" in json.loads(r2.stdout)["calibration"]


def test_fp8_generation_and_training_reach_the_recipe(tmp_path):
    import yaml

    r = CliRunner().invoke(
        app,
        [
            "rl", *JOB, "--top", "1", "--generation-precision", "fp8", "--training-precision", "fp8_blockwise",
            "--trainer-backend", "megatron", "--out", str(tmp_path),
        ],
    )
    assert r.exit_code == 0, r.output
    text = (tmp_path / "nemo_rl_grpo.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    assert cfg["policy"]["megatron_cfg"]["fp8_cfg"] == {
        "enabled": True,
        "fp8": "e4m3",
        "fp8_recipe": "blockwise",
        "fp8_param": False,
    }
    assert "fp8 weights" in text and "(fp8_blockwise)" in text  # the header says what was predicted
    r = CliRunner().invoke(app, ["rl", *JOB, "--training-precision", "fp4x"])
    assert r.exit_code == 2 and "--training-precision 'fp4x': accepted bf16, fp8" in " ".join(r.stderr.split())


@pytest.mark.parametrize("outside_first", [False, True])
def test_the_export_is_the_fastest_plan_inside_the_trainer_s_validated_scope(tmp_path, monkeypatch, outside_first):
    """The seed's job: its fastest plan is inside the trainer's validated scope (the model of 2026-12-01's last refit),
    so it is exported. With ``outside_first`` an AutoModel plan outside CP 8 x EP 128 is put first (as an earlier model
    ranked
    it): the export is still the fastest plan inside the scope, and the note says what is faster outside it."""
    import dataclasses

    import rl.cli as cli_rl

    real = cli_rl.enumerate_plans

    def reordered(*a, **k):
        ps = real(*a, **k)
        if not outside_first:
            return ps
        out = next(p for p in ps.plans if not p.trainer.in_validated_scope)
        return dataclasses.replace(ps, plans=[out, *[p for p in ps.plans if p is not out]])

    monkeypatch.setattr(cli_rl, "enumerate_plans", reordered)
    seed = [
        "--model", "MiniMax-M3", "--gpus", "32x8xH200", "--framework", "nemo-rl", "--prompt-len", "2048",
        "--response-len", "6144", "--prompts-per-step", "32", "--generations-per-prompt", "16",
    ]
    r = CliRunner().invoke(app, ["rl", *seed, "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    exported = d["exported_plan"]
    assert exported == d["recommended_plan"]  # what the terminal names first
    assert not any("outside" in n for n in exported["notes"])
    inside = [p for p in d["plans"] if not any("outside" in n for n in p["notes"])]
    assert (
        exported["predicted"]["step_time_s"] == inside[0]["predicted"]["step_time_s"]
    )  # the fastest plan inside the scope
    assert any("outside" in n for n in d["plans"][0]["notes"]) is outside_first
    if not outside_first:
        assert (
            exported["predicted"]["step_time_s"] == d["plans"][0]["predicted"]["step_time_s"]
            and d["export_note"] is None
        )
        return
    assert "validated scope" in d["export_note"] and "outside AutoModel's validated scope" in d["export_note"]


def test_no_plan_names_its_counts_and_the_first_engine_data_gap(monkeypatch):
    """A job refused for engine data names one gap whole (what the engine model lacked), counts candidates and splits
    apart."""
    from specs.errors import TunerError

    def no_data(job, shape):
        raise TunerError(
            f"aiconfigurator 0.12.0 has no bf16 sglang data for Qwen/Qwen3-30B-A3B on h100_sxm at {shape.label}: no "
            "rows"
        )

    monkeypatch.setattr(
        plan_mod.enumerate_plans, "__kwdefaults__", {**plan_mod.enumerate_plans.__kwdefaults__, "latency": no_data}
    )
    monkeypatch.setattr(plan_mod.evaluate, "__kwdefaults__", {**plan_mod.evaluate.__kwdefaults__, "latency": no_data})
    r = CliRunner().invoke(app, ["rl", *JOB, "--framework", "nemo-rl"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "no RL plan fits Qwen3-30B-A3B on 4x8xH100" in text
    assert (
        "aiconfigurator has no data for the engine shape (" in text
        and " candidates; the first: aiconfigurator 0.12.0 has no bf16 sglang data for Qwen/Qwen3-30B-A3B on h100_sxm "
        "at tp="
        in text
    )
    assert "(splits)" not in text


def test_nested_engine_errors_are_said_once():
    from rl.engine import _collapse_repeats

    assert (
        _collapse_repeats("perf database error: perf database error: no DSA rows (first: /x)")
        == "perf database error: no DSA rows (first: /x)"
    )
    assert _collapse_repeats("a: b: c") == "a: b: c"


@pytest.mark.slow
@pytest.mark.real_engine
def test_the_readmes_refused_slime_job_says_why(tmp_path, monkeypatch):
    """README: MiniMax-M3 with slime's SGLang engines is refused with the reason (aiconfigurator 0.12.0 has no SGLang
    rows
    for its attention); the message counts splits as splits and shows the first gap once, not its nested prefixes."""
    monkeypatch.setenv("MLT_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(
        app,
        [
            "rl", "--model", "MiniMax-M3", "--gpus", "32x8xH200", "--framework", "slime", "--prompt-len", "2048",
            "--response-len", "6144",
        ],
    )
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert "no RL plan fits MiniMax-M3 on 32x8xH200" in msg
    assert "the first: aiconfigurator 0.12.0 has no bf16 sglang data for MiniMaxAI/MiniMax-M3 on h200_sxm at " in msg
    assert "perf database error: perf database error" not in msg
    assert (
        re.search(r"no megatron trainer layout fits the split's trainer GPUs \(\d+ splits?\)", msg)
        and "(splits)" not in msg
    )


@pytest.mark.parametrize(
    "text,needle",
    [
        ("response_len,count\n100,nan\n", "lengths and counts must be finite numbers"),
        ("[[1, 2]]", "lengths and counts must be finite numbers"),
        ('{"lengths": [1e400]}', "lengths and counts must be finite numbers"),
        ("100\nabc\n", "entry 2 ('abc', count 1): lengths and counts must be numbers"),
    ],
)
def test_bad_response_length_histograms_are_refused(tmp_path, text, needle):
    """Each crashed with an internal error before (ValueError / OverflowError, a numpy overflow warning)."""
    f = tmp_path / ("h.json" if text.startswith(("[", "{")) else "h.csv")
    f.write_text(text)
    r = CliRunner().invoke(app, ["rl", *JOB, "--response-lengths", str(f)])
    msg = " ".join(r.stderr.split())
    assert r.exit_code == 2 and needle in msg and "internal error" not in r.output and "Warning" not in r.output, (
        r.output
    )


def test_calibrate_names_rollout_gpus_that_are_not_whole_nodes():
    r = CliRunner().invoke(
        app,
        [
            "rl", "calibrate", "--log", str(ROOT / "tests" / "fixtures" / "rl_logs" / "nemo_rl_grpo_sync.log"),
            "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--rollout-gpus", "17", "--rollout-layout",
            "vllm:tp=2,ep=1,pp=1", "--trainer-layout", "megatron:tp=1,cp=1,ep=8,pp=1,vpp=1",
        ],
    )
    msg = " ".join(r.stderr.split())
    assert (
        r.exit_code == 2
        and "--rollout-gpus 17: rollout GPUs are whole 8-GPU nodes of --gpus 4x8xH100" in msg
        and "accepted: 8, 16, 24" in msg
    ), msg


@pytest.mark.parametrize("value", ["nans", "-5.00s"])
def test_calibrate_names_a_timer_that_is_not_a_number(tmp_path, value):
    """The step with such a timer was left out without a word before (or, when every step had one, 'no step timing')."""
    src = (ROOT / "tests" / "fixtures" / "rl_logs" / "nemo_rl_grpo_sync.log").read_text()
    log = tmp_path / "bad.log"
    log.write_text(src.replace("• generation: 200.00s (66.7%)", f"• generation: {value} (66.7%)", 1))
    r = CliRunner().invoke(
        app,
        [
            "rl", "calibrate", "--log", str(log), "--model", "Qwen3-30B-A3B", "--gpus", "4x8xH100", "--rollout-gpus",
            "32", "--colocated", "--rollout-layout", "vllm:tp=2,ep=1,pp=1", "--trainer-layout",
            "megatron:tp=1,cp=1,ep=8,pp=1,vpp=1",
        ],
    )
    msg = " ".join(r.stderr.split())
    assert r.exit_code == 2 and f"line 14: timer 'generation' reads {value[:-1]!r}, not a number of seconds" in msg, (
        r.output
    )


@pytest.mark.parametrize("width", [80, 120])
def test_tune_rl_names_its_plan_first_and_fits_the_terminal(terminal, width):
    """The recommended plan comes first; the tables keep the columns that fit (no line wider, no cell cut) and a legend
    defines the ones shown."""
    fits = terminal(width)
    r = CliRunner().invoke(
        app, ["rl", *JOB, "--no-colocated", "--rollout-gpus", "16", "--async-steps", "1", "--top", "3"]
    )
    assert r.exit_code == 0, r.output
    lines = fits(r.output)
    first = next(i for i, ln in enumerate(lines) if ln.startswith("Recommended plan (predicted, #"))
    assert first < next(i for i, ln in enumerate(lines) if ln.startswith("Fastest plans"))
    head = next(ln for ln in lines if ln.lstrip().startswith("#  GPUs"))
    assert (head.split()[:5] == ["#", "GPUs", "engines", "trainer", "K"]) if width == 80 else ("logprob" in head)
    assert "GPUs: rollout+trainer GPUs" in " ".join(r.output.split()) and "docs/rl.md#reading-the-output" in r.output
