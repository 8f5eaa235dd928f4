"""The `tune` command line, end to end (CliRunner; the analytical backend; no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from launch.exporters import validate_recipe
from search_spaces.pipeline import layer_counts_from_string
from tuner.cli import app

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    """One real main job: MiniMax-M2 on 64 H200 (the seed's job), 16 trials, the front drawn (--png)."""
    d = tmp_path_factory.mktemp("results")
    r = _run(
        "--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "16", "--results-dir", str(d), "--study", "m2",
        "--verbose", "--png",
    )
    return r, d / "m2"


def test_main_job_reports_counts_front_and_files(main_run):
    r, out = main_run
    assert r.exit_code == 0, r.output
    text = r.output
    assert "Layouts considered:" in text and "break a Megatron rule" in text and "not fitting (memory interval" in text
    assert "world_div_etp_ep_pp" in text  # grouped by rule
    assert "Pareto front (predicted" in text and "Best layout (predicted" in text
    assert "model backend" in text and "(90%: " in text
    assert "--pipeline-model-parallel-layout '" in text
    for f in ("pareto.csv", "pareto.png", "recipe.yaml", "run_slime.sh", "megatron_args.sh", "study.db", "config.yaml"):
        assert (out / f).exists(), f
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_exported_recipe_is_valid_and_predicted(main_run):
    _, out = main_run
    rec = yaml.safe_load((out / "recipe.yaml").read_text())
    validate_recipe(rec)
    assert rec["status"] == "predicted" and rec["result"] is None
    assert rec["prediction"]["note"] == "predicted, not measured"
    lay = rec["layout"]
    assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == 64
    assert lay["pp"] > 1  # the seed job's best layout pipelines its 62 layers: the layout string is exported
    counts = layer_counts_from_string(lay["pipeline_model_parallel_layout"], lay["pp"], 62)
    assert sum(map(sum, counts)) == 62
    assert (
        f"--pipeline-model-parallel-layout '{lay['pipeline_model_parallel_layout']}'"
        in (out / "run_slime.sh").read_text()
    )
    # bash accepts both scripts
    for f in ("run_slime.sh", "megatron_args.sh"):
        assert subprocess.run(["bash", "-n", str(out / f)]).returncode == 0


def test_pareto_csv_rows_are_non_dominated(main_run):
    import csv

    _, out = main_run
    rows = list(csv.DictReader((out / "pareto.csv").open()))
    assert rows and all(r["source"] == "predicted" for r in rows)
    pts = [(float(r["tokens_per_s_per_gpu"]), float(r["peak_gib"])) for r in rows]
    for a in pts:
        assert not any(b[0] >= a[0] and b[1] <= a[1] and b != a for b in pts)


def test_resume_never_evaluates_a_layout_twice(main_run):
    import optuna

    r, out = main_run
    again = _run(
        "--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "12", "--results-dir", str(out.parent), "--study",
        "m2",
    )
    assert again.exit_code == 0, again.output
    st = optuna.load_study(study_name="m2", storage=f"sqlite:///{out / 'study.db'}")
    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    keys = [t.user_attrs["key"] for t in done]
    assert len(keys) == len(set(keys))
    assert len(st.trials) == 28  # 16 + 12 trials kept
    assert "pareto.png" not in again.output  # drawn (and listed) only with --png


def test_resume_with_other_inputs_is_refused(main_run):
    _, out = main_run
    r = runner.invoke(
        app, ["--model", "MiniMax-M2", "--gpus", "128xH200", "--results-dir", str(out.parent), "--study", "m2"]
    )
    assert r.exit_code == 2
    assert "already exists with" in r.output and "num_gpus=64" in r.output and "num_gpus=128" in r.output
    assert "Optuna search" not in r.output  # refused before the progress bar starts


def test_a_study_of_formulas_with_the_same_estimates_resumes(tmp_path, monkeypatch):
    """A study recorded with a formula digest listed in SAME_ESTIMATES (earlier sources whose estimates the estimate
    digest found identical) resumes under today's formulas; any other digest is refused (the test below)."""
    import cost_model.version as version

    job = ("--model", "MiniMax-M2", "--gpus", "64xH200", "--layers", "4", "--results-dir", str(tmp_path), "--study",
           "eq")
    assert _run(*job, "--trials", "2").exit_code == 0
    made_with = version.formula_digest()
    monkeypatch.setattr(version, "formula_digest", lambda: "fedcba9876543210")
    monkeypatch.setattr(version, "SAME_ESTIMATES", frozenset({made_with}))
    r = _run(*job, "--resume", "--trials", "1")
    assert r.exit_code == 0, r.output
    assert "3 layouts evaluated in total (1 now)" in r.output


def test_resume_with_another_cost_model_is_refused_and_the_study_still_reads(main_run, monkeypatch):
    """A study records the digest of the cost model's formulas; resuming it with other formulas is refused (its
    predictions would mix), while tune pareto still reads it, untouched."""
    import cost_model.version as version

    _, out = main_run

    def content() -> list[str]:  # every row of every table; the file's bytes move when SQLite checkpoints its WAL
        import sqlite3

        with sqlite3.connect(out / "study.db") as conn:
            return list(conn.iterdump())

    before = content()
    monkeypatch.setattr(version, "formula_digest", lambda: "0123456789abcdef")
    r = runner.invoke(
        app,
        [
            "--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "16", "--results-dir", str(out.parent), "--study",
            "m2",
        ],
    )
    assert r.exit_code == 2, r.output
    assert (
        "another version of the cost model" in r.output
        and "0123456789abcdef" in r.output
        and "Traceback" not in r.output
    )
    assert content() == before
    p = _run("pareto", "--study", "m2", "--results-dir", str(out.parent), "--top", "3")
    assert p.exit_code == 0 and "Pareto front (predicted;" in p.output


def test_pareto_and_export_commands(main_run, tmp_path):
    _, out = main_run
    r = _run("pareto", "--study", "m2", "--results-dir", str(out.parent), "--top", "3")
    assert r.exit_code == 0 and "Pareto front (predicted;" in r.output
    r = _run(
        "export", "--study", "m2", "--results-dir", str(out.parent), "--format", "megatron", "--out",
        str(tmp_path / "a.sh"),
    )
    assert r.exit_code == 0
    text = (tmp_path / "a.sh").read_text()
    assert text.startswith("#") and "MEGATRON_ARGS=(" in text and "--tensor-model-parallel-size" in text
    r = _run("export", "--study", "m2", "--results-dir", str(out.parent), "--format", "recipe")
    assert r.exit_code == 0
    validate_recipe(yaml.safe_load(r.stdout))
    r = runner.invoke(app, ["export", "--study", "m2", "--results-dir", str(out.parent), "--trial", "99999"])
    assert r.exit_code == 2 and "not a finished trial" in r.output


def test_estimate_json_seed_layout():
    r = _run(
        "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "8", "--vpp", "4", "--ep", "8", "--recompute",
        "full", "--first-stage-layers", "7", "--last-stage-layers", "7", "--json",
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["source"] == "predicted" and d["label"] == "TP1 PP8 VPP4 EP8 DP8"
    assert d["pipeline_model_parallel_layout"] == "Et|(tt|)*30tL"
    assert 0.8 * 2034.42 <= d["tokens_per_s_per_gpu"] <= 1.2 * 2034.42


def test_workload_flags_take_megatron_spellings_too():
    base = ("estimate", "--model", "Llama-3.1-8B", "--gpus", "8xH100", "--json")
    short = json.loads(_run(*base, "--seq-len", "4096", "--global-batch", "64").stdout)
    megatron = json.loads(_run(*base, "--seq-length", "4096", "--global-batch-size", "64").stdout)
    default = json.loads(_run(*base).stdout)
    assert short["tokens_per_s_per_gpu"] == megatron["tokens_per_s_per_gpu"] != default["tokens_per_s_per_gpu"]


def test_check_lists_every_broken_rule():
    r = runner.invoke(
        app, ["check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "32", "--pp", "3", "--ep", "7"]
    )
    assert r.exit_code == 2
    for rule in ("world_div_tp_pp_cp", "heads_div_tp", "experts_div_ep"):
        assert rule in r.output
    ok = _run(
        "check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "8", "--vpp", "4", "--ep", "8", "--recompute",
        "full", "--first-stage-layers", "7", "--last-stage-layers", "7",
    )
    assert ok.exit_code == 0 and "Et|(tt|)*30tL" in ok.output
    bad = runner.invoke(
        app,
        [
            "check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "8", "--ep", "8", "--pipeline-layout",
            "Et|(tt|)*29tL",
        ],
    )
    assert bad.exit_code == 2 and "pipeline_layout" in bad.output


def test_models_and_gpus():
    r = _run("models")
    assert r.exit_code == 0 and "MiniMax-M2" in r.output and "10.42" in r.output
    r = _run("gpus")
    assert r.exit_code == 0 and "H200" in r.output and "989" in r.output


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "NoSuchModel", "--gpus", "64xH200"], "unknown model"),
        (["--model", "MiniMax-M2x", "--gpus", "64xH200"], "Did you mean MiniMax-M2"),
        (["--model", "MiniMax-M2", "--gpus", "64xH2000"], "unknown GPU 'H2000'"),
        (["--model", "MiniMax-M2", "--gpus", "60xH200"], "not a whole number of 8-GPU nodes"),
        (["--model", "MiniMax-M2", "--gpus", "0xH200"], "at least 1"),
        (["--model", "MiniMax-M2", "--gpus", "lots"], "expected COUNTxGPU"),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "ray", "--ray-address", "127.0.0.1:1"],
            "nothing answers there",
        ),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "ray", "--ray-address", "nonsense"],
            "expected auto, HOST:PORT",
        ),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "ray", "--ray-address", ""],
            "expected auto, HOST:PORT",
        ),
        (
            [
                "--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "ray", "--ray-address",
                "h:99999999999999999999",
            ],
            "port 1-65535",
        ),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--trial-env", "A=b"], "--trial-env is for --backend ray"),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "ray", "--trial-env", "\u00c9=1"],
            "expected NAME=VALUE",
        ),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--parallel-trials", "2"],
            "--parallel-trials > 1 needs --backend ray",
        ),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--storage", "journal:"], "needs a file path"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--storage", "x"], "expected an RDB URL"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--storage", "sqlite://"], "in-memory database"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--storage", "sqlite:///:memory:"], "in-memory database"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--ray-address", "auto"], "--ray-address is for --backend ray"),
        (
            [
                "--model", "MiniMax-M2", "--gpus", "64xH200", "--parallel-trials", "2", "--backend", "command",
                "--command-template", "x.yaml",
            ],
            "--parallel-trials > 1 needs --backend ray",
        ),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--trial-env", "NOEQUALS"], "expected NAME=VALUE"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "local"], "no GPU found"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--backend", "slurm"], "unknown backend"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "0"], "--trials must be at least 1"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--seq-len", "0"], "--seq-len must be a positive integer"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--memory-headroom", "1.5"], "--memory-headroom"),
        (["--model", "MiniMax-M2", "--gpus", "8xH100"], "The fewest GPUs on which a layout of this space fits: 32"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--stack", "nemo"], "--stack 'nemo'"),
        (["--model", "MiniMax-M2"], "--gpus is required"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--study", ".."], "a study name is"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--study", "../escape"], "a study name is"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--seed", "-1"], "--seed must be"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--gpus-per-node", "0"], "--gpus-per-node must be at least 1"),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--gpus-per-node", "128"], "exceeds the 64 GPUs"),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--network-gbps", "0"],
            "--network-gbps must be a number of at least 1 and at most",
        ),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--network-gbps", "nan"],
            "--network-gbps must be a number of at least 1 and at most",
        ),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--network-gbps", "1e-310"],
            "--network-gbps must be a number of at least 1 and at most",
        ),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--network-gbps", "1e30"],
            "at most 100,000 Gb/s per node, got 1e+30",
        ),
        (["--model", "MiniMax-M2", "--gpus", "64xH200", "--usd-per-gpu-hour", "nan"], "--usd-per-gpu-hour must be"),
        (
            ["--model", "MiniMax-M2", "--gpus", "64xH200", "--network-gbps", "1e308"],
            "Gb/s per node, got 1e+308",
        ),  # "got inf" before
        (["--model", "MiniMax-M2", "--gpus", "8x0xH200"], "'8x0xH200': the GPUs per node must be at least 1"),
        (["--model", "MiniMax-M2", "--gpus", "0x8xH200"], "'0x8xH200': the node count must be at least 1"),
        (["--model", "Llama-3.1-8B", "--gpus", "8xA100", "--precision", "fp8"], "A100 has no fp8"),
        (["--model", "[/x]", "--gpus", "64xH200"], "unknown model"),
    ],
)
def test_bad_input_one_clear_message(args, needle, tmp_path):
    r = runner.invoke(app, args + ["--results-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output
    assert not any(tmp_path.iterdir()), "a rejected input must not leave a study behind"


def test_bad_results_dir_and_storage_refused_before_any_work(tmp_path):
    """A file where the results folder would go, or a storage URL of no database kind SQLAlchemy knows, is named
    before the layouts are enumerated (no layout summary printed), exit 2, nothing written."""
    blocker = tmp_path / "afile"
    blocker.write_text("keep me")
    base = ["--model", "MiniMax-M2", "--gpus", "64xH200"]
    for extra, needle in (
        (["--results-dir", str(blocker)], f"{blocker} is a file, not a folder"),
        (["--results-dir", str(blocker / "sub")], f"{blocker} is a file, not a folder"),
        (
            ["--storage", "bogus://x", "--results-dir", str(tmp_path / "r")],
            "--storage 'bogus://x': not an RDB URL SQLAlchemy can open",
        ),
    ):
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 2, r.output
        assert needle in r.output and "Traceback" not in r.output
        assert "Layouts considered" not in r.output  # refused before the enumeration
    assert blocker.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_trial_steps_and_warmup_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    args = [
        "--model", "MiniMax-M2", "--layers", "2", "--gpus", "2xH200", "--backend", "local", "--results-dir",
        str(tmp_path),
    ]
    for bad, needle in (
        (["--trial-steps", "4", "--trial-warmup-steps", "4"], "--trial-warmup-steps must be from 0 to 3"),
        (["--trial-steps", "0"], "--trial-steps must be from 1"),
    ):
        r = runner.invoke(app, args + bad)
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
    r = runner.invoke(app, [a if a != "2xH200" else "2x1xH200" for a in args])  # two nodes of one GPU
    assert r.exit_code == 2 and "runs on one machine" in r.output and "--backend ray" in r.output, r.output
    assert not any(tmp_path.iterdir())


def test_bad_files(tmp_path):
    cfg = _write(tmp_path, "config.json", json.dumps({"hidden_size": 1024, "num_attention_heads": 8}))
    r = runner.invoke(app, ["--model", cfg, "--gpus", "8xH100", "--results-dir", str(tmp_path / "r")])
    assert r.exit_code == 2 and "missing num_hidden_layers" in r.output
    space = _write(tmp_path, "space.yaml", "tp: [1, 2]\nzero_stage: [1]\n")
    r = runner.invoke(
        app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--space", space, "--results-dir", str(tmp_path / "r")]
    )
    assert r.exit_code == 2 and "zero_stage" in r.output
    cal = _write(tmp_path, "cal.yaml", "gemm_eff: 0.5\n")
    r = runner.invoke(
        app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--calibration", cal, "--results-dir", str(tmp_path / "r")]
    )
    assert r.exit_code == 2 and "unknown constants" in r.output


def test_console_script_has_no_traceback():
    p = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--model", "NoSuchModel", "--gpus", "64xH200"], capture_output=True,
        text=True, cwd=Path(__file__).resolve().parents[2],
    )
    assert p.returncode == 2
    assert "unknown model" in p.stderr and "Traceback" not in p.stderr + p.stdout
    assert len(p.stderr.strip().splitlines()) <= 3


def test_check_takes_split_from_layout_string():
    base = ["check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--ep", "8", "--recompute", "full"]
    r = _run(*base, "--pp", "8", "--pipeline-layout", "Et|(tt|)*30tL")
    assert r.exit_code == 0 and "TP1 PP8 VPP4 EP8 DP8" in r.output
    # 64 stages contradict --vpp 4
    r = runner.invoke(app, base + ["--pp", "8", "--vpp", "4", "--pipeline-layout", "E|(t|)*62L"])
    assert r.exit_code == 2 and "--vpp is 4" in r.output
    # contradicts --first/--last
    r = runner.invoke(
        app,
        base
        + ["--pp", "8", "--first-stage-layers", "8", "--last-stage-layers", "6", "--pipeline-layout", "Et|(tt|)*30tL"],
    )
    assert r.exit_code == 2 and "leave them out" in r.output
    # an even split that does not divide suggests a first/last split
    r = runner.invoke(app, base + ["--pp", "8", "--vpp", "4"])
    assert r.exit_code == 2 and "try --first-stage-layers 7 --last-stage-layers 7" in r.output


def test_check_reports_tuner_policy_as_note():
    r = _run(
        "check", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "2", "--ep", "8", "--recompute", "full",
        "--first-stage-layers", "31", "--last-stage-layers", "31",
    )
    assert r.exit_code == 0, r.output
    assert "pipeline_split_canonical" in r.output and "Megatron accepts it" in r.output


def test_estimate_error_is_not_eaten_by_markup():
    r = runner.invoke(app, ["estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "8", "--ep", "8"])
    assert r.exit_code == 2
    assert "rule pipeline_split" in r.output and "try --first-stage-layers 7 --last-stage-layers 7" in r.output


def test_dense_model_note_is_printed_whole(tmp_path):
    r = _run(
        "--model", "Llama-3.1-8B", "--gpus", "8xH100", "--trials", "4", "--results-dir", str(tmp_path), "--verbose"
    )
    assert r.exit_code == 0, r.output
    assert "collapsed to [1], [1], [alltoall]" in r.output


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--recompute", "bogus"], "--recompute 'bogus': accepted none, selective, full"),
        (["--dispatcher", "nccl"], "--dispatcher 'nccl': accepted alltoall"),
        (
            ["--recompute", "full", "--recompute-modules", "core_attn"],
            "--recompute-modules needs --recompute selective",
        ),
        (["--pipeline-layout", ""], "pipeline_layout"),
    ],
)
def test_estimate_bad_layout_flags(extra, needle):
    r = runner.invoke(app, ["estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "2", "--ep", "8"] + extra)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    "cfg,needle",
    [
        ({"num_local_experts": -8}, "non-negative"),
        (
            {"topk_method": "noaux_tc", "n_group": float("inf")},
            "n_group must be an integer, got inf",
        ),  # OverflowError before
        ({"mlp_only_layers": 5}, "mlp_only_layers must be a list of layer indices, got 5"),  # no field named before
        ({"mlp_only_layers": [[1]]}, "mlp_only_layers must be a list of layer indices"),
        ({"tuner": {"moe_layer_freq": 5}}, "tuner.moe_layer_freq must be a list of 0 / 1 per layer"),
        ({"first_k_dense_replace": -5}, "first_k_dense_replace must be >= 0"),  # accepted before
        ({"intermediate_size": 14336.7}, "intermediate_size must be an integer"),
        ({"num_key_value_heads": 64}, "must be a multiple of num_key_value_heads"),
        ({"num_experts_per_tok": 16, "num_local_experts": 8}, "exceeds num_experts"),
        ({"head_dim": "x"}, "head_dim must be an integer"),
        ({"tuner": [1, 2]}, "'tuner' section must be an object"),
        ({"text_config": "x", "hidden_size": None}, "text_config must be an object"),
        (
            {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 0},
            "needs qk_nope_head_dim (qk_head_dim) and v_head_dim > 0",
        ),
    ],
)
def test_bad_model_config_values(cfg, needle, tmp_path):
    base = {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    base.update(cfg)
    base = {k: v for k, v in base.items() if v is not None}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(base))
    r = runner.invoke(app, ["estimate", "--model", str(p), "--gpus", "8xH100"])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_a_deeply_nested_config_is_refused_cleanly(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)  # RecursionError before
    r = runner.invoke(app, ["estimate", "--model", str(p), "--gpus", "8xH100"])
    assert r.exit_code == 2 and "nested too deeply" in r.output and "Traceback" not in r.output


def test_binary_files_are_rejected_cleanly(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 4)
    for args in (
        ["--model", str(junk), "--gpus", "8xH100"],
        ["--model", "MiniMax-M2", "--gpus", "64xH200", "--space", str(junk)],
        ["--model", "MiniMax-M2", "--gpus", "64xH200", "--calibration", str(junk)],
    ):
        r = runner.invoke(app, args + ["--results-dir", str(tmp_path / "r")])
        assert r.exit_code == 2 and "Traceback" not in r.output, (args, r.output)


def test_calibration_values_are_range_checked(tmp_path):
    p = tmp_path / "cal.yaml"
    for text in (
        "gemm_efficiency: -0.5\n", "gemm_efficiency: 0\n", "hbm_efficiency: .nan\n", "moe_load_imbalance: 0.5\n",
        "gemm_generation_factor_blackwell_ultra: 1.0e-300\n", "gemm_family_factor_blackwell: 0.05\n",
    ):
        p.write_text(text)
        r = runner.invoke(
            app,
            [
                "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "2", "--ep", "8", "--calibration",
                str(p),
            ],
        )
        assert r.exit_code == 2 and "calibration" in r.output, (text, r.output)


@pytest.mark.slow
def test_equivalent_inputs_resume_the_same_study(tmp_path):
    a = _run(
        "--model", "MiniMax-M2", "--layers", "4", "--gpus", "16xH200", "--trials", "3", "--results-dir", str(tmp_path),
        "--study", "eq",
    )
    assert a.exit_code == 0, a.output
    b = _run(
        "--model", "minimax-m2", "--layers", "4", "--gpus", "2x8xH200", "--network-gbps", "3200", "--trials", "3",
        "--results-dir", str(tmp_path), "--study", "eq",
    )
    assert b.exit_code == 0, b.output


@pytest.mark.slow
def test_reports_survive_a_moved_model_config(tmp_path):
    from importlib import resources

    cfgdir = tmp_path / "MyModel"
    cfgdir.mkdir()
    cfg = cfgdir / "config.json"
    cfg.write_text(resources.files("specs").joinpath("data/models/Mixtral-8x7B.json").read_text())
    r = _run("--model", str(cfg), "--gpus", "16xH100", "--trials", "4", "--results-dir", str(tmp_path / "r"))
    assert r.exit_code == 0, r.output
    study = next((tmp_path / "r").iterdir()).name
    assert study.startswith("MyModel-")
    cfg.unlink()
    r = _run("export", "--study", study, "--results-dir", str(tmp_path / "r"), "--format", "recipe")
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["model"] == "MyModel"


# --------------------------------------------------------------------------- the error boundary (issue 13.6)


def test_debug_anywhere_shows_the_traceback_and_still_exits_2():
    args = ["estimate", "--model", "NoSuchModel", "--gpus", "64xH200"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 2 and "Traceback" not in plain.output
    assert (
        plain.stdout == ""
        and plain.stderr.count("\n") == 1
        and plain.stderr.startswith("error: --model 'NoSuchModel': unknown model")
    )
    for where in (0, 1, len(args)):  # before the sub-command, right after it, at the end
        r = runner.invoke(app, args[:where] + ["--debug"] + args[where:])
        assert r.exit_code == 2, (where, r.output)
        assert "Traceback (most recent call last)" in r.stderr and "specs.errors.TunerError" in r.stderr
        assert r.stderr.rstrip().splitlines()[-1] == plain.stderr.rstrip()  # the same red line last


def test_debug_from_the_environment(monkeypatch):
    monkeypatch.setenv("TUNE_DEBUG", "1")
    r = runner.invoke(app, ["--model", "NoSuchModel", "--gpus", "64xH200"])
    assert r.exit_code == 2 and "Traceback" in r.stderr
    monkeypatch.setenv("TUNE_DEBUG", "0")
    assert "Traceback" not in runner.invoke(app, ["--model", "NoSuchModel", "--gpus", "64xH200"]).stderr


def test_a_value_after_double_dash_is_not_taken_for_debug():
    from tuner.cli._common import _take_debug

    assert _take_debug(["a", "--debug", "--", "--debug"]) == (["a", "--", "--debug"], True)
    assert _take_debug(["a", "--", "--debug"]) == (["a", "--", "--debug"], False)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["estimate", "--tpp", "2"], "No such option: --tpp"), (["pareto", "--top", "-1"], "--top"),
        (["estimate", "--tp", "two"], "Invalid value for '--tp'"),
        (["nosuchcommand"], "No such command 'nosuchcommand'"),
    ],
)
def test_usage_errors_are_one_red_line(args, needle):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "--help" in lines[0] and "Usage:" not in r.output and "╭" not in r.output


