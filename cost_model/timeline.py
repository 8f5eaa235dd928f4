"""The predicted step of one layout as a Chrome trace (Trace Event Format JSON, for Perfetto and chrome://tracing).

:func:`step_trace` turns :func:`cost_model.estimate.estimate_details` into events, one process per pipeline rank with:
one thread per virtual stage (each micro-batch's forward ``F3`` and backward ``B3`` in Megatron's order, as
:func:`cost_model.pipeline_schedule.simulate_pipeline` times it); ``GPU time by part`` (each pass cut into its parts
back to back, then the step's tail: exposed pipeline p2p, DP reduce-scatter and all-gather, optimizer step and CPU
offload, each next part starting when the slowest rank is done); and ``hidden communication`` (what the overlaps hide,
drawn from the start of the work that hides it).

The bubble is every gap in a rank's stage threads before the tail: by construction the trace's step is the estimate's
``step_time_s`` and the ranks' mean idle time over it its ``pp_bubble / step_time_s`` (:func:`trace_step_seconds`,
:func:`trace_bubble_fraction`). Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
(``ph: "X"`` events, ``ts`` / ``dur`` in microseconds, ``ph: "M"`` names; ``otherData`` holds the layout, the step time
and the bubble fraction)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from cost_model.pipeline_schedule import Pass
from cost_model.step_detail import CHUNK_PARTS, HIDDEN_PARTS, TAIL_PARTS, StepDetails
from specs.units import GIB

#: Microseconds per second (the trace's unit).
US = 1e6

#: Thread ids of a rank's non-stage lanes (stage threads are 0 .. vpp-1).
PARTS_TID = 1000
HIDDEN_TID = 1001
P2P_TID = 1002

#: Event names of the chunk parts on the ``GPU time by part`` lane.
PART_NAMES = {
    "compute": "compute", "recompute": "recompute", "tp_comm": "TP comm (exposed)", "cp_comm": "CP comm (exposed)",
    "ep_comm": "EP all-to-all (exposed)"}
HIDDEN_NAMES = {"tp_comm": "TP comm (hidden)", "cp_comm": "CP comm (hidden)", "ep_comm": "EP all-to-all (hidden)"}
#: Event names of the step's tail (:data:`cost_model.step_detail.TAIL_PARTS`).
TAIL_NAMES = {
    "pp_p2p": "PP p2p (exposed)", "dp_comm": "DP grad reduce-scatter + param all-gather", "optimizer": "optimizer step",
    "offload": "CPU optimizer offload"}
#: chrome://tracing's reserved colours (catapult ``color_scheme``); Perfetto colours by name instead.
_COLOURS = {
    "forward": "rail_response", "backward": "rail_animation", "compute": "good", "recompute": "yellow",
    "tp_comm": "terrible", "cp_comm": "terrible", "ep_comm": "terrible", "hidden": "grey", "pp_p2p": "bad",
    "dp_comm": "bad", "optimizer": "olive", "offload": "olive"}


def _role(r: int, pp: int) -> str:
    if pp == 1:
        return "only"
    return "first" if r == 0 else "last" if r == pp - 1 else "middle"


def _meta(pid: int, tid: int | None, name: str, value: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid,
                          "args": {"name" if name.endswith("_name") else "sort_index": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _x(name: str, cat: str, pid: int, tid: int, start_s: float, dur_s: float, args: dict[str, Any],
       colour: str) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * US, "dur": dur_s * US,
            "cname": colour, "args": args}


def step_trace(d: StepDetails, *, title: str = "", source: str = "predicted",
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Chrome trace of one predicted step of ``d`` (:func:`cost_model.estimate.estimate_details`): a JSON-able dict
    of ``traceEvents`` (metadata, then complete events by process, thread and start; ``ts`` / ``dur`` in microseconds
    from the step's start), ``displayTimeUnit`` and ``otherData`` (``title``, ``source``, the layout, ``step_time_s``,
    ``bubble_fraction``, the time and memory parts, the pipeline's simulated and closed-form time, and ``extra``)."""
    est, lay = d.estimate, d.estimate.layout
    step_end = d.pipeline_s + sum(max(d.tail[p]) for p in TAIL_PARTS)
    events, hidden_cursor = _schedule_events(d, step_end)
    events += _tail_events(d, step_end, hidden_cursor)
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"]))
    other = {
        "source": source, "title": title, "layout": lay.label, "layout_fields": lay.to_dict(),
        "recompute": lay.recompute_label, "dispatcher": lay.dispatcher.value, "micro_batch_size": lay.micro_batch_size,
        "num_microbatches": d.num_microbatches, "step_time_s": est.step_time_s, "bubble_fraction": d.bubble_fraction,
        "pipeline_s": d.pipeline_s, "closed_form_pipeline_s": d.closed_form_pipeline_s,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu, "peak_gib": est.peak_gib, "time_parts_s": dict(est.time),
        "memory_gib_worst_rank": {k: v / GIB for k, v in est.memory.items()},
        "memory_gib_by_rank": {k: [x / GIB for x in v] for k, v in d.memory.items()},
        "note": ("Every event is a prediction of the analytical model. Within a forward or backward the parts are "
                 "drawn back to back; the model gives their totals, not how the kernels interleave. Idle time in the "
                 "stage lanes before the tail is the pipeline bubble."),
        **(extra or {})}
    return {"traceEvents": _meta_events(d) + events, "displayTimeUnit": "ms", "otherData": other}


