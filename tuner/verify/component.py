"""The optimizer component test (``tune verify --component optimizer``): precision-aware Adam against FP64.

Megatron-core's precision-aware Adam (Transformer Engine) and an FP64 Adam (:func:`adam_reference`) take the same
gradients; the worst tensor's relative L2 error of the update after 1 and 3 steps must be within the seed's bound,
``2 x the default GPU optimizer's error + 1e-3`` (``../shared/seeds/001_*``, ``correctness.component_tests``), the
FP32 masters TE rebuilds from bf16 weights and 16-bit remainders (:func:`reconstruct_fp32`) must be bitwise those of
an arm with explicit FP32 masters, and every negative control must fail (:func:`decide_component_test`). The GPU
program is :mod:`launch.harness.component`; the decision here is NumPy, tested in CI on recorded numbers.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from launch._trial import kill_group
from launch.harness.component import COMPONENT_ARMS, AdamHyper
from specs.errors import TunerError
from tuner.verify.inputs import json_default

#: The seed's bound of the component test: ``COMPONENT_BOUND_FACTOR x default error + COMPONENT_BOUND_ABS``
#: (``../shared/seeds/001_*``: "bound 2 x the default GPU optimizer's error + 1e-3").
COMPONENT_BOUND_FACTOR = 2.0
COMPONENT_BOUND_ABS = 1e-3


def split_fp32(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """FP32 values as TE stores them with ``store_param_remainders``: (``uint16`` bf16 bits, ``int16`` remainder), the
    bf16 rounded up when the remainder reads negative (``transformer_engine/common/multi_tensor/adam.cu``,
    ``AdamFunctorMasterParamRemainder``)."""
    bits = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)
    hi = (bits >> 16).astype(np.uint16)
    lo = (bits & 0xFFFF).astype(np.uint16).view(np.int16)
    hi = (hi + (lo < 0).astype(np.uint16)).astype(np.uint16)
    return hi, lo


def reconstruct_fp32(bf16_bits: Any, remainder: Any) -> np.ndarray:
    """The FP32 master TE rebuilds from bf16 bits and an int16 remainder (inverse of :func:`split_fp32`;
    ``AdamFunctorMasterParamRemainder``, "Reconstruct FP32 params")."""
    hi = np.asarray(bf16_bits).astype(np.int32) & 0xFFFF
    rem = np.asarray(remainder).astype(np.int16)
    hi = (hi - (rem < 0).astype(np.int32)) & 0xFFFF
    bits = (hi.astype(np.uint32) << 16) | (rem.view(np.uint16).astype(np.uint32))
    return bits.view(np.float32)


def adam_reference(p0: Any, grads: Sequence[Any], hyper: AdamHyper, *, weight_decay: float | None = None,
                   clip_coeffs: Sequence[float] | None = None) -> list[np.ndarray]:
    """Adam with decoupled weight decay in float64, one array of weights per step of ``grads``.

    For step ``t`` (from 1), gradient ``g`` (times the step's clip coefficient): ``m = b1 m + (1 - b1) g``,
    ``v = b2 v + (1 - b2) g^2``, ``p = p - lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)``: TE's
    ``AdamFunctor`` (``adam.cu``, "weight decay" mode) and, in exact arithmetic, ``torch.optim.AdamW``.
    ``weight_decay`` defaults to ``hyper.weight_decay``, ``clip_coeffs`` to 1 per step."""
    p = np.asarray(p0, dtype=np.float64).copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    wd = hyper.weight_decay if weight_decay is None else weight_decay
    out = []
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, dtype=np.float64) * (clip_coeffs[t - 1] if clip_coeffs is not None else 1.0)
        m = hyper.beta1 * m + (1 - hyper.beta1) * g
        v = hyper.beta2 * v + (1 - hyper.beta2) * g * g
        mh = m / (1 - hyper.beta1**t)
        vh = v / (1 - hyper.beta2**t)
        p = p - hyper.lr * (mh / (np.sqrt(vh) + hyper.eps) + wd * p)
        out.append(p.copy())
    return out


def component_bound(default_error: float) -> float:
    """The seed's bound on the worst tensor's relative L2 error of the update: ``2 x default_error + 1e-3``."""
    return COMPONENT_BOUND_FACTOR * float(default_error) + COMPONENT_BOUND_ABS


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentResult:
    """The decision of the component test, from the component program's JSON lines."""

    passed: bool
    steps: tuple[int, ...]
    default_error: dict[int, float]
    bound: dict[int, float]
    arms: dict[str, dict[str, Any]]
    """Per arm: ``kind``, ``errors`` {step: worst relative L2}, ``worst_tensor`` {step: name}, ``verdict``
    (``pass`` / ``fail`` for tested arms, ``failed as expected`` / ``did not fail`` for controls), ``why``."""
    bitwise: dict[str, Any]
    problems: tuple[str, ...] = ()
    required_moments: tuple[str, ...] = ("fp32",)

    @property
    def result(self) -> str:
        return "pass" if self.passed else "fail"

    def detail(self) -> str:
        """One paragraph in the seed's style (the ``detail`` field of a component test)."""
        parts = []
        for name in ("gpu", "offload", "gpu_bf16_moments"):
            a = self.arms.get(name)
            if not a:
                continue
            errs = ", ".join(f"{_fmt(a['errors'].get(s))} after {s} step{'s' if s != 1 else ''} (bound "
                             f"{_fmt(self.bound.get(s))})" for s in self.steps)
            parts.append(f"{name.replace('_', ' ')}: worst tensor (update) relative L2 error {errs}: {a['verdict']}")
        b = self.bitwise
        if b:
            parts.append("reconstructed FP32 masters "
                         + ("bitwise identical to" if b.get("identical") else "NOT bitwise identical to")
                         + f" the arm with explicit FP32 masters ({b.get('mismatched', '?')} of "
                         f"{b.get('elements', '?')} elements differ)")
        ctl = [(n, a) for n, a in self.arms.items() if a["kind"] == "control"]
        if ctl:
            parts.append("negative controls: " + "; ".join(f"{n.removeprefix('control_').replace('_', ' ')} "
                                                           f"{a['verdict']} ({a['why']})" for n, a in ctl))
        parts.append("bound 2 x the default GPU optimizer's error + 1e-3 (default: "
                     f"{', '.join(_fmt(self.default_error.get(s)) for s in self.steps)})")
        if self.problems:
            parts.append("problems: " + "; ".join(self.problems))
        return "; ".join(parts)

    def entry(self, *, shape: str, gpu: str, date: str) -> dict[str, Any]:
        """The recipe's ``correctness.component_tests`` entry in the seed's form (test, shape, gpu, date, result,
        detail, note)."""
        return {"test": _test_name("offload" in self.arms), "shape": shape, "gpu": gpu, "date": date,
                "result": self.result, "detail": self.detail(),
                "note": "the optimizer step is elementwise: the arms are fed the same recorded gradients as the FP64 "
                "reference"}

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "steps": list(self.steps),
                "default_error": {str(k): v for k, v in self.default_error.items()},
                "bound": {str(k): v for k, v in self.bound.items()}, "arms": self.arms, "bitwise": self.bitwise,
                "problems": list(self.problems), "required_moments": list(self.required_moments),
                "detail": self.detail()}