def test_an_internal_error_is_one_line_exit_1_with_the_traceback_under_debug(monkeypatch):
    import specs

    def boom():
        raise RuntimeError("a bug")

    monkeypatch.setattr(specs, "list_gpus", boom)
    r = runner.invoke(app, ["gpus"])
    assert (
        r.exit_code == 1
        and "internal error: RuntimeError: a bug" in r.stderr
        and "--debug" in r.stderr
        and "Traceback" not in r.output
    )
    r = runner.invoke(app, ["gpus", "--debug"])
    assert r.exit_code == 1 and "Traceback" in r.stderr and "RuntimeError: a bug" in r.stderr


def test_ctrl_c_in_the_main_job_says_how_to_resume(monkeypatch, tmp_path):
    import shlex

    import tuner.study

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tuner.study, "run_study", interrupted)
    rd = tmp_path / "my results"
    args = [
        "--model", "Llama-3.1-8B", "--gpus", "8xH100", "--trials", "3", "--results-dir", str(rd), "--study", "x.y-1",
    ]
    r = runner.invoke(app, args + ["--debug"])
    assert r.exit_code == 130, r.output
    line = next(ln for ln in r.stderr.splitlines() if "to resume: " in ln)
    assert shlex.split(line.split("resume: ", 1)[1]) == [
        "tune",
        *args,
    ]  # pastes back as the same command, --debug aside
    # without --trials the same command would only show the study: the resume command adds --resume
    args = [a for a in args if a not in ("--trials", "3")]
    r = runner.invoke(app, args)
    line = next(ln for ln in r.stderr.splitlines() if "to resume: " in ln)
    assert r.exit_code == 130 and shlex.split(line.split("resume: ", 1)[1]) == ["tune", *args, "--resume"]


