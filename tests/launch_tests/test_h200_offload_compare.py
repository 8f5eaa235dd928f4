"""benchmarks/h200_cpu_adam.py and h200_offload.py: the offload primitives' figures printed in the offload note are what
``--compare`` derives from the recorded device rows (``benchmarks/results/h200_te_2026-12-02/call30``, ``call31``), the
primitives' sum is judged against the optimizer's step and a whole step, and bad rows get one message."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import h200_cpu_adam as hca  # noqa: E402
import h200_offload as ho  # noqa: E402

from cost_model.fidelity import known_gaps  # noqa: E402
from specs import Layout  # noqa: E402
from specs.errors import TunerError  # noqa: E402

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
    assert f"{alone['bf16-1.0-default']['measured_s']:.2f} s against {alone['fp32-1.0-default']['measured_s']:.2f} s" in note
    assert f"{res['seed_reference_what_if']['primitives_error'] * 100:.0f}% too fast" in note
    # without the precision-aware optimizer the masters stay pinned: no pageable clause
    plain = known_gaps(Layout(world_size=8, tp=8, optimizer_offload_fraction=1.0, use_precision_aware_optimizer=False))[0]
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
    assert w["primitives_offload_s"] < w["model_offload_s"] and w["primitives_tokens_per_s_per_gpu"] > w["model_tokens_per_s_per_gpu"]


def test_bad_files_get_one_message(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"kind": "host"}\nnot json\n')
    assert hca.main(["--compare", str(bad)]) == 2 and "not a cpu_adam.jsonl" in capsys.readouterr().err
    bad.write_text(json.dumps({"kind": "host"}) + "\n" + json.dumps({"kind": "adam", "fused": True}) + "\n")
    assert hca.main(["--compare", str(bad)]) == 2 and "lacks a field" in capsys.readouterr().err
    assert ho.main(["--compare", str(OFFLOAD)]) == 2 and "--primitives" in capsys.readouterr().err
    assert ho.main(["--compare", str(bad), "--primitives", str(bad)]) == 2 and "lacks a field" in capsys.readouterr().err
    assert ho.main(["--compare", str(bad), "--primitives", str(CPU_ADAM)]) == 2
    assert "h2d_pageable_fp32_to_bf16" in capsys.readouterr().err
    with pytest.raises(TunerError, match="not a offload.jsonl"):
        ho.compare(tmp_path / "missing.jsonl", CPU_ADAM, [])