def _test_name(offload: bool) -> str:
    return ("precision-aware Adam on the GPU" + (" and CPU optimizer offload (fraction 1.0, overlapped copies)"
                                                 if offload else "") + ", each against an FP64 reference")


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def decide_component_test(rows: Iterable[Mapping[str, Any]], *,
                          required_moments: Sequence[str] = ("fp32",)) -> ComponentResult:
    """Decide the component test from the JSON lines of :mod:`launch.harness.component`: pass when every ``test`` arm
    whose moments are in ``required_moments`` is within :func:`component_bound` of the ``default`` arm's error at
    every step, the rebuilt masters are bitwise identical, and every class of bug (``ComponentArm.detects``) has a
    ``control`` arm over the bound or differing bitwise (a crashed control detected nothing; beta2 0.95 for 0.98 stays
    within it, ``benchmarks/results/h200_te_2026-12-01/call12``). Raises TunerError: no row of the ``default`` arm."""
    by_arm: dict[str, dict[int, Mapping[str, Any]]] = {}
    kinds: dict[str, str] = {}
    errors: dict[str, str] = {}
    bit_rows = []
    for r in rows:
        if (ev := r.get("event")) == "arm":
            by_arm.setdefault(str(r["arm"]), {})[int(r["step"])] = r
            kinds[str(r["arm"])] = str(r.get("kind", ""))
        elif ev == "arm_error":
            errors[str(r["arm"])] = str(r.get("message", ""))
            kinds.setdefault(str(r["arm"]), str(r.get("kind", "")))
        elif ev == "bitwise":
            bit_rows.append(r)
    if "default" not in by_arm:
        raise TunerError("the component test has no result for the default GPU optimizer"
                         + (f" (it failed: {errors['default'][:200]})" if "default" in errors else "") + ": no bound "
                         "can be set")
    steps = tuple(sorted(by_arm["default"]))
    default_error = {s: float(by_arm["default"][s]["worst_rel_l2"]) for s in steps}
    bound = {s: component_bound(e) for s, e in default_error.items()}
    arms: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in list(by_arm) + [n for n in errors if n not in by_arm]:
        arms[name], problem = _arm_verdict(name, kinds.get(name, ""), by_arm.get(name, {}), errors.get(name), bit_rows,
                                           bound, required_moments)
        if problem:
            problems.append(problem)
    # Every class of bug must be caught by at least one of its controls (one wrong hyperparameter, eps or beta2,
    # is enough for that class); a control that did not fail is reported in its verdict either way.
    classes: dict[str, list[str]] = {}
    for name, info in arms.items():
        if info["kind"] == "control":
            classes.setdefault(str(info.get("detects") or name), []).append(name)
    for cls, names in sorted(classes.items()):
        if not any(arms[n]["verdict"] == "failed as expected" for n in names):
            each = "; ".join(f"{n} {arms[n]['verdict']} ({arms[n].get('why', '')})" for n in names)
            problems.append(f"no negative control of class {cls} failed: {each}")
    need = [a.name for a in COMPONENT_ARMS if a.kind == "test" and a.moments in required_moments and a.name not in arms]
    problems += [f"arm {n} was not run" for n in need]
    bit, problem = _bitwise(bit_rows, "gpu" in arms)
    if problem:
        problems.append(problem)
    return ComponentResult(passed=not problems, steps=steps, default_error=default_error, bound=bound, arms=arms,
                           bitwise=bit, problems=tuple(problems), required_moments=tuple(required_moments))


