"""``tune verify``: does a layout train the same numbers as a reference layout?

The plan (:func:`plan_verify`), for a candidate layout and a reference layout of the
same model, GPUs and workload:

1. **reference arm**: the harness builds the model with the reference layout from the
   seed, trains it ``warm_start_steps`` steps (a warm start: from random weights a check
   compares little more than how fast each arm learns byte frequencies), writes the weights
   once as a megatron-core distributed checkpoint (``<out>/checkpoint``), loads them back
   (the same code path as the candidate) and trains ``steps`` optimizer steps with a fresh
   optimizer;
2. **candidate arm**: the harness builds the model with the candidate layout, loads the
   same checkpoint (megatron-core reshards it to the candidate's TP/PP/VPP/EP) and trains
   ``steps`` optimizer steps with a fresh optimizer.

With ``init_checkpoint`` (the user's own distributed checkpoint) both arms load that instead.
Both arms: the same byte-tokenised text in Megatron's sample order (so every optimizer step
sees the same rows, :mod:`launch.harness.data`; the measured steps read the rows after the
warm start's), the same hyperparameters (Adam, linear learning-rate warm-up then constant,
gradient clipping 1.0, weight decay 0.1), the same global batch. The loss of
each step is the mean over the global batch. Then :func:`tuner.convergence.compare_losses`
(Megatron-Bridge's metrics and thresholds, plus missing steps and NaN fail) decides.

Outputs under ``<out>``: ``verify.json`` (plan, both curves, the result),
``losses.png`` (both curves and the relative difference) and each arm's harness folder
(``reference/``, ``candidate/``: spec, JSON lines, log). The checkpoint is deleted after
the check unless asked to keep it.

Runs on this machine's GPUs with the local backend (torchrun); the layouts must be for the
GPU count of this machine (use a slice of the model, ``--layers``, as for real trials).
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

from launch._trial import kill_group
from launch.base import Measurement, TrialFailed, TrialStopped
from search_spaces.rules import check_layout
from specs import Cluster, ModelSpec, Workload
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from tuner.convergence import ConvergenceResult, ConvergenceThresholds, compare_losses
from tuner.numerics import correctness_block as numerics_correctness_block

__all__ = [
    "DEFAULT_LR",
    "ComponentOutcome",
    "ComponentPlan",
    "GradParityArm",
    "GradParityOutcome",
    "GradParityPlan",
    "VerifyArm",
    "VerifyOutcome",
    "VerifyPlan",
    "checkpoint_model_reasons",
    "correctness_block",
    "parity_backend_factory",
    "parse_layout_spec",
    "plan_component_test",
    "plan_grad_parity",
    "plan_verify",
    "run_component_test",
    "run_grad_parity",
    "run_verify",
]

#: Peak learning rate of both arms (Adam). 3e-4 without warm-up was measured to be unstable on the
#: MiniMax-M2 slice (the loss rose from 12.6 to 17.7, then spiked; bf16 noise grew into 14% differences).
DEFAULT_LR = 1e-4
#: Linear learning-rate warm-up, steps (of the warm start and of each arm's measured steps).
DEFAULT_LR_WARMUP = 5
#: Steps the reference arm trains from the seed before writing the check's starting checkpoint: a check
#: that starts from random weights compares little more than how fast each arm learns byte frequencies.
DEFAULT_WARM_START = 40
#: Seed of the initial weights (the reference arm writes them; both arms load them).
DEFAULT_SEED = 1234


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyArm:
    """One training run of the check."""

    name: str
    """``reference`` or ``candidate``."""
    layout: Layout
    save_checkpoint: str | None
    """Where this arm writes the initial weights before loading them back (the reference arm only)."""
    load_checkpoint: str
    """The checkpoint this arm starts from (the same for both arms)."""
    fault: str | None = None
    """A deliberate bug (negative control); None for a real check."""
    pretrain_steps: int = 0
    """Warm-start steps this arm trains before writing ``save_checkpoint``."""

    def harness_options(self, plan: VerifyPlan) -> dict[str, Any]:
        """Fields of this arm's :class:`launch.harness.spec.HarnessSpec`."""
        opts: dict[str, Any] = {
            "data": "corpus",
            "corpus_path": plan.corpus_path,
            "corpus_sha256": plan.corpus_sha256,
            "lr": plan.lr,
            "load_checkpoint": self.load_checkpoint,
            "save_checkpoint": self.save_checkpoint,
            "fault": self.fault,
            "pretrain_steps": self.pretrain_steps,
            "data_step_offset": plan.warm_start_steps,
            "lr_warmup_steps": plan.lr_warmup_steps,
        }
        return opts


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
            "model": self.model.name,
            "gpus": self.cluster.label,
            "seq_length": self.workload.seq_length,
            "global_batch_size": self.workload.global_batch_size,
            "candidate": {"label": self.candidate.label, "layout": self.candidate.to_dict()},
            "reference": {"label": self.reference.label, "layout": self.reference.to_dict()},
            "steps": self.steps,
            "lr": self.lr,
            "seed": self.seed,
            "lr_warmup_steps": self.lr_warmup_steps,
            "warm_start_steps": self.warm_start_steps,
            "optimizer": "Adam (beta1 0.9, beta2 0.95), linear warm-up then constant learning rate, weight decay 0.1, gradient clipping 1.0; fresh in each arm",
            "data": {"corpus": self.corpus_source, "sha256": self.corpus_sha256, "tokenizer": "bytes", "order": "Megatron pretraining sampler"},
            "checkpoint": {"dir": self.checkpoint_dir, "written_by": "the user" if self.init_checkpoint else "reference",
                           "loaded_by": [a.name for a in self.arms]},
            "arms": [{"name": a.name, "label": a.layout.label, "save_checkpoint": a.save_checkpoint, "load_checkpoint": a.load_checkpoint, "fault": a.fault} for a in self.arms],
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
        return {
            "result": self.result,
            "summary": self.summary(),
            "date": self.date,
            "plan": self.plan.to_dict(),
            "reference_losses": list(self.reference_losses),
            "candidate_losses": list(self.candidate_losses),
            "convergence": self.convergence.to_dict() if self.convergence else None,
            "error": self.error,
            "arm_logs": self.arm_logs,
            "versions": self.versions,
        }