def _meta_events(d: StepDetails) -> list[dict[str, Any]]:
    """The trace's process and thread names: one process per PP rank, a thread per chunk and per part lane."""
    pp, meta = d.pp, []
    for r in range(pp):
        what = f"{int(sum(d.layers[r]))} layers"
        if r == 0:
            what += " + embedding"
        if r == pp - 1:
            what += " + output layer"
        meta += [_meta(r, None, "process_name", f"PP rank {r} ({_role(r, pp)}; {what})"),
                 _meta(r, None, "process_sort_index", r)]
        for v in range(d.vpp):
            stage = v * pp + r
            meta += [_meta(r, v, "thread_name", f"stage {stage} (chunk {v}, {int(d.layers[r][v])} layers)"),
                     _meta(r, v, "thread_sort_index", v)]
        for tid, name in ((PARTS_TID, "GPU time by part (exposed)"),
                          (HIDDEN_TID, "communication hidden behind compute"), (P2P_TID, "PP p2p sends (hidden)")):
            meta += [_meta(r, tid, "thread_name", name), _meta(r, tid, "thread_sort_index", tid)]
    return meta


def _schedule_events(d: StepDetails, step_end: float) -> tuple[list[dict[str, Any]], list[float]]:
    """Every forward and backward of the pipeline schedule with its parts, the communication hidden under it and the
    p2p send after it; and where each rank's hidden lane ends."""
    pp, vpp, t = d.pp, d.vpp, d.times
    events: list[dict[str, Any]] = []
    sends = 2 * d.num_microbatches * vpp  # the estimate's p2p sends per rank per step (terms.schedule.pp_p2p_time)
    hidden_cursor = [0.0] * pp
    p2p_cursor = [0.0] * pp
    for op in d.schedule:
        r, v, mb = op.rank, op.op.chunk, op.op.microbatch
        fwd = op.op.kind is Pass.forward
        kind = "forward" if fwd else "backward"
        parts = t.forward if fwd else t.backward
        hidden = t.hidden_forward if fwd else t.hidden_backward
        secs = {p: parts[p][r][v] for p in CHUNK_PARTS}
        stage = v * pp + r
        args = {"microbatch": mb, "chunk": v, "stage": stage, "layers": int(d.layers[r][v]), "pass": kind,
                "parts_s": secs, "hidden_s": {p: hidden[p][r][v] for p in HIDDEN_PARTS}}
        events.append(_x(f"{'F' if fwd else 'B'}{mb}", kind, r, v, op.start_s, op.end_s - op.start_s, args,
                         _COLOURS[kind]))
        order = [p for p in (CHUNK_PARTS if fwd else ("recompute", "compute", "tp_comm", "cp_comm", "ep_comm"))
                 if secs[p] > 0]
        at = op.start_s
        for i, p in enumerate(order):
            dur = secs[p] if i < len(order) - 1 else max(op.end_s - at, 0.0)  # the last part ends with the op
            events.append(_x(PART_NAMES[p], p, r, PARTS_TID, at, dur,
                             {"microbatch": mb, "chunk": v, "pass": kind, "seconds": secs[p]}, _COLOURS[p]))
            at += dur
        at = max(op.start_s, hidden_cursor[r])
        for p in HIDDEN_PARTS:
            h = hidden[p][r][v]
            dur = min(h, max(op.end_s - at, 0.0))  # drawn under the work that hides it
            if dur > 0:
                events.append(_x(HIDDEN_NAMES[p], "hidden", r, HIDDEN_TID, at, dur,
                                 {"microbatch": mb, "chunk": v, "pass": kind, "seconds": h}, _COLOURS["hidden"]))
                at += dur
        hidden_cursor[r] = at
        send = d.tail_hidden["pp_p2p"][r] / sends
        if send > 0 and not (fwd and stage == pp * vpp - 1) and not (not fwd and stage == 0):
            at = max(op.end_s, p2p_cursor[r])
            dur = min(send, max(step_end - at, 0.0))
            events.append(_x(f"send {'activation' if fwd else 'gradient'} mb{mb}", "hidden", r, P2P_TID, at, dur,
                             {"microbatch": mb, "to_stage": stage + (1 if fwd else -1), "seconds": send},
                             _COLOURS["hidden"]))
            p2p_cursor[r] = at + dur
    return events, hidden_cursor


