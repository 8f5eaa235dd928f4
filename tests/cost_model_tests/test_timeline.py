"""The predicted step as a Chrome trace (cost_model.timeline): its structure, and that it shows the estimate's
numbers."""

from __future__ import annotations

import json

import pytest

from cost_model.estimate import estimate, estimate_details
from cost_model.timeline import (
    HIDDEN_TID,
    P2P_TID,
    PARTS_TID,
    TAIL_NAMES,
    check_trace,
    step_trace,
    trace_bubble_fraction,
    trace_lanes,
    trace_step_seconds,
)
from specs import RunOptions
from specs.layout import Dispatcher, Layout, RecomputeGranularity

BEST = Layout(
    world_size=64, tp=1, pp=4, vpp=8, ep=16, recompute_granularity=RecomputeGranularity.selective,
    recompute_modules=("moe",), dispatcher=Dispatcher.flex_deepep, num_layers_in_first_pipeline_stage=16,
    num_layers_in_last_pipeline_stage=14,
)
OVERLAPPED = Layout(
    world_size=64, tp=2, sequence_parallel=True, pp=4, vpp=2, cp=2, ep=8, num_layers_in_first_pipeline_stage=16,
    num_layers_in_last_pipeline_stage=14,
)
OPTS = RunOptions(tp_comm_overlap=True, overlap_moe_expert_parallel_comm=True, overlap_grad_reduce=True)


@pytest.fixture(params=["seed_tuned", "best", "overlapped", "reference"])
def case(request, minimax, h200x64, seed_workload, seed_tuned, seed_reference):
    lay, opts = {
        "seed_tuned": (seed_tuned, RunOptions()),
        "best": (BEST, RunOptions()),
        "overlapped": (OVERLAPPED, OPTS),
        "reference": (seed_reference, RunOptions()),
    }[request.param]
    d = estimate_details(minimax, h200x64, seed_workload, lay, options=opts)
    return d, step_trace(d, title="test")


def test_the_trace_is_well_formed_json(case):
    d, trace = case
    assert check_trace(trace) == []
    back = json.loads(json.dumps(trace))
    assert back["otherData"]["source"] == "predicted" and back["displayTimeUnit"] == "ms"
    assert all(e["ph"] in ("X", "M") for e in back["traceEvents"])


def test_the_step_and_the_bubble_are_the_estimate_s(case, minimax, h200x64, seed_workload):
    d, trace = case
    e = estimate(
        minimax,
        h200x64,
        seed_workload,
        d.estimate.layout,
        options=OPTS if d.estimate.layout == OVERLAPPED else RunOptions(),
    )
    assert trace_step_seconds(trace) == pytest.approx(e.step_time_s, rel=1e-12)
    assert trace_bubble_fraction(trace) == pytest.approx(e.time["pp_bubble"] / e.step_time_s, rel=1e-9, abs=1e-12)
    assert trace["otherData"]["step_time_s"] == e.step_time_s
    assert trace["otherData"]["bubble_fraction"] == pytest.approx(e.time["pp_bubble"] / e.step_time_s, rel=1e-12)
    xs = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    assert min(ev["ts"] for ev in xs) == 0.0
    assert max(ev["ts"] + ev["dur"] for ev in xs) == pytest.approx(e.step_time_s * 1e6, rel=1e-12)


