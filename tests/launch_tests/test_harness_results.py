"""Reading the harness's JSON lines and classifying failures (no torch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from launch.base import FailureKind
from launch.harness.results import classify_failure, cv, median_after_warmup, read_results

GIB = 2**30
FIXTURE = Path(__file__).parents[1] / "fixtures" / "h200_minimax_slice.jsonl"


def _write(p: Path, objs: list, tail: str = "") -> Path:
    p.write_text("".join(json.dumps(o) + "\n" for o in objs) + tail)
    return p


def test_read_complete_run(tmp_path):
    p = _write(
        tmp_path / "s.jsonl",
        [
            {"event": "start", "world_size": 4, "layout": {"tp": 1}},
            *[
                {
                    "event": "step",
                    "step": i,
                    "step_time_s": t,
                    "tokens_per_s_per_gpu": 8 * 8192 / t / 4,
                    "loss": 12.0,
                    "grad_norm": 2.0,
                }
                for i, t in enumerate([3.0, 1.2, 1.0, 1.1, 1.0], 1)
            ],
            {
                "event": "summary",
                "median_step_time_s": 1.05,
                "peak_reserved_bytes": [100 * GIB, 110 * GIB],
                "peak_allocated_bytes": [90 * GIB, 95 * GIB],
            },
        ],
    )
    r = read_results(p)
    assert r.complete and len(r.steps) == 5 and r.start["world_size"] == 4
    assert r.peak_reserved_bytes == 110 * GIB and r.peak_allocated_bytes == 95 * GIB
    assert r.steps[1].step == 2 and r.steps[1].step_time_s == 1.2 and r.steps[0].loss == 12.0


def test_read_cut_off_and_missing(tmp_path):
    p = _write(
        tmp_path / "s.jsonl",
        [{"event": "step", "step": 1, "step_time_s": 1.0, "tokens_per_s_per_gpu": 5.0}],
        tail='{"event": "st',
    )
    r = read_results(p)
    assert len(r.steps) == 1 and not r.complete and r.bad_lines == 1 and math.isnan(r.peak_reserved_bytes)
    assert read_results(tmp_path / "nope.jsonl").steps == []


def test_median_and_cv():
    assert median_after_warmup([9.0, 1.0, 2.0, 3.0], 1) == 2.0
    assert median_after_warmup([9.0], 2) == 9.0
    assert math.isnan(median_after_warmup([], 2))
    assert cv([1.0]) == 0.0 and cv([1.0, 1.0]) == 0.0 and cv([1.0, 3.0]) == pytest.approx(0.5)


def test_classify_oom_from_json(tmp_path):
    r = read_results(
        _write(
            tmp_path / "s.jsonl",
            [{"event": "oom", "rank": 2, "reserved_bytes": 138 * GIB, "max_allocated_bytes": 130 * GIB}],
        )
    )
    kind, msg, reached = classify_failure(1, r, "", timed_out=True)  # OOM wins over the timeout it caused
    assert kind == FailureKind.oom and reached == 138 * GIB and "rank(s) 2" in msg and "138.0 GiB" in msg


def test_classify_oom_from_log_text(tmp_path):
    r = read_results(tmp_path / "none.jsonl")
    log = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ... this process has 137.50 GiB "
        "memory in use."
    )
    kind, msg, reached = classify_failure(1, r, log)
    assert kind == FailureKind.oom and reached == pytest.approx(137.5 * GIB)


def test_classify_timeout_nccl_crash(tmp_path):
    empty = read_results(tmp_path / "none.jsonl")
    assert classify_failure(None, empty, "", timed_out=True)[0] == FailureKind.timeout
    kind, msg, _ = classify_failure(
        1, empty, "x\ntorch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1\n"
    )
    assert kind == FailureKind.crash and msg.startswith("NCCL error")
    err = read_results(
        _write(tmp_path / "e.jsonl", [{"event": "error", "rank": 3, "type": "AssertionError", "message": "bad"}])
    )
    kind, msg, _ = classify_failure(1, err, "")
    assert kind == FailureKind.crash and "rank 3" in msg and "AssertionError" in msg
    kind, msg, _ = classify_failure(-9, empty, "last words\n")
    assert kind == FailureKind.crash and "exit status -9" in msg and "last words" in msg


def test_measured_fixture_is_readable():
    """The committed H200 measurements (docs/measurements.md) have the fields calibration needs."""
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines() if x.strip()]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 12
    for r in ok:
        assert (
            r["step_time_s"] > 0 and r["peak_reserved_gib"] > 0 and r["pred_step_time_s"] > 0 and r["pred_peak_gib"] > 0
        )
        assert {"tp", "pp", "ep", "etp", "vpp", "micro_batch_size", "dispatcher", "recompute_granularity"} <= set(
            r["layout"]
        )
    assert {r["layout"]["tp"] for r in ok} >= {1, 2, 4} and {r["layout"]["pp"] for r in ok} >= {1, 2, 4}
    assert any(r["status"] == "timeout" for r in rows)


def test_a_profiled_step_is_read_with_its_traces():
    from launch.harness.results import parse_results

    text = "\n".join(
        json.dumps(x)
        for x in [
            {
                "event": "step",
                "step": 1,
                "step_time_s": 1.0,
                "tokens_per_s_per_gpu": 10.0,
                "loss": 1.0,
                "grad_norm": 1.0,
                "profiled": True,
            },
            {"event": "profile", "step": 1, "files": ["/t/profile_step1_pp0.json", "/t/profile_step1_pp1.json"]},
        ]
    )
    r = parse_results(text)
    assert r.bad_lines == 0 and len(r.steps) == 1
    assert r.profile["files"] == ["/t/profile_step1_pp0.json", "/t/profile_step1_pp1.json"]


def test_memory_phases_and_forward_only_lines_are_kept() -> None:
    from launch.harness.results import parse_results

    text = "\n".join(
        [
            '{"event": "memory_phase", "phase": "after_build", "allocated_bytes": 10, '
            '"live_tensors_bytes": {"cuda/bfloat16": 8}}',
            '{"event": "memory_phase", "phase": "step1_after_forward_backward", "allocated_bytes": 30}',
            '{"event": "forward_only", "steps": 2, "step_times_s": [0.5, 0.4], "median_step_time_s": 0.4}',
            '{"event": "unknown"}',
        ]
    )
    r = parse_results(text)
    assert [m["phase"] for m in r.memory_phases] == ["after_build", "step1_after_forward_backward"]
    assert r.memory_phases[0]["live_tensors_bytes"] == {"cuda/bfloat16": 8}
    assert r.forward_only["median_step_time_s"] == 0.4 and r.bad_lines == 1