# --------------------------------------------------------------------------- study names, suggested commands (issue
# 18.7)


@pytest.mark.parametrize("name", ["a;rm -rf x", "../up", "-x", ""])
def test_pareto_and_export_check_study_names_as_tune_does(name, tmp_path):
    main = runner.invoke(
        app, ["--model", "MiniMax-M2", "--gpus", "64xH200", "--study", name, "--results-dir", str(tmp_path)]
    )
    for cmd in (["pareto"], ["export", "--format", "slime"], ["verify", "--reference", "tp=1"]):
        r = runner.invoke(app, [*cmd, "--study", name, "--results-dir", str(tmp_path)])
        assert r.exit_code == 2, (cmd, r.output)
        if name:
            assert (
                r.stderr == main.stderr and "a study name is 1-128 letters" in r.stderr
            )  # the same rule, the same message
        else:
            assert "--study is required" in r.stderr
    assert not any(tmp_path.iterdir())


def test_suggested_commands_are_shell_quoted_and_run_as_printed(tmp_path):
    import shlex

    rd = tmp_path / "results; dir $HOME"  # a space, a ';' and a '$' in the path
    r = _run(
        "--model", "Llama-3.1-8B", "--gpus", "8xH100", "--trials", "6", "--top", "1", "--results-dir", str(rd),
        "--study", "q",
    )
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    more = next(i for i, ln in enumerate(lines) if "more on the front" in ln)
    pareto_cmd = shlex.split(lines[more + 1])
    assert pareto_cmd == ["tune", "pareto", "--study", "q", "--results-dir", str(rd), "--top", "0"]
    again = _run(*pareto_cmd[1:])
    assert again.exit_code == 0 and "Pareto front (predicted;" in again.output
    nxt = next(i for i, ln in enumerate(lines) if ln.startswith("Next: measure"))
    trials_cmd = shlex.split(lines[nxt + 1])  # the same job with real trials and a budget
    assert trials_cmd[:5] == ["tune", "--model", "Llama-3.1-8B", "--gpus", "8xH100"] and trials_cmd[-6:-1] == [
        "--backend", "ray", "--ray-address", "auto", "--gpu-hours",
    ]
    assert trials_cmd[trials_cmd.index("--results-dir") + 1] == str(rd)
    missing = runner.invoke(app, ["pareto", "--study", "nope", "--results-dir", str(rd)])
    suggestion = missing.stderr.split("`")[1]
    assert shlex.split(suggestion)[-4:] == ["--study", "nope", "--results-dir", str(rd)]


