"""``run_slime.sh``: a slime launch of the layout, in the seed recipe's ``run:`` style, that runs as it is."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._describe import _summary
from launch.exporters._flags import (
    _OPTIMIZER_LINES,
    SEED_ENV,
    _check,
    _dispatcher_args,
    _env,
    _max_tokens_per_gpu,
    _optimizer_layout_args,
    _parallel_args,
    _pipeline_layout_string,
    _precision_args,
    _recompute_args,
    misc_lines,
    model_args,
)
from launch.exporters._shell import SHEBANG, STRICT_MODE, Sh, bash_array, command, comment, group_flags
from specs import Cluster, ModelSpec, Workload
from specs.errors import TunerError
from specs.layout import Dispatcher, Layout

__all__ = ["SLIME_SCRIPT_ENV", "slime_script", "SlimeScriptExporter"]

#: The environment variables ``run_slime.sh`` reads: name -> what it is (and its default, if any).
SLIME_SCRIPT_ENV: dict[str, str] = {
    "HF_CKPT": "the Hugging Face checkpoint folder (--hf-checkpoint); required",
    "TORCH_DIST": "the torch_dist checkpoint of the same weights (--ref-load); required",
    "SFT_DATA": "the training rows (--prompt-data); required",
    "PROFILE_DIR": "a folder for TensorBoard logs (--tensorboard-dir); required",
    "SLIME_ENTRY_MODULE": "the slime module that `python -m` runs (the seed recipe does not name it); required",
    "PYTHON": "the Python interpreter; default python3",
    "SLIME_DIR": "a slime checkout, put first on PYTHONPATH (the entry module and slime_plugins); default: unset, PYTHONPATH as it is",
    "NVLINK_COUNT": "NVLinks of this machine (NCCL_NVLS_ENABLE=1 when > 0); default: counted from `nvidia-smi topo -m`",
}

_REQUIRED = ("HF_CKPT", "TORCH_DIST", "SFT_DATA", "PROFILE_DIR")


def slime_script(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    layout: Layout,
    *,
    extra_env: Mapping[str, str] | None = None,
    num_rollout: int = 20,
    entry_module: str | None = None,
) -> str:
    """Bash that trains ``layout`` with slime, in the seed's ``run:`` style (the recipe's ``run`` block).

    Checks that the variables it needs are set (``: "${HF_CKPT:?...}"``), reads ``PYTHON``
    (default ``python3``), ``SLIME_DIR`` (prepended to ``PYTHONPATH`` when set) and ``NVLINK_COUNT``
    (default: counted as slime's scripts do), then the seed's four environment exports,
    ``MODEL_ARGS=( ... )`` from :func:`model_args`, then ``"$PYTHON" -m "$SLIME_ENTRY_MODULE" --async``
    with the seed's SFT arguments (``--rollout-batch-size`` and ``--global-batch-size`` both the
    workload's global batch), the layout's flags in the seed's order, the seed's optimizer
    hyperparameters and misc flags, the token dispatcher and the pipeline layout string. With the
    seed's layout on 8 x 8 H200 every flag of the seed's command line comes back with its value.
    Every argument is ``shlex.quote``-d; only the variables above are expanded.

    The seed writes its entry point as ``<slime entry module>``; unless ``entry_module`` is given
    (then it is the default of ``SLIME_ENTRY_MODULE``) the script stops with a message when
    ``SLIME_ENTRY_MODULE`` is unset. :class:`SlimeScriptExporter` adds the shebang and strict mode.

    Args:
        model: The model.
        cluster: The GPUs: ``--actor-num-nodes`` and ``--actor-num-gpus-per-node``.
        workload: Sequence length and global batch.
        layout: The layout.
        extra_env: More environment variables, exported after the seed's four;
            values are literal (they are quoted for the shell).
        num_rollout: ``--num-rollout``: optimizer steps (20 in the seed).
        entry_module: The default slime module to run with ``python -m``.

    Returns:
        The script's text (bash), without a shebang.

    Raises:
        TunerError: as :func:`layout_args`, if the world size is not the
            cluster's GPU count, an extra variable name is not a shell name, or
            ``num_rollout`` is below 1.
    """
    _check(layout, model, workload, cluster)
    if num_rollout < 1:
        raise TunerError(f"num_rollout must be at least 1, got {num_rollout}")
    env = _env(extra_env)
    gbs = str(workload.global_batch_size)
    entry = (f"SLIME_ENTRY_MODULE=${{SLIME_ENTRY_MODULE:-{shlex.quote(entry_module)}}}" if entry_module else
             'SLIME_ENTRY_MODULE=${SLIME_ENTRY_MODULE:?set SLIME_ENTRY_MODULE to the slime module to run with python -m}')
    out: list[str] = [
        *comment(f"slime: {model.name} on {cluster.num_gpus} {cluster.gpu.name} ({cluster.num_nodes} x {cluster.gpus_per_node}), "
                 f"{layout.label}", None),
        *comment(_summary(layout, model, workload)),
        "# Needs HF_CKPT, TORCH_DIST, SFT_DATA, PROFILE_DIR and SLIME_ENTRY_MODULE; reads PYTHON (default python3),",
        "# SLIME_DIR (a slime checkout, put first on PYTHONPATH) and NVLINK_COUNT (default: counted with nvidia-smi).",
        *(f': "${{{v}:?set {v} to {SLIME_SCRIPT_ENV[v].split(";")[0]}}}"' for v in _REQUIRED),
        entry,
        "PYTHON=${PYTHON:-python3}",
        'if [ -n "${SLIME_DIR:-}" ]; then export PYTHONPATH="$SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}"; fi',
        "NVLINK_COUNT=${NVLINK_COUNT:-$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l || true)}",
        "",
    ]
    for k, v in env.items():
        out.append(f"export {k}={v if k in SEED_ENV and SEED_ENV[k] == v else shlex.quote(v)}")
    out += ["", bash_array("MODEL_ARGS", model_args(model)).rstrip("\n"), ""]
    if model.is_moe and layout.dispatcher == Dispatcher.allgather:
        out.append("# The layout's dispatcher is allgather; slime rewrites allgather to alltoall, so alltoall is asked for.")
    groups: list[Sequence[str]] = [
        ("--actor-num-nodes", str(cluster.num_nodes)),
        ("--actor-num-gpus-per-node", str(cluster.gpus_per_node)),
        (Sh('"${MODEL_ARGS[@]}"'),),
        ("--hf-checkpoint", Sh('"$HF_CKPT"')),
        ("--ref-load", Sh('"$TORCH_DIST"')),
        ("--rollout-function-path", "pretokenized_sft_rollout.generate_rollout"),
        ("--prompt-data", Sh('"$SFT_DATA"')),
        ("--input-key", "messages"),
        ("--metadata-key", "metadata"),
        ("--num-rollout", str(num_rollout)),
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
    groups += list(_OPTIMIZER_LINES)
    groups += group_flags(_optimizer_layout_args(layout))
    groups += list(misc_lines(model))
    prec = _precision_args(workload, "slime")
    if prec:
        groups.append(prec)
    groups += [("--distributed-timeout-minutes", "30"), ("--tensorboard-dir", Sh('"$PROFILE_DIR"'))]
    disp = _dispatcher_args(layout, model, "slime")
    if disp:
        groups.append(disp)
    pls = _pipeline_layout_string(layout, model)
    if pls is not None:
        groups.append(("--pipeline-model-parallel-layout", pls))
    out += command((Sh('"$PYTHON"'), "-m", Sh('"$SLIME_ENTRY_MODULE"'), "--async"), groups)
    return "\n".join(out) + "\n"


class SlimeScriptExporter(Exporter):
    """``run_slime.sh``: :func:`slime_script` behind ``#!/usr/bin/env bash`` and ``set -euo pipefail``, executable."""

    name = "slime"
    file_name = "run_slime.sh"
    description = "run_slime.sh: a slime launch in the seed recipe's run: style (bash; reads HF_CKPT, TORCH_DIST, SFT_DATA, PROFILE_DIR, SLIME_ENTRY_MODULE, PYTHON, SLIME_DIR)"
    executable = True

    def render(self, context: ExportContext) -> str:
        """The script: shebang, a line saying how to run it, strict mode, then :func:`slime_script`.

        Raises:
            TunerError: as :func:`slime_script`.
        """
        body = slime_script(context.model, context.cluster, context.workload, context.layout)
        head = [SHEBANG, f"# {self.file_name}, exported by megatron-layout-tuner: run it as it is (./{self.file_name}).", STRICT_MODE]
        return "\n".join(head) + "\n" + body
