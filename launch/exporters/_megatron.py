"""``megatron_args.sh``: the layout's Megatron-LM arguments as a bash array; run, it launches ``pretrain_gpt.py`` with
torchrun."""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._bridge import bridge_scripts_note
from launch.exporters._describe import _every_weight_note, _summary
from launch.exporters._flags import EXCLUSIVE_FLAGS, SEED_ENV, launch_env, megatron_args
from launch.exporters._shell import (
    SHEBANG,
    STRICT_MODE,
    Sh,
    bash_array,
    comment,
    require_set,
    user_arg_variables,
    with_note,
)
from specs import Cluster, ModelSpec, RunOptions, Workload
from specs.layout import Layout

__all__ = ["MEGATRON_SCRIPT_ENV", "megatron_args_script", "MegatronArgsExporter"]

#: Run as a program (not sourced): strict mode, then the launch. Sourced, the caller's shell options stay as they were
#: (``set -e`` in an interactive shell would close it at the next failing command).
_EXECUTED = '[[ -n "${BASH_VERSION:-}" && "${BASH_SOURCE[0]}" == "$0" ]]'

#: The environment variables ``megatron_args.sh`` reads when run: name -> what it is (and its default). Defaults as in
#: Megatron-LM's ``examples/llama/train_llama3_8b_h100_fp8.sh`` (NVIDIA/Megatron-LM at 779c5b7): ``pretrain_gpt.py`` run
#: from the checkout's root, ``--split 99,1,0``, ``--save-interval 1000``, ``MASTER_ADDR`` localhost, ``MASTER_PORT``
#: 29500.
MEGATRON_SCRIPT_ENV: dict[str, str] = {
    "DATA_PATH": "your data: the prefix of the .bin/.idx pair tools/preprocess_data.py writes (--data-path), or MOCK "
                 "for the mock data of Megatron-LM (--mock-data); required",
    "TOKENIZER_MODEL": "the Hugging Face tokenizer, e.g. the checkpoint folder (--tokenizer-model); required unless "
                       "DATA_PATH=MOCK",
    "TRAIN_ITERS": "the number of optimizer steps (--train-iters); required",
    "CHECKPOINT_PATH": "where checkpoints are saved and a run resumes from (--save, --load); default "
                       "checkpoints/<model>",
    "SAVE_INTERVAL": "steps between checkpoints (--save-interval); default 1000",
    "SPLIT": "train / validation / test shares of DATA_PATH (--split); default 99,1,0",
    "TENSORBOARD_DIR": "a folder for TensorBoard logs (--tensorboard-dir); default: unset, no logs",
    "PRETRAIN_SCRIPT": "Megatron-LM's training program; default pretrain_gpt.py (run from the Megatron-LM checkout)",
    "NNODES": "nodes of the run (torchrun --nnodes); default the layout's",
    "NODE_RANK": "this node's rank (torchrun --node-rank); default 0",
    "MASTER_ADDR": "the first node's address (torchrun --master-addr); default localhost",
    "MASTER_PORT": "a free port on the first node (torchrun --master-port); default 29500",
}


#: The environment ``megatron_args.sh`` exports when run, before :func:`launch_env`: Megatron-LM asserts
#: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` before Blackwell with TP or CP > 1, unless FSDP or the EP overlap is on
#: (``megatron/training/arguments.py`` l.1453-1479 at d98e8a64); run_slime.sh exports the seed's value always.
_RUN_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": SEED_ENV["CUDA_DEVICE_MAX_CONNECTIONS"]}


def _need(v: str) -> str:
    """What to set ``v`` to (the text of :data:`MEGATRON_SCRIPT_ENV`, up to "; required")."""
    return MEGATRON_SCRIPT_ENV[v].split("; required")[0]


#: The user's flags that give the data (one of them is the data source) and the tokenizer.
_DATA_FLAGS = next(s for s in EXCLUSIVE_FLAGS if "--data-path" in s)
_TOKENIZER_FLAGS = frozenset({"--tokenizer-type", "--tokenizer-model"})


