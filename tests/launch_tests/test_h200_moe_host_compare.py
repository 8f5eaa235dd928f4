"""benchmarks/h200_moe_host.py: its configurations build harness specs here (no GPU), and ``--compare`` turns the
device's rows into per-layer host and GPU times, the host fit and the three ways of combining them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import h200_moe_host as hm


def test_every_configuration_builds_a_te_spec_with_its_experts_and_precision():
    for cid, (model, layers, experts, precision, recipe, fused) in hm.CONFIGS.items():
        spec = hm._spec(cid, 4096)
        assert (
            spec.use_transformer_engine and spec.model["num_experts"] == experts and spec.model["num_layers"] == layers
        )
        assert spec.model["name"].startswith(model)
        assert spec.precision == precision and spec.fp8_recipe == (recipe or spec.fp8_recipe)
        assert spec.moe_permute_fusion is fused and spec.layout["ep"] == 1 and spec.layout["dispatcher"] == "alltoall"
    # the pairs whose difference is one layer are 1- and 2-layer builds of one configuration
    for one, two in hm.LAYER_PAIRS.values():
        a, b = hm.CONFIGS[one], hm.CONFIGS[two]
        assert (a[1], b[1]) == (1, 2) and a[0] == b[0] and a[2:] == b[2:]


#: A synthetic machine: host per layer 3 ms forward / 5 ms backward plus 40 us per expert GEMM; the embedding 0.2 ms
#: of host and 0.1 ms of GPU per pass; GPU work per layer proportional to tokens. The event time is the larger of host
#: and GPU, so the fit must recover the host constants and the "max" form must be exact.
HOST_F, HOST_B, PER_GEMM, EMB_H, EMB_G = 3e-3, 5e-3, 40e-6, 0.2e-3, 0.1e-3


def _row(cid: str, seq: int, mbs: int) -> dict:
    _, layers, experts, _, _, _ = hm.CONFIGS[cid]
    tokens = seq * mbs
    hf, hb = EMB_H + layers * (HOST_F + 2 * experts * PER_GEMM), EMB_H + layers * (HOST_B + 4 * experts * PER_GEMM)
    gf, gb = EMB_G + layers * tokens * 1e-6, EMB_G + layers * tokens * 2e-6
    return {
        "config": cid,
        "seq_length": seq,
        "micro_batch_size": mbs,
        "fwd_s": max(hf, gf),
        "bwd_s": max(hb, gb),
        "host_fwd_s": hf,
        "host_bwd_s": hb,
        "kernels_fwd_s": gf,
        "kernels_fwd_bwd_s": gf + gb,
    }


def _write(tmp_path: Path, rows: list[dict]) -> str:
    f = tmp_path / "moe_host.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [*rows, {"event": "versions", "cpu": "x"}]) + "\n")
    return str(f)


def test_compare_recovers_the_host_constants_and_finds_the_form(tmp_path):
    cids = ["qw-e16-l1", "qw-e16-l2", "qw-e8-l1", "qw-e32-l1", "qw-e128-l1", "mm-e32-l1", "mm-e32-l2"]
    # at 128 tokens the GPU work (0.13 ms per layer) is far below the host's: the event time is the host's
    out = hm.compare([_write(tmp_path, [_row(c, s, m) for c in cids for s, m in hm.POINTS])])
    fit = out["host_fit"]
    # the 1-layer configurations keep the embedding's host time (0.2 ms) unless their model's pair removes it; both
    # models have a pair here, so the fit sees layers only
    assert fit["layer_forward_s"] == pytest.approx(HOST_F, rel=1e-6)
    assert fit["layer_backward_s"] == pytest.approx(HOST_B, rel=1e-6)
    assert fit["per_expert_gemm_s"] == pytest.approx(PER_GEMM, rel=1e-6)
    assert fit["max_abs_error"] < 1e-9
    forms = out["forms"]["median_abs_error"]
    assert forms["max"] == {"fwd": 0.0, "bwd": 0.0}
    assert forms["sum"]["fwd"] > 0.1 and forms["rss"]["bwd"] > 0.0
    # one layer of the qw-e16 pair at micro-batch 4: host 3 + 1.28 ms, GPU 16.4 ms -> GPU-bound
    (r,) = [x for x in out["forms"]["rows"] if x["config"] == "qw-e16" and x["tokens"] == 4 * 4096]
    assert r["fwd_kernels_ms"] == pytest.approx(16.384, abs=0.01) and r["fwd_host_ms"] == pytest.approx(4.28, abs=0.01)
    assert r["fwd_measured_ms"] == pytest.approx(16.38, abs=0.01)


def test_compare_refuses_rows_it_cannot_read(tmp_path):
    good = _row("qw-e16-l1", 128, 1)
    for bad, msg in (
        ({**good, "config": "qw-e99"}, "not one this benchmark runs"),
        ({**good, "config": ["qw-e16-l1"]}, "not one this benchmark runs"),
        ({**good, "micro_batch_size": 3}, "not one this benchmark runs"),
        ({**good, "micro_batch_size": True}, "not one this benchmark runs"),
        ({**good, "seq_length": 128.0}, "not one this benchmark runs"),
        ({**good, "num_experts": 32}, "num_experts 32 .configuration qw-e16-l1 has 16"),
        ({**good, "model": "MiniMax-M2"}, "not a row of configuration qw-e16-l1"),
        ({**good, "fwd_s": 0}, "fwd_s must be numbers > 0"),
        ({**good, "fwd_s": 1e300}, "at most 3600"),
        ({**good, "kernels_fwd_s": float("nan")}, "kernels_fwd_s must be numbers > 0"),
        ({**good, "bwd_s": True}, "bwd_s must be numbers > 0"),
        ({**good, "kernels_fwd_s": 1.0, "kernels_fwd_bwd_s": 0.5}, "cannot take longer"),
    ):
        with pytest.raises(ValueError, match=msg):
            hm.compare([_write(tmp_path, [bad])])
    with pytest.raises(ValueError, match="a second row"):
        hm.compare([_write(tmp_path, [good, good])])
    with pytest.raises(ValueError, match="no measured rows"):
        hm.compare([_write(tmp_path, [])])
    # too few configurations at the probe point to fit three constants: the message names the file
    with pytest.raises(ValueError, match="moe_host.jsonl: fewer than three"):
        hm.compare([_write(tmp_path, [good])])
    # one expert count only: the per-expert cost cannot be told from the layer's
    with pytest.raises(ValueError, match="at least two local-expert counts"):
        hm.compare([_write(tmp_path, [_row(c, 128, 1) for c in ("qw-e16-l1", "qw-e16-l2", "qw-e16-l1-fp8")])])


def test_a_two_layer_row_not_slower_than_its_one_layer_row_is_refused(tmp_path):
    rows = [_row(c, s, m) for c in ("qw-e16-l1", "qw-e16-l2", "qw-e8-l1", "qw-e32-l1") for s, m in hm.POINTS]
    two = next(r for r in rows if r["config"] == "qw-e16-l2" and r["seq_length"] == 4096 and r["micro_batch_size"] == 2)
    one = next(r for r in rows if r["config"] == "qw-e16-l1" and r["seq_length"] == 4096 and r["micro_batch_size"] == 2)
    two.update({k: one[k] for k in hm.TIMES})
    with pytest.raises(
        ValueError, match="qw-e16 at seq 4096, micro-batch 2: one layer's fwd_s, bwd_s, kernels_fwd_s, kernels_bwd_s"
    ):
        hm.compare([_write(tmp_path, rows)])


def test_unpaired_rows_are_used_alone_or_listed(tmp_path):
    """A pair's 1-layer row without its 2-layer partner is a 1-layer configuration; a 2-layer row without its 1-layer
    partner cannot lose its embedding and is listed as left out."""
    rows = [_row(c, s, m) for c in ("qw-e16-l1", "qw-e8-l1", "qw-e32-l1", "mm-e32-l2") for s, m in hm.POINTS]
    out = hm.compare([_write(tmp_path, rows)])
    configs = {r["config"] for r in out["per_layer_ms"]}
    assert {"qw-e16-l1", "qw-e8-l1", "qw-e32-l1"} <= configs and "mm-e32" not in configs
    assert len(out["left_out"]) == len(hm.POINTS) and all(x.startswith("mm-e32-l2 at seq") for x in out["left_out"])
    json.dumps(out, allow_nan=False)  # strict JSON: every number finite


def test_the_gpu_run_refuses_its_settings_before_it_starts(tmp_path, monkeypatch, capsys):
    """CONFIGS, BUDGET_S and OUT are checked before torch is imported or a folder is made."""
    for env, needle in (
        ({"CONFIGS": ","}, "no configuration"),
        ({"CONFIGS": "bogus"}, "unknown"),
        ({"CONFIGS": "qw-e8-l1,qw-e8-l1"}, "given twice"),
        ({"BUDGET_S": "abc"}, "BUDGET_S"),
        ({"BUDGET_S": "-5"}, "BUDGET_S"),
        ({"OUT": str(tmp_path / "afile")}, "is a file"),
    ):
        (tmp_path / "afile").write_text("keep")
        for k in ("CONFIGS", "BUDGET_S", "OUT"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sys, "argv", ["h200_moe_host.py"])
        monkeypatch.chdir(tmp_path)
        assert hm.main() == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
        assert (tmp_path / "afile").read_text() == "keep" and not (tmp_path / "h200_moe_host_out").exists()


def test_compare_from_the_command_line_names_the_bad_file(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "none.jsonl"
    monkeypatch.setattr(sys, "argv", ["h200_moe_host.py", "--compare", str(missing)])
    assert hm.main() == 2
    assert str(missing) in capsys.readouterr().err