def test_every_rank_runs_2_m_vpp_chunks_on_its_stage_lanes(case):
    d, trace = case
    lay = d.estimate.layout
    lanes = trace_lanes(trace)
    for r in range(lay.pp):
        ops = [ev for v in range(lay.vpp) for ev in lanes.get((r, v), [])]
        assert len(ops) == 2 * d.num_microbatches * lay.vpp
        for v in range(lay.vpp):
            lane = lanes[(r, v)]
            assert sorted(ev["args"]["microbatch"] for ev in lane if ev["cat"] == "forward") == list(
                range(d.num_microbatches)
            )
            assert sorted(ev["args"]["microbatch"] for ev in lane if ev["cat"] == "backward") == list(
                range(d.num_microbatches)
            )
            assert {ev["args"]["stage"] for ev in lane} == {v * lay.pp + r}
        # the ranks' lanes: one per virtual stage, the parts, the hidden communication, the p2p sends, all named
        names = {
            ev["tid"]: ev["args"]["name"]
            for ev in trace["traceEvents"]
            if ev["ph"] == "M" and ev["name"] == "thread_name" and ev["pid"] == r
        }
        assert set(names) == {*range(lay.vpp), PARTS_TID, HIDDEN_TID, P2P_TID}
    procs = [ev["args"]["name"] for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["name"] == "process_name"]
    assert procs[0].startswith("PP rank 0 (first") and procs[-1].startswith(f"PP rank {lay.pp - 1} (last")


def test_the_parts_lane_is_the_chunks_cut_into_parts_then_the_tail(case):
    d, trace = case
    lanes = trace_lanes(trace)
    for r in range(d.pp):
        parts = lanes[(r, PARTS_TID)]
        busy = sum(ev["dur"] for v in range(d.vpp) for ev in lanes[(r, v)])
        in_pipeline = [ev for ev in parts if ev["ts"] < d.pipeline_s * 1e6 - 1e-6]
        assert sum(ev["dur"] for ev in in_pipeline) == pytest.approx(busy, rel=1e-9)
        tail = [ev for ev in parts if ev["ts"] >= d.pipeline_s * 1e6 - 1e-6]
        assert [ev["name"] for ev in tail] == [
            TAIL_NAMES[p] for p in ("pp_p2p", "dp_comm", "optimizer", "offload") if d.tail[p][r] > 0
        ]
        if d.estimate.layout.recompute_granularity != RecomputeGranularity.none:
            assert any(ev["name"] == "recompute" for ev in parts)


def test_the_bubble_is_idle_time_at_the_pipeline_s_ends(case):
    d, trace = case
    lanes = trace_lanes(trace)
    first = [min(ev["ts"] for v in range(d.vpp) for ev in lanes[(r, v)]) for r in range(d.pp)]
    assert first[0] == 0.0
    if d.pp > 1:
        assert all(b > a for a, b in zip(first, first[1:]))  # each rank waits for the one before it (warm-up)


def test_hidden_communication_is_drawn_only_when_something_overlaps(case):
    d, trace = case
    hidden = [ev for (pid, tid), lane in trace_lanes(trace).items() if tid == HIDDEN_TID for ev in lane]
    lay = d.estimate.layout
    if lay == OVERLAPPED:
        assert {"TP comm (hidden)", "EP all-to-all (hidden)", "DP comm (hidden)", "CP comm (hidden)"} <= {
            ev["name"] for ev in hidden
        }
    elif (
        lay.optimizer_offload_fraction > 0
    ):  # the reference port: --overlap-cpu-optimizer-d2h-h2d hides part of the copies
        assert {ev["name"] for ev in hidden} == {"offload copies (hidden)"}
    else:
        assert hidden == []
    sends = [ev for (pid, tid), lane in trace_lanes(trace).items() if tid == P2P_TID for ev in lane]
    assert bool(sends) == (lay.vpp > 1)  # the interleaved schedule overlaps its p2p (pp_p2p_overlap)


def test_check_trace_finds_overlaps_and_unnamed_lanes(case):
    _, trace = case
    bad = json.loads(json.dumps(trace))
    xs = [ev for ev in bad["traceEvents"] if ev["ph"] == "X" and ev["tid"] == 0 and ev["pid"] == 0]
    xs[1]["ts"] = xs[0]["ts"] + xs[0]["dur"] / 2
    bad["traceEvents"].append({"name": "stray", "ph": "X", "pid": 99, "tid": 0, "ts": 0.0, "dur": 1.0})
    problems = check_trace(bad)
    assert any("overlaps" in p for p in problems) and any("pid 99" in p for p in problems)
