"""benchmarks/h200_recompute.py: its variants build harness specs here (no GPU), and ``--compare`` turns the device's
rows into measured-versus-predicted recompute figures (medians over rounds, against the slice's base)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import h200_recompute as hr


def test_every_variant_builds_a_te_spec_with_its_recompute_fields():
    for sid, (_, _, modules, _) in hr.SLICES.items():
        vs = hr.variants(modules)
        assert vs[0] == ("base", {}) and [n for n, _ in vs[1:]] == ["full", *[f"sel-{m}" for m in modules]]
        for name, rec in vs:
            spec = hr._spec(sid, rec)
            assert spec.use_transformer_engine and spec.global_batch_size == 1 and spec.layout["micro_batch_size"] == 1
            want = {"base": "none", "full": "full"}.get(name, "selective")
            assert spec.layout["recompute_granularity"] == want
            if want == "selective":
                assert spec.layout["recompute_modules"] == [name.removeprefix("sel-")]


def _row(variant: str, rnd: int, fwd_bwd: float, saved: float, rec: dict | None = None) -> dict:
    return {
        "slice": "mm",
        "variant": variant,
        "round": rnd,
        "recompute": rec or {},
        "fwd_bwd_s": fwd_bwd,
        "fwd_s": 0.025,
        "fwd_nograd_s": 0.02,
        "saved_bytes": saved,
        "peak_extra_bytes": saved + 1e9,
    }


def test_compare_takes_medians_over_rounds_and_differences_against_base(tmp_path):
    full = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    lines = [
        _row("base", 0, 0.080, 3.0 * 2**30),
        _row("base", 1, 0.078, 3.0 * 2**30),
        _row("base", 2, 0.090, 3.0 * 2**30),
        _row("full", 0, 0.102, 1.0 * 2**30, full),
        _row("full", 1, 0.100, 1.0 * 2**30, full),
        {"event": "versions", "torch": "x"},
    ]
    f = tmp_path / "recompute.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = hr.compare([str(f)])
    (row,) = out["rows"]
    assert row["variant"] == "full" and row["rounds"] == 2
    assert row["base_fwd_bwd_s"] == pytest.approx(0.080)  # median of 0.078, 0.080, 0.090
    assert row["extra_s"] == pytest.approx(0.101 - 0.080)
    assert row["extra_spread_s"] == pytest.approx(0.002)
    assert row["stash_saved_gib"] == pytest.approx(2.0)
    # the model: full recompute of a MiniMax-M2 layer re-runs its forward, tens of ms on an H200, and frees most of its
    # stash
    assert 0.005 < row["predicted_extra_s"] < 0.1
    assert row["extra_measured_over_predicted"] == pytest.approx(row["extra_s"] / row["predicted_extra_s"], rel=1e-2)
    assert 0.5 < row["predicted_stash_saved_gib"] < 5
    s = out["slices"]["mm"]
    assert s["fwd_bwd_s"] == pytest.approx(0.080) and 0.02 < s["predicted_layers_fwd_bwd_s"] < 0.3
    assert s["error"] == pytest.approx(s["predicted_layers_fwd_bwd_s"] / 0.080 - 1, abs=1e-3)


def test_compare_refuses_variants_without_a_base(tmp_path):
    """A variant is measured against its slice's base: without one there is nothing to compare (an error, not an empty
    comparison)."""
    f = tmp_path / "r.jsonl"
    f.write_text(
        json.dumps(_row("sel-moe", 0, 0.1, 1e9, {"recompute_granularity": "selective", "recompute_modules": ["moe"]}))
        + "\n"
    )
    with pytest.raises(ValueError, match="slice mm has no base row"):
        hr.compare([str(f)])


_FULL = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json\n", "line 1: not JSON"),
        ("[1, 2]\n", "line 1: not a JSON object"),
        (json.dumps({"slice": "zz", "variant": "base", "fwd_bwd_s": 0.1}) + "\n", "line 1: slice 'zz' is not one of"),
        (json.dumps({**_row("base", 0, 0.1, 1e9), "slice": ["mm"]}) + "\n", "line 1: slice"),
        (json.dumps({**_row("base", 0, 0.1, 1e9), "fwd_s": "fast"}) + "\n", "line 1: fwd_s must be finite"),
        (
            json.dumps(_row("base", 0, 0.1, 1e9)).replace('"fwd_s": 0.025', '"fwd_s": NaN') + "\n",
            "fwd_s must be finite",
        ),
        (json.dumps({**_row("base", 0, 0.1, 1e9), "fwd_s": 0}) + "\n", "fwd_s must be finite numbers \\(timings > 0 s"),
        (json.dumps({**_row("base", 0, 0.1, 1e9), "saved_bytes": 10**400}) + "\n", "saved_bytes must be finite"),
        (
            json.dumps({**_row("base", 0, 0.1, 1e9), "peak_extra_bytes": float("inf")}).replace("Infinity", "1e999")
            + "\n",
            "peak_extra_bytes must be finite",
        ),
        (json.dumps(_row("sel-bogus", 0, 0.1, 1e9)) + "\n", "variant 'sel-bogus' is not one of slice mm's"),
        (
            json.dumps(_row("full", 0, 0.1, 1e9, {**_FULL, "recompute_num_layers": "1"})) + "\n",
            "variant full of slice mm has recompute",
        ),
        (json.dumps(_row("base", 0, 0.1, 1e9, _FULL)) + "\n", "variant base of slice mm has recompute {}"),
        (json.dumps({**_row("base", 0, 0.1, 1e9), "round": [0]}) + "\n", "round must be a whole number"),
        (
            json.dumps({**_row("base", 0, 0.1, 1e9), "apply_rope_fusion": "false"}) + "\n",
            "apply_rope_fusion must be true or false",
        ),
        (
            json.dumps(_row("base", 0, 0.1, 1e9)) + "\n" + json.dumps(_row("base", 0, 0.1, 1e9)) + "\n",
            "line 2: a second row of mm base round 0",
        ),
    ],
)
def test_compare_names_the_line_it_cannot_read(tmp_path, text, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        hr.compare([str(f)])
    with pytest.raises(ValueError, match="cannot read it"):
        hr.compare([str(tmp_path / "missing.jsonl")])


def test_compare_refuses_rows_of_both_rope_settings(tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text(
        json.dumps(_row("base", 0, 0.08, 3e9))
        + "\n"
        + json.dumps({**_row("base", 1, 0.07, 3e9), "apply_rope_fusion": True})
        + "\n"
    )
    with pytest.raises(ValueError, match="ROPE_FUSION"):
        hr.compare([str(f)])


def test_the_recorded_device_rows_are_read_whole():
    f = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-01" / "call23" / "recompute.jsonl"
    out = hr.compare([str(f)])
    assert len(out["rows"]) == 15 and sorted(out["slices"]) == ["ds", "mm", "qw"]
    # measured side (independent of the model): docs/measurements.md, "Sixth batch"
    assert out["slices"]["ds"]["fwd_bwd_s"] == pytest.approx(0.0768, abs=1e-4)
    ds_full = next(r for r in out["rows"] if (r["slice"], r["variant"]) == ("ds", "full"))
    assert ds_full["extra_s"] == pytest.approx(0.0241, abs=2e-4) and ds_full["stash_saved_gib"] == pytest.approx(
        3.056, abs=2e-3
    )


@pytest.mark.parametrize(
    "call, rows, compared",
    [
        ("call23", "recompute.jsonl", "compare.json"),
        ("call24", "recompute.jsonl", "compare.json"),
        ("call24", "recompute_rope.jsonl", "compare_rope.json"),
    ],
)
def test_the_recorded_comparison_is_what_compare_gives(call, rows, compared):
    """``call23/compare.json`` and ``call24/compare*.json`` (quoted in docs/measurements.md, "Sixth batch" and "Seventh
    batch") are the comparisons of the recorded rows under the shipped cost model: a change of either the comparison or
    the model shows here (re-make the files and the figures in the docs then:
    ``python benchmarks/h200_recompute.py --compare .../recompute.jsonl > .../compare.json``)."""
    d = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-01" / call
    # the figures are rounded as written (5 decimals for seconds, 3 for GiB and ratios)
    assert json.loads(json.dumps(hr.compare([str(d / rows)]))) == json.loads((d / compared).read_text())


def test_the_fused_rows_are_predicted_with_fused_rope():
    """The rows of ``ROPE_FUSION=1`` are predicted with ``apply_rope_fusion`` on: the MLA layer's predicted time is the
    unfused one less the measured unfused-RoPE cost (5.23 ms per layer at 8,192 tokens; docs/measurements.md)."""
    d = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-01" / "call24"
    unfused, fused = hr.compare([str(d / "recompute.jsonl")]), hr.compare([str(d / "recompute_rope.jsonl")])
    gap = unfused["slices"]["ds"]["predicted_layers_fwd_bwd_s"] - fused["slices"]["ds"]["predicted_layers_fwd_bwd_s"]
    assert gap == pytest.approx(0.00523, abs=2e-5)
    measured = unfused["slices"]["ds"]["fwd_bwd_s"] - fused["slices"]["ds"]["fwd_bwd_s"]
    assert measured == pytest.approx(0.00523, abs=1e-5)  # what the constant was set from (medians of 3 rounds)


def test_a_file_without_measured_rows_is_refused(tmp_path):
    """The profile rows (``PROFILE=1``) or only events compare nothing: one error, not an empty comparison."""
    f = tmp_path / "profile.jsonl"
    f.write_text(
        json.dumps({"event": "profile", "slice": "ds", "variant": "base", "kernels": []})
        + "\n"
        + json.dumps({"event": "versions", "torch": "x"})
        + "\n"
    )
    with pytest.raises(ValueError, match="no measured rows"):
        hr.compare([str(f)])


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("seq_length", 4096, "seq_length 4096"), ("micro_batch_size", 2, "micro_batch_size 2"),
        ("model", "MiniMax-M2[2 layers]", "model 'MiniMax-M2[2 layers]'"), ("precision", "fp8", "precision 'fp8'"),
    ],
)
def test_a_row_of_another_workload_is_refused(tmp_path, field, value, needle):
    """The model is asked about this benchmark's workload (8,192 tokens, micro-batch 1, bf16, the slice's layers): a row
    that says otherwise would be compared against the wrong prediction."""
    f = tmp_path / "r.jsonl"
    f.write_text(
        json.dumps(_row("base", 0, 0.08, 3e9)) + "\n" + json.dumps({**_row("base", 1, 0.08, 3e9), field: value}) + "\n"
    )
    with pytest.raises(ValueError, match=re.escape(f"line 2: {needle}")):
        hr.compare([str(f)])


@pytest.mark.parametrize(
    "rows, profile, compared",
    [
        ("recompute.jsonl", None, "compare.json"), ("recompute.jsonl", "profile.jsonl", "compare_kernels.json"),
        ("recompute_rope.jsonl", None, "compare_rope.json"),
        ("recompute_rope.jsonl", "profile_rope.jsonl", "compare_kernels_rope.json"),
    ],
)
def test_the_tenth_batch_comparison_is_what_compare_gives(rows, profile, compared):
    """``h200_te_2026-12-02/call32`` (``PROFILE=all``, quoted in docs/measurements.md, "Tenth batch"): by CUDA events
    and
    by the kernels' total under the shipped cost model."""
    d = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-02" / "call32"
    got = hr.compare([str(d / rows)], [str(d / profile)] if profile else None)
    assert json.loads(json.dumps(got)) == json.loads((d / compared).read_text())
    if profile:
        assert got["timing"] == "kernels"
        ev = hr.compare([str(d / rows)])
        # the kernels' total replaced the event time: the host-bound MoE slices' GPU work is far below their event time
        if "mm" in got["slices"]:
            assert got["slices"]["mm"]["fwd_bwd_s"] < 0.8 * ev["slices"]["mm"]["fwd_bwd_s"]
        assert got["slices"]["ds"]["fwd_bwd_s"] == pytest.approx(ev["slices"]["ds"]["fwd_bwd_s"], rel=0.03)  # GPU-bound


