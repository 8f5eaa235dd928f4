"""``tune verify``: does a layout train the same numbers as a reference layout?

:func:`plan_verify` plans two arms of the same model, GPUs and workload. The reference arm trains
``warm_start_steps`` from the seed, writes a megatron-core distributed checkpoint (``<out>/checkpoint``), loads it
back and trains ``steps`` steps with a fresh optimizer; the candidate arm loads the same checkpoint (resharded) and
trains ``steps`` steps (with ``init_checkpoint`` both load the user's). Both see the same byte-tokenised rows in
Megatron's sample order (:mod:`launch.harness.data`) and hyperparameters; a step's loss is the mean over the global
batch. :func:`tuner.verify.convergence.compare_losses` decides. Outputs under ``<out>``: ``verify.json``,
``losses.png`` and each arm's harness folder.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.base import Measurement, TrialFailed, TrialStopped
from specs import Cluster, ModelSpec, Workload
from specs.errors import TunerError
from specs.layout import Layout
from tuner.verify.convergence import ConvergenceResult, ConvergenceThresholds, compare_losses
from tuner.verify.inputs import check_inputs, json_default, refuse_unrunnable

#: MiniMax-M2 slice (the loss rose from 12.6 to 17.7, then spiked; bf16 noise grew into 14% differences).
DEFAULT_LR = 1e-4
#: Linear learning-rate warm-up, steps (of the warm start and of each arm's measured steps).
DEFAULT_LR_WARMUP = 5
#: Steps the reference arm trains before writing the starting checkpoint: from random weights a check compares
#: little more than how fast each arm learns byte frequencies.
DEFAULT_WARM_START = 40
#: Seed of the initial weights (the reference arm writes them; both arms load them).
DEFAULT_SEED = 1234


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyArm:
    """One training run of the check (``reference`` or ``candidate``): the reference trains ``pretrain_steps`` and
    writes ``save_checkpoint``; both start from ``load_checkpoint``; ``fault``, a deliberate bug (negative control)."""

    name: str
    layout: Layout
    save_checkpoint: str | None
    load_checkpoint: str
    fault: str | None = None
    pretrain_steps: int = 0

    def harness_options(self, plan: VerifyPlan) -> dict[str, Any]:
        """Fields of this arm's :class:`launch.harness.spec.HarnessSpec`."""
        return {"data": "corpus", "corpus_path": plan.corpus_path, "corpus_sha256": plan.corpus_sha256, "lr": plan.lr,
                "load_checkpoint": self.load_checkpoint, "save_checkpoint": self.save_checkpoint, "fault": self.fault,
                "pretrain_steps": self.pretrain_steps, "data_step_offset": plan.warm_start_steps,
                "lr_warmup_steps": plan.lr_warmup_steps}


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyPlan:
    """Everything a check runs: written to ``verify.json`` before the first arm starts."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    candidate: Layout
    reference: Layout
    steps: int
    lr: float
    seed: int
    out_dir: str
    checkpoint_dir: str
    corpus_path: str | None
    corpus_source: str
    corpus_sha256: str
    arms: tuple[VerifyArm, ...]
    fault: str | None = None
    thresholds: ConvergenceThresholds = field(default_factory=ConvergenceThresholds)
    warm_start_steps: int = 0
    lr_warmup_steps: int = 0
    init_checkpoint: str | None = None
    """The user's checkpoint both arms start from (no warm start, nothing written)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name, "gpus": self.cluster.label, "seq_length": self.workload.seq_length,
            "global_batch_size": self.workload.global_batch_size,
            "candidate": {"label": self.candidate.label, "layout": self.candidate.to_dict()},
            "reference": {"label": self.reference.label, "layout": self.reference.to_dict()},
            "steps": self.steps, "lr": self.lr, "seed": self.seed, "lr_warmup_steps": self.lr_warmup_steps,
            "warm_start_steps": self.warm_start_steps,
            "optimizer": "Adam (beta1 0.9, beta2 0.95), linear warm-up then constant learning rate, weight decay 0.1, "
            "gradient clipping 1.0; fresh in each arm",
            "data": {"corpus": self.corpus_source, "sha256": self.corpus_sha256, "tokenizer": "bytes",
                     "order": "Megatron pretraining sampler"},
            "checkpoint": {"dir": self.checkpoint_dir,
                           "written_by": "the user" if self.init_checkpoint else "reference",
                           "loaded_by": [a.name for a in self.arms]},
            "arms": [{"name": a.name, "label": a.layout.label, "save_checkpoint": a.save_checkpoint,
                      "load_checkpoint": a.load_checkpoint, "fault": a.fault} for a in self.arms],
            "fault": self.fault,
            "thresholds": {k: getattr(self.thresholds, k) for k in self.thresholds.__slots__},
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyOutcome:
    """What a check found. ``result`` is ``pass``, ``fail`` (the curves differ) or ``error`` (an arm did not finish)."""

    plan: VerifyPlan
    result: str
    convergence: ConvergenceResult | None
    reference_losses: tuple[float, ...] = ()
    candidate_losses: tuple[float, ...] = ()
    error: str = ""
    arm_logs: dict[str, str] = field(default_factory=dict)
    date: str = ""
    versions: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.result == "pass"

    def summary(self) -> str:
        if self.convergence is None:
            return f"error: {self.error}"
        return self.convergence.summary()

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "summary": self.summary(), "date": self.date, "plan": self.plan.to_dict(),
                "reference_losses": list(self.reference_losses), "candidate_losses": list(self.candidate_losses),
                "convergence": self.convergence.to_dict() if self.convergence else None, "error": self.error,
                "arm_logs": self.arm_logs, "versions": self.versions}