_LAYOUT_KEYS_HELP = "tp, pp, vpp, cp, ep, etp, micro_batch_size (or mbs), recompute (none|selective|full), dispatcher, sequence_parallel, ..."


def parse_layout_spec(text: str, world_size: int) -> Layout:
    """A layout from ``key=value`` pairs, e.g. ``tp=1,pp=1,ep=1`` (fields not given take :class:`Layout`'s defaults).

    Keys are :class:`Layout`'s field names (Megatron's), plus ``mbs`` for
    ``micro_batch_size`` and ``recompute`` for ``recompute_granularity`` (``full`` then
    means uniform, 1 layer, as Megatron's defaults; ``selective`` means ``core_attn``).
    ``sequence_parallel`` defaults to on when ``tp > 1``.

    Raises:
        TunerError: an empty string, a pair without ``=``, an unknown key or a bad value.
    """
    if not text or not text.strip():
        raise TunerError(f"a layout is key=value pairs, e.g. 'tp=1,pp=1,ep=1'; got {text!r}")
    d: dict[str, Any] = {}
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        if "=" not in part:
            raise TunerError(f"layout {text!r}: {part!r} is not key=value; keys: {_LAYOUT_KEYS_HELP}")
        k, v = (x.strip() for x in part.split("=", 1))
        k = {"mbs": "micro_batch_size", "recompute": "recompute_granularity"}.get(k, k)
        if k in d:
            raise TunerError(f"layout {text!r}: {k} given twice")
        d[k] = v
    d.setdefault("world_size", world_size)
    ints = {"world_size", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "recompute_num_layers",
            "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"}
    bools = {"sequence_parallel", "use_distributed_optimizer", "use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d"}
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in ints:
            try:
                out[k] = int(v)
            except (TypeError, ValueError):
                raise TunerError(f"layout {text!r}: {k}={v!r} is not an integer") from None
            if not 0 <= out[k] <= 1_000_000:
                raise TunerError(f"layout {text!r}: {k}={v} is out of range (0 .. 1,000,000; parallel sizes are at most the GPU count)")
        elif k in bools:
            if str(v).lower() not in ("true", "false", "1", "0", "on", "off"):
                raise TunerError(f"layout {text!r}: {k}={v!r} is not true/false")
            out[k] = str(v).lower() in ("true", "1", "on")
        elif k == "optimizer_offload_fraction":
            try:
                out[k] = float(v)
            except ValueError:
                raise TunerError(f"layout {text!r}: {k}={v!r} is not a number") from None
        elif k == "recompute_modules":
            out[k] = tuple(x for x in str(v).split("+") if x)
        else:
            out[k] = v
    out.setdefault("sequence_parallel", out.get("tp", 1) > 1)
    g = out.get("recompute_granularity", "none")
    if g == "full":
        out.setdefault("recompute_method", "uniform")
        out.setdefault("recompute_num_layers", 1)
    if g == "selective":
        out.setdefault("recompute_modules", ("core_attn",))
    try:
        return Layout.from_dict(out)
    except TunerError as e:
        raise TunerError(f"layout {text!r}: {e}") from None
    except (TypeError, ValueError) as e:
        raise TunerError(f"layout {text!r}: {e}; keys: {_LAYOUT_KEYS_HELP}") from None