def test_a_lora_job_says_which_exported_files_train_every_weight(tmp_path):
    """Megatron-LM's and slime's scripts have no LoRA; megatron_bridge.yaml holds the adapters; real trials (which
    would train every weight too) are not suggested."""
    r = _run("--model", "Llama-3.1-8B", "--gpus", "8xH100", "--task", "lora", "--trials", "3", "--results-dir",
             str(tmp_path), "--study", "l")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert ("note: run_slime.sh and megatron_args.sh train every weight (no LoRA there): more memory than predicted; "
            "megatron_bridge.yaml trains the adapters (peft)") in text
    assert "peft" in yaml.safe_load((tmp_path / "l" / "megatron_bridge.yaml").read_text())
    assert "--backend" not in text


def test_calibrate_records_its_command_shell_quoted(tmp_path):
    import shlex

    out = tmp_path / "cal out.yaml"
    data = tmp_path / "runs; $HOME.csv"  # the first 20 published runs: a fit of seconds, not of the whole table
    lines = (Path(__file__).parents[2] / "benchmarks/data/published_runs.csv").read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:21]))
    r = runner.invoke(app, ["calibrate", "--data", str(data), "--out", str(out), "--max-nfev", "5"])
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text())
    assert shlex.split(doc["provenance"]["command"]) == [
        "tune", "calibrate", "--data", str(data), "--out", str(out), "--max-nfev", "5",
    ]
    assert f"--calibration '{out}'" in r.stdout