def plan_verify(model: ModelSpec, cluster: Cluster, workload: Workload, candidate: Layout, reference: Layout, *,
                out_dir: str | Path, steps: int = 20, lr: float = DEFAULT_LR, lr_warmup_steps: int = DEFAULT_LR_WARMUP,
                warm_start_steps: int = DEFAULT_WARM_START, init_checkpoint: str | Path | None = None,
                seed: int = DEFAULT_SEED, corpus: str | Path | None = None, fault: str | None = None,
                thresholds: ConvergenceThresholds | None = None) -> VerifyPlan:
    """The checkpoint-once, load-many plan of a candidate / reference pair (see the module docstring): ``steps`` (>= 3)
    per arm at peak ``lr`` after ``lr_warmup_steps``; ``corpus`` a UTF-8 text file (None: CPython's bundled
    documentation); ``fault`` a deliberate bug of the candidate arm (:data:`launch.harness.spec.FAULTS`). Raises
    InfeasibleLayout or TunerError: as :func:`tuner.verify.inputs.check_inputs`; ``steps`` < 3, a bad learning rate
    or warm-up."""
    if steps < 3:
        raise TunerError(f"--steps must be at least 3 (a correlation needs a curve), got {steps!r}")
    if not 0 < lr < 1:
        raise TunerError(f"--lr must be in (0, 1), got {lr!r}")
    for flag, v in (("--lr-warmup-steps", lr_warmup_steps), ("--warm-start-steps", warm_start_steps)):
        if v < 0:
            raise TunerError(f"{flag} must be 0 or more, got {v!r}")
    if lr_warmup_steps > steps:
        raise TunerError(f"--lr-warmup-steps {lr_warmup_steps} is more than --steps {steps}: the measured steps would "
                         "never reach the peak learning rate")
    if init_checkpoint is not None:
        ic = Path(init_checkpoint)
        if not (ic.is_dir() and (ic / "metadata.json").exists()):
            raise TunerError(f"--init-checkpoint {str(ic)!r}: not a megatron-core distributed checkpoint (a folder "
                             "with metadata.json)")
        warm_start_steps = 0
    c = check_inputs(candidate, reference, model, cluster, workload, fault=fault, what="--reference",
                     init_checkpoint=init_checkpoint, corpus=corpus)
    out = Path(out_dir)
    ckpt = str(Path(init_checkpoint)) if init_checkpoint is not None else str(out / "checkpoint")
    save = None if init_checkpoint is not None else ckpt
    arms = (VerifyArm(name="reference", layout=reference, save_checkpoint=save, load_checkpoint=ckpt,
                      pretrain_steps=warm_start_steps),
            VerifyArm(name="candidate", layout=candidate, save_checkpoint=None, load_checkpoint=ckpt, fault=fault))
    return VerifyPlan(
        model=model, cluster=cluster, workload=workload, candidate=candidate, reference=reference, steps=steps,
        lr=float(lr), seed=seed, out_dir=str(out), checkpoint_dir=ckpt,
        corpus_path=str(corpus) if corpus is not None else None,
        corpus_source=c.source, corpus_sha256=c.sha256, arms=arms, fault=fault,
        thresholds=thresholds or ConvergenceThresholds(),
        warm_start_steps=warm_start_steps, lr_warmup_steps=lr_warmup_steps,
        init_checkpoint=str(init_checkpoint) if init_checkpoint is not None else None,
    )