def plan_verify(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    candidate: Layout,
    reference: Layout,
    *,
    out_dir: str | Path,
    steps: int = 20,
    lr: float = DEFAULT_LR,
    lr_warmup_steps: int = DEFAULT_LR_WARMUP,
    warm_start_steps: int = DEFAULT_WARM_START,
    init_checkpoint: str | Path | None = None,
    seed: int = DEFAULT_SEED,
    corpus: str | Path | None = None,
    fault: str | None = None,
    thresholds: ConvergenceThresholds | None = None,
) -> VerifyPlan:
    """The checkpoint-once, load-many plan for a candidate / reference pair (no GPU work; see the module docstring).

    Args:
        model: the model (already sliced with ``--layers`` where needed).
        cluster: the GPUs; both layouts must use all of them.
        workload: sequence length and global batch of both arms.
        candidate: the layout under test.
        reference: the layout trusted to train correctly (e.g. TP 1 PP 1 EP 1).
        out_dir: folder of this check's outputs.
        steps: optimizer steps per arm (>= 3).
        lr: peak learning rate of both arms (linear warm-up over ``lr_warmup_steps``, then constant).
        warm_start_steps: steps the reference arm trains from the seed before it writes the
            starting checkpoint (0: the check starts from the seed's random weights).
        init_checkpoint: a megatron-core distributed checkpoint of this model (e.g. your own) that
            both arms load instead; then nothing is written and there is no warm start.
        corpus: a UTF-8 text file, or None for CPython's bundled documentation.
        fault: a deliberate bug for the candidate arm (:data:`launch.harness.spec.FAULTS`): a negative control.

    Raises:
        InfeasibleLayout: a layout breaks one of Megatron's rules (the rule and the reason are named).
        TunerError: the layouts are for another GPU count or identical, ``steps`` < 3,
            a bad learning rate or corpus, or an unknown fault.
    """
    from launch.harness.data import load_corpus
    from launch.harness.spec import FAULTS

    if isinstance(steps, bool) or not isinstance(steps, int) or not 3 <= steps <= 100_000:
        raise TunerError(f"--steps must be an integer from 3 to 100,000 (a correlation needs a curve), got {steps!r}")
    if not (isinstance(lr, (int, float)) and 0 < lr < 1):
        raise TunerError(f"--lr must be in (0, 1), got {lr!r}")
    if fault is not None and fault not in FAULTS:
        raise TunerError(f"--fault {fault!r}: accepted {', '.join(FAULTS)}")
    for flag, v in (("--lr-warmup-steps", lr_warmup_steps), ("--warm-start-steps", warm_start_steps)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100_000:
            raise TunerError(f"{flag} must be an integer from 0 to 100,000, got {v!r}")
    if lr_warmup_steps > steps:
        raise TunerError(f"--lr-warmup-steps {lr_warmup_steps} is more than --steps {steps}: the measured steps would never reach the peak learning rate")
    if init_checkpoint is not None:
        ic = Path(init_checkpoint)
        if not (ic.is_dir() and (ic / "metadata.json").exists()):
            raise TunerError(f"--init-checkpoint {str(ic)!r}: not a megatron-core distributed checkpoint (a folder with metadata.json)")
        why = checkpoint_model_reasons(ic, model)
        if why:
            raise TunerError("--init-checkpoint: " + "; ".join(why))
        warm_start_steps = 0
    for name, lay in (("candidate", candidate), ("reference", reference)):
        if lay.world_size != cluster.num_gpus:
            raise TunerError(f"the {name} layout {lay.label} is for {lay.world_size} GPUs, the check for {cluster.num_gpus} ({cluster.label})")
        broken = check_layout(lay, model, workload)
        if broken:
            rule, why = broken[0]
            raise InfeasibleLayout(rule, f"the {name} layout {lay.label} breaks a rule: {why}")
    if candidate == reference and fault is None:
        raise TunerError(f"the candidate and the reference are the same layout ({candidate.label}): nothing to compare; give another --reference")
    c = load_corpus(corpus)
    out = Path(out_dir)
    if init_checkpoint is not None:
        ckpt = str(Path(init_checkpoint))
        arms = (
            VerifyArm(name="reference", layout=reference, save_checkpoint=None, load_checkpoint=ckpt),
            VerifyArm(name="candidate", layout=candidate, save_checkpoint=None, load_checkpoint=ckpt, fault=fault),
        )
    else:
        ckpt = str(out / "checkpoint")
        arms = (
            VerifyArm(name="reference", layout=reference, save_checkpoint=ckpt, load_checkpoint=ckpt, pretrain_steps=warm_start_steps),
            VerifyArm(name="candidate", layout=candidate, save_checkpoint=None, load_checkpoint=ckpt, fault=fault),
        )
    return VerifyPlan(
        model=model, cluster=cluster, workload=workload, candidate=candidate, reference=reference, steps=steps,
        lr=float(lr), seed=seed, out_dir=str(out), checkpoint_dir=ckpt, corpus_path=str(corpus) if corpus is not None else None,
        corpus_source=c.source, corpus_sha256=c.sha256, arms=arms, fault=fault, thresholds=thresholds or ConvergenceThresholds(),
        warm_start_steps=warm_start_steps, lr_warmup_steps=lr_warmup_steps, init_checkpoint=str(init_checkpoint) if init_checkpoint is not None else None,
    )


#: Makes the backend of one arm: (plan, arm) -> an object with ``run(layout, *, model, cluster, workload, trial_dir=...)``.
BackendFactory = Callable[[VerifyPlan, VerifyArm], Any]


def local_backend_factory(*, timeout_s: float = 900.0, launcher: list[str] | None = None, env: Any = None) -> BackendFactory:
    """Arms run by :class:`launch.local_backend.LocalBackend` (``launcher`` / ``env``: for tests)."""
    from launch.local_backend import LocalBackend

    def make(plan: VerifyPlan, arm: VerifyArm) -> Any:
        return LocalBackend(
            trials_dir=plan.out_dir, num_gpus=plan.cluster.num_gpus, steps=plan.steps, warmup_steps=min(2, plan.steps - 1),
            timeout_s=timeout_s, launcher=launcher, env=env, harness_options=arm.harness_options(plan),
        )

    return make


def run_verify(
    plan: VerifyPlan,
    backend_factory: BackendFactory | None = None,
    *,
    keep_checkpoint: bool = False,
    on_arm: Callable[[str, str], None] | None = None,
) -> VerifyOutcome:
    """Run both arms of ``plan`` and compare their loss curves; write ``verify.json`` and ``losses.png``.

    An arm that fails (out of memory, timeout, crash) makes the outcome ``error`` with the
    arm's message; it is not a ``fail`` of the check (nothing was compared).

    Args:
        plan: from :func:`plan_verify`.
        backend_factory: makes each arm's backend (default: the local backend).
        keep_checkpoint: keep ``<out>/checkpoint`` (default: deleted at the end).
        on_arm: called with (arm name, "start" | "done" | "failed") for progress.

    Raises:
        TunerError: ``out_dir`` cannot be written.
        InfeasibleLayout: the local backend cannot run an arm here (e.g. another GPU count).
    """
    factory = backend_factory or local_backend_factory()
    for arm in plan.arms:  # both arms, before either runs: no GPU time on a check that cannot finish
        why = factory(plan, arm).refusal(arm.layout, plan.model, plan.workload)
        if why:
            raise InfeasibleLayout("harness_env", f"the {arm.name} arm ({arm.layout.label}) cannot run here: {why}; "
                                   "check a layout this machine can run with --candidate KEY=VALUE,... (e.g. the same layout with dispatcher=alltoall)")
    out = Path(plan.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        ck = Path(plan.checkpoint_dir)
        if ck.exists() and plan.init_checkpoint is None:
            shutil.rmtree(ck)  # a stale checkpoint of an earlier check: the reference arm writes it again
        (out / "verify.json").write_text(json.dumps({"result": "running", "plan": plan.to_dict()}, indent=2, default=str))
    except OSError as e:
        raise TunerError(f"cannot write the check's folder {out} ({e.strerror or e})") from None
    losses: dict[str, tuple[float, ...]] = {}
    logs: dict[str, str] = {}
    versions: dict[str, Any] = {}
    error = ""
    try:
        for arm in plan.arms:
            if on_arm:
                on_arm(arm.name, "start")
            backend = factory(plan, arm)
            try:
                m: Measurement = backend.run(arm.layout, model=plan.model, cluster=plan.cluster, workload=plan.workload, trial_dir=arm.name)
            except (TrialFailed, TrialStopped) as e:
                logs[arm.name] = getattr(e, "log_path", "") or str(out / arm.name)
                error = f"the {arm.name} arm ({arm.layout.label}) did not finish: {e}"
                if on_arm:
                    on_arm(arm.name, "failed")
                break
            logs[arm.name] = m.log_path
            losses[arm.name] = tuple(m.losses)
            versions = (m.extra.get("summary") or {}).get("versions", versions)
            if on_arm:
                on_arm(arm.name, "done")
    finally:
        if not keep_checkpoint and plan.init_checkpoint is None:  # never delete the user's checkpoint
            shutil.rmtree(plan.checkpoint_dir, ignore_errors=True)
    conv = None
    if not error:
        conv = compare_losses(losses["candidate"], losses["reference"], plan.thresholds)
    outcome = VerifyOutcome(
        plan=plan,
        result="error" if error else conv.result,  # type: ignore[union-attr]
        convergence=conv,
        reference_losses=losses.get("reference", ()),
        candidate_losses=losses.get("candidate", ()),
        error=error,
        arm_logs=logs,
        date=_dt.date.today().isoformat(),
        versions=versions,
    )
    (out / "verify.json").write_text(json.dumps(outcome.to_dict(), indent=2, default=_json_default))
    if conv is not None:
        try:
            plot_losses(outcome, out / "losses.png")
        except Exception:  # noqa: BLE001 - a plot must not lose a finished check
            pass
    return outcome


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return str(x)


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
    a.plot(np.arange(1, len(cand) + 1), cand, "s--", ms=3, label=f"candidate {p.candidate.label}" + (f" (fault: {p.fault})" if p.fault else ""))
    a.set_ylabel("loss (mean over the global batch)")
    a.set_title(f"{p.model.name} on {p.cluster.label}: {outcome.result} ({', '.join(outcome.convergence.failed_metrics) if outcome.convergence and outcome.convergence.failed_metrics else 'all checks'})", fontsize=9)
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


def correctness_block(outcome: VerifyOutcome) -> dict[str, Any]:
    """The recipe's ``correctness`` block in the seed's form (``result``, ``summary``, ``reference``, ``convergence``)."""
    p = outcome.plan
    start = (f"the checkpoint {p.init_checkpoint}, loaded into both layouts" if p.init_checkpoint else
             "one megatron-core distributed checkpoint written once by the reference arm"
             + (f" after {p.warm_start_steps} warm-start steps from the seed" if p.warm_start_steps else " from the seed")
             + " and loaded into both layouts")
    ref_text = (f"{p.reference.label} on the same {p.cluster.label}: the same starting weights ({start}), the same rows in the "
                f"same order ({p.corpus_source}, byte tokens), the same hyperparameters (Adam, lr {p.lr:g} after {p.lr_warmup_steps} "
                f"warm-up steps, fresh optimizer state, global batch {p.workload.global_batch_size}, seq {p.workload.seq_length})")
    conv: dict[str, Any] = {"steps": p.steps, "result": outcome.result}
    if outcome.convergence is not None:
        c = outcome.convergence
        conv.update(
            correlation=_round(c.correlation, 7),
            final_loss_difference=_round(c.final_loss_difference, 4),
            pointwise_failures=int(c.pointwise_failures),
        )
        if c.failed_metrics:
            conv["failed_metrics"] = list(c.failed_metrics)
    conv["reference"] = p.reference.label
    conv["note"] = (f"candidate arm: {p.candidate.label}; reference arm: {p.reference.label}; {p.steps} steps each on {p.model.name}, "
                    f"checked {outcome.date} by `tune verify` with Megatron-Bridge validate_convergence's metrics and default "
                    "thresholds (missing steps and NaN fail)")
    if outcome.error:
        conv["note"] += f"; error: {outcome.error}"
    return {
        "result": outcome.result,
        "summary": outcome.summary(),
        "reference": ref_text,
        "convergence": conv,
    }


def _round(x: float, nd: int) -> float | None:
    return round(float(x), nd) if x == x and math.isfinite(x) else None


# ==================================================================================================
# checkpoints of another model


def layout_text(lay: Layout) -> str:
    """A layout in one line, with what the short label leaves out (micro-batch, recompute, dispatcher, offload,
    sequence parallelism, optimizer), e.g. ``TP1 PP1 DP1, mbs 2, recompute none, alltoall, offload none``."""
    parts = [lay.label + (" SP" if lay.sequence_parallel and lay.tp > 1 else ""), f"mbs {lay.micro_batch_size}",
             f"recompute {lay.recompute_label}", str(lay.dispatcher.value), f"offload {lay.offload_label}"]
    if not lay.use_precision_aware_optimizer:
        parts.append("precision-aware off")
    elif lay.exp_avg_dtype != "fp32" or lay.exp_avg_sq_dtype != "fp32":
        parts.append(f"moments {lay.exp_avg_dtype}/{lay.exp_avg_sq_dtype}")
    return ", ".join(parts)


def checkpoint_model_reasons(path: str | Path, model: ModelSpec) -> list[str]:
    """Why the distributed checkpoint at ``path`` cannot start a check of ``model`` (empty when it can, or when it
    cannot be told: a checkpoint without the harness's ``model.json`` is taken as it is).

    The harness writes ``model.json`` (the model and its fingerprint, :func:`tuner.numerics.model_fingerprint`)
    beside every checkpoint it saves; a fingerprint that differs from ``model``'s (another model, another slice,
    another expert count) is refused before any GPU time is spent.
    """
    from tuner.numerics import model_fingerprint

    p = Path(path)
    if not (p.is_dir() and (p / "metadata.json").exists()):
        return [f"{str(p)!r} is not a megatron-core distributed checkpoint (a folder with metadata.json)"]
    side = p / "model.json"
    if not side.exists():
        return []
    try:
        d = json.loads(side.read_text())
        fp, name = d.get("fingerprint"), (d.get("model") or {}).get("name")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        return [f"{side}: unreadable ({e})"]
    import dataclasses

    want = model_fingerprint(dataclasses.asdict(model))
    if fp != want:
        return [f"the checkpoint {str(p)!r} is of another model ({name!r}, fingerprint {fp}) than the check's {model.name!r} "
                f"(fingerprint {want}): layers, widths or experts differ"]
    return []


# ==================================================================================================
# the optimizer component test (tune verify --component optimizer)


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
    decision: Any = None
    """A :class:`tuner.numerics.ComponentResult` (None on error)."""
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
            return {"test": "precision-aware Adam on the GPU and CPU optimizer offload (fraction 1.0, overlapped copies), each against an "
                            "FP64 reference", "shape": shape, "gpu": self.plan.gpu, "date": self.date, "result": "error", "detail": self.error,
                    "note": "the component program did not finish"}
        return self.decision.entry(shape=shape, gpu=self.plan.gpu, date=self.date)

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "error": self.error, "date": self.date, "seconds": self.seconds, "entry": self.entry(),
                "decision": self.decision.to_dict() if self.decision is not None else None, "spec": json.loads(self.plan.spec.to_json())}


def plan_component_test(
    *,
    out_dir: str | Path,
    experts: int | None = None,
    max_experts: int = 512,
    steps: tuple[int, ...] = (1, 3),
    moments: tuple[str, ...] = ("fp32",),
    arms: tuple[str, ...] | None = None,
    env: Any = None,
    gpu: str = "H200",
    check_machine: bool = True,
) -> ComponentPlan:
    """The component test's plan, refused before any GPU time when this machine cannot run it.

    Args:
        out_dir: folder of the spec, the JSON lines and ``component.json``.
        experts: run exactly this many experts (default: as many as fit, up to ``max_experts``; the program decides
            from the GPU's free memory and the host's available memory).
        steps: the steps after which the update is measured.
        moments: ``fp32`` and/or ``bf16``: the moment dtypes whose arms decide (the recipe's ``exp_avg_dtype``).
        arms: a subset of :data:`tuner.numerics.COMPONENT_ARMS` (default: all).
        env: a :class:`launch.harness.spec.HarnessEnv` (default: probed).
        check_machine: also check torch / megatron-core and that a GPU is visible (off in tests with a fake program).

    Raises:
        TunerError: Transformer Engine is not installed (precision-aware Adam is TE's FusedAdam; the component test
            measures TE's kernels), torch / megatron-core is missing, no GPU is visible, or a bad argument.
    """
    from launch.harness.component import ComponentSpec
    from launch.harness.spec import HarnessEnv
    from tuner.numerics import COMPONENT_ARMS

    bad = [m for m in moments if m not in ("fp32", "bf16")]
    if bad or not moments:
        raise TunerError(f"--moments {','.join(moments)!r}: accepted fp32, bf16 (the recipe's exp_avg_dtype)")
    names = tuple(a.name for a in COMPONENT_ARMS) if arms is None else tuple(arms)
    spec = ComponentSpec(experts=experts, max_experts=max_experts, steps=tuple(steps), arms=names)
    e = env if env is not None else HarnessEnv.detect()
    if not e.transformer_engine:
        raise TunerError("tune verify --component optimizer needs Transformer Engine on this machine: megatron-core's precision-aware "
                         "Adam is TE's FusedAdam (with store_param_remainders); install transformer-engine, or run it where it is installed")
    if check_machine:
        from launch.local_backend import check_harness_dependencies, machine_gpu_count

        check_harness_dependencies("tune verify --component optimizer")
        if machine_gpu_count() < 1:
            raise TunerError("tune verify --component optimizer needs 1 GPU and this machine shows none (nvidia-smi / CUDA_VISIBLE_DEVICES)")
    return ComponentPlan(spec=spec, out_dir=str(out_dir), required_moments=tuple(moments), gpu=gpu)


def run_component_test(plan: ComponentPlan, *, launcher: list[str] | None = None, timeout_s: float = 900.0) -> ComponentOutcome:
    """Run the component program (one process, one GPU) and decide (:func:`tuner.numerics.decide_component_test`).

    Writes ``<out>/component_spec.json``, ``<out>/component.jsonl`` (the program's lines), ``<out>/log.txt`` and
    ``<out>/component.json`` (the outcome and the seed-form entry).

    Args:
        launcher: the program (default ``python -m launch.harness.component``); tests pass a fake one.
        timeout_s: wall-clock limit; the program's process group is killed after it.

    Raises:
        TunerError: the folder cannot be written.
    """
    import os
    import subprocess
    import sys
    import time

    from launch.harness.results import read_lines
    from launch.local_backend import SAFE_ENV
    from tuner.numerics import decide_component_test

    out = Path(plan.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        spec_path, lines, log = out / "component_spec.json", out / "component.jsonl", out / "log.txt"
        spec_path.write_text(plan.spec.to_json())
        if lines.exists():
            lines.unlink()
    except OSError as e:
        raise TunerError(f"cannot write the component test's folder {out} ({e.strerror or e})") from None
    cmd = [*(launcher or [sys.executable, "-m", "launch.harness.component"]), "--spec", str(spec_path), "--out", str(lines)]
    t0 = time.monotonic()
    error = ""
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **SAFE_ENV})
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = None
            error = f"the component program ran past {timeout_s:g} s and was stopped"
    rows = tuple(read_lines(lines))
    if not error and rc != 0:
        errs = [r for r in rows if r.get("event") in ("error", "refused")]
        error = (f"the component program exited with status {rc}: " + (str(errs[0].get("message") or errs[0].get("reasons")) if errs else
                 log.read_text(errors="replace")[-500:]))
    decision = None
    if not error:
        try:
            decision = decide_component_test(rows, required_moments=plan.required_moments)
        except TunerError as e:
            error = str(e)
    o = ComponentOutcome(plan=plan, result="error" if decision is None else decision.result, decision=decision, rows=rows, error=error,
                         date=_dt.date.today().isoformat(), seconds=time.monotonic() - t0)
    (out / "component.json").write_text(json.dumps(o.to_dict(), indent=2, default=_json_default))
    return o