# --------------------------------------------------------------------------- estimate --layers, the layout options
# (issue 13.6, 18.7)


def test_estimate_takes_layers_like_the_main_job():
    full = json.loads(_run("estimate", "--model", "MiniMax-M2", "--gpus", "4xH200", "--ep", "4", "--json").stdout)
    r = _run("estimate", "--model", "MiniMax-M2", "--gpus", "4xH200", "--ep", "4", "--layers", "4", "--json")
    assert r.exit_code == 0, r.output
    sliced = json.loads(r.stdout)
    assert sliced["label"] == full["label"] == "TP1 PP1 EP4 DP4"
    assert (
        sliced["memory_gib"]["weights"] < full["memory_gib"]["weights"] / 10
    )  # 4 of 62 layers (embedding and head kept)
    ok = _run("check", "--model", "MiniMax-M2", "--gpus", "4xH200", "--ep", "2", "--pp", "2", "--layers", "4")
    assert ok.exit_code == 0 and "MiniMax-M2[4 layers]" in ok.output and "'Ett|ttL'" in ok.output, (
        ok.output
    )  # 4 layers over PP 2
    for bad, needle in (("0", "--layers must be"), ("63", "--layers must be from 1 to 62")):
        r = runner.invoke(app, ["estimate", "--model", "MiniMax-M2", "--gpus", "4xH200", "--layers", bad])
        assert r.exit_code == 2 and needle in r.stderr, r.output


