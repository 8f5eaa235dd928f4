"""benchmarks/h200_attention.py: the cost model's attention constants are what ``--compare`` derives from the recorded
device rows (``benchmarks/results/h200_te_2026-12-02/call29``), and bad rows get one message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import h200_attention as ha
from cost_model.calibration import BASE_CALIBRATION
from cost_model.terms import compute
from specs.errors import TunerError
from specs.hardware import load_gpu

ROWS = (
    Path(__file__).parents[2] / "benchmarks" / "results" / "h200_te_2026-12-02" / "call29" / "attn" / "attention.jsonl"
)
PEAK = load_gpu("H200").peak_flops_bf16


def _rows() -> list[dict]:
    return [json.loads(ln) for ln in ROWS.read_text().splitlines() if ln.strip()]


def test_the_shipped_constants_are_the_measured_ones():
    d = ha.derive([r for r in _rows() if "fwd_bwd_kernel_s" in r], PEAK)
    assert BASE_CALIBRATION.attention_call_macs == pytest.approx(
        d["call_s"] * PEAK * d["efficiency_hd128"] / 3, rel=0.01
    )
    assert BASE_CALIBRATION.attention_window_extra_keys == pytest.approx(d["window_extra_keys"], abs=1)
    assert BASE_CALIBRATION.attention_sink_extra_keys == pytest.approx(d["sink_extra_keys"], abs=1)
    assert d["head_dim_factor"].keys() == compute.ATTENTION_HEAD_DIM_FACTOR.keys()
    for pair, f in d["head_dim_factor"].items():
        assert compute.ATTENTION_HEAD_DIM_FACTOR[pair] == pytest.approx(f, abs=5e-4), pair
    # the judged shapes (no constant comes from them) are within 4.3% of the kernels' time
    judged = [r for r in _rows() if r["id"].startswith("judge-")]
    assert len(judged) == 7
    assert max(abs(ha.predict(r, d, PEAK) / r["fwd_bwd_kernel_s"] - 1) for r in judged) < 0.045


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ({"heads": 0}, "heads must be a whole number >= 1"),
        ({"window": "128"}, "window must be a whole number >= 0"),
        ({"fwd_bwd_s": float("inf")}, "fwd_bwd_s must be a number of seconds in (0, 1000)"),
        ({"id": 5}, "id must be a string"),
    ],
)
def test_bad_rows_get_one_message(edit, needle, tmp_path, capsys):
    rows = _rows()
    rows[0] = {**rows[0], **edit}
    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TunerError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        ha.compare([str(f)])


def test_a_file_without_the_named_cases_derives_nothing(tmp_path, capsys):
    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in _rows() if r["id"] != "hd128-s4096") + "\n")
    assert ha.compare([str(f)]) == 0
    assert (
        "constants not derived: the constants come from named cases; missing or errored: hd128-s4096"
        in capsys.readouterr().out
    )