@dataclass(frozen=True)
class _OwnRunArgs:
    """The data, tokenizer, step, checkpoint and log arguments ``megatron_args.sh`` adds from its variables, each
    only where the array does not set it or one that excludes it; the tokenizer only with its own data."""

    data: bool
    tokenizer: bool
    split: bool
    train_iters: bool
    save: bool
    load: bool
    save_interval: bool
    tensorboard: bool

    @classmethod
    def given(cls, flags: set[str]) -> _OwnRunArgs:
        data = not flags & _DATA_FLAGS
        return cls(data=data, tokenizer=data and not flags & _TOKENIZER_FLAGS, split=data and "--split" not in flags,
                   train_iters=not flags & {"--train-iters", "--train-samples"}, save="--save" not in flags,
                   load="--load" not in flags, save_interval="--save-interval" not in flags,
                   tensorboard="--tensorboard-dir" not in flags)

    @property
    def adds(self) -> bool:
        """Whether any argument is added (bash < 4.4 takes an empty array's expansion for unset)."""
        return any((self.data, self.tokenizer, self.train_iters, self.save, self.load, self.save_interval,
                    self.tensorboard))

    @property
    def checks(self) -> list[tuple[str, str, str | None]]:
        out: list[tuple[str, str, str | None]] = []
        if self.data:
            out.append(("DATA_PATH", _need("DATA_PATH"), None))
        if self.train_iters:
            out.append(("TRAIN_ITERS", _need("TRAIN_ITERS"), None))
        if self.tokenizer:
            out.append(("TOKENIZER_MODEL", _need("TOKENIZER_MODEL"), '[ "${DATA_PATH:-}" != MOCK ]'))
        return out

    @property
    def read(self) -> list[str]:
        return [v for v, on in (("CHECKPOINT_PATH", self.save or self.load), ("SAVE_INTERVAL", self.save_interval),
                                ("SPLIT", self.split), ("TENSORBOARD_DIR", self.tensorboard)) if on]

    def lines(self, checkpoints: str) -> list[str]:
        """Bash lines building ``DATA_ARGS``; ``checkpoints``: CHECKPOINT_PATH's default."""
        tok = ' --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL"'
        out = ["  DATA_ARGS=()"]
        if self.data:
            split = ' --split "${SPLIT:-99,1,0}"' if self.split else ""
            out += ['  if [ "$DATA_PATH" = MOCK ]; then',
                    "    DATA_ARGS+=(--mock-data" + (" --tokenizer-type NullTokenizer" if self.tokenizer else "") + ")",
                    "  else",
                    '    DATA_ARGS+=(--data-path "$DATA_PATH"' + split + (tok if self.tokenizer else "") + ")",
                    "  fi"]
        if self.train_iters:
            out.append('  DATA_ARGS+=(--train-iters "$TRAIN_ITERS")')
        if self.save or self.load:
            out.append(f"  CHECKPOINT_PATH=${{CHECKPOINT_PATH:-{checkpoints}}}")
        ck = [w for f, on in (("--save", self.save), ("--load", self.load)) if on for w in (f, '"$CHECKPOINT_PATH"')]
        if self.save_interval:
            ck += ["--save-interval", '"${SAVE_INTERVAL:-1000}"']
        if ck:
            out.append("  DATA_ARGS+=(" + " ".join(ck) + ")")
        if self.tensorboard:
            out.append('  if [ -n "${TENSORBOARD_DIR:-}" ]; then DATA_ARGS+=(--tensorboard-dir "$TENSORBOARD_DIR"); fi')
        return out


