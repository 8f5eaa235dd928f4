"""The device runs of issues 14 and 16 on 1 x H200 with Transformer Engine, budget-aware and resumable.

Started by ``benchmarks/h200_te.sh`` (which sets the environment). Parts (``PART``, comma-separated):

- ``probe``: the first-trial probe (``benchmarks/h200_te_layouts.py`` ``PROBE``) as the fresh machine's first GPU work;
- ``component``: the optimizer component test (:func:`tuner.verify.component.run_component_test`);
- ``sweep``: the layouts of ``benchmarks/h200_te_layouts.py`` ``CASES`` (the local backend, one torchrun each); with
  ``SWEEP_ONLY=id,id,...`` only those, in that order; ``SWEEP_GPUS=1xH100`` records (and predicts) the cases on the
  GPU the machine has when it is not the cases' H200;
- ``snapshot``: only the sweep cases with the saved-tensor census;
- ``parity``: the convergence check with the ``norm_grad_scaled`` fault (its checkpoint kept), then gradient parity
  of four 1-GPU layout pairs and two faults from that checkpoint (:func:`tuner.verify.parity_check.run_grad_parity`);
- ``probe_last``: the probe again, at the end of the batch;
- ``all``: probe, component, the first sweep cases, parity, the rest of the sweep, probe_last.

Every case runs in processes of its own with a timeout; a failure is recorded and the next case runs. Before a case
starts, its planned time (``est_s``) is checked against what is left of ``BUDGET_S`` (seconds since this program
started); a case that does not fit is skipped with a note. Done cases are recorded in ``$WORK/state.json`` (``WORK``
default ``/tmp/h200_te``, which survives between calls while the machine stays warm), so the next call continues
where this one stopped. With ``FINAL=1`` the budget keeps room for ``probe_last``.

Outputs under ``$OUT`` (at most 8 files): ``probe.jsonl``, ``component.jsonl``, ``sweep.jsonl``, ``census.jsonl``,
``parity.jsonl``, ``driver.log``, ``logs.tgz`` (the logs of cases that failed, and the component test's).
"""

from __future__ import annotations

import json
import math
import os
import reprlib
import shutil
import sys
import tarfile
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

T0 = time.monotonic()
OUT = Path(os.environ.get("OUT") or "h200_te_out")
WORK = Path(os.environ.get("WORK") or "/tmp/h200_te")
BUDGET = float(os.environ.get("BUDGET_S") or 540)
FINAL = os.environ.get("FINAL") == "1"
GIB = 2**30
#: For tests (CI, no GPU): a program that stands in for ``torchrun ... -m launch.harness.train`` / the component
#: program, and a Transformer Engine to claim (``benchmarks/h200_te.py`` is then run end to end with fakes).
LAUNCHER = os.environ.get("H200_TE_LAUNCHER", "").split() or None
COMPONENT_LAUNCHER = os.environ.get("H200_TE_COMPONENT_LAUNCHER", "").split() or None
FAKE_TE = os.environ.get("H200_TE_FAKE_TE") == "1"


def harness_env() -> Any:
    from launch.harness.spec import HarnessEnv

    return HarnessEnv(transformer_engine=True) if FAKE_TE else HarnessEnv.detect()


def elapsed() -> float:
    return time.monotonic() - T0


def log(msg: str) -> None:
    line = f"[{elapsed():6.0f}s] {msg}"
    print(line, flush=True)
    with open(OUT / "driver.log", "a") as f:
        f.write(line + "\n")


def emit(name: str, row: dict[str, Any]) -> None:
    with open(OUT / name, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def uptime_s() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class State:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            self.d = {"done": [], "calls": 0}
        self.d["calls"] = int(self.d.get("calls", 0)) + 1
        self.save()

    def done(self, cid: str) -> bool:
        return cid in self.d["done"]

    def mark(self, cid: str, **info: Any) -> None:
        if cid not in self.d["done"]:
            self.d["done"].append(cid)
        self.d.setdefault("info", {})[cid] = info
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.d, indent=1, default=str))


def keep_log(cid: str, path: Path | str | None) -> None:
    if not path:
        return
    p = Path(path)
    src = p / "log.txt" if p.is_dir() else p
    if src.exists():
        (WORK / "logs").mkdir(parents=True, exist_ok=True)
        (WORK / "logs" / f"{cid}.txt").write_text(src.read_text(errors="replace")[-40000:])


# ----------------------------------------------------------------------------------------------------------------
# sweep cases