def _arm_verdict(name: str, kind: str, rs: Mapping[int, Mapping[str, Any]], err: str | None,
                 bit_rows: Sequence[Mapping[str, Any]],
                 bound: Mapping[int, float], required_moments: Sequence[str]) -> tuple[dict[str, Any], str]:
    """One arm's row of :attr:`ComponentResult.arms` and the problem that fails the test ('' when none)."""
    spec = {a.name: a for a in COMPONENT_ARMS}
    kind = kind or (spec[name].kind if name in spec else "")
    steps = tuple(bound)
    errs = {s: float(rs[s]["worst_rel_l2"]) for s in rs}
    worst = {s: str(rs[s].get("worst_tensor", "")) for s in rs}
    over = [s for s in steps if s in errs and not errs[s] <= bound[s]]
    info: dict[str, Any] = {"kind": kind, "errors": errs, "worst_tensor": worst}
    problem = ""
    if kind in ("baseline", "bitwise"):
        info["verdict"] = "reference" if err is None else "error"
        info["why"] = err or ""
        if err is not None:
            problem = f"arm {name} failed: {err[:200]}"
    elif kind == "test":
        moments = spec[name].moments if name in spec else "fp32"
        required = moments in required_moments
        if err is not None:
            info["verdict"], info["why"] = "error", err[:300]
        elif set(steps) - set(errs):
            info["verdict"], info["why"] = "fail", f"no result after step(s) {sorted(set(steps) - set(errs))}"
        elif over:
            s = over[0]
            info["verdict"], info["why"] = "fail", f"{errs[s]:.3g} > {bound[s]:.3g} after {s} steps ({worst[s]})"
        else:
            info["verdict"], info["why"] = "pass", ""
        info["required"] = required
        if required and info["verdict"] != "pass":
            problem = f"arm {name}: {info['verdict']} {info['why']}"
    elif kind == "control":
        bits = [b for b in bit_rows if b.get("arm") == name and not b.get("identical")]
        if over:
            s = over[0]
            plural = "s" if s != 1 else ""
            info["verdict"] = "failed as expected"
            info["why"] = f"relative_l2 {errs[s]:.3g} > {bound[s]:.3g} after {s} step{plural}"
        elif bits:
            info["verdict"], info["why"] = "failed as expected", "masters differ bitwise"
        elif err is not None:  # a control that crashed detected nothing
            info["verdict"], info["why"] = "error", f"the control could not run: {err[:200]}"
            problem = f"negative control {name} could not run: {err[:200]}"
        else:
            info["verdict"] = "did not fail"
            info["why"] = "within the bound at every step: " + ", ".join(f"{_fmt(errs.get(s))} <= {_fmt(bound[s])}"
                                                                         for s in steps)
        info["detects"] = spec[name].detects if name in spec else name
    return info, problem


