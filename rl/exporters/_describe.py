"""What the RL formats share: the context of a plan, the plan of a context (or why there is none) and the prediction
lines their headers carry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launch.exporters._base import ExportContext
from specs import Cluster
from specs.errors import TunerError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rl.plan import RLJob, RLPlan

__all__ = ["plan_context", "prediction_lines", "rl_plan_of"]


def plan_context(plan: RLPlan, job: RLJob) -> ExportContext:
    """The context of an RL plan: the trainer's GPUs, workload and layout, with the plan and job attached."""
    cl = job.cluster
    n = plan.choice.trainer_gpus
    trainer = Cluster(gpu=cl.gpu, num_gpus=n, gpus_per_node=min(cl.gpus_per_node, n),
                      inter_node_bytes_per_s=cl.inter_node_bytes_per_s,
                      usd_per_gpu_hour=cl.usd_per_gpu_hour)
    return ExportContext(model=job.model, cluster=trainer, workload=job.workload, layout=plan.trainer.layout,
                         rl_plan=plan, rl_job=job)


def rl_plan_of(context: ExportContext, fmt: str) -> tuple[RLPlan, RLJob]:
    """The RL plan and job of ``context``.

    Raises TunerError: a context without an RL plan (a training study's layout): the format named with where its plans
    come from."""
    from rl.plan import RLJob, RLPlan

    plan, job = context.rl_plan, context.rl_job
    if not isinstance(plan, RLPlan) or not isinstance(job, RLJob):
        raise TunerError(
            f"--format {fmt} renders an RL post-training plan: write it with `tune rl ... --out DIR`; "
            "a training study's layout exports as recipe, slime or megatron"
        )
    return plan, job


def prediction_lines(plan: RLPlan, job: RLJob) -> list[str]:
    """What the plan predicts, one fact a line, and that nothing of it was measured (for the header comments)."""
    p = plan.parts
    c = plan.choice
    mode = ("colocated" if c.colocated else
            f"non-colocated: {c.rollout_gpus} rollout GPUs + {c.trainer_gpus} trainer GPUs, async K={c.async_steps}")
    return [
        f"tune rl plan for {job.model.name} on {job.cluster.label} ({mode})",
        "PREDICTED by megatron-layout-tuner (analytical model + rollout simulation); nothing below was measured",
        f"predicted step time {p.step_time_s:.1f} s = generation {p.generation_s:.1f} + log-prob {p.logprob_s:.1f} + "
        f"training {p.training_s:.1f} "
        f"+ refit {p.refit_s:.1f} + switch {p.switch_s:.1f} + overhead {p.overhead_s:.1f} (K={c.async_steps}: "
        f"{p.bound})",
        f"engines: {c.num_engines} x {plan.rollout_label}, {job.generation_precision} weights, gpu_memory_utilization "
        f"{c.gpu_memory_utilization:g}, "
        f"max_num_seqs {c.max_num_seqs}, {'eager' if c.enforce_eager else 'CUDA graphs'}, KV cache "
        f"{plan.kv_capacity_tokens:,} tokens/engine, {plan.preemptions} preemptions predicted",
        f"trainer: {plan.trainer.label} on {c.trainer_gpus} GPUs ({job.training_precision}), predicted peak "
        f"{plan.trainer.peak_bytes / 2**30:.1f} GiB/GPU",
        f"responses: {job.responses.source}",
        "measured: none (run it, then `tune rl calibrate --log LOG` to fit this cluster's factors)",
    ]
