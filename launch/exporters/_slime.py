"""``run_slime.sh``: a slime training launch of the layout on the user's rows, in the seed recipe's ``run:`` style."""

from __future__ import annotations

from collections.abc import Sequence

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._bridge import bridge_scripts_note
from launch.exporters._describe import _every_weight_note, _summary
from launch.exporters._flags import (
    HPARAM_FLAGS,
    _check,
    _dispatcher_args,
    _max_tokens_per_gpu,
    _optimizer_layout_args,
    _parallel_args,
    _pipeline_layout_string,
    _precision_args,
    _recompute_args,
    launch_env,
    merge_user_args,
    misc_lines,
    model_args,
    optimizer_lines,
    options_args,
)
from launch.exporters._shell import (
    SHEBANG,
    STRICT_MODE,
    Sh,
    bash_array,
    command,
    comment,
    group_flags,
    require_set,
    user_arg_variables,
    with_note,
)
from specs import Cluster, ModelSpec, RunOptions, Workload
from specs.layout import Dispatcher, Layout

__all__ = ["SEED_NUM_ROLLOUT", "SEED_ROLLOUT", "SFT_ROLLOUT", "SLIME_SCRIPT_ENV", "slime_env", "slime_script",
           "SlimeScriptExporter"]

#: slime's supervised fine-tuning rollout (``slime/rollout/sft_rollout.py``, as slime's ``scripts/run-*-sft.sh`` use
#: it).
SFT_ROLLOUT = "slime.rollout.sft_rollout.generate_rollout"

#: The seed's benchmark (``BENCHMARK=1``): its own pre-tokenized rollout module (not part of slime) and 20 steps.
SEED_ROLLOUT = "pretokenized_sft_rollout.generate_rollout"
SEED_NUM_ROLLOUT = 20

#: The environment variables ``run_slime.sh`` reads: name -> what it is (and its default, if any).
SLIME_SCRIPT_ENV: dict[str, str] = {
    "HF_CKPT": "the Hugging Face checkpoint folder, also the tokenizer (--hf-checkpoint); required",
    "TORCH_DIST": "the torch_dist checkpoint of the same weights, the starting point (--ref-load); required",
    "SFT_DATA": "your training rows, a parquet or JSONL file with a messages column (--prompt-data); required",
    "SAVE_DIR": "where checkpoints are saved and a run resumes from (--save, --load); required unless BENCHMARK=1",
    "SLIME_DIR": "a slime checkout: put first on PYTHONPATH (slime_plugins) and where the entry point is; default: "
                 "unset",
    "SLIME_ENTRY": "the slime program to run; default $SLIME_DIR/train_async.py (train_async.py with SLIME_DIR unset)",
    "NUM_EPOCH": "passes over SFT_DATA (--num-epoch); default 1",
    "NUM_ROLLOUT": "optimizer steps instead of epochs (--num-rollout); default: unset (20 with BENCHMARK=1)",
    "SAVE_INTERVAL": "steps between checkpoints (--save-interval); default 1000, as slime's SFT scripts",
    "TENSORBOARD_DIR": "a folder for TensorBoard logs (--tensorboard-dir); default: unset, no logs",
    "PYTHON": "the Python interpreter; default python3",
    "NVLINK_COUNT": "NVLinks of this machine (NCCL_NVLS_ENABLE=1 when > 0); default: counted from nvidia-smi topo -m",
    "BENCHMARK": "1: the seed's benchmark (its pre-tokenized rollout module, NUM_ROLLOUT steps, nothing saved); "
                 "default 0",
}

_REQUIRED = ("HF_CKPT", "TORCH_DIST", "SFT_DATA")


#: Variables run_slime.sh sets itself (a default) or reads as optional: a kept argument may expand them.
_SET_HERE = ("PYTHON", "SLIME_ENTRY", "NUM_EPOCH", "SAVE_INTERVAL", "NVLINK_COUNT", "SAVE_DIR", "HF_CKPT", "TORCH_DIST",
             "SFT_DATA", "SLIME_DIR", "PYTHONPATH")


def _needed(save_dir: bool = True) -> list[tuple[str, str, str | None]]:
    """:func:`require_set` entries of ``run_slime.sh``; ``save_dir``: whether it checkpoints to SAVE_DIR."""
    return [(v, SLIME_SCRIPT_ENV[v].split(";")[0], None) for v in _REQUIRED] + [
        ("SAVE_DIR", SLIME_SCRIPT_ENV["SAVE_DIR"].split(";")[0], '[ "${BENCHMARK:-0}" != 1 ]')] * save_dir