def _bitwise(bit_rows: Sequence[Mapping[str, Any]], gpu_ran: bool) -> tuple[dict[str, Any], str]:
    """The ``gpu`` arm's bitwise comparison of the rebuilt masters, and the problem that fails the test ('' when
    none)."""
    main = [b for b in bit_rows if b.get("arm") == "gpu"]
    if not main:
        return {}, "no bitwise comparison of the rebuilt masters was recorded" if gpu_ran else ""
    bit = {"arm": "gpu", "against": main[0].get("against"), "steps": sorted(int(b["step"]) for b in main),
           "identical": all(bool(b.get("identical")) for b in main),
           "mismatched": sum(int(b.get("mismatched", 0)) for b in main),
           "elements": sum(int(b.get("elements", 0)) for b in main)}
    return bit, "" if bit["identical"] else "the rebuilt masters are not bitwise identical to the explicit-master arm's"


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentPlan:
    """What ``tune verify --component optimizer`` runs (:mod:`launch.harness.component`)."""

    spec: Any
    """A :class:`launch.harness.component.ComponentSpec`."""
    out_dir: str
    required_moments: tuple[str, ...] = ("fp32",)
    """Moment dtypes whose test arms decide the result (the recipe's: ``fp32`` unless it sets bf16 moments)."""
    gpu: str = "H200"


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentOutcome:
    """The component test's outcome: ``result`` pass / fail, or ``error`` (the program did not finish)."""

    plan: ComponentPlan
    result: str
    decision: ComponentResult | None = None
    """None on error."""
    rows: tuple[dict[str, Any], ...] = ()
    error: str = ""
    date: str = ""
    seconds: float = 0.0

    @property
    def experts(self) -> int | None:
        return next((int(r["experts"]) for r in self.rows if r.get("event") == "start"), None)

    def entry(self) -> dict[str, Any]:
        """The ``correctness.component_tests`` entry in the seed's form."""
        shape = self.plan.spec.shape_text(self.experts or self.plan.spec.num_experts)
        if self.decision is None:
            return {"test": _test_name(True), "shape": shape, "gpu": self.plan.gpu, "date": self.date,
                    "result": "error", "detail": self.error, "note": "the component program did not finish"}
        return self.decision.entry(shape=shape, gpu=self.plan.gpu, date=self.date)

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "error": self.error, "date": self.date, "seconds": self.seconds,
                "entry": self.entry(), "decision": self.decision.to_dict() if self.decision is not None else None,
                "spec": json.loads(self.plan.spec.to_json())}