def test_estimate_and_check_share_one_declaration_of_the_layout_options():
    import dataclasses

    import typer.main

    from tuner.cli._layout import LayoutFlags

    cmd = typer.main.get_command(app)
    want = {
        f.metadata["option"].default.split("/")[0] for f in dataclasses.fields(LayoutFlags)
    }  # each field's first flag name
    for name in ("estimate", "check"):
        opts = {o for p in cmd.get_command(None, name).params for o in p.opts}
        assert want <= opts, (name, want - opts)
    assert len(want) == len(dataclasses.fields(LayoutFlags)) == 20


def test_layout_options_refuse_a_clash():
    from tuner.cli._layout import layout_options

    def bad(layout: object, tp: int = 1) -> None: ...

    def none(x: int = 1) -> None: ...

    with pytest.raises(TypeError, match="clash"):
        layout_options(bad)
    with pytest.raises(TypeError, match="needs a `layout: LayoutFlags`"):
        layout_options(none)


# --------------------------------------------------------------------------- exporters through the registry


def test_export_formats_come_from_the_registry(main_run, tmp_path, monkeypatch):
    import rl.exporters  # noqa: F401 - registers the RL formats, as `tune export` does
    from launch.exporters import ExportContext, Exporter, _registry, exporter_names, register_exporter

    _, out = main_run
    assert exporter_names() == ["recipe", "slime", "megatron", "bridge", "nemo-rl", "slime-rl"]
    r = runner.invoke(app, ["export", "--study", "m2", "--results-dir", str(out.parent), "--format", "yaml"])
    assert (
        r.exit_code == 2
        and "--format 'yaml': accepted recipe, slime, megatron, bridge, nemo-rl or slime-rl" in r.stderr
    )
    # the RL formats render `tune rl` plans: a training study's layout is refused, naming where they come from
    r = runner.invoke(app, ["export", "--study", "m2", "--results-dir", str(out.parent), "--format", "nemo-rl"])
    assert r.exit_code == 2 and "renders an RL post-training plan" in r.stderr and "tune rl" in r.stderr

    class Labels(Exporter):
        name, file_name, description, main_job = "labels", "labels.txt", "the layout's label", False

        def render(self, context: ExportContext) -> str:
            return f"{context.study}: {context.layout.label} on {context.cluster.num_gpus} GPUs\n"

    monkeypatch.setattr(_registry, "_REGISTRY", dict(_registry._REGISTRY))
    register_exporter(Labels())
    r = _run("export", "--study", "m2", "--results-dir", str(out.parent), "--format", "labels")
    assert r.exit_code == 0 and r.stdout.startswith("m2: TP") and r.stdout.endswith("on 64 GPUs\n")
    with pytest.raises(ValueError, match="already writes recipe.yaml"):
        register_exporter(type("Clash", (Labels,), {"name": "clash", "file_name": "recipe.yaml"})())


