"""cost_model.fidelity.known_gaps: the measured gaps are printed beside the predictions they apply to, and only
there."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cost_model.fidelity import known_gaps
from specs import Layout
from tuner.cli import app


def test_gaps_apply_to_offload_and_heavy_recompute_only():
    plain = Layout(world_size=8)
    assert known_gaps(plain) == []
    assert known_gaps(Layout(world_size=8, recompute_granularity="selective", recompute_modules=("core_attn",))) == []
    off = known_gaps(Layout(world_size=8, optimizer_offload_fraction=0.5))
    assert len(off) == 1 and "14-25% too short" in off[0] and "at DP 8" in off[0] and "unsharded" in off[0]
    one = known_gaps(Layout(world_size=8, tp=8, optimizer_offload_fraction=0.5))
    assert "14-25% too short" in one[0] and "unsharded" not in one[0]  # DP 1: no first-optimizer clause
    full = known_gaps(
        Layout(world_size=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    )
    assert (
        len(full) == 1
        and "0.93-1.24x" in full[0]
        and "decoder alone" in full[0]
        and "0.8-2.3x" in full[0]
        and "host-bound" in full[0]
    )
    assert len(known_gaps(Layout(world_size=8, recompute_granularity="selective", recompute_modules=("moe",)))) == 1
    ln = known_gaps(
        Layout(world_size=8, recompute_granularity="selective", recompute_modules=("core_attn", "layernorm"))
    )
    assert len(ln) == 1 and ln[0].startswith("recompute 'layernorm'") and "0.1 ms predicted" in ln[0]


def test_recompute_notes_follow_the_model_kind():
    from specs import load_model

    full = Layout(world_size=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    ln = Layout(world_size=8, recompute_granularity="selective", recompute_modules=("layernorm",))
    dense = load_model("Llama-3.1-8B")
    assert known_gaps(full, dense) == [] and known_gaps(ln, dense) == []  # measured 1.17x on a dense layer: within 20%
    moe = load_model("Qwen3-30B-A3B")
    assert [g.split(":")[0] for g in known_gaps(full, moe)] == ["recompute"]
    assert [g.split(":")[0] for g in known_gaps(ln, moe)] == ["recompute 'layernorm'"]


def test_estimate_json_and_text_carry_the_gaps():
    args = [
        "estimate", "--model", "MiniMax-M2", "--gpus", "64xH200", "--tp", "1", "--pp", "8", "--vpp", "4", "--ep", "8",
        "--recompute", "full", "--first-stage-layers", "7", "--last-stage-layers", "7",
    ]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    assert any("recompute" in g for g in json.loads(r.output)["known_gaps"])
    t = CliRunner().invoke(app, args)
    assert (
        t.exit_code == 0 and "note: recompute of MoE layers" in t.output and "docs/known_gaps.md#recompute" in t.output
    )


@pytest.mark.slow
def test_main_job_prints_the_gap_of_its_best_layout(tmp_path):
    space = tmp_path / "full.yaml"
    space.write_text(
        "tp: [1, 2]\npp: [1]\nvpp: [1]\ncp: [1]\nep: [8]\netp: [1]\nmicro_batch_size: [1]\n"
        "recompute:\n  - {granularity: full, method: uniform, num_layers: [1]}\noptimizer_offload_fraction: [0.0]\n"
        "dispatcher: [alltoall]\npipeline_split: {even: true, max_stage_deficit: 0}\n"
    )
    r = CliRunner().invoke(
        app,
        [
            "--model", "Qwen3-30B-A3B", "--gpus", "8xH100", "--global-batch", "16", "--space", str(space), "--stack",
            "megatron", "--trials", "2", "--results-dir", str(tmp_path), "--study", "full",
        ],
    )
    assert r.exit_code == 0, r.output
    best = r.output[r.output.index("Best layout") :]
    assert "note: recompute of MoE layers" in best


def test_gpt_oss_features_gap_only_for_gpt_oss():
    from specs import load_model

    plain = Layout(world_size=8)
    assert (
        len(known_gaps(plain, load_model("GPT-OSS-120B"))) == 1
        and "GPT-OSS" in known_gaps(plain, load_model("GPT-OSS-120B"))[0]
    )
    assert known_gaps(plain, load_model("Qwen3-30B-A3B")) == []
    # the sinks are priced: a model with sinks but SwiGLU gets no note
    assert (
        known_gaps(
            plain,
            load_model("GPT-OSS-120B").replace(
                activation_func="silu", activation_func_clamp_value=0.0, glu_linear_offset=0.0
            ),
        )
        == []
    )


def test_mla_gap_only_for_mla_models():
    from specs import load_model

    plain = Layout(world_size=8)
    ds = known_gaps(plain, load_model("DeepSeek-V3"))
    assert len(ds) == 1 and ds[0].startswith("MLA:") and "against 63.9 ms predicted" in ds[0] and "128 heads" in ds[0]
    assert known_gaps(plain, load_model("MiniMax-M2")) == []


def test_blackwell_ultra_gets_a_note_with_the_factor_it_was_priced_with():
    from cost_model.calibration import DEFAULT_CALIBRATION
    from specs import load_gpu

    lay = Layout(world_size=8)
    assert known_gaps(lay, None, load_gpu("B200")) == [] and known_gaps(lay, None, load_gpu("H200")) == []
    (note,) = known_gaps(lay, None, load_gpu("GB300"))
    assert (
        note.startswith("GB300 (Blackwell Ultra)")
        and f"{DEFAULT_CALIBRATION.gemm_generation_factor_blackwell_ultra:.2f}x" in note
    )
    (mine,) = known_gaps(
        lay, None, load_gpu("B300"), DEFAULT_CALIBRATION.replace(gemm_generation_factor_blackwell_ultra=1.5)
    )
    assert "1.50x Blackwell's" in mine


def test_the_offload_and_recompute_notes_quote_the_recorded_rows_under_the_shipped_calibration():
    """The figures the notes print are what the recorded H200 rows give now: the offload steps' errors
    (``tune validate --trials`` on call16 / call17) and the sixth and seventh batches' recompute ratios."""
    import json
    from pathlib import Path

    from tuner.validate_trials import predict_trials, read_trials

    res = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-01"
    rows, _ = read_trials([res / "call16" / "sweep.jsonl", res / "call17" / "sweep.jsonl"])
    err = {p.row.label: p.step_error for p in predict_trials(rows) if p.row.label.startswith("mm-offload")}
    note = known_gaps(Layout(world_size=8, optimizer_offload_fraction=0.5))[0]
    assert f"{err['mm-offload-0.5'] * 100:+.1f}% / {err['mm-offload-1.0'] * 100:+.1f}% at offload 0.5 / 1.0" in note
    assert f"{-err['mm-offload-0.5'] * 100:.0f}-{-err['mm-offload-1.0'] * 100:.0f}% too short" in note
    ratios: dict[str, list[float]] = {"mm": [], "qw": []}
    for call in ("call23", "call24"):
        for r in json.loads((res / call / "compare.json").read_text())["rows"]:
            if r["slice"] in ratios and r["variant"] in ("full", "sel-moe"):
                ratios[r["slice"]].append(r["extra_measured_over_predicted"])
    full = known_gaps(
        Layout(world_size=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    )[0]
    assert f"{min(ratios['mm']):.2f}-{max(ratios['mm']):.2f}x the predicted extra time on MiniMax-M2" in full
    assert f"{min(ratios['qw']):.2f}-{max(ratios['qw']):.2f}x on Qwen3-30B-A3B" in full