def _run_args(user_flags: set[str]) -> list[str]:
    """Bash lines that build ``RUN_ARGS`` (rollout, checkpoint, steps, logs) without the user's flags."""
    ck = [w for f, v in (("--load", '"$SAVE_DIR"'), ("--save", '"$SAVE_DIR"'), ("--save-interval", '"$SAVE_INTERVAL"'))
          if f not in user_flags for w in (f, v)]
    out = [
        'if [ "${BENCHMARK:-0}" = 1 ]; then',
        f"  RUN_ARGS=(--rollout-function-path {SEED_ROLLOUT} --num-rollout \"${{NUM_ROLLOUT:-{SEED_NUM_ROLLOUT}}}\")",
        "else",
        f"  RUN_ARGS=(--rollout-function-path {SFT_ROLLOUT} --rollout-shuffle"
        + ("\n    " + " ".join(ck) if ck else "") + ")",
        '  if [ -n "${NUM_ROLLOUT:-}" ]; then RUN_ARGS+=(--num-rollout "$NUM_ROLLOUT"); '
        'else RUN_ARGS+=(--num-epoch "$NUM_EPOCH"); fi',
        "fi",
    ]
    if "--tensorboard-dir" not in user_flags:
        out.append('if [ -n "${TENSORBOARD_DIR:-}" ]; then RUN_ARGS+=(--tensorboard-dir "$TENSORBOARD_DIR"); fi')
    return out


def slime_script(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, *,
                 options: RunOptions | None = None, user_args: Sequence[str] = ()) -> str:
    """Bash that trains ``layout`` with slime on the user's rows (the recipe's ``run`` block).

    slime's SFT path as ``scripts/run-qwen3-235B-A22B-sft.sh`` runs it (THUDM/slime at 4a2812e): ``train_async.py`` with
    :data:`SFT_ROLLOUT`, ``--loss-type sft_loss``, ``--debug-train-only``. ``BENCHMARK=1`` runs the seed's benchmark:
    with the seed's layout on 8 x 8 H200 every flag of the seed's command comes back. With ``user_args`` (``tune
    --from``) the tool's hyperparameters are left out and the user's arguments come last. No shebang.

    Raises:
        TunerError: as :func:`layout_args`, or the world size is not the cluster's GPU count.
    """
    groups, user = _command_groups(model, cluster, workload, layout, options, user_args)
    user_flags = {g[0] for g in user}
    save_dir = not {"--save", "--load"} <= user_flags
    reads = [v for v, on in (("SAVE_INTERVAL", "--save-interval" not in user_flags),
                             ("TENSORBOARD_DIR", "--tensorboard-dir" not in user_flags)) if on]
    out: list[str] = [
        *comment(f"slime: {model.name} on {cluster.num_gpus} {cluster.gpu.name} ({cluster.num_nodes} x "
                 f"{cluster.gpus_per_node}), {layout.label}", None),
        *comment(_summary(layout, model, workload)),
        *(line for note in _every_weight_note(workload, "slime") for line in comment(note)),
        *comment(
            "Trains on your rows with slime's SFT path. Needs a Ray cluster running on the nodes (`ray start --head` "
            "on the first, `ray start --address HEAD:6379` on the others) and HF_CKPT, TORCH_DIST, SFT_DATA"
            f"{', SAVE_DIR' * save_dir}; reads "
            f"{', '.join(['SLIME_DIR', 'SLIME_ENTRY', 'NUM_EPOCH', 'NUM_ROLLOUT', *reads, 'PYTHON', 'NVLINK_COUNT'])}. "
            "BENCHMARK=1 runs the seed's 20-step benchmark instead."
        ),
        *require_set("run_slime.sh", _needed(save_dir) + user_arg_variables(user_args, known=_SET_HERE)),
        "PYTHON=${PYTHON:-python3}",
        "SLIME_ENTRY=${SLIME_ENTRY:-${SLIME_DIR:+$SLIME_DIR/}train_async.py}",
        '[ -f "$SLIME_ENTRY" ] || { printf \'run_slime.sh: no slime entry point at %s: set SLIME_DIR to a slime '
        'checkout (or SLIME_ENTRY to its train_async.py)\\n\' "$SLIME_ENTRY" >&2; exit 2; }',
        "NUM_EPOCH=${NUM_EPOCH:-1}",
        "SAVE_INTERVAL=${SAVE_INTERVAL:-1000}",
        'if [ -n "${SLIME_DIR:-}" ]; then export PYTHONPATH="$SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}"; fi',
        "NVLINK_COUNT=${NVLINK_COUNT:-$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l || true)}",
        "",
    ]
    out += [f"export {k}={v}" for k, v in _env(groups, user, model, options).items()]
    out += ["", bash_array("MODEL_ARGS", model_args(model)).rstrip("\n"), ""]
    out += [*_run_args(user_flags), ""]
    if model.is_moe and layout.dispatcher == Dispatcher.allgather:
        out.append("# The layout's dispatcher is allgather; slime rewrites allgather to alltoall, so alltoall is asked "
                   "for.")
    for g in user:
        groups.append([Sh(f'"{a}"') if "$" in a and '"' not in a else a for a in g])  # "$VAR" stays an expansion
    out += command((Sh('"$PYTHON"'), Sh('"$SLIME_ENTRY"')), groups)
    return "\n".join(out) + "\n"


