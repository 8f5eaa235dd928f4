"""``tune verify``: a study's layout against a reference layout, same weights and data (see :mod:`tuner.verify`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from specs.errors import TunerError
from tuner.cli._common import ResultsOpt, StorageOpt, StudyNameOpt, err, load_study, out, study_context

if TYPE_CHECKING:
    from tuner.study.records import TrialRow

__all__ = ["app", "verify"]

app = typer.Typer(add_completion=False)  # one command: typer would add --install-completion to it


@app.command()
def verify(
    study: StudyNameOpt = None, storage: StorageOpt = None, results_dir: ResultsOpt = Path("results"),
    trial: Annotated[int | None, typer.Option("--trial", help=(
        "Trial whose layout is checked (default: the study's best, the layout tune recommended: of those that ran or "
        "are predicted to fit, the least memory within 1% of the fastest)."))] = None,
    reference: Annotated[str | None, typer.Option("--reference", help=(
        "Reference layout as key=value pairs, e.g. 'tp=1,pp=1,ep=1' (other fields: Megatron's defaults)."))] = None,
    candidate: Annotated[str | None, typer.Option("--candidate", help=(
        "Check this layout (key=value pairs) instead of a trial's; the study gives the model, GPUs and "
        "workload."))] = None,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps per arm.")] = 20,
    lr: Annotated[float, typer.Option("--lr", help=(
        "Peak learning rate of both arms (Adam, after a linear warm-up)."))] = 1e-4,
    lr_warmup_steps: Annotated[int, typer.Option("--lr-warmup-steps", help="Linear learning-rate warm-up, steps.")] = 5,
    warm_start_steps: Annotated[int, typer.Option("--warm-start-steps", help=(
        "Steps the reference arm trains from the seed before writing the shared starting checkpoint (0: start from "
        "random weights)."))] = 40,
    init_checkpoint: Annotated[Path | None, typer.Option("--init-checkpoint", help=(
        "Start both arms from this megatron-core distributed checkpoint instead (e.g. your model's); no "
        "warm start."))] = None,
    corpus: Annotated[Path | None, typer.Option("--corpus", help=(
        "UTF-8 text file to train on (default: CPython's bundled documentation)."))] = None,
    fault: Annotated[str | None, typer.Option("--fault", help=(
        "Negative control: inject a deliberate bug into the candidate arm (embedding_shard_misplaced, "
        "sp_norm_grad_unreduced, non_causal_attention)."))] = None,
    timeout: Annotated[float, typer.Option("--timeout", help=(
        "Seconds one arm may run, model build and checkpoint included."))] = 900.0,
    keep_checkpoint: Annotated[bool, typer.Option("--keep-checkpoint", help=(
        "Keep the initial-weights checkpoint."))] = False,
    out_file: Annotated[Path | None, typer.Option("--out", help=(
        "Also write the layout's recipe YAML, with the correctness block, here."))] = None,
    component: Annotated[str | None, typer.Option("--component", rich_help_panel="Component test", help=(
        "Run a component test instead: 'optimizer' (precision-aware Adam on the GPU and offloaded, against an FP64 "
        "reference; needs Transformer Engine; no study needed)."))] = None,
    experts: Annotated[int | None, typer.Option("--experts", rich_help_panel="Component test", help=(
        "Component test: run exactly this many experts of the seed's MoE layer (default: as many as fit, up to "
        "--max-experts)."))] = None,
    max_experts: Annotated[int, typer.Option("--max-experts", min=10, rich_help_panel="Component test", help=(
        "Component test: at most this many experts (on 1 x H200, 16 experts took 68 s; 256 did not finish in 400 s: "
        "docs/measurements.md)."))] = 64,
    moments: Annotated[str, typer.Option("--moments", rich_help_panel="Component test", help=(
        "Component test: the recipe's moment dtypes whose arms decide (fp32, bf16 or fp32,bf16)."))] = "fp32",
    component_steps: Annotated[str, typer.Option("--component-steps", rich_help_panel="Component test", help=(
        "Component test: the steps after which the update is compared (comma-separated)."))] = "1,3",
    grad_parity: Annotated[bool, typer.Option("--grad-parity", rich_help_panel="Gradient parity", help=(
        "Compare every parameter's full gradient after one forward and backward of the same batch from the same "
        "weights, instead of the loss curves."))] = False,
    parity_step: Annotated[int, typer.Option("--parity-step", min=0, rich_help_panel="Gradient parity", help=(
        "Gradient parity: the optimizer step whose rows are the batch."))] = 0,
    noise_factor: Annotated[float, typer.Option("--noise-factor", rich_help_panel="Gradient parity", help=(
        "Gradient parity: the threshold is this many times the worst relative L2 error between two runs of the "
        "reference (measured each time)."))] = 10.0,
    noise_floor: Annotated[float, typer.Option("--noise-floor", rich_help_panel="Gradient parity", help=(
        "Gradient parity: the threshold is at least this (torch.testing's bf16 tolerance)."))] = 1.6e-2,
) -> None:
    """Train the study's layout and a reference layout from the same weights on the same text; compare the loss curves.

    Megatron-Bridge's validate_convergence metrics and thresholds decide (correlation >= 0.95, final loss within 3%,
    point-wise 10/5/2% with at most 10% of steps out, 3-sigma outliers), and a missing step or a NaN fails. Runs on
    this machine's GPUs (the gpu extra); the layouts must be for its GPU count.
    With --grad-parity, every parameter's gradient is compared instead (relative L2 and cosine, against the
    reference's own run-to-run noise); with --component optimizer, the optimizer component test runs. A recipe is
    ``verified`` only when the convergence check and gradient parity both passed for its layout.
    """
    from tuner.study import trial_rows
    from tuner.verify.inputs import parse_layout_spec
    if component is not None:
        if grad_parity:
            raise TunerError("give --component or --grad-parity, not both")
        _component(component, study, storage, results_dir, experts, max_experts, moments, component_steps, timeout,
                   out_file)
        return
    if study is None:
        raise TunerError("--study is required, e.g. --study MiniMax-M2-L4-4xH200-s8192-gbs8")
    if reference is None:
        raise TunerError("--reference is required: the layout to compare with, e.g. --reference tp=1,pp=1,ep=1")
    if not timeout > 0:
        raise TunerError(f"--timeout must be > 0 s, got {timeout}")
    if candidate is not None and trial is not None:
        raise TunerError("give --trial or --candidate, not both")
    st, m, c, w, cfg, lay, trial_no, row = _candidate(study, storage, results_dir, trial, need_trial=candidate is None)
    if candidate is not None:
        lay = parse_layout_spec(candidate, c.num_gpus)
        row = next((r for r in trial_rows(st) if r.layout == lay), None)
        trial_no = row.trial if row else None
    ref = parse_layout_spec(reference, c.num_gpus)
    name = (f"trial{trial_no}" if trial_no is not None else "layout-" + _slug(lay.label)) + (f"-{fault}" if fault
                                                                                             else "")
    if grad_parity:
        _check_out(out_file)
        _grad_parity(st, m, c, w, cfg, lay, ref, trial_no, row, name=name, results_dir=results_dir,
                     init_checkpoint=init_checkpoint, corpus=corpus, fault=fault, parity_step=parity_step,
                     noise_factor=noise_factor, noise_floor=noise_floor, timeout=timeout, out_file=out_file)
        return
    _convergence(st, m, c, w, cfg, lay, ref, trial_no, row, name=name, results_dir=results_dir, steps=steps, lr=lr,
                 lr_warmup_steps=lr_warmup_steps, warm_start_steps=warm_start_steps, init_checkpoint=init_checkpoint,
                 corpus=corpus, fault=fault, timeout=timeout, keep_checkpoint=keep_checkpoint, out_file=out_file)



def _convergence(st: Any, m: Any, c: Any, w: Any, cfg: Any, lay: Any, ref: Any, trial_no: int | None, row: Any, *,
                 name: str, results_dir: Path, steps: int, lr: float, lr_warmup_steps: int, warm_start_steps: int,
                 init_checkpoint: Path | None, corpus: Path | None, fault: str | None, timeout: float,
                 keep_checkpoint: bool, out_file: Path | None) -> None:
    """The convergence check of ``tune verify`` (``typer.Exit`` 1 when it did not pass)."""
    from tuner.verify.correctness import stored_correctness
    from tuner.verify.loss_check import VerifyOutcome, convergence_block, local_backend_factory, plan_verify, run_verify

    plan = plan_verify(m, c, w, lay, ref, out_dir=results_dir / st.study_name / "verify" / name, steps=steps, lr=lr,
                       lr_warmup_steps=lr_warmup_steps, warm_start_steps=warm_start_steps,
                       init_checkpoint=init_checkpoint, corpus=corpus, fault=fault)
    _check_out(out_file)
    from launch.local_backend import check_harness_dependencies, check_local_gpus

    check_harness_dependencies("tune verify")
    check_local_gpus(c, "tune verify")
    what = f"trial {trial_no}" if trial_no is not None else "a layout"
    out.print(f"Checking {what} of [bold]{escape(st.study_name)}[/]: candidate {lay.label}"
              f"{f' with fault {fault}' if fault else ''} vs reference {ref.label}, {steps} steps each, {m.name} on "
              f"{c.label}; data {escape(plan.corpus_source)} (byte tokens); outputs in {escape(plan.out_dir)}")

    def on_arm(arm: str, state: str) -> None:
        err.print(f"  {arm}: {state}")

    outcome: VerifyOutcome = run_verify(plan, local_backend_factory(timeout_s=timeout), keep_checkpoint=keep_checkpoint,
                                        on_arm=on_arm)
    _print_outcome(outcome)
    block = convergence_block(outcome)
    if fault is None and trial_no is not None:
        _store(st, f"verify:{trial_no}", block, f"{plan.out_dir}/verify.json")
    if out_file:
        _write_recipe(out_file,
                      _recipe_text(st, m, c, w, cfg, lay, row, stored_correctness(st, trial_no, convergence=block)))
    if outcome.result != "pass":
        raise typer.Exit(code=1)

def _check_out(out_file: Path | None) -> None:
    if out_file is not None:
        from tuner.study.config import check_output_path

        check_output_path("--out", out_file, writes="recipe.yaml")  # the recipe with its correctness block
    if out_file is not None and (out_file.is_dir() or not os.access(out_file.parent, os.W_OK)):
        raise TunerError(f"--out {str(out_file)!r}: cannot write a file there (checked before any GPU work, not after)")


def _store(st: Any, key: str, value: Any, where: str) -> None:
    try:
        st.set_user_attr(key, value)
    except Exception as e:  # noqa: BLE001 - the check's files are written; the study is only a copy
        err.print(f"note: could not store the result in the study ({escape(type(e).__name__)}); it is in "
                  f"{escape(where)}")


def _component(kind: str, study: str | None, storage: str | None, results_dir: Path, experts: int | None,
               max_experts: int, moments: str, component_steps: str, timeout: float, out_file: Path | None) -> None:
    """``tune verify --component optimizer`` (:func:`tuner.verify.component.run_component_test`)."""
    from tuner.verify.component import plan_component_test, run_component_test
    from tuner.verify.correctness import stored_correctness

    if kind != "optimizer":
        raise TunerError(f"--component {kind!r}: accepted optimizer (precision-aware Adam against an FP64 reference)")
    if not timeout > 0:
        raise TunerError(f"--timeout must be > 0 s, got {timeout}")
    try:
        steps = tuple(sorted({int(x) for x in component_steps.split(",") if x.strip()}))
    except ValueError:
        raise TunerError(f"--component-steps {component_steps!r}: expected step numbers such as 1,3") from None
    if not steps or steps[0] < 1:
        raise TunerError(f"--component-steps {component_steps!r}: expected step numbers >= 1 such as 1,3")
    if out_file is not None and study is None:
        raise TunerError("--out with --component needs --study: the recipe is a study's layout")
    _check_out(out_file)
    st = load_study(study, storage, results_dir, writes=True) if study is not None else None
    where = results_dir / st.study_name / "verify" / "component" if st is not None else results_dir / "component-test"
    plan = plan_component_test(out_dir=where, experts=experts, max_experts=max_experts, steps=steps,
                               moments=tuple(x.strip() for x in moments.split(",") if x.strip()))
    out.print("Component test of the optimizer: precision-aware Adam on the GPU and offloaded (fraction 1.0) against "
              f"an FP64 reference, steps {', '.join(map(str, steps))}; outputs in {escape(str(where))}")
    o = run_component_test(plan, timeout_s=timeout)
    _print_component(o)
    if st is not None:
        _store(st, "verify-component", o.entry(), f"{where}/component.json")
    if out_file is not None and st is not None:
        st2, m, c, w, cfg, lay, trial_no, row = _candidate(st.study_name, storage, results_dir, None)
        _write_recipe(out_file, _recipe_text(st2, m, c, w, cfg, lay, row, stored_correctness(st2, trial_no)))
    if o.result != "pass":
        raise typer.Exit(code=1)


def _print_component(o: Any) -> None:
    if o.decision is None:
        out.print(f"[bold red]error[/]: {escape(o.error)}")
        return
    d = o.decision
    t = Table(title=f"optimizer component test, {o.experts} experts (bound: 2 x the default GPU optimizer's error + "
              "1e-3)", title_justify="left")
    for col in ("arm", "kind", *(f"step {s}" for s in d.steps), "verdict"):
        t.add_column(col)
    t.add_row("bound", "", *(f"{d.bound[s]:.3g}" for s in d.steps), "")
    for name, info in d.arms.items():
        errs = info.get("errors", {})
        t.add_row(name, str(info.get("kind", "")), *(f"{errs[s]:.3g}" if s in errs else "-" for s in d.steps),
                  escape(str(info.get("verdict", ""))))
    out.print(t)
    colour = "green" if o.result == "pass" else "red"
    out.print(f"[bold {colour}]{o.result}[/]: {escape(d.detail())}")


def _grad_parity(st: Any, m: Any, c: Any, w: Any, cfg: dict[str, Any], lay: Any, ref: Any, trial_no: int | None,
                 row: Any, *, name: str, results_dir: Path, init_checkpoint: Path | None, corpus: Path | None,
                 fault: str | None, parity_step: int, noise_factor: float, noise_floor: float, timeout: float,
                 out_file: Path | None) -> None:
    """``tune verify --grad-parity``: every parameter's gradient of the candidate against the reference's."""
    from launch.local_backend import check_harness_dependencies, check_local_gpus
    from tuner.verify.correctness import stored_correctness
    from tuner.verify.parity_check import parity_backend_factory, plan_grad_parity, run_grad_parity

    out_dir = results_dir / st.study_name / "verify" / f"parity-{name}"
    plan = plan_grad_parity(m, c, w, lay, ref, out_dir=out_dir, init_checkpoint=init_checkpoint, corpus=corpus,
                            reference_dir=results_dir / st.study_name / "verify"
                            / f"parity-reference-{_slug(ref.label)}",
                            data_step_offset=parity_step, fault=fault, factor=noise_factor, floor=noise_floor)
    check_harness_dependencies("tune verify --grad-parity")
    check_local_gpus(c, "tune verify --grad-parity")
    out.print(f"Gradient parity of {escape(lay.label)}{f' with fault {fault}' if fault else ''} against "
              f"{escape(ref.label)}: one forward and backward of the same batch from the same weights, every gradient "
              f"gathered in fp32; outputs in {escape(str(out_dir))}")

    def on_arm(arm: str, state: str) -> None:
        err.print(f"  {arm}: {state}")

    o = run_grad_parity(plan, parity_backend_factory(timeout_s=timeout), on_arm=on_arm)
    block = o.block(gpu=c.gpu.name)
    colour = "green" if o.result == "pass" else "red"
    out.print(f"[bold {colour}]{o.result}[/]: {escape(o.parity.summary() if o.parity is not None else o.error)}")
    if fault is None and trial_no is not None:
        _store(st, f"verify-parity:{trial_no}", block, f"{out_dir}/parity.json")
    if out_file is not None:
        _write_recipe(out_file,
                      _recipe_text(st, m, c, w, cfg, lay, row, stored_correctness(st, trial_no, grad_parity=block)))
    if o.result != "pass":
        raise typer.Exit(code=1)


def _write_recipe(out_file: Path, text: str) -> None:
    from specs.files import write_output

    write_output(out_file, text, label="--out")
    err.print(f"wrote {out_file}", markup=False)


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label).strip("-").lower()


def _candidate(study: str, storage: str | None, results_dir: Path, trial: int | None, *,
               need_trial: bool = True) -> tuple[Any, ...]:
    from tuner.report import pick_trial_row
    from tuner.study import trial_rows

    st = load_study(study, storage, results_dir, writes=True)
    m, c, w, cfg = study_context(st)
    if not need_trial:
        return st, m, c, w, cfg, None, None, None
    row = pick_trial_row(st.study_name, trial_rows(st), m, trial, "verify", best=st.user_attrs.get("best_trial"))
    return st, m, c, w, cfg, row.layout, row.trial, row


def _print_outcome(o: Any) -> None:
    if o.convergence is None:
        out.print(f"[bold red]error[/]: {escape(o.error)}")
        return
    cv = o.convergence
    t = Table(title=f"convergence over {cv.steps} steps (Megatron-Bridge thresholds)", title_justify="left")
    for col in ("check", "value", "threshold", "result"):
        t.add_column(col)
    th = cv.thresholds

    def ok(name: str) -> str:
        return "[red]fail[/]" if name in cv.failed_metrics else "[green]pass[/]"

    t.add_row("correlation", f"{cv.correlation:.7f}" if cv.correlation == cv.correlation else "undefined",
              f">= {th.correlation_threshold}", ok("correlation"))
    t.add_row("final loss difference", f"{cv.final_loss_difference:.2%}", f"<= {th.final_loss_tolerance:.0%}",
              ok("final_loss"))
    t.add_row("point-wise failures", f"{cv.pointwise_failures} of {cv.compared_steps}",
              f"<= {th.max_outlier_ratio:.0%} of steps", ok("point_wise_tolerance"))
    t.add_row("3-sigma outliers", f"{cv.outliers} of {cv.compared_steps}", f"<= {th.max_outlier_ratio:.0%} of steps",
              ok("outliers"))
    t.add_row("missing steps", str(len(cv.missing_steps)), "0", ok("missing_steps"))
    t.add_row("NaN / Inf steps", str(len(cv.non_finite_steps)), "0", ok("non_finite"))
    out.print(t)
    n = max(len(o.reference_losses), len(o.candidate_losses))
    if n:
        first, last = 0, n - 1
        def at(xs: tuple[float, ...], i: int) -> str:
            return f"{xs[i]:.4f}" if i < len(xs) else "-"
        out.print(f"loss at step 1: reference {at(o.reference_losses, first)}, candidate "
                  f"{at(o.candidate_losses, first)}; at step {n}: reference {at(o.reference_losses, last)}, candidate "
                  f"{at(o.candidate_losses, last)}")
    colour = "green" if o.passed else "red"
    out.print(f"[bold {colour}]{o.result}[/]: {escape(o.summary())}")
    out.print(f"curves: {escape(o.plan.out_dir)}/losses.png; details: {escape(o.plan.out_dir)}/verify.json")


def _recipe_text(st: Any, m: Any, c: Any, w: Any, cfg: dict[str, Any], lay: Any, row: TrialRow | None,
                 block: dict[str, Any] | None) -> str:
    """The recipe of ``lay`` (trial ``row``, or a given candidate when None) with the correctness ``block``."""
    from launch.exporters import get_exporter
    from tuner.cli.studies import study_export_context
    from tuner.study import trial_rows

    return get_exporter("recipe").render(study_export_context(st, m, c, w, cfg, lay, row, trial_rows(st),
                                                              correctness=block))