def _tail_events(d: StepDetails, step_end: float, hidden_cursor: list[float]) -> list[dict[str, Any]]:
    """The step's tail after the pipeline (its parts back to back) and the DP and offload communication hidden."""
    events: list[dict[str, Any]] = []
    phase = d.pipeline_s
    starts: dict[str, float] = {}
    for part in TAIL_PARTS:
        starts[part] = phase
        length = max(d.tail[part])
        for r in range(d.pp):
            dur = d.tail[part][r]
            if dur > 0:
                events.append(_x(TAIL_NAMES[part], part, r, PARTS_TID, phase, dur,
                                 {"seconds": dur, "step_part_s": length}, _COLOURS[part]))
        phase += length
    for r in range(d.pp):
        at = hidden_cursor[r]
        for part, name, start in (("dp_comm", "DP comm (hidden)", d.pipeline_s - d.tail_hidden["dp_comm"][r]),
                                  ("offload", "offload copies (hidden)", starts["offload"])):
            h = d.tail_hidden[part][r]
            at = max(at, start)
            dur = min(h, max(step_end - at, 0.0))
            if dur > 0:
                events.append(_x(name, "hidden", r, HIDDEN_TID, at, dur, {"seconds": h}, _COLOURS["hidden"]))
                at += dur
    return events


def _complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]


def trace_step_seconds(trace: dict[str, Any]) -> float:
    """The trace's step: from its first event's start to its last event's end (seconds)."""
    xs = _complete(trace)
    return (max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)) / US if xs else 0.0


def trace_bubble_fraction(trace: dict[str, Any]) -> float:
    """The ranks' mean idle time in their stage lanes before the tail, over the step: each rank's pipeline time (the
    end of its last forward / backward on any rank) less its forward and backward time, averaged over the ranks."""
    ops = [e for e in _complete(trace) if e.get("cat") in ("forward", "backward")]
    if not ops:
        return 0.0
    end = max(e["ts"] + e["dur"] for e in ops)
    start = min(e["ts"] for e in _complete(trace))
    ranks = sorted({e["pid"] for e in ops})
    idle = [(end - start) - sum(e["dur"] for e in ops if e["pid"] == r) for r in ranks]
    return float(sum(idle)) / len(ranks) / US / trace_step_seconds(trace)


def trace_lanes(trace: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Complete events by (pid, tid), in the order they appear."""
    lanes: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in _complete(trace):
        lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    return lanes


def check_trace(trace: dict[str, Any], *, tolerance_us: float = 1e-6) -> list[str]:
    """What keeps ``trace`` from being a well-formed Chrome trace of this module's kind (empty: nothing).

    Checks the JSON Object Format (``traceEvents`` a list; each event's ``ph`` ``X`` or ``M``; ``X`` events with a
    string name, integer pid / tid, numeric ``ts`` and ``dur >= 0``), that every lane's events are sorted by start
    and do not overlap (by more than ``tolerance_us``), and that every pid and tid with events has a name."""
    problems: list[str] = []
    evs = trace.get("traceEvents")
    if not isinstance(evs, list):
        return ["traceEvents is not a list"]
    names: set[tuple[int, int | None]] = set()
    for i, e in enumerate(evs):
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "process_name":
                names.add((e["pid"], None))
            elif e.get("name") == "thread_name":
                names.add((e["pid"], e["tid"]))
            continue
        if ph != "X":
            problems.append(f"event {i}: ph {ph!r} (expected X or M)")
            continue
        if not isinstance(e.get("name"), str) or not all(isinstance(e.get(k), int) for k in ("pid", "tid")):
            problems.append(f"event {i}: name, pid or tid missing or of the wrong type")
        if not all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur")) or e.get("dur", -1) < 0:
            problems.append(f"event {i}: ts / dur missing or dur negative")
    for (pid, tid), lane in trace_lanes(trace).items():
        if (pid, None) not in names or (pid, tid) not in names:
            problems.append(f"lane pid {pid} tid {tid} has no process_name / thread_name")
        for a, b in pairwise(lane):
            if b["ts"] < a["ts"]:
                problems.append(f"lane pid {pid} tid {tid}: {b['name']} at {b['ts']:.3f} us starts before {a['name']} "
                                f"at {a['ts']:.3f} us")
            elif b["ts"] < a["ts"] + a["dur"] - tolerance_us:
                problems.append(f"lane pid {pid} tid {tid}: {b['name']} at {b['ts']:.3f} us overlaps {a['name']} "
                                f"ending at {a['ts'] + a['dur']:.3f} us")
    return problems