#: Makes the backend of one arm: (plan, arm) -> an object with ``run(layout, *, model, cluster, workload,
#: trial_dir=...)``.
BackendFactory = Callable[[VerifyPlan, VerifyArm], Any]


def local_backend_factory(*, timeout_s: float = 900.0, launcher: list[str] | None = None,
                          env: Any = None) -> BackendFactory:
    """Arms run by :class:`launch.local_backend.LocalBackend` (``launcher`` / ``env``: for tests)."""
    from launch.local_backend import LocalBackend

    def make(plan: VerifyPlan, arm: VerifyArm) -> Any:
        return LocalBackend(trials_dir=plan.out_dir, num_gpus=plan.cluster.num_gpus, steps=plan.steps,
                            warmup_steps=min(2, plan.steps - 1), timeout_s=timeout_s, launcher=launcher, env=env,
                            harness_options=arm.harness_options(plan))

    return make


def run_verify(plan: VerifyPlan, backend_factory: BackendFactory | None = None, *, keep_checkpoint: bool = False,
               on_arm: Callable[[str, str], None] | None = None) -> VerifyOutcome:
    """Run both arms of ``plan`` and compare their loss curves; write ``verify.json`` and ``losses.png``. An arm that
    fails makes the outcome ``error``, not ``fail``. ``on_arm`` gets (arm, "start" | "done" | "failed"). Raises
    TunerError: ``out_dir`` cannot be written; InfeasibleLayout: an arm cannot run here (e.g. another GPU count)."""
    factory = backend_factory or local_backend_factory()
    refuse_unrunnable(factory, plan, "; check a layout this machine can run with --candidate KEY=VALUE,... (e.g. the "
                      "same layout with dispatcher=alltoall)")
    out = Path(plan.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        ck = Path(plan.checkpoint_dir)
        if ck.exists() and plan.init_checkpoint is None:
            shutil.rmtree(ck)  # a stale checkpoint of an earlier check: the reference arm writes it again
        (out / "verify.json").write_text(json.dumps({"result": "running", "plan": plan.to_dict()}, indent=2,
                                                    default=str))
    except OSError as e:
        raise TunerError(f"cannot write the check's folder {out} ({e.strerror or e})") from None
    losses: dict[str, tuple[float, ...]] = {}
    logs: dict[str, str] = {}
    versions: dict[str, Any] = {}
    error = ""
    say = on_arm or (lambda arm, state: None)
    try:
        for arm in plan.arms:
            say(arm.name, "start")
            backend = factory(plan, arm)
            try:
                m: Measurement = backend.run(arm.layout, model=plan.model, cluster=plan.cluster, workload=plan.workload,
                                             trial_dir=arm.name)
            except (TrialFailed, TrialStopped) as e:
                logs[arm.name] = getattr(e, "log_path", "") or str(out / arm.name)
                error = f"the {arm.name} arm ({arm.layout.label}) did not finish: {e}"
                say(arm.name, "failed")
                break
            logs[arm.name] = m.log_path
            losses[arm.name] = tuple(m.losses)
            versions = (m.extra.get("summary") or {}).get("versions", versions)
            say(arm.name, "done")
    finally:
        if not keep_checkpoint and plan.init_checkpoint is None:  # never delete the user's checkpoint
            shutil.rmtree(plan.checkpoint_dir, ignore_errors=True)
    conv = None
    if not error:
        conv = compare_losses(losses["candidate"], losses["reference"], plan.thresholds)
    outcome = VerifyOutcome(plan=plan, result=conv.result if conv is not None else "error", convergence=conv,
                            reference_losses=losses.get("reference", ()), candidate_losses=losses.get("candidate", ()),
                            error=error, arm_logs=logs, date=_dt.date.today().isoformat(), versions=versions)
    (out / "verify.json").write_text(json.dumps(outcome.to_dict(), indent=2, default=json_default))
    if conv is not None:
        try:
            plot_losses(outcome, out / "losses.png")
        except Exception:  # noqa: BLE001 - a plot must not lose a finished check
            pass
    return outcome


def plot_losses(outcome: VerifyOutcome, path: str | Path) -> Path:
    """Both loss curves (top) and the candidate's relative difference with its tolerance band (bottom), as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ref = np.array(outcome.reference_losses, dtype=float)
    cand = np.array(outcome.candidate_losses, dtype=float)
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    p = outcome.plan
    a.plot(np.arange(1, len(ref) + 1), ref, "o-", ms=3, label=f"reference {p.reference.label}")
    a.plot(np.arange(1, len(cand) + 1), cand, "s--", ms=3,
           label=f"candidate {p.candidate.label}" + (f" (fault: {p.fault})" if p.fault else ""))
    a.set_ylabel("loss (mean over the global batch)")
    failed = outcome.convergence.failed_metrics if outcome.convergence else ()
    a.set_title(f"{p.model.name} on {p.cluster.label}: {outcome.result} ({', '.join(failed) or 'all checks'})",
                fontsize=9)
    a.legend(fontsize=8)
    n = min(len(ref), len(cand))
    if n:
        rel = (cand[:n] - ref[:n]) / ref[:n]
        steps = np.arange(1, n + 1)
        b.plot(steps, 100 * rel, "k.-")
        tol = np.array([p.thresholds.tolerance(x) for x in ref[:n]])
        b.fill_between(steps, -100 * tol, 100 * tol, alpha=0.15, label="point-wise tolerance")
        b.legend(fontsize=8)
    b.set_ylabel("candidate vs reference, %")
    b.set_xlabel("optimizer step")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def convergence_block(outcome: VerifyOutcome) -> dict[str, Any]:
    """The convergence check's ``correctness`` block in the seed's form (``result``, ``summary``, ``reference``,
    ``convergence``); :func:`tuner.verify.correctness.correctness_block` joins it with the other checks."""
    p = outcome.plan
    start = (f"the checkpoint {p.init_checkpoint}, loaded into both layouts" if p.init_checkpoint else
             "one megatron-core distributed checkpoint written once by the reference arm"
             + (f" after {p.warm_start_steps} warm-start steps from the seed" if p.warm_start_steps else " from the "
                "seed")
             + " and loaded into both layouts")
    ref_text = (f"{p.reference.label} on the same {p.cluster.label}: the same starting weights ({start}), the same "
                f"rows in the same order ({p.corpus_source}, byte tokens), the same hyperparameters (Adam, lr {p.lr:g} "
                f"after {p.lr_warmup_steps} warm-up steps, fresh optimizer state, global batch "
                f"{p.workload.global_batch_size}, seq {p.workload.seq_length})")
    conv: dict[str, Any] = {"steps": p.steps, "result": outcome.result}
    if outcome.convergence is not None:
        c = outcome.convergence
        conv.update(correlation=_round(c.correlation, 7), final_loss_difference=_round(c.final_loss_difference, 4),
                    pointwise_failures=int(c.pointwise_failures))
        if c.failed_metrics:
            conv["failed_metrics"] = list(c.failed_metrics)
    conv["reference"] = p.reference.label
    conv["note"] = (f"candidate arm: {p.candidate.label}; reference arm: {p.reference.label}; {p.steps} steps each on "
                    f"{p.model.name}, checked {outcome.date} by `tune verify` with Megatron-Bridge "
                    "validate_convergence's metrics and default thresholds (missing steps and NaN fail)")
    if outcome.error:
        conv["note"] += f"; error: {outcome.error}"
    return {"result": outcome.result, "summary": outcome.summary(), "reference": ref_text, "convergence": conv}


def _round(x: float, nd: int) -> float | None:
    return round(float(x), nd) if math.isfinite(x) else None