def test_kernels_needs_profile_rows_of_every_measured_row(tmp_path):
    d = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-02" / "call32"
    rows = d / "recompute.jsonl"
    prof = [json.loads(ln) for ln in (d / "profile.jsonl").read_text().splitlines() if ln.strip()]
    short = tmp_path / "profile.jsonl"
    short.write_text("\n".join(json.dumps(p) for p in prof[1:]) + "\n")
    with pytest.raises(ValueError, match="no profile row of"):
        hr.compare([str(rows)], [str(short)])
    no_round = tmp_path / "p1.jsonl"
    no_round.write_text(json.dumps({k: v for k, v in prof[0].items() if k != "round"}) + "\n")
    with pytest.raises(ValueError, match="no round"):
        hr.compare([str(rows)], [str(no_round)])
    twice = tmp_path / "p2.jsonl"
    twice.write_text(json.dumps(prof[0]) + "\n" + json.dumps(prof[0]) + "\n")
    with pytest.raises(ValueError, match="a second profile row"):
        hr.compare([str(rows)], [str(twice)])
    with pytest.raises(ValueError, match="not a profile row"):
        hr.compare([str(rows)], [str(rows)])


def test_the_printed_notes_quote_the_tenth_batch():
    """The recompute notes printed beside MoE layouts quote ``call32/compare_kernels.json``."""
    from cost_model.fidelity import known_gaps
    from specs import Layout, load_model

    d = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-02" / "call32"
    rows = {(r["slice"], r["variant"]): r for r in json.loads((d / "compare_kernels.json").read_text())["rows"]}
    heavy = [rows[(s, v)]["extra_measured_over_predicted"] for s in ("mm", "qw") for v in ("full", "sel-moe")]
    moe = load_model("Qwen3-30B-A3B")
    full = known_gaps(
        Layout(world_size=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1), moe
    )
    assert f"{min(heavy):.2f}-{max(heavy):.2f}x the predicted extra" in full[0]
    ln = known_gaps(Layout(world_size=8, recompute_granularity="selective", recompute_modules=("layernorm",)), moe)
    mm, qw = rows[("mm", "sel-layernorm")]["extra_s"] * 1e3, rows[("qw", "sel-layernorm")]["extra_s"] * 1e3
    assert f"{mm:+.1f} and {qw:+.1f} ms" in ln[0]


def test_kernels_rows_are_checked_field_by_field(tmp_path):
    d = Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-02" / "call32"
    rows = d / "recompute.jsonl"
    prof = [json.loads(ln) for ln in (d / "profile.jsonl").read_text().splitlines() if ln.strip()]
    for field, value, message in (
        ("variant", ["full"], "is not one this benchmark runs"), ("round", "0", "round must be a whole"),
        ("round", -1, "round must be a whole"), ("apply_rope_fusion", "no", "must be true or false"),
    ):
        f = tmp_path / "p.jsonl"
        f.write_text(json.dumps({**prof[0], field: value}) + "\n")
        with pytest.raises(ValueError, match=message):
            hr.compare([str(rows)], [str(f)])
    # the two RoPE runs in one comparison: named as such, not as a duplicate row
    with pytest.raises(ValueError, match="mix runs with and without ROPE_FUSION"):
        hr.compare([str(rows), str(d / "recompute_rope.jsonl")])
    with pytest.raises(ValueError, match="mix runs with and without ROPE_FUSION"):
        hr.compare([str(rows)], [str(d / "profile.jsonl"), str(d / "profile_rope.jsonl")])