def plan_component_test(*, out_dir: str | Path, experts: int | None = None, max_experts: int = 512,
                        steps: tuple[int, ...] = (1, 3), moments: tuple[str, ...] = ("fp32",),
                        arms: tuple[str, ...] | None = None, env: Any = None, gpu: str = "H200",
                        check_machine: bool = True) -> ComponentPlan:
    """The component test's plan, refused before any GPU time when this machine cannot run it. ``experts``: exactly this
    many (default: as many as fit, up to ``max_experts``); ``moments``: the dtypes whose arms decide (the recipe's
    ``exp_avg_dtype``); ``env``: a :class:`launch.harness.spec.HarnessEnv` (default probed). Raises TunerError: no
    Transformer Engine (precision-aware Adam is TE's FusedAdam), no torch / megatron-core, no GPU (``check_machine``),
    or bad ``moments``."""
    from launch.harness.component import ComponentSpec
    from launch.harness.spec import HarnessEnv

    bad = [m for m in moments if m not in ("fp32", "bf16")]
    if bad or not moments:
        raise TunerError(f"--moments {','.join(moments)!r}: accepted fp32, bf16 (the recipe's exp_avg_dtype)")
    names = tuple(a.name for a in COMPONENT_ARMS) if arms is None else tuple(arms)
    spec = ComponentSpec(experts=experts, max_experts=max_experts, steps=tuple(steps), arms=names)
    e = env if env is not None else HarnessEnv.detect()
    if not e.transformer_engine:
        raise TunerError("tune verify --component optimizer needs Transformer Engine on this machine: megatron-core's "
                         "precision-aware Adam is TE's FusedAdam (with store_param_remainders); install "
                         "transformer-engine, or run it where it is installed")
    if check_machine:
        from launch.local_backend import check_harness_dependencies, machine_gpu_count

        check_harness_dependencies("tune verify --component optimizer")
        if machine_gpu_count() < 1:
            raise TunerError("tune verify --component optimizer needs 1 GPU and this machine shows none (nvidia-smi / "
                             "CUDA_VISIBLE_DEVICES)")
    return ComponentPlan(spec=spec, out_dir=str(out_dir), required_moments=tuple(moments), gpu=gpu)


def run_component_test(plan: ComponentPlan, *, launcher: list[str] | None = None,
                       timeout_s: float = 900.0) -> ComponentOutcome:
    """Run the component program (one process, one GPU, killed after ``timeout_s``) and decide; writes
    ``component_spec.json``, ``component.jsonl``, ``log.txt`` and ``component.json`` under the plan's folder. Raises
    TunerError: the folder cannot be written."""
    import os
    import subprocess
    import sys
    import time

    from launch.harness.results import read_lines
    from launch.local_backend import SAFE_ENV

    out = Path(plan.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        spec_path, lines, log = out / "component_spec.json", out / "component.jsonl", out / "log.txt"
        spec_path.write_text(plan.spec.to_json())
        if lines.exists():
            lines.unlink()
    except OSError as e:
        raise TunerError(f"cannot write the component test's folder {out} ({e.strerror or e})") from None
    cmd = [*(launcher or [sys.executable, "-m", "launch.harness.component"]), "--spec", str(spec_path), "--out",
           str(lines)]
    t0 = time.monotonic()
    error = ""
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **SAFE_ENV})
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = None
            error = f"the component program ran past {timeout_s:g} s and was stopped"
    rows = tuple(read_lines(lines))
    if not error and rc != 0:
        errs = [r for r in rows if r.get("event") in ("error", "refused")]
        error = (f"the component program exited with status {rc}: "
                 + (str(errs[0].get("message") or errs[0].get("reasons")) if errs else
                 log.read_text(errors="replace")[-500:]))
    decision = None
    if not error:
        try:
            decision = decide_component_test(rows, required_moments=plan.required_moments)
        except TunerError as e:
            error = str(e)
    o = ComponentOutcome(plan=plan, result="error" if decision is None else decision.result, decision=decision,
                         rows=rows, error=error, date=_dt.date.today().isoformat(), seconds=time.monotonic() - t0)
    (out / "component.json").write_text(json.dumps(o.to_dict(), indent=2, default=json_default))
    return o