def megatron_args_script(model: ModelSpec, cluster: Cluster, workload: Workload, layout: Layout, *,
                         options: RunOptions | None = None, user_args: Sequence[str] = ()) -> str:
    """A bash file defining ``MEGATRON_ARGS=( ... )`` (each element ``shlex.quote``-d): run, it launches
    ``pretrain_gpt.py`` with torchrun, the arguments of :data:`MEGATRON_SCRIPT_ENV` and the environment of
    :func:`launch_env` over :data:`_RUN_ENV`; ``--print`` prints the array;
    sourced, it only defines it. With ``user_args`` the run adds only what they do not set (:class:`_OwnRunArgs`).

    Raises:
        TunerError: as :func:`megatron_args`.
    """
    argv = megatron_args(model, cluster, workload, layout, options=options, user_args=user_args)
    own = _OwnRunArgs.given({a for a in argv if a.startswith("--")})
    checked = {c[0] for c in own.checks}
    needs = [n + " (or MOCK)" * (n == "DATA_PATH") for n in ("DATA_PATH", "TOKENIZER_MODEL", "TRAIN_ITERS")
             if n in checked]
    runs = textwrap.wrap("NODE_RANK and MASTER_ADDR); " + (f"needs {', '.join(needs)}; " if needs else "")
                         + f"reads {', '.join([*own.read, 'PRETRAIN_SCRIPT', 'NNODES', 'MASTER_PORT'])}", 78)
    head = [
        SHEBANG,
        *comment(f"Megatron-LM arguments for {model.name} on {cluster.num_gpus} {cluster.gpu.name} "
                 f"({cluster.num_nodes} x {cluster.gpus_per_node}): {layout.label}", None),
        *comment(_summary(layout, model, workload)),
        *(line for note in _every_weight_note(workload, "Megatron-LM") for line in comment(note)),
        "# Exported by megatron-layout-tuner. Three uses (bash):",
        "#   ./megatron_args.sh           launch pretrain_gpt.py with torchrun on this node (run it on every node with",
        *("#" + " " * 32 + line for line in runs),
        "#   ./megatron_args.sh --print   print the layout's arguments, one per line, and start nothing (a variable",
        "#                                not set is printed as $NAME)",
        "#   source megatron_args.sh      define MEGATRON_ARGS only",
    ]
    if model.qk_layernorm_full_dim:
        head.append("# --spec needs slime's slime_plugins package on PYTHONPATH (full-width QK norm).")
    head.append(f"if {_EXECUTED}; then {STRICT_MODE}; fi")
    # of the user's arguments, those written (not slime's own, which megatron_args leaves out)
    user_vars = user_arg_variables(argv, known=[n for n, _, _ in own.checks])
    if own.checks or user_vars:
        head += [f'if {_EXECUTED} && [ "${{1:-}}" != --print ]; then',
                 *require_set("megatron_args.sh", [*own.checks, *user_vars], "  "), "fi"]
    if user_vars:  # the kept arguments expand them as MEGATRON_ARGS is built, under set -u when executed
        shown = " ".join(f'"${{{n}=\\${n}}}"' for n, _, _ in user_vars)
        head.append(f'if {_EXECUTED} && [ "${{1:-}}" = --print ]; then : {shown}; fi')
    name = shlex.quote("checkpoints/" + re.sub(r"[\x00-\x1f\x7f]+", "_",
                                               model.name))  # no control character reaches the script
    tail = [
        f"if {_EXECUTED}; then",
        '  if [ "${1:-}" = --print ]; then printf \'%s\\n\' "${MEGATRON_ARGS[@]}"; exit 0; fi',
        *(own.lines(name) if own.adds else []),
        *(f"  export {k}={v}" for k, v in launch_env(argv, options, _RUN_ENV).items()),
        f'  torchrun --nnodes "${{NNODES:-{cluster.num_nodes}}}" --node-rank "${{NODE_RANK:-0}}" '
        f"--nproc-per-node {cluster.gpus_per_node} \\",
        '    --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-29500}" \\',
        '    "${PRETRAIN_SCRIPT:-pretrain_gpt.py}" "${MEGATRON_ARGS[@]}"' + (' "${DATA_ARGS[@]}"' if own.adds else ""),
        "fi",
    ]
    argv = [Sh(f'"{x}"') if "$" in x and '"' not in x else x for x in argv]  # the user's "$VAR" stays an expansion
    return "\n".join(head) + "\n" + bash_array("MEGATRON_ARGS", argv) + "\n".join(tail) + "\n"


class MegatronArgsExporter(Exporter):
    """``megatron_args.sh``: :func:`megatron_args_script`, executable (run, it prints the arguments)."""

    name = "megatron"
    file_name = "megatron_args.sh"
    trains_every_weight = True  # Megatron-LM has no LoRA arguments
    description = ("megatron_args.sh: run it to launch Megatron-LM's pretrain_gpt.py with torchrun on your data "
                   "(DATA_PATH, TOKENIZER_MODEL, TRAIN_ITERS); source it for MEGATRON_ARGS")
    executable = True

    def render(self, context: ExportContext) -> str:
        body = megatron_args_script(context.model, context.cluster, context.workload, context.layout,
                                    options=context.options, user_args=context.user_args)
        return with_note(body, bridge_scripts_note(context.bridge_yaml))