def test_export_out_writes_scripts_executable(main_run, tmp_path):
    import stat

    _, out = main_run
    for fmt, mode in (("slime", 0o755), ("megatron", 0o755)):
        f = tmp_path / f"{fmt}.sh"
        r = _run("export", "--study", "m2", "--results-dir", str(out.parent), "--format", fmt, "--out", str(f))
        assert r.exit_code == 0 and f"wrote {f}" in r.stderr
        assert stat.S_IMODE(f.stat().st_mode) == mode and f.read_text().startswith("#!/usr/bin/env bash\n")
    for name in ("run_slime.sh", "megatron_args.sh"):  # the main job's files too
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o755


def test_tune_rl_is_mounted_and_imported_only_when_used():
    code = (
        "import sys; from typer.testing import CliRunner; from tuner.cli import app; r = CliRunner().invoke(app, "
        "['models']); "
        "assert r.exit_code == 0 and 'rl.cli' not in sys.modules and 'typer.rich_utils' not in sys.modules; "
        "assert 'tuner.cli.catalogue' in sys.modules and not {'tuner.cli.estimate', 'tuner.cli.fit'} & "
        "set(sys.modules); "
        "r = CliRunner().invoke(app, ['rl', '--help']); "
        "assert r.exit_code == 0 and 'validate' in r.output and 'calibrate' in r.output and 'rl.cli' in sys.modules; "
        "assert sys.modules['typer.rich_utils'].Table.__name__ == '_FoldingHelpTable'; print('ok')"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    r = runner.invoke(app, ["rl", "validate"])  # through the root app: one line, exit 2, as every command
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_split_hint_never_suggests_a_refused_split():
    base = ["estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--pp", "2", "--ep", "8"]
    r = runner.invoke(
        app, [*base, "--first-stage-layers", "31", "--last-stage-layers", "31"]
    )  # the even split restated
    assert r.exit_code == 2 and "leave both 0" in r.output and "try --first-stage-layers" not in r.output
    r = runner.invoke(app, [*base, "--first-stage-layers", "40", "--last-stage-layers", "40"])  # too many layers
    assert r.exit_code == 2 and "rule pipeline_split" in r.output
    assert (
        "try --first-stage-layers 31 --last-stage-layers 31" not in r.output and "try --first-stage-layers" in r.output
    )


def test_split_hint_gives_up_on_far_more_virtual_stages_than_layers():
    from specs import Layout, load_model
    from tuner.cli._layout import split_hint

    m = load_model("MiniMax-M2")  # 62 layers: 2 x 10,000 virtual stages had searched for minutes before refusing
    assert split_hint(m, Layout(world_size=64, pp=2, vpp=10000, ep=8)) == ""
    assert split_hint(m, Layout(world_size=64, pp=8, vpp=4, ep=8)).startswith("; try --first-stage-layers")


def test_constants_that_overflow_the_step_are_refused_before_any_study(tmp_path, monkeypatch):
    """A finite but absurd constant (in range, so the calibration loads) that makes a step or a peak inf / nan is one
    message, exit 2, and no study is created (Optuna would refuse the nan and leave an empty study behind)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "huge.yaml").write_text("constants:\n  moe_load_imbalance: 1.0e+300\n")
    est = runner.invoke(
        app,
        [
            "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "4", "--ep",
            "8", "--recompute", "full", "--first-stage-layers", "7", "--last-stage-layers", "7", "--calibration",
            "huge.yaml",
        ],
    )
    assert est.exit_code == 2 and "non-finite step time or peak memory" in est.output and "Traceback" not in est.output
    (tmp_path / "tiny.yaml").write_text("constants:\n  cpu_adam_params_per_s_per_node: 1.0e-300\n")
    main = runner.invoke(
        app,
        [
            "--model", "MiniMax-M2", "--gpus", "64xH200", "--calibration", "tiny.yaml", "--trials", "4", "--study",
            "adam",
        ],
    )
    assert main.exit_code == 2 and "non-finite" in main.output and "--calibration" in main.output
    assert not (tmp_path / "results" / "adam").exists()


def test_an_empty_megatron_core_is_refused_by_estimate_as_by_the_main_job():
    r = runner.invoke(
        app,
        [
            "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--ep", "8",
            "--megatron-core", "",
        ],
    )
    assert r.exit_code == 2 and "--megatron-core ''" in r.output and "known: 0.13" in r.output


@pytest.mark.parametrize("width", [80, 120])
def test_main_job_fits_the_terminal_and_cuts_no_cell(tmp_path, monkeypatch, terminal, width):
    fits = terminal(width)
    monkeypatch.chdir(tmp_path)
    r = _run("--model", "MiniMax-M2", "--gpus", "64xH200", "--trials", "12", "--results-dir", "r", "--study", "w")
    assert r.exit_code == 0, r.output
    lines = fits(r.stdout)
    assert len(lines) <= 30
    head = lines[lines.index(next(ln for ln in lines if ln.startswith("trial ")))]
    assert head.split()[:3] == ["trial", "layout", "recompute"]  # the trial number first, never cut
    assert next(ln for ln in lines if ln.strip()).startswith("MiniMax-M2 on ") and "(90%: " in r.stdout
    assert any(ln.startswith("Best layout (predicted, trial ") for ln in lines[:4])


ESTIMATE = [
    "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "4", "--ep", "8", "--recompute",
    "full", "--first-stage-layers", "7", "--last-stage-layers", "7",
]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--help"], "--accumulate-allreduce-grads-in-fp32"),  # an option name is never folded
        (["rl", "--help"], "--gpu-memory-utilization"),
        (["estimate", *ESTIMATE], "dispatcher_buffers"),
        (["check", *ESTIMATE], "valid"),
        (["models"], "Qwen3-235B-A22B"),
        (["gpus"], "GB300"),
        (["validate", "--data", "cost_model/data/seed_runs.csv"], "TP1 PP8 VPP4 EP8 DP8"),
        (["validate", "--trials", "tests/fixtures/h200_te_call12/sweep.jsonl"], "mm-fp8-tensorwise"),
    ],
    ids=["help", "rl-help", "estimate", "check", "models", "gpus", "validate", "validate-trials"],
)
def test_each_command_fits_the_terminal_and_cuts_no_cell(terminal, monkeypatch, width, args, needle):
    """At 80 and 120 columns no line is wider and no cell is cut; what a narrow terminal leaves out is in --json."""
    fits = terminal(width)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    r = runner.invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    fits(r.output, padded="--help" in args)
    assert needle in r.output


@pytest.mark.parametrize("width", [80, 120])
def test_pareto_fits_the_terminal_and_cuts_no_cell(main_run, terminal, width):
    fits = terminal(width)
    _, study = main_run
    r = _run("pareto", "--study", "m2", "--results-dir", str(study.parent))
    assert r.exit_code == 0, r.output
    lines = fits(r.output)
    assert any(ln.split()[:3] == ["trial", "layout", "recompute"] for ln in lines)


def test_the_pareto_table_names_recompute_in_one_short_word():
    from tuner.cli._front import _short_recompute

    assert _short_recompute("selective moe_act+layernorm+core_attn") == "act+ln+attn"
    assert _short_recompute("selective mlp") == "mlp"
    assert [_short_recompute(x) for x in ("full uniform 1", "full block 2", "none")] == ["full u1", "full b2", "none"]


def test_the_pareto_table_always_shows_the_best_layout():
    from tuner.cli._front import table_rows

    front = [{"trial": t} for t in (5, 6, 7, 8, 3, 9)]
    assert [r["trial"] for r in table_rows(front, 3, keep=3)] == [5, 6, 3]
    assert [r["trial"] for r in table_rows(front, 3, keep=6)] == [5, 6, 7]
    assert [r["trial"] for r in table_rows(front, 3, keep=42)] == [5, 6, 7]
    assert table_rows(front, 0, keep=3) == front


def test_an_error_wraps_at_the_terminal_under_its_first_word(terminal):
    fits = terminal(80)
    r = runner.invoke(app, ["--model", "Foo", "--gpus", "64xH200"])
    assert r.exit_code == 2
    first, *rest = fits(r.output)
    assert first.startswith("error: --model 'Foo': unknown model.") and rest
    assert all(ln.startswith(" " * 7) and ln[7] != " " for ln in rest)


def test_front_rows_that_differ_only_in_dispatcher_or_offload_say_so(capsys):
    """Two layouts of one label and recompute are told apart: the row whose dispatcher or offload is not the best's
    names it under its layout."""
    from tuner.cli._front import print_front

    row = {"trial": 0, "label": "TP4 PP8 EP8 DP2", "recompute": "full uniform 1", "micro_batch_size": 2,
           "tokens_per_s_per_gpu": 1800.0, "peak_gib": 62.1, "dispatcher": "flex+deepep", "offload": "none"}
    front = [row, {**row, "trial": 1, "tokens_per_s_per_gpu": 1728.0, "dispatcher": "alltoall"},
             {**row, "trial": 2, "tokens_per_s_per_gpu": 965.0, "offload": "optimizer 0.5"}]
    print_front(front, 0, "front", best_trial=0)
    lines = capsys.readouterr().out.splitlines()
    at = {int(line.split()[0]): i for i, line in enumerate(lines) if line.split() and line.split()[0].isdigit()}
    assert lines[at[0] + 1].split()[0] == "1"  # the best: nothing under it
    assert lines[at[1] + 1].strip() == "alltoall"
    assert lines[at[2] + 1].strip() == "offload 0.5"
    print_front(front, 3, "front", best_trial=0)  # 3 lines at most: the tagged row that does not fit goes
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[2:5]] == ["0", "1", "alltoall"] and "1 more on the front:" in lines


def test_an_exported_script_read_back_has_no_overrides(main_run):
    """The model preset's own launch arguments (MiniMax-M2's --no-rope-fusion, --moe-permute-fusion), which every
    export carries, are not the launch's run-flag choices: `tune --from` on the exported run_slime.sh says so."""
    _, out = main_run
    r = _run("--from", str(out / "run_slime.sh"), "--gpus", "H200", "--results-dir", str(out.parent), "--study",
             "m2-read-back", "--trials", "2")
    assert r.exit_code == 0, r.output
    assert "overrides: none" in r.output
