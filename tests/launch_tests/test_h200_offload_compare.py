"""benchmarks/h200_cpu_adam.py and h200_offload.py: the offload primitives' figures printed in the offload note are what
``--compare`` derives from the recorded device rows (``benchmarks/results/h200_te_2026-12-02/call30``, ``call31``), the
primitives' sum is judged against the optimizer's step and a whole step, and bad rows get one message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import h200_cpu_adam as hca
from benchmarks import h200_offload as ho
from cost_model.fidelity import known_gaps
from specs import Layout
from specs.errors import TunerError

ROOT = Path(__file__).parents[2] / "benchmarks" / "results"
CPU_ADAM = ROOT / "h200_te_2026-12-02" / "call30" / "cpu_adam.jsonl"
OFFLOAD = ROOT / "h200_te_2026-12-02" / "call31" / "offload.jsonl"
STEPS = [ROOT / "h200_te_2026-12-01" / "call16" / "sweep.jsonl", ROOT / "h200_te_2026-12-01" / "call17" / "sweep.jsonl"]


@pytest.fixture(scope="module")
def res() -> dict:
    return ho.compare(OFFLOAD, CPU_ADAM, STEPS)


def test_the_note_quotes_the_recorded_rows(res):
    note = known_gaps(Layout(world_size=8, tp=8, optimizer_offload_fraction=1.0))[0]
    rate = res["fused_adamw_params_per_s"]
    assert f"{rate[1] / 1e9:.2f} G parameters/s on one thread" in note and f"{rate[16] / 1e9:.1f} G on 16" in note
    assert f"{res['pageable_h2d_bytes_per_s'] / 1e9:.1f} GB/s" in note
    alone = {r["case"]: r for r in res["optimizer_alone"]}
    assert (
        f"{alone['bf16-1.0-default']['measured_s']:.2f} s against {alone['fp32-1.0-default']['measured_s']:.2f} s"
        in note
    )
    assert f"{res['seed_reference_what_if']['primitives_error'] * 100:.0f}% too fast" in note
    # without the precision-aware optimizer the masters stay pinned: no pageable clause
    plain = known_gaps(Layout(world_size=8, tp=8, optimizer_offload_fraction=1.0, use_precision_aware_optimizer=False))[
        0
    ]
    assert "pageable" not in plain and "one thread" in plain


def test_the_primitives_explain_the_optimizer_step(res):
    alone = {r["case"]: r["ratio"] for r in res["optimizer_alone"]}
    assert set(alone) == {"bf16-1.0-default", "fp32-1.0-default", "bf16-0.5-default", "bf16-1.0-1", "fp32-1.0-1"}
    # on one thread and with the pageable copy the sum is within 14%; fp32 on 16 threads is where it falls short
    assert all(0.9 < v < 1.14 for k, v in alone.items() if k != "fp32-1.0-default")
    assert alone["fp32-1.0-default"] > 1.3
    whole = [r for r in res["whole_steps"] if "ratio" in r]
    assert [r["case"] for r in whole] == ["mm-offload-0.5"] and 0.85 < whole[0]["ratio"] < 0.95


def test_the_reference_what_if_uses_the_models_offloaded_parameters(res):
    w = res["seed_reference_what_if"]
    assert 3.4e9 < w["offloaded_params_per_gpu"] < 3.8e9  # 31 layers x 32 experts / EDP 4 + a 16th of the dense part
    assert (
        w["primitives_offload_s"] < w["model_offload_s"]
        and w["primitives_tokens_per_s_per_gpu"] > w["model_tokens_per_s_per_gpu"]
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_bad_files_get_one_message(tmp_path, capsys):
    bad = _write(tmp_path / "x.jsonl", [{"kind": "host"}, "not json"])
    assert hca.main(["--compare", str(bad)]) == 2 and "line 2: not JSON" in capsys.readouterr().err
    _write(bad, [{"kind": "host"}, {"kind": "adam", "fused": True}])
    assert (
        hca.main(["--compare", str(bad)]) == 2
        and "line 2: threads must be a whole number >= 1" in capsys.readouterr().err
    )
    assert ho.main(["--compare", str(OFFLOAD)]) == 2 and "--primitives" in capsys.readouterr().err
    assert ho.main(["--primitives", str(CPU_ADAM)]) == 2 and "go with --compare" in capsys.readouterr().err
    assert ho.main(["--compare", str(bad), "--primitives", str(CPU_ADAM)]) == 2
    assert "kind must be one of copy, hdo" in capsys.readouterr().err
    with pytest.raises(TunerError, match="cannot read it"):
        ho.compare(tmp_path / "missing.jsonl", CPU_ADAM, [])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("params_per_s", float("inf"), "params_per_s must be a finite number > 0"),
        ("params_per_s", 0, "params_per_s must be a finite number > 0"),
        ("threads", 1e400, "threads must be a whole number >= 1"),
        ("threads", True, "threads must be a whole number >= 1"),
        ("threads", 1.7, "threads must be a whole number >= 1"), ("fused", "yes", "fused must be true or false"),
    ],
)
def test_bad_primitive_rows_are_refused(tmp_path, field, value, message):
    rows = _lines(CPU_ADAM)
    i = next(k for k, r in enumerate(rows) if r["kind"] == "adam")
    rows[i][field] = value
    with pytest.raises(TunerError, match=message):
        hca.compare(_write(tmp_path / "c.jsonl", rows))
    rows = _lines(CPU_ADAM)
    rows.append([1])
    with pytest.raises(TunerError, match="not a JSON object"):
        hca.compare(_write(tmp_path / "c.jsonl", rows))
    rows = _lines(CPU_ADAM)
    rows.append(rows[1])
    with pytest.raises(TunerError, match="a second fused 'adam' row"):
        hca.compare(_write(tmp_path / "c.jsonl", rows))
    rows = _lines(CPU_ADAM)
    next(r for r in rows if r["kind"] == "adam_procs" and r["processes"] == 8)["median_per_process_params_per_s"] = 0
    with pytest.raises(TunerError, match="median_per_process_params_per_s must be"):
        ho.compare(OFFLOAD, _write(tmp_path / "c.jsonl", rows), [])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("offloaded_params", 0, "offloaded_params must be a finite number > 0"),
        ("step_s", -2, "step_s must be a finite number > 0"),
        ("step_s", float("nan"), "step_s must be a finite number > 0"),
        ("threads", True, "threads must be a whole number >= 1"),
        ("params", "garbage", "params must be one of bf16, fp32"),
    ],
)
def test_bad_offload_rows_are_refused(tmp_path, field, value, message):
    rows = _lines(OFFLOAD)
    next(r for r in rows if r["kind"] == "hdo")[field] = value
    with pytest.raises(TunerError, match=message):
        ho.compare(_write(tmp_path / "o.jsonl", rows), CPU_ADAM, [])
    rows = _lines(OFFLOAD)
    next(r for r in rows if r.get("name") == "h2d_pageable_fp32_to_bf16")["gb_per_s"] = float("inf")
    with pytest.raises(TunerError, match="gb_per_s must be"):
        ho.compare(_write(tmp_path / "o.jsonl", rows), CPU_ADAM, [])
    rows = _lines(OFFLOAD)
    rows.append(rows[-1])
    with pytest.raises(TunerError, match="a second row of hdo"):
        ho.compare(_write(tmp_path / "o.jsonl", rows), CPU_ADAM, [])


def test_bad_step_files_are_refused(tmp_path):
    with pytest.raises(TunerError, match="given twice"):
        ho.compare(OFFLOAD, CPU_ADAM, [STEPS[0], STEPS[0]])
    with pytest.raises(TunerError, match="no finished harness row with optimizer offload"):
        ho.compare(OFFLOAD, CPU_ADAM, [CPU_ADAM])
    rows = _lines(STEPS[0])
    r = next(x for x in rows if x.get("id") == "mm-offload-0.5")
    r["layout"]["optimizer_offload_fraction"] = 1.5
    with pytest.raises(TunerError, match="optimizer_offload_fraction must be a finite number >= 0 and <= 1"):
        ho.compare(OFFLOAD, CPU_ADAM, [_write(tmp_path / "s.jsonl", rows)])
    rows = _lines(STEPS[0])
    r = next(x for x in rows if x.get("id") == "mm-offload-0.5")
    r["layout"]["use_precision_aware_optimizer"] = "false"
    with pytest.raises(TunerError, match="use_precision_aware_optimizer must be true or false"):
        ho.compare(OFFLOAD, CPU_ADAM, [_write(tmp_path / "s.jsonl", rows)])
    rows = _lines(STEPS[0])
    next(x for x in rows if x.get("id") == "mm-offload-0.5")["options"] = {"cross_entropy_fusion": True}
    got = ho.compare(OFFLOAD, CPU_ADAM, [_write(tmp_path / "s.jsonl", rows)])["whole_steps"]
    assert got[0].get("skipped")  # its options differ from every no-offload row's: no base


def test_the_recorded_comparison_is_what_compare_gives(res):
    """``call31/compare.json`` (quoted in docs/measurements.md, "Ninth batch") is what ``--compare`` prints now."""
    assert json.loads(json.dumps(res)) == json.loads((OFFLOAD.parent / "compare.json").read_text())


def test_the_recorded_primitives_comparison_is_what_compare_gives():
    """``call30/compare.json`` (quoted in docs/measurements.md, "Ninth batch") is what ``h200_cpu_adam.py --compare``
    prints now."""
    assert json.loads(json.dumps(hca.compare(CPU_ADAM))) == json.loads((CPU_ADAM.parent / "compare.json").read_text())