# ==================================================================================================
# gradient parity (tune verify --grad-parity)


@dataclass(frozen=True, kw_only=True, slots=True)
class GradParityArm:
    """One forward and backward of the parity check."""

    name: str
    """``reference``, ``reference_repeat`` (the noise run) or ``candidate``."""
    layout: Layout
    dump_dir: str
    fault: str | None = None
    save_checkpoint: str | None = None
    """The reference arm writes the seed's weights here when the check has no checkpoint of its own."""

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
                "global_batch_size": self.workload.global_batch_size, "candidate": layout_text(self.candidate), "reference": layout_text(self.reference),
                "checkpoint": self.checkpoint_dir, "written_by": "the user" if self.init_checkpoint else "reference",
                "data": {"corpus": self.corpus_source, "sha256": self.corpus_sha256, "step": self.data_step_offset},
                "arms": [{"name": a.name, "layout": layout_text(a.layout), "fault": a.fault, "dump": a.dump_dir} for a in self.arms],
                "fault": self.fault, "threshold_rule": f"max({self.factor:g} x noise, {self.floor:g})"}


def plan_grad_parity(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    candidate: Layout,
    reference: Layout,
    *,
    out_dir: str | Path,
    init_checkpoint: str | Path | None = None,
    reference_dir: str | Path | None = None,
    corpus: str | Path | None = None,
    data_step_offset: int = 0,
    fault: str | None = None,
    factor: float = 10.0,
    floor: float = 1.6e-2,
    candidate_model: ModelSpec | None = None,
) -> GradParityPlan:
    """The gradient-parity plan: reference, a second run of the reference (its noise sets the threshold), candidate;
    one forward and backward each, from one checkpoint, on one global batch (see :mod:`tuner.numerics`).

    Args:
        model: the model (sliced where needed); ``candidate_model``: the candidate's, if given separately (must be the same).
        init_checkpoint: a distributed checkpoint of ``model`` both arms load (e.g. the one a convergence check kept);
            None: the reference arm writes the seed's weights to ``<out>/checkpoint`` and every arm loads them.
        reference_dir: where the reference's two dumps go (default ``<out>``); a later check of another candidate
            with the same reference, checkpoint and batch reuses them.
        data_step_offset: the optimizer step whose rows are the batch (the convergence check's first measured step is
            its warm start's length).
        fault: a deliberate bug in the candidate (negative control, :data:`launch.harness.spec.FAULTS`).
        factor, floor: the threshold rule (:meth:`tuner.numerics.ParityThresholds.from_noise`).

    Raises:
        InfeasibleLayout: a layout breaks one of Megatron's rules.
        TunerError: the candidate's model is not the reference's; a layout is for another GPU count; the layouts are the
            same without a fault; the checkpoint is not one, or is of another model; a bad corpus, fault or threshold.
    """
    import dataclasses

    from launch.harness.data import load_corpus
    from launch.harness.spec import FAULTS
    from tuner.numerics import model_fingerprint

    if candidate_model is not None and model_fingerprint(dataclasses.asdict(candidate_model)) != model_fingerprint(dataclasses.asdict(model)):
        raise TunerError(f"the candidate ({candidate_model.name}) and the reference ({model.name}) are not the same model: gradient parity "
                         "compares two layouts of one model")
    if fault is not None and fault not in FAULTS:
        raise TunerError(f"--fault {fault!r}: accepted {', '.join(FAULTS)}")
    if isinstance(data_step_offset, bool) or not isinstance(data_step_offset, int) or data_step_offset < 0:
        raise TunerError(f"the batch's step must be an integer >= 0, got {data_step_offset!r}")
    if not (factor >= 1 and 0 < floor < 1):
        raise TunerError(f"parity threshold rule needs factor >= 1 and 0 < floor < 1, got factor {factor!r}, floor {floor!r}")
    for name, lay in (("candidate", candidate), ("reference", reference)):
        if lay.world_size != cluster.num_gpus:
            raise TunerError(f"the {name} layout {lay.label} is for {lay.world_size} GPUs, the check for {cluster.num_gpus} ({cluster.label})")
        broken = check_layout(lay, model, workload)
        if broken:
            rule, why = broken[0]
            raise InfeasibleLayout(rule, f"the {name} layout {lay.label} breaks a rule: {why}")
    if candidate == reference and fault is None:
        raise TunerError(f"the candidate and the reference are the same layout ({candidate.label}): nothing to compare; give another reference")
    if init_checkpoint is not None:
        why = checkpoint_model_reasons(init_checkpoint, model)
        if why:
            raise TunerError("--init-checkpoint: " + "; ".join(why))
    c = load_corpus(corpus)
    out = Path(out_dir)
    rdir = Path(reference_dir) if reference_dir is not None else out
    ckpt = str(Path(init_checkpoint)) if init_checkpoint is not None else str(rdir / "checkpoint")
    slug = "".join(ch if ch.isalnum() else "-" for ch in candidate.label).strip("-").lower() + (f"-{fault}" if fault else "")
    arms = (
        GradParityArm(name="reference", layout=reference, dump_dir=str(rdir / "reference" / "grads"),
                      save_checkpoint=None if init_checkpoint is not None else ckpt),
        GradParityArm(name="reference_repeat", layout=reference, dump_dir=str(rdir / "reference_repeat" / "grads")),
        GradParityArm(name="candidate", layout=candidate, dump_dir=str(out / f"candidate-{slug}" / "grads"), fault=fault),
    )
    return GradParityPlan(model=model, cluster=cluster, workload=workload, candidate=candidate, reference=reference, out_dir=str(out),
                          checkpoint_dir=ckpt, corpus_path=str(corpus) if corpus is not None else None, corpus_source=c.source,
                          corpus_sha256=c.sha256, arms=arms, data_step_offset=data_step_offset, fault=fault, factor=float(factor),
                          floor=float(floor), init_checkpoint=str(init_checkpoint) if init_checkpoint is not None else None)