def _command_groups(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, options: RunOptions | None,
                    user_args: Sequence[str]) -> tuple[list[Sequence[str]], list[list[str]]]:
    """The command's flag groups (:func:`_groups`, with the free ones the user's launch does not set) and the user's
    kept groups (``tune --from``: the tool's hyperparameters left out, the user's win).

    Raises:
        TunerError: as :func:`layout_args`, or the world size is not the cluster's GPU count."""
    _check(layout, model, workload, cluster)
    groups = _groups(model, cluster, workload, layout, options, hparams=not user_args)
    user: list[list[str]] = []
    if user_args:
        misc = [g for line in misc_lines(model, options) for g in group_flags(line) if g[0] not in HPARAM_FLAGS]
        free, user = merge_user_args([*groups, *group_flags(model_args(model))], misc, user_args)
        groups += free
    return groups, user


def _env(groups: Sequence[Sequence[str]], user: Sequence[Sequence[str]], model: ModelSpec,
         options: RunOptions | None) -> dict[str, str]:
    """The seed's environment for the command of ``groups`` and ``user`` (:func:`launch_env`)."""
    return launch_env([str(a) for g in (*groups, *user) for a in g] + model_args(model), options)


def slime_env(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, *,
              options: RunOptions | None = None, user_args: Sequence[str] = ()) -> dict[str, str]:
    """The environment :func:`slime_script` exports (name -> shell text): :data:`SEED_ENV` as Megatron-LM accepts it
    beside the command's arguments (:func:`launch_env`).

    Raises:
        TunerError: as :func:`slime_script`."""
    return _env(*_command_groups(model, cluster, workload, layout, options, user_args), model, options)


def _groups(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, options: RunOptions | None, *,
            hparams: bool = True) -> list[Sequence[str]]:
    """:func:`slime_script`'s arguments, one group a line; ``hparams`` False drops the seed's optimizer
    hyperparameters and numerics flags."""
    gbs = str(workload.global_batch_size)
    groups: list[Sequence[str]] = [
        ("--actor-num-nodes", str(cluster.num_nodes)),
        ("--actor-num-gpus-per-node", str(cluster.gpus_per_node)),
        (Sh('"${MODEL_ARGS[@]}"'),),
        ("--hf-checkpoint", Sh('"$HF_CKPT"')),
        ("--ref-load", Sh('"$TORCH_DIST"')),
        ("--prompt-data", Sh('"$SFT_DATA"')),
        ("--input-key", "messages"),
        ("--metadata-key", "metadata"),
        (Sh('"${RUN_ARGS[@]}"'),),
        ("--rollout-batch-size", gbs),
        ("--global-batch-size", gbs),
        ("--loss-type", "sft_loss"),
        ("--calculate-per-token-loss",),
        ("--disable-compute-advantages-and-returns",),
        ("--debug-train-only",),
        ("--seq-length", str(workload.seq_length)),
    ]
    groups += group_flags(_parallel_args(layout, model) + _recompute_args(layout))
    groups += [("--use-dynamic-batch-size",), ("--max-tokens-per-gpu", str(_max_tokens_per_gpu(layout, workload)))]
    groups += list(optimizer_lines(options)) * hparams
    groups += group_flags(_optimizer_layout_args(layout))
    groups += list(misc_lines(model, options)) * hparams
    groups += group_flags(options_args(model, workload, options, layout, hparams=hparams))
    prec = _precision_args(workload, "slime")
    if prec:
        groups.append(prec)
    groups += [("--distributed-timeout-minutes", "30")]
    disp = _dispatcher_args(layout, model, "slime")
    if disp:
        groups.append(disp)
    pls = _pipeline_layout_string(layout, model)
    if pls is not None:
        groups.append(("--pipeline-model-parallel-layout", pls))
    return groups


class SlimeScriptExporter(Exporter):
    """``run_slime.sh``: :func:`slime_script` behind ``#!/usr/bin/env bash`` and ``set -euo pipefail``, executable."""

    name = "slime"
    file_name = "run_slime.sh"
    trains_every_weight = True  # slime has no LoRA arguments
    description = ("run_slime.sh: a slime SFT training launch of your rows (bash; needs HF_CKPT, TORCH_DIST, SFT_DATA, "
                   "SAVE_DIR and a running Ray cluster)")
    executable = True

    def render(self, context: ExportContext) -> str:
        body = slime_script(context.model, context.cluster, context.workload, context.layout, options=context.options,
                            user_args=context.user_args)
        head = [SHEBANG,
                f"# {self.file_name}, exported by megatron-layout-tuner: run it as it is (./{self.file_name}).",
                STRICT_MODE]
        return with_note("\n".join(head) + "\n" + body, bridge_scripts_note(context.bridge_yaml, slime=True))
