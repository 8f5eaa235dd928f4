"""Gradient parity (``tune verify --grad-parity``): the plan and the run of its three arms.

From one checkpoint and one global batch: the reference layout, the reference again (their difference is the
noise that sets the threshold) and the candidate each run one forward and backward and dump every parameter's
full gradient (:mod:`launch.harness.grads`); :mod:`tuner.verify.parity` compares the dumps.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launch.base import TrialFailed, TrialStopped
from specs import Cluster, ModelSpec, Workload
from specs.errors import TunerError
from specs.layout import Layout
from tuner.verify.inputs import check_inputs, json_default, layout_text, refuse_unrunnable
from tuner.verify.loss_check import DEFAULT_LR
from tuner.verify.parity import ParityResult, ParityThresholds, compare_grad_dumps, load_grad_dump, parity_block


@dataclass(frozen=True, kw_only=True, slots=True)
class GradParityArm:
    """One forward and backward of the parity check: ``reference``, ``reference_repeat`` (the noise run) or
    ``candidate``; the reference writes the seed's weights to ``save_checkpoint`` when the check has none."""

    name: str
    layout: Layout
    dump_dir: str
    fault: str | None = None
    save_checkpoint: str | None = None

    def harness_options(self, plan: GradParityPlan) -> dict[str, Any]:
        return {
            "data": "corpus", "corpus_path": plan.corpus_path, "corpus_sha256": plan.corpus_sha256, "lr": plan.lr,
            "load_checkpoint": plan.checkpoint_dir, "save_checkpoint": self.save_checkpoint, "fault": self.fault,
            "data_step_offset": plan.data_step_offset, "dump_grads": self.dump_dir,
            "label": f"{self.name} ({layout_text(self.layout)}{', fault ' + self.fault if self.fault else ''})",
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class GradParityPlan:
    """Everything a gradient-parity check runs (no GPU work to make it)."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    candidate: Layout
    reference: Layout
    out_dir: str
    checkpoint_dir: str
    corpus_path: str | None
    corpus_source: str
    corpus_sha256: str
    arms: tuple[GradParityArm, ...]
    data_step_offset: int = 0
    fault: str | None = None
    lr: float = DEFAULT_LR
    factor: float = 10.0
    floor: float = 1.6e-2
    init_checkpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.name, "gpus": self.cluster.label, "seq_length": self.workload.seq_length,
                "global_batch_size": self.workload.global_batch_size, "candidate": layout_text(self.candidate),
                "reference": layout_text(self.reference),
                "checkpoint": self.checkpoint_dir, "written_by": "the user" if self.init_checkpoint else "reference",
                "data": {"corpus": self.corpus_source, "sha256": self.corpus_sha256, "step": self.data_step_offset},
                "arms": [{"name": a.name, "layout": layout_text(a.layout), "fault": a.fault,
                          "dump": a.dump_dir} for a in self.arms],
                "fault": self.fault, "threshold_rule": f"max({self.factor:g} x noise, {self.floor:g})"}


def plan_grad_parity(model: ModelSpec, cluster: Cluster, workload: Workload, candidate: Layout, reference: Layout, *,
                     out_dir: str | Path, init_checkpoint: str | Path | None = None,
                     reference_dir: str | Path | None = None, corpus: str | Path | None = None,
                     data_step_offset: int = 0, fault: str | None = None, factor: float = 10.0,
                     floor: float = 1.6e-2) -> GradParityPlan:
    """The gradient-parity plan: reference, a second reference run (its noise sets the threshold), candidate; one
    forward and backward each from ``init_checkpoint`` (None: the seed's weights, written by the reference) on the
    rows of step ``data_step_offset``. The reference's dumps go to ``reference_dir`` (default ``out_dir``), reused by
    later candidates; ``factor`` and ``floor`` make the threshold (:meth:`ParityThresholds.from_noise`). Raises
    InfeasibleLayout or TunerError: as :func:`tuner.verify.inputs.check_inputs`, or a bad threshold rule."""
    if not (factor >= 1 and 0 < floor < 1):
        raise TunerError(f"--noise-factor must be >= 1 and --noise-floor in (0, 1), got {factor!r}, {floor!r}")
    c = check_inputs(candidate, reference, model, cluster, workload, fault=fault, what="reference",
                     init_checkpoint=init_checkpoint, corpus=corpus)
    out = Path(out_dir)
    rdir = Path(reference_dir) if reference_dir is not None else out
    ckpt = str(Path(init_checkpoint)) if init_checkpoint is not None else str(rdir / "checkpoint")
    slug = "".join(ch if ch.isalnum() else "-" for ch in candidate.label).strip("-").lower() + (f"-{fault}"
                                                                                                if fault else "")
    arms = (
        GradParityArm(name="reference", layout=reference, dump_dir=str(rdir / "reference" / "grads"),
                      save_checkpoint=None if init_checkpoint is not None else ckpt),
        GradParityArm(name="reference_repeat", layout=reference, dump_dir=str(rdir / "reference_repeat" / "grads")),
        GradParityArm(name="candidate", layout=candidate, dump_dir=str(out / f"candidate-{slug}" / "grads"),
                      fault=fault),
    )
    return GradParityPlan(model=model, cluster=cluster, workload=workload, candidate=candidate, reference=reference,
                          out_dir=str(out), checkpoint_dir=ckpt,
                          corpus_path=str(corpus) if corpus is not None else None, corpus_source=c.source,
                          corpus_sha256=c.sha256, arms=arms, data_step_offset=data_step_offset, fault=fault,
                          factor=float(factor), floor=float(floor),
                          init_checkpoint=str(init_checkpoint) if init_checkpoint is not None else None)


@dataclass(frozen=True, kw_only=True, slots=True)
class GradParityOutcome:
    """What a parity check found: ``result`` pass / fail, or ``error`` (an arm did not finish)."""

    plan: GradParityPlan
    result: str
    parity: ParityResult | None = None
    noise: ParityResult | None = None
    """The reference's second run against its first (``parity``: the candidate against the reference)."""
    thresholds: ParityThresholds | None = None
    error: str = ""
    arm_seconds: dict[str, float] = field(default_factory=dict)
    losses: dict[str, float | None] = field(default_factory=dict)
    """Step-1 loss of each arm (the same batch and weights: equal to bf16 noise)."""
    reused: tuple[str, ...] = ()
    date: str = ""
    seconds: float = 0.0

    def block(self, gpu: str = "") -> dict[str, Any]:
        """The recipe's ``correctness.grad_parity`` entry (:func:`tuner.verify.parity.parity_block`)."""
        if self.parity is None:
            return {"result": "error", "candidate": layout_text(self.plan.candidate),
                    "reference": layout_text(self.plan.reference), "note": self.error}
        return parity_block(self.parity, date=self.date, gpu=gpu, seconds=self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "error": self.error, "date": self.date, "seconds": self.seconds,
                "arm_seconds": self.arm_seconds,
                "losses": self.losses, "reused": list(self.reused), "plan": self.plan.to_dict(),
                "thresholds": asdict(self.thresholds) if self.thresholds is not None else None,
                "noise": self.noise.to_dict(all_tensors=False) if self.noise is not None else None,
                "parity": self.parity.to_dict() if self.parity is not None else None}


def parity_backend_factory(*, timeout_s: float = 900.0, launcher: list[str] | None = None,
                           env: Any = None) -> Callable[[GradParityPlan, GradParityArm], Any]:
    """Arms run by :class:`launch.local_backend.LocalBackend`: one step (no warm-up), the dump at step 1."""
    from launch.local_backend import LocalBackend

    def make(plan: GradParityPlan, arm: GradParityArm) -> Any:
        return LocalBackend(trials_dir=Path(plan.out_dir) / "runs", num_gpus=plan.cluster.num_gpus, steps=1,
                            warmup_steps=0, timeout_s=timeout_s,
                            launcher=launcher, env=env, harness_options=arm.harness_options(plan))

    return make


def _reusable(arm: GradParityArm, plan: GradParityPlan) -> bool:
    """An earlier dump of this arm that fits this plan (same layout, checkpoint, batch, no fault)."""
    if arm.name == "candidate" or plan.init_checkpoint is None:
        return False
    try:
        m = load_grad_dump(arm.dump_dir).meta
    except TunerError:
        return False
    b = m.get("batch") or {}
    return (m.get("layout") == arm.layout.to_dict() and not m.get("fault")
            and b.get("data_step_offset") == plan.data_step_offset
            and b.get("corpus_sha256") == plan.corpus_sha256
            and b.get("global_batch_size") == plan.workload.global_batch_size
            and b.get("seq_length") == plan.workload.seq_length)


def run_grad_parity(plan: GradParityPlan, backend_factory: Callable[[GradParityPlan, GradParityArm], Any] | None = None,
                    *, on_arm: Callable[[str, str], None] | None = None) -> GradParityOutcome:
    """Run the arms of ``plan`` (reusing the reference's dumps where they fit), set the threshold from the reference's
    noise and compare the candidate; writes ``parity.json``. Raises InfeasibleLayout: an arm cannot run here (checked
    for every arm before any runs); TunerError: the folder cannot be written, or the noise measurement itself is
    broken."""
    factory = backend_factory or parity_backend_factory()
    refuse_unrunnable(factory, plan)
    out = Path(plan.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TunerError(f"cannot write the check's folder {out} ({e.strerror or e})") from None
    say = on_arm or (lambda arm, state: None)
    t0 = time.monotonic()
    secs: dict[str, float] = {}
    reused: list[str] = []
    error = ""
    for arm in plan.arms:
        if _reusable(arm, plan):
            reused.append(arm.name)
            continue
        shutil.rmtree(Path(arm.dump_dir), ignore_errors=True)
        say(arm.name, "start")
        ta = time.monotonic()
        try:
            factory(plan, arm).run(arm.layout, model=plan.model, cluster=plan.cluster, workload=plan.workload,
                                   trial_dir=Path(arm.dump_dir).parent.name)
        except (TrialFailed, TrialStopped) as e:
            error = f"the {arm.name} arm ({arm.layout.label}) did not finish: {e}"
            say(arm.name, "failed")
            break
        secs[arm.name] = time.monotonic() - ta
        if not (Path(arm.dump_dir) / "index.json").exists():
            error = f"the {arm.name} arm ({arm.layout.label}) finished without writing its gradients to {arm.dump_dir}"
            break
        say(arm.name, "done")
    noise = parity = th = None
    losses: dict[str, float | None] = {}
    if not error:
        ref, rep, cand = (load_grad_dump(a.dump_dir) for a in plan.arms)
        losses = {a.name: d.meta.get("loss") for a, d in zip(plan.arms, (ref, rep, cand))}
        cache = Path(plan.arms[0].dump_dir).parent.parent / "noise.json"
        if {"reference", "reference_repeat"} <= set(reused) and cache.exists():
            noise = ParityResult.from_dict(json.loads(cache.read_text()))  # the same two dumps as the earlier pair's
        else:
            noise = compare_grad_dumps(rep, ref)
            cache.write_text(json.dumps(noise.to_dict(), default=json_default))
        th = ParityThresholds.from_noise(noise, factor=plan.factor, floor=plan.floor)
        parity = compare_grad_dumps(cand, ref, th)
        shutil.rmtree(Path(plan.arms[2].dump_dir), ignore_errors=True)
    o = GradParityOutcome(plan=plan, result=parity.result if parity is not None else "error", parity=parity,
                          noise=noise, thresholds=th, error=error, arm_seconds=secs, losses=losses,
                          reused=tuple(reused), date=_dt.date.today().isoformat(), seconds=time.monotonic() - t0)
    (out / "parity.json").write_text(json.dumps(o.to_dict(), indent=2, default=json_default))
    return o
