"""``run_slime_rl.sh``: an RL plan as a slime launch (``train.py`` / ``train_async.py``), in the style of slime's
``scripts/run-*.sh``.

Flags are those of ``slime/utils/arguments.py`` (THUDM/slime 624b824a): the placement (``--actor-num-nodes``,
``--actor-num-gpus-per-node``, ``--rollout-num-gpus`` or ``--colocate``, ``--rollout-num-gpus-per-engine``), Megatron's
parallel flags, the rollout batch (``--rollout-batch-size``, ``--n-samples-per-prompt``, ``--global-batch-size``, the
length caps) and the SGLang engine's (slime forwards every ``--sglang-<server arg>``: ``--sglang-mem-fraction-static``,
``--sglang-max-running-requests``, ``--sglang-ep-size``, ``--sglang-enable-dp-attention``, ``--sglang-dp-size``,
``--sglang-disable-cuda-graph``). Model, checkpoint and data flags are the user's: they follow the script's name on its
command line (``"$@"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._shell import SHEBANG, STRICT_MODE, bash_array, comment
from rl.exporters._describe import prediction_lines, rl_plan_of
from specs.errors import TunerError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from rl.plan import RLJob, RLPlan

__all__ = ["SlimeRLExporter", "render_slime_script", "slime_rl_args"]


def slime_rl_args(plan: RLPlan, job: RLJob) -> list[str]:
    """The plan's slime flags, one argv word each (values as strings).

    Raises TunerError: a plan slime cannot run (a vLLM engine or an AutoModel trainer)."""
    from rl.engine import Engine
    from rl.trainer import TrainerBackend

    c = plan.choice
    if c.engine != Engine.sglang:
        raise TunerError("the slime export needs an SGLang engine (slime's rollout backend); use --engine sglang")
    if plan.trainer.backend != TrainerBackend.megatron:
        raise TunerError("the slime export needs a Megatron trainer; slime trains with Megatron-core")
    lay = plan.trainer.layout
    per = job.cluster.gpus_per_node
    s = c.shape
    args: list[tuple[str, Any]] = [
        ("--actor-num-nodes", max(1, c.trainer_gpus // per)),
        ("--actor-num-gpus-per-node", min(per, c.trainer_gpus)),
    ]
    args.append(("--colocate", None) if c.colocated else ("--rollout-num-gpus", c.rollout_gpus))
    args += [
        ("--rollout-num-gpus-per-engine", s.gpus),
        ("--tensor-model-parallel-size", lay.tp),
        ("--pipeline-model-parallel-size", lay.pp),
        ("--context-parallel-size", lay.cp),
        ("--expert-model-parallel-size", lay.ep),
        ("--expert-tensor-parallel-size", lay.etp),
    ]
    if lay.tp > 1:
        args.append(("--sequence-parallel", None))
    if lay.recompute_granularity.value == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    args += [
        ("--rollout-batch-size", job.prompts_per_step),
        ("--n-samples-per-prompt", job.generations_per_prompt),
        ("--global-batch-size", job.train_sequences),
        ("--rollout-max-prompt-len", job.prompt_len),
        ("--rollout-max-response-len", job.response_len),
        ("--sglang-mem-fraction-static", c.gpu_memory_utilization),
        ("--sglang-max-running-requests", c.max_num_seqs),
    ]
    if s.ep > 1:
        args.append(("--sglang-ep-size", s.ep))
    if s.attention_dp > 1:
        args += [("--sglang-enable-dp-attention", None), ("--sglang-dp-size", s.attention_dp)]
    if c.enforce_eager:
        args.append(("--sglang-disable-cuda-graph", None))
    argv: list[str] = []
    for flag, val in args:
        argv.append(flag)
        if val is not None:
            argv.append(str(val))
    return argv


def render_slime_script(plan: RLPlan, job: RLJob) -> str:
    """The launch: shebang, the prediction as comments, strict mode, ``PLAN_ARGS=( ... )``, then
    ``exec "$PYTHON" "$SLIME_DIR/<entry>" "${PLAN_ARGS[@]}" "$@"``.

    ``<entry>`` is ``train_async.py`` for an asynchronous plan (K >= 1), else ``train.py``; ``PYTHON`` defaults to
    ``python3``, ``SLIME_DIR`` (a slime checkout) to the working folder. Every value is ``shlex.quote``-d.

    Raises TunerError: as :func:`slime_rl_args`."""
    argv = slime_rl_args(plan, job)
    entry = "train_async.py" if plan.choice.async_steps else "train.py"
    lines = [SHEBANG, *(c for line in prediction_lines(plan, job) for c in comment(line, None))]
    lines += comment(
        "Model, checkpoint and data flags (MODEL_ARGS, --hf-checkpoint, --load, --prompt-data, ...) are yours: pass "
        "them after this "
        "script's name. Reads PYTHON (default python3) and SLIME_DIR (a slime checkout; default: the working folder)."
    )
    lines += [STRICT_MODE, "PYTHON=${PYTHON:-python3}", "SLIME_DIR=${SLIME_DIR:-.}", "",
              bash_array("PLAN_ARGS", argv).rstrip("\n"), ""]
    lines += [f'exec "$PYTHON" "$SLIME_DIR/{entry}" "${{PLAN_ARGS[@]}}" "$@"', ""]
    return "\n".join(lines)


class SlimeRLExporter(Exporter):
    """``run_slime_rl.sh``: :func:`render_slime_script` of the context's RL plan (``tune rl --out``), executable."""

    name = "slime-rl"
    file_name = "run_slime_rl.sh"
    description = "run_slime_rl.sh: an RL plan as a slime launch (tune rl --out; bash; reads PYTHON, SLIME_DIR)"
    executable = True
    main_job = False

    def render(self, context: ExportContext) -> str:
        """The launch of ``context.rl_plan``.

        Raises TunerError: no RL plan in the context, or a plan slime cannot run."""
        plan, job = rl_plan_of(context, self.name)
        return render_slime_script(plan, job)
