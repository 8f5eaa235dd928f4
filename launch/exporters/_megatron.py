"""``megatron_args.sh``: the layout's Megatron-LM arguments as a bash array, to ``source`` (or run, to print them)."""

from __future__ import annotations

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._describe import _summary
from launch.exporters._flags import megatron_args
from launch.exporters._shell import SHEBANG, STRICT_MODE, bash_array, comment
from specs import Cluster, ModelSpec, Workload
from specs.layout import Layout

__all__ = ["megatron_args_script", "MegatronArgsExporter"]

#: Run as a program (not sourced): strict mode, then print the arguments. Sourced, the caller's
#: shell options stay as they were (``set -e`` in an interactive shell would close it at the next
#: failing command).
_EXECUTED = '[[ -n "${BASH_VERSION:-}" && "${BASH_SOURCE[0]}" == "$0" ]]'


def megatron_args_script(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout) -> str:
    """A bash file that defines ``MEGATRON_ARGS=( ... )``, one flag and its values per line.

    Every element is ``shlex.quote``-d, so the pipeline layout string's ``|``,
    ``(`` and ``*`` reach Megatron unchanged. Use it as::

        source megatron_args.sh
        torchrun --nnodes N --nproc-per-node G ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" <data and tokenizer args>

    (``$(cat file)`` would not do: word splitting does not undo quotes.) Run as a program
    (``./megatron_args.sh``) it turns on ``set -euo pipefail``, prints the arguments one per line
    (``mapfile -t ARGS < <(./megatron_args.sh)`` reads them back) and starts nothing; sourced, it
    only defines the array and leaves the shell's options alone.

    Args:
        model: The model.
        cluster: The GPUs.
        workload: The workload.
        layout: The layout.

    Returns:
        The file's text, from ``#!/usr/bin/env bash``.

    Raises:
        TunerError: as :func:`megatron_args`.
    """
    argv = megatron_args(model, cluster, workload, layout)
    head = [
        SHEBANG,
        *comment(f"Megatron-LM arguments for {model.name} on {cluster.num_gpus} {cluster.gpu.name} "
                 f"({cluster.num_nodes} x {cluster.gpus_per_node}): {layout.label}", None),
        *comment(_summary(layout, model, workload)),
        "# Exported by megatron-layout-tuner. Use (bash):",
        "#   source megatron_args.sh",
        f"#   torchrun --nnodes {cluster.num_nodes} --nproc-per-node {cluster.gpus_per_node} ... pretrain_gpt.py "
        '"${MEGATRON_ARGS[@]}" <data, tokenizer and checkpoint arguments>',
        "# Run as a program (./megatron_args.sh) it prints the arguments, one per line, and starts nothing.",
    ]
    if model.qk_layernorm_full_dim:
        head.append("# --spec needs slime's slime_plugins package on PYTHONPATH (full-width QK norm).")
    head.append(f"if {_EXECUTED}; then {STRICT_MODE}; fi")
    tail = f"if {_EXECUTED}; then printf '%s\\n' \"${{MEGATRON_ARGS[@]}}\"; fi\n"
    return "\n".join(head) + "\n" + bash_array("MEGATRON_ARGS", argv) + tail


class MegatronArgsExporter(Exporter):
    """``megatron_args.sh``: :func:`megatron_args_script`, executable (run, it prints the arguments)."""

    name = "megatron"
    file_name = "megatron_args.sh"
    description = 'megatron_args.sh: MEGATRON_ARGS=(...) for Megatron-LM\'s pretrain_gpt.py (source it; pass "${MEGATRON_ARGS[@]}")'
    executable = True

    def render(self, context: ExportContext) -> str:
        """:func:`megatron_args_script` of the context's layout.

        Raises:
            TunerError: as :func:`megatron_args_script`.
        """
        return megatron_args_script(context.model, context.cluster, context.workload, context.layout)