@dataclass(frozen=True, kw_only=True, slots=True)
class GradParityOutcome:
    """What a parity check found: ``result`` pass / fail, or ``error`` (an arm did not finish)."""

    plan: GradParityPlan
    result: str
    parity: Any = None
    """The candidate against the reference (:class:`tuner.numerics.ParityResult`)."""
    noise: Any = None
    """The reference's second run against its first."""
    thresholds: Any = None
    error: str = ""
    arm_seconds: dict[str, float] = field(default_factory=dict)
    losses: dict[str, float] = field(default_factory=dict)
    """Step-1 loss of each arm (the same batch and weights: equal to bf16 noise)."""
    reused: tuple[str, ...] = ()
    date: str = ""
    seconds: float = 0.0

    def block(self, gpu: str = "") -> dict[str, Any]:
        """The recipe's ``correctness.grad_parity`` entry (:func:`tuner.numerics.parity_block`)."""
        from tuner.numerics import parity_block

        if self.parity is None:
            return {"result": "error", "candidate": layout_text(self.plan.candidate), "reference": layout_text(self.plan.reference), "note": self.error}
        return parity_block(self.parity, date=self.date, gpu=gpu, seconds=self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "error": self.error, "date": self.date, "seconds": self.seconds, "arm_seconds": self.arm_seconds,
                "losses": self.losses, "reused": list(self.reused), "plan": self.plan.to_dict(),
                "thresholds": self.thresholds.to_dict() if self.thresholds is not None else None,
                "noise": self.noise.to_dict(all_tensors=False) if self.noise is not None else None,
                "parity": self.parity.to_dict() if self.parity is not None else None}