def run_sweep_case(c: dict[str, Any], cid: str, out_name: str) -> dict[str, Any]:
    from launch.base import TrialFailed
    from launch.harness.results import read_results
    from launch.harness.spec import harness_layout, override_model
    from launch.local_backend import LocalBackend
    from search_spaces.rules import check_layout
    from specs import Workload, load_model, parse_gpus
    from specs.errors import TunerError
    from specs.layout import Layout
    from specs.model import slice_model

    model = slice_model(load_model(c["model"]), c["layers"])
    model = override_model(model, c.get("model_overrides"), c["id"])
    gpus = sweep_gpus() or c["gpus"]  # the GPU the machine has, when it is not the case's H200 (1xH100)
    cluster = parse_gpus(gpus)
    wl = Workload(seq_length=c["seq_len"], global_batch_size=c["global_batch"], precision=c["precision"])
    lay = Layout.from_dict(c["layout"])
    row: dict[str, Any] = {
        "id": cid,
        "case": c["id"],
        "model": model.name,
        "gpus": gpus,
        "seq_length": wl.seq_length,
        "global_batch_size": wl.global_batch_size,
        "precision": c["precision"],
        "layout": lay.to_dict(),
        "label": lay.label,
        "model_overrides": c.get("model_overrides") or {},
        "options": c["options"],
        "steps": c["steps"],
        "warmup": c["warmup"],
        "uptime_at_start_s": uptime_s(),
        "driver_elapsed_at_start_s": elapsed(),
    }
    broken = check_layout(lay, model, wl)
    if broken:
        row["rules_broken"] = [f"[{r}] {m}" for r, m in broken]
    backend = LocalBackend(
        trials_dir=WORK / "trials",
        num_gpus=cluster.num_gpus,
        steps=c["steps"],
        warmup_steps=c["warmup"],
        timeout_s=max(60.0, min(2.5 * c["est_s"], BUDGET - elapsed() + 30)),
        harness_options={**c["options"], "label": cid},
        launcher=LAUNCHER,
        env=harness_env(),
    )
    try:
        from cost_model.estimate import estimate

        e = estimate(model, cluster, wl, harness_layout(lay, backend.env))
        row.update(
            pred_step_time_s=e.step_time_s,
            pred_peak_gib=e.peak_bytes / GIB,
            pred_note="shipped calibration; it does not model the harness options",
        )
    except Exception as ex:  # noqa: BLE001 - a prediction is a side note here
        row["pred_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
    t = time.monotonic()
    try:
        m = backend.run(lay, model=model, cluster=cluster, workload=wl, trial_dir=cid)
        s = m.extra["summary"]
        res = read_results(Path(m.log_path) / "steps.jsonl")
        row.update(
            status="ok",
            step_time_s=s["median_step_time_s"],
            step_time_cv=s["step_time_cv"],
            tokens_per_s_per_gpu=m.tokens_per_s_per_gpu,
            peak_reserved_gib=m.peak_bytes / GIB,
            peak_allocated_gib=m.extra["peak_allocated_bytes"] / GIB,
            peak_reserved_bytes_per_rank=s["peak_reserved_bytes"],
            peak_allocated_bytes_per_rank=s["peak_allocated_bytes"],
            peak_host_rss_gib=(s.get("peak_host_rss_bytes") or 0) / GIB,
            host_memory_per_rank=s.get("host_memory_per_rank"),
            run_options=s.get("run_options"),
            step_times_s=[st.step_time_s for st in res.steps],
            losses=[st.loss for st in res.steps],
            grad_norms=[st.grad_norm for st in res.steps],
            build_s=s.get("build_s"),
            versions=s.get("versions"),
            notes=s.get("notes"),
            num_microbatches=s.get("num_microbatches"),
        )
        if res.memory_phases:
            row["memory_phases"] = res.memory_phases
        if res.forward_only:
            row["forward_only"] = res.forward_only
        for cen in res.census:
            emit("census.jsonl", {"id": cid, **cen})
        row["census_modules"] = [x.get("module") for x in res.census]
    except TunerError as ex:
        row.update(status="refused", message=str(ex))
    except TrialFailed as ex:
        row.update(status=ex.kind.value, message=str(ex)[:1500])
        if math.isfinite(ex.memory_reached_bytes):
            row["memory_reached_gib"] = ex.memory_reached_bytes / GIB
        keep_log(cid, ex.log_path)
        lp = Path(ex.log_path) / "log.txt"
        if lp.exists():
            row["log_tail"] = lp.read_text(errors="replace")[-2500:]
    row["wall_s"] = time.monotonic() - t
    emit(out_name, row)
    log(
        f"{cid}: {row.get('status')} step {_f(row.get('step_time_s'))} s (cv {_f(row.get('step_time_cv'))}), reserved "
        f"{_f(row.get('peak_reserved_gib'))} "
        f"GiB, host {_f(row.get('peak_host_rss_gib'))} GiB, wall {row['wall_s']:.0f} s"
        + (f" -- {str(row.get('message'))[:200]}" if row.get("message") else "")
    )
    shutil.rmtree(WORK / "trials" / cid / "ckpt", ignore_errors=True)
    return row


def _f(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


# ----------------------------------------------------------------------------------------------------------------
# the component test


def run_component(cid: str) -> dict[str, Any]:
    from tuner.verify.component import plan_component_test, run_component_test

    left = BUDGET - elapsed()
    plan = plan_component_test(
        out_dir=WORK / "component",
        max_experts=int(os.environ.get("COMPONENT_MAX_EXPERTS", "256")),
        moments=("fp32",),
        env=harness_env(),
        check_machine=COMPONENT_LAUNCHER is None,
    )
    cap = float(os.environ.get("COMPONENT_TIMEOUT_S", "480"))
    o = run_component_test(plan, timeout_s=max(60.0, min(cap, left - 20)), launcher=COMPONENT_LAUNCHER)
    for r in o.rows:
        emit("component.jsonl", {"id": cid, **{k: v for k, v in r.items() if k != "traceback"}})
    d = o.to_dict()
    emit("component.jsonl", {"id": cid, "event": "decision", **d})
    keep_log(cid, WORK / "component" / "log.txt")
    log(f"{cid}: {o.result} in {o.seconds:.0f} s, {o.experts} experts" + (f" -- {o.error[:300]}" if o.error else ""))
    if o.decision is not None:
        for name, a in o.decision.arms.items():
            log(
                f"   {name:28s} {a['verdict']:18s} "
                + " ".join(f"step{s}={_e(a['errors'].get(s))}" for s in o.decision.steps)
                + (f"  ({a['why'][:120]})" if a.get("why") else "")
            )
        log(f"   bound: {o.decision.bound}; bitwise: {o.decision.bitwise}")
    return {"result": o.result}


def _e(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


# ----------------------------------------------------------------------------------------------------------------
# convergence check + gradient parity


def _parity_setup() -> tuple[Any, Any, Any, Any]:
    from specs import Workload, load_model, parse_gpus
    from specs.layout import Layout
    from specs.model import slice_model

    e = int(os.environ.get("PARITY_EXPERTS", "64"))
    m = slice_model(load_model("MiniMax-M2"), 1)
    m = m.replace(num_experts=e, name=f"MiniMax-M2[1 layers, {e} experts]")
    return m, parse_gpus("1xH200"), Workload(seq_length=4096, global_batch_size=8), Layout(world_size=1)


def parity_candidates(ref: Any) -> dict[str, tuple[Any, str | None]]:
    """Candidate id -> (layout, fault)."""
    mbs2 = ref.replace(micro_batch_size=2)
    return {
        "par-fault-norm-grad-scaled": (mbs2, "norm_grad_scaled"),
        "par-mbs2": (mbs2, None),
        "par-full-recompute": (
            ref.replace(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
            None,
        ),
        "par-allgather": (ref.replace(dispatcher="allgather"), None),
        "par-fault-non-causal": (ref, "non_causal_attention"),
        "par-offload-1.0": (ref.replace(optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=True), None),
    }


def run_convergence(cid: str) -> dict[str, Any]:
    from tuner.verify.loss_check import convergence_block, local_backend_factory, plan_verify, run_verify

    m, c, wl, ref = _parity_setup()
    cand, fault = parity_candidates(ref)["par-fault-norm-grad-scaled"]
    plan = plan_verify(m, c, wl, cand, ref, out_dir=WORK / "conv", steps=20, fault=fault)
    t = time.monotonic()
    o = run_verify(
        plan,
        local_backend_factory(
            timeout_s=max(90.0, min(300.0, (BUDGET - elapsed()) / 2)), launcher=LAUNCHER, env=harness_env()
        ),
        keep_checkpoint=True,
    )
    d = o.to_dict()
    d.pop("arm_logs", None)
    emit(
        "parity.jsonl",
        {"id": cid, "kind": "convergence", "seconds": time.monotonic() - t, "block": convergence_block(o), **d},
    )
    if o.result == "error":
        for arm in ("reference", "candidate"):
            keep_log(f"{cid}-{arm}", WORK / "conv" / arm)
    from tuner.verify.inputs import layout_text

    log(
        f"{cid}: convergence {o.result} ({o.summary()[:240]}) in {time.monotonic() - t:.0f} s; candidate "
        f"{layout_text(cand)} with fault {fault}"
    )
    return {"result": o.result}


def run_parity(cid: str) -> dict[str, Any]:
    from tuner.verify.parity_check import parity_backend_factory, plan_grad_parity, run_grad_parity

    m, c, wl, ref = _parity_setup()
    cand, fault = parity_candidates(ref)[cid]
    ck = WORK / "conv" / "checkpoint"
    have_ck = (ck / "metadata.json").exists()
    plan = plan_grad_parity(
        m,
        c,
        wl,
        cand,
        ref,
        out_dir=WORK / "parity" / cid,
        init_checkpoint=ck if have_ck else None,
        reference_dir=WORK / "parity" / "ref" if have_ck else None,
        data_step_offset=40 if have_ck else 0,
        fault=fault,
    )
    o = run_grad_parity(
        plan,
        parity_backend_factory(
            timeout_s=max(90.0, min(240.0, BUDGET - elapsed())), launcher=LAUNCHER, env=harness_env()
        ),
    )
    d = o.to_dict()
    emit("parity.jsonl", {"id": cid, "kind": "grad_parity", "block": o.block(gpu="H200"), **d})
    if o.result == "error":
        for a in plan.arms:
            keep_log(f"{cid}-{a.name}", Path(plan.out_dir) / "runs" / Path(a.dump_dir).parent.name)
    th = o.thresholds
    log(
        f"{cid}: {o.result} in {o.seconds:.0f} s (arms {', '.join(f'{k} {v:.0f}s' for k, v in o.arm_seconds.items())}; "
        f"reused {list(o.reused)}); "
        + (f"noise {_e(th.noise_rel_l2)}, threshold {_e(th.rel_l2)}; " if th is not None else "")
        + (o.parity.summary()[:400] if o.parity is not None else o.error[:300])
    )
    return {"result": o.result}


# ----------------------------------------------------------------------------------------------------------------


def build_queue(parts: list[str]) -> list[tuple[str, str, float, Any]]:
    """(case id, output file, planned seconds, runner)."""
    from benchmarks.h200_te_layouts import CASES, PROBE

    sweep = [
        (c["id"], "sweep.jsonl", float(c["est_s"]), (lambda c=c, cid=c["id"]: run_sweep_case(c, cid, "sweep.jsonl")))
        for c in CASES
    ]
    probe_first = [
        (
            "probe-first",
            "probe.jsonl",
            float(PROBE["est_s"]),
            lambda: run_sweep_case(PROBE, "probe-first", "probe.jsonl"),
        )
    ]
    probe_last = [
        ("probe-last", "probe.jsonl", float(PROBE["est_s"]), lambda: run_sweep_case(PROBE, "probe-last", "probe.jsonl"))
    ]
    component = [("component", "component.jsonl", 200.0, lambda: run_component("component"))]
    est = {"par-fault-norm-grad-scaled": 130.0, "par-offload-1.0": 70.0}
    from specs.layout import Layout

    parity = [
        ("conv-fault-norm-grad-scaled", "parity.jsonl", 130.0, lambda: run_convergence("conv-fault-norm-grad-scaled"))
    ]
    parity += [
        (cid, "parity.jsonl", est.get(cid, 45.0), (lambda cid=cid: run_parity(cid)))
        for cid in parity_candidates(Layout(world_size=1))
    ]
    parity_extra = [
        x for x in parity if x[0] == "par-offload-1.0"
    ]  # optimizer offload does not touch the gradients: last
    parity = [x for x in parity if x[0] != "par-offload-1.0"]
    census_ids = {c["id"] for c in CASES if c["options"].get("saved_tensor_census")}
    q: list[tuple[str, str, float, Any]] = []
    for p in parts:
        if p == "all":
            q += probe_first + component + sweep[:4] + parity + sweep[4:] + parity_extra + probe_last
        elif p == "probe":
            q += probe_first
        elif p == "probe_last":
            q += probe_last
        elif p == "component":
            q += component
        elif p == "sweep":
            only = [x.strip() for x in (os.environ.get("SWEEP_ONLY") or "").split(",") if x.strip()]
            unknown = sorted(set(only) - {x[0] for x in sweep})
            if unknown:
                refuse(f"SWEEP_ONLY {reprlib.repr(unknown)}: not sweep cases; accepted: {[x[0] for x in sweep]}")
            q += [x for cid in only for x in sweep if x[0] == cid] if only else sweep
        elif p == "snapshot":
            q += [x for x in sweep if x[0] in census_ids]
        elif p == "parity":
            q += parity + parity_extra
        else:
            refuse(f"PART {p!r:.40}: accepted all, probe, component, sweep, snapshot, parity, probe_last")
    seen: set[str] = set()
    return [x for x in q if not (x[0] in seen or seen.add(x[0]))]  # type: ignore[func-returns-value]


def refuse(message: str) -> NoReturn:
    """Stop the driver on bad input: one line on standard error, exit 2 (before any case runs)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def sweep_gpus() -> str | None:
    """``SWEEP_GPUS`` read as the GPU it names, written the one way rows are (``1xH100``), or None when it is not set;
    it must name one GPU of a bundled type (the sweep's cases are 1-GPU layouts), else :func:`refuse`."""
    raw = os.environ.get("SWEEP_GPUS")
    if not raw:
        return None
    from specs import parse_gpus
    from specs.errors import TunerError

    try:
        cluster = parse_gpus(raw, name="SWEEP_GPUS")
    except TunerError as e:
        refuse(str(e))
    if cluster.num_gpus != 1:
        refuse(f"SWEEP_GPUS {reprlib.repr(raw)}: the sweep's cases run on one GPU; give 1xGPU (e.g. 1xH100)")
    return f"1x{cluster.gpu.name}"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    sweep_gpus()
    parts = [p.strip() for p in (os.environ.get("PART") or "all").split(",") if p.strip()]
    state = State(WORK / "state.json")
    queue = build_queue(parts)
    probe_est = next((e for cid, _, e, _ in queue if cid == "probe-last"), 0.0)
    log(
        f"call {state.d['calls']}: parts {parts}, budget {BUDGET:.0f} s, {len(queue)} cases, "
        f"{sum(1 for q in queue if state.done(q[0]))} done before; "
        f"uptime {uptime_s()} s; final {FINAL}"
    )
    try:
        env = harness_env()
        log(f"environment: transformer_engine {env.transformer_engine}")
        if not env.transformer_engine:
            log("Transformer Engine is not importable (PYTHONPATH=/tmp/site? was the machine given back?): stopping")
            return 2
    except Exception as e:  # noqa: BLE001
        log(f"environment check failed: {e}")
    for cid, out_name, est, fn in queue:
        if state.done(cid):
            continue
        reserve = probe_est if (FINAL and cid != "probe-last") else 0.0
        if elapsed() + est + reserve > BUDGET:
            log(
                f"{cid}: skipped (planned {est:.0f} s, {BUDGET - elapsed():.0f} s "
                f"left{', keeping room for probe-last' if reserve else ''})"
            )
            emit(
                out_name,
                {
                    "id": cid,
                    "status": "skipped",
                    "reason": f"budget: planned {est:.0f} s, {BUDGET - elapsed():.0f} s left",
                },
            )
            continue
        t = time.monotonic()
        try:
            info = fn() or {}
        except Exception as e:  # noqa: BLE001 - a case that breaks is recorded; the next one runs
            info = {"result": "driver_error", "message": f"{type(e).__name__}: {e}"}
            emit(
                out_name,
                {
                    "id": cid,
                    "status": "driver_error",
                    "message": f"{type(e).__name__}: {str(e)[:1500]}",
                    "traceback": traceback.format_exc()[-3000:],
                },
            )
            log(f"{cid}: driver error {type(e).__name__}: {str(e)[:300]}")
        state.mark(
            cid,
            seconds=time.monotonic() - t,
            planned=est,
            **{k: v for k, v in info.items() if k in ("result", "status")},
        )
    left = [cid for cid, *_ in queue if not state.done(cid)]
    log(f"end of call {state.d['calls']}: {len(queue) - len(left)} of {len(queue)} cases done in all; left: {left}")
    if (WORK / "logs").exists():
        with tarfile.open(OUT / "logs.tgz", "w:gz") as tar:
            tar.add(WORK / "logs", arcname="logs")
    par = [cid for cid, *_ in queue if cid.startswith(("par-", "conv-"))]
    if par and all(state.done(cid) for cid in par):  # the dumps (GBs each) and the checkpoint are no longer needed
        shutil.rmtree(WORK / "parity", ignore_errors=True)
        shutil.rmtree(WORK / "conv" / "checkpoint", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