def parity_backend_factory(*, timeout_s: float = 900.0, launcher: list[str] | None = None, env: Any = None) -> Callable[[GradParityPlan, GradParityArm], Any]:
    """Arms run by :class:`launch.local_backend.LocalBackend`: one step (no warm-up), the dump at step 1."""
    from launch.local_backend import LocalBackend

    def make(plan: GradParityPlan, arm: GradParityArm) -> Any:
        return LocalBackend(trials_dir=Path(plan.out_dir) / "runs", num_gpus=plan.cluster.num_gpus, steps=1, warmup_steps=0, timeout_s=timeout_s,
                            launcher=launcher, env=env, harness_options=arm.harness_options(plan))

    return make


def _reusable(arm: GradParityArm, plan: GradParityPlan) -> bool:
    """An earlier dump of this arm that fits this plan (same layout, checkpoint, batch, no fault)."""
    from tuner.numerics import load_grad_dump

    if arm.name == "candidate" or plan.init_checkpoint is None:
        return False
    try:
        d = load_grad_dump(arm.dump_dir)
    except TunerError:
        return False
    m = d.meta
    b = m.get("batch") or {}
    return (m.get("layout") == arm.layout.to_dict() and not m.get("fault") and b.get("data_step_offset") == plan.data_step_offset
            and b.get("corpus_sha256") == plan.corpus_sha256 and b.get("global_batch_size") == plan.workload.global_batch_size
            and b.get("seq_length") == plan.workload.seq_length)


def run_grad_parity(
    plan: GradParityPlan,
    backend_factory: Callable[[GradParityPlan, GradParityArm], Any] | None = None,
    *,
    on_arm: Callable[[str, str], None] | None = None,
    keep_candidate_dump: bool = False,
) -> GradParityOutcome:
    """Run the arms of ``plan`` (reusing the reference's dumps where they fit) and compare; writes ``<out>/parity.json``.

    The noise (the reference's second run against its first) sets the threshold
    (:meth:`tuner.numerics.ParityThresholds.from_noise`); then the candidate is compared with the reference.

    Raises:
        InfeasibleLayout: an arm cannot run here (checked for every arm before any runs).
        TunerError: the folder cannot be written, or the noise measurement itself is broken.
    """
    import time

    from tuner.numerics import ParityThresholds, compare_grad_dumps, load_grad_dump

    factory = backend_factory or parity_backend_factory()
    for arm in plan.arms:
        why = factory(plan, arm).refusal(arm.layout, plan.model, plan.workload)
        if why:
            raise InfeasibleLayout("harness_env", f"the {arm.name} arm ({arm.layout.label}) cannot run here: {why}")
    out = Path(plan.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TunerError(f"cannot write the check's folder {out} ({e.strerror or e})") from None
    t0 = time.monotonic()
    secs: dict[str, float] = {}
    reused: list[str] = []
    error = ""
    for arm in plan.arms:
        if _reusable(arm, plan):
            reused.append(arm.name)
            continue
        shutil.rmtree(Path(arm.dump_dir), ignore_errors=True)
        if on_arm:
            on_arm(arm.name, "start")
        ta = time.monotonic()
        try:
            factory(plan, arm).run(arm.layout, model=plan.model, cluster=plan.cluster, workload=plan.workload,
                                   trial_dir=Path(arm.dump_dir).parent.name)
        except (TrialFailed, TrialStopped) as e:
            error = f"the {arm.name} arm ({arm.layout.label}) did not finish: {e}"
            if on_arm:
                on_arm(arm.name, "failed")
            break
        secs[arm.name] = time.monotonic() - ta
        if not (Path(arm.dump_dir) / "index.json").exists():
            error = f"the {arm.name} arm ({arm.layout.label}) finished without writing its gradients to {arm.dump_dir}"
            break
        if on_arm:
            on_arm(arm.name, "done")
    noise = parity = th = None
    losses: dict[str, float] = {}
    if not error:
        from tuner.numerics import ParityResult

        ref, rep, cand = (load_grad_dump(a.dump_dir) for a in plan.arms)
        losses = {a.name: d.meta.get("loss") for a, d in zip(plan.arms, (ref, rep, cand))}
        cache = Path(plan.arms[0].dump_dir).parent.parent / "noise.json"
        if {"reference", "reference_repeat"} <= set(reused) and cache.exists():
            noise = ParityResult.from_dict(json.loads(cache.read_text()))  # the same two dumps as the earlier pair's
        else:
            noise = compare_grad_dumps(rep, ref)
            cache.write_text(json.dumps(noise.to_dict(), default=_json_default))
        th = ParityThresholds.from_noise(noise, factor=plan.factor, floor=plan.floor)
        parity = compare_grad_dumps(cand, ref, th)
        if not keep_candidate_dump:
            shutil.rmtree(Path(plan.arms[2].dump_dir), ignore_errors=True)
    o = GradParityOutcome(plan=plan, result="error" if error else parity.result, parity=parity, noise=noise, thresholds=th, error=error,  # type: ignore[union-attr]
                          arm_seconds=secs, losses=losses, reused=tuple(reused), date=_dt.date.today().isoformat(), seconds=time.monotonic() - t0)
    (out / "parity.json").write_text(json.dumps(o.to_dict(), indent=2, default=_json_default))
    return o


def stored_correctness(st: Any, trial_no: int | None, *, convergence: Any = None, grad_parity: Any = None) -> dict[str, Any] | None:
    """The ``correctness`` block of a study's trial from what ``tune verify`` stored: the convergence check
    (``verify:N``), gradient parity (``verify-parity:N``) and the optimizer component test (``verify-component``),
    the given ones replacing the stored ones; None when nothing was checked (:func:`tuner.numerics.correctness_block`)."""
    attrs = st.user_attrs
    conv = convergence if convergence is not None else (attrs.get(f"verify:{trial_no}") if trial_no is not None else None)
    par = grad_parity if grad_parity is not None else (attrs.get(f"verify-parity:{trial_no}") if trial_no is not None else None)
    comp = attrs.get("verify-component")
    if conv is None and par is None and comp is None:
        return None
    return numerics_correctness_block(convergence=conv, grad_parity=par, component_tests=[comp] if comp else [])
