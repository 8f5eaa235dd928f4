"""A user's launch as the tuner's inputs: ``tune --from FILE``.

:func:`read_launch` reads a Megatron-LM / slime argument list or shell script (``MODEL_ARGS=( ... )`` arrays and
``NAME=value`` assignments expanded where the launch uses them, ``"${MODEL_ARGS[@]}"`` included), this project's
``recipe.yaml`` (its ``run`` block, its model and GPU), a Megatron-Bridge override YAML or performance config
(``ConfigContainer`` and ``perf_matrix``), or a NeMo-RL config. The launch's arguments are parsed with :mod:`argparse` and
sorted three ways (:class:`LaunchFile`): **understood** (the model, the GPUs, the workload, the layout and the run
options the cost model prices), **known without effect** on the estimate (:data:`NO_EFFECT_ARGS`: learning rate,
paths, logging, RL rollout settings ...) and **not understood** (named, never dropped). The arguments that are not
understood or have no effect are kept, in order, for the exported commands (:attr:`LaunchFile.user_args`).
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from specs.errors import TunerError
from specs.files import parse_errors, read_user_text
from specs.stacks import RunFlags

__all__ = ["NO_EFFECT_ARGS", "LaunchFile", "read_launch"]

#: Arguments of Megatron-LM and slime that do not change the estimate (optimizer hyperparameters, data, checkpoints,
#: logging, RL rollout and generation settings, numerics that cost nothing the model prices).
NO_EFFECT_ARGS = frozenset("""
--lr --min-lr --lr-decay-style --lr-warmup-fraction --lr-warmup-iters --lr-decay-iters --lr-warmup-init --weight-decay
--start-weight-decay --end-weight-decay --weight-decay-incr-style --adam-beta1 --adam-beta2 --adam-eps --clip-grad
--sgd-momentum --init-method-std --seed --attention-dropout --hidden-dropout --attention-softmax-in-fp32
--attention-backend --distributed-timeout-minutes --distributed-backend --tensorboard-dir --wandb-project --wandb-group
--wandb-exp-name --log-interval --log-throughput --log-timers-to-tensorboard --eval-iters --eval-interval --save-interval
--train-iters --train-samples --exit-interval --hf-checkpoint --ref-load --load --save --data-path --split --tokenizer-type
--tokenizer-model --vocab-file --merge-file --data-cache-path --no-load-optim --no-load-rng --finetune --use-checkpoint-args
--ckpt-format --model-name --prompt-data --input-key --label-key --metadata-key --apply-chat-template --rollout-shuffle
--num-rollout --rollout-batch-size --n-samples-per-prompt --rollout-max-response-len --rollout-max-prompt-len
--rollout-temperature --rollout-top-p --rollout-function-path --over-sampling-batch-size --balance-data
--num-steps-per-rollout --loss-type --calculate-per-token-loss --disable-compute-advantages-and-returns --debug-train-only
--advantage-estimator --use-kl-loss --kl-loss-coef --kl-loss-type --kl-coef --entropy-coef --eps-clip --eps-clip-high
--rollout-num-gpus-per-engine --rollout-num-gpus --sglang-mem-fraction-static --sglang-ep-size --colocate --async
--use-wandb --actor-num-nodes-for-rollout --moe-router-bias-update-rate --no-gradient-accumulation-fusion
--no-masked-softmax-fusion --no-bias-dropout-fusion --manual-gc --manual-gc-interval --overlap-param-gather
--check-for-nan-in-loss-and-grad --no-check-for-nan-in-loss-and-grad --use-mcore-models --transformer-impl-checks
--moe-router-dtype --moe-grouped-gemm --moe-aux-loss-coeff --moe-router-load-balancing-type --moe-router-pre-softmax
--moe-z-loss-coeff --moe-token-drop-policy --moe-per-layer-logging --spec --mock-data --no-create-attention-mask-in-dataloader
--max-position-embeddings --make-vocab-size-divisible-by --use-flash-attn --empty-unused-memory-level --cpu-offloading
--cuda-graph-warmup-steps --te-rng-tracker --use-te-rng-tracker
""".split())

#: Model-architecture arguments: they identify the model preset (``--num-layers`` below the preset's slices it).
_IDENTITY = ("hidden_size", "num_attention_heads", "num_experts", "moe_ffn_hidden_size", "vocab_size", "moe_router_topk",
             "num_query_groups", "kv_channels", "kv_lora_rank", "q_lora_rank")

#: The launch arguments of the slime RL framework (a file that has one is a slime launch).
_SLIME_ONLY = ("--actor-num-nodes", "--actor-num-gpus-per-node", "--max-tokens-per-gpu", "--use-dynamic-batch-size",
               "--rollout-batch-size", "--hf-checkpoint", "--debug-train-only")


class LaunchTask(TypedDict, total=False):
    """A launch's training task as :class:`tuner.cli._common.RunChoice` fields (those it gives)."""

    task: str
    lora_rank: int
    lora_target_modules: str
    """Comma-separated, as ``--lora-target-modules``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchFile:
    """What a launch file says, and how each of its arguments was read."""

    path: Path
    kind: str
    """``shell`` (an argument list or script), ``recipe`` (this project's ``recipe.yaml``), ``megatron-bridge`` (an
    override YAML: its sections' settings as Megatron-LM's arguments) or ``nemo-rl`` (a NeMo-RL config with its
    ``defaults:`` files merged: ``policy.megatron_cfg`` read as Megatron-Bridge's settings)."""
    stack: str
    """The stack the launch is written for: ``slime`` or ``megatron-lm``."""
    model: str | None = None
    """The model preset the architecture arguments identify (or the recipe's), None when the file names none."""
    num_layers: int | None = None
    """``--num-layers`` when below the preset's: a slice (``--layers``)."""
    model_notes: tuple[str, ...] = ()
    """Architecture arguments that differ from the preset's (the preset's value is used)."""
    gpu: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    seq_length: int | None = None
    global_batch_size: int | None = None
    precision: str | None = None
    layout: dict[str, Any] = field(default_factory=dict)
    """:class:`tuner.cli._layout.LayoutFlags` fields the launch gives."""
    run_flags: RunFlags = field(default_factory=RunFlags)
    understood: tuple[str, ...] = ()
    no_effect: tuple[str, ...] = ()
    not_understood: tuple[str, ...] = ()
    user_args: tuple[str, ...] = ()
    """The launch's arguments without effect or not understood, with their values, in order: the exports keep them."""
    task: LaunchTask | None = None
    """``task``, ``lora_rank``, ``lora_target_modules`` when the file trains LoRA adapters (NeMo-RL
    ``policy.megatron_cfg.peft.enabled``), else None."""

    @property
    def summary(self) -> str:
        """``N understood; K without effect on the estimate: ...; M not understood: ...`` (each name listed once)."""
        return self.short_summary(limit=None)

    def short_summary(self, limit: int | None = 6) -> str:
        """:attr:`summary` with at most ``limit`` names of those not understood and none of those without effect
        (None: every name)."""

        def names(xs: tuple[str, ...]) -> str:
            shown = xs if limit is None else xs[:limit]
            return " ".join(shown) + (f" and {len(xs) - len(shown)} more" if len(xs) > len(shown) else "")

        s = f"{len(self.understood)} arguments understood"
        if self.no_effect:
            s += f"; {len(self.no_effect)} without effect on the estimate" + (f": {names(self.no_effect)}" if limit is None else "")
        s += f"; {len(self.not_understood)} not understood: {names(self.not_understood)}" if self.not_understood else "; none not understood"
        return s


# ---- shell text -----------------------------------------------------------------------------------------------------

_SEPARATORS = set(";&|\n")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(\[@\]|\[\*\])?\}|([A-Za-z_][A-Za-z0-9_]*))$")


def _shell_statements(text: str) -> tuple[list[list[str]], dict[str, list[str]]]:
    """The simple commands of ``text`` (lists of words, quotes removed) and its variables (``NAME=value`` and
    ``NAME=( ... )`` arrays), by :mod:`shlex` with bash's separators as punctuation. Command substitutions ``$( ... )``
    are left out."""
    lx = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|()\n")
    lx.whitespace = " \t\r"
    lx.whitespace_split = True
    try:
        tokens = list(lx)
    except ValueError as e:
        raise TunerError(f"not a shell script shlex can read ({e})") from None
    stmts: list[list[str]] = [[]]
    variables: dict[str, list[str]] = {}
    i = 0
    while i < len(tokens):
        t = tokens[i]
        is_punct = bool(t) and all(ch in ";&|()\n" for ch in t)
        if is_punct and "(" in t:
            prev = stmts[-1][-1] if stmts[-1] else ""
            depth = t.count("(") - t.count(")")
            body: list[str] = []
            i += 1
            while i < len(tokens) and depth > 0:
                u = tokens[i]
                if u and all(ch in ";&|()\n" for ch in u):
                    depth += u.count("(") - u.count(")")
                else:
                    body.append(u)
                i += 1
            m = _ASSIGN.match(prev)
            if m and not m.group(2):  # NAME=( ... ): an array
                variables[m.group(1)] = [w for b in body for w in _expand(b, variables)]
                stmts[-1].pop()
            elif prev.endswith("$"):  # $( ... ): a command substitution, its value unknown
                stmts[-1][-1] = prev[:-1] + "$(...)"
            continue
        if is_punct:
            if any(ch in _SEPARATORS for ch in t):
                stmts.append([])
            i += 1
            continue
        stmts[-1].append(t)
        i += 1
    out: list[list[str]] = []
    for s in stmts:
        words = s[1:] if s[:1] == ["export"] else s
        if words and all(_ASSIGN.match(w) for w in words):
            for w in words:
                m = _ASSIGN.match(w)
                assert m is not None
                variables[m.group(1)] = [m.group(2)]
            continue
        if s:
            out.append(s)
    return out, variables


def _expand(word: str, variables: Mapping[str, list[str]]) -> list[str]:
    """``word`` with a whole-word ``$NAME``, ``${NAME}`` or ``${NAME[@]}`` replaced by the variable's value(s) when the
    file sets it; otherwise the word as it is."""
    m = _VAR.match(word)
    if not m:
        return [word]
    name = m.group(1) or m.group(3)
    if name in variables:
        return list(variables[name]) if m.group(2) else [" ".join(variables[name])]
    return [word]


def _sourced(stmts: list[list[str]], base: Path | None, depth: int = 0) -> dict[str, list[str]]:
    """The variables of the files the script ``source``-s (``source F`` / ``. F``): ``F`` relative to ``base`` (the
    script's folder), a leading ``${SCRIPT_DIR}/``-style variable read as that folder (slime's scripts source
    ``"${SCRIPT_DIR}/models/<model>.sh"``). Files not found are skipped (their variables stay unexpanded, and are named)."""
    out: dict[str, list[str]] = {}
    if base is None or depth > 4:
        return out
    for st in stmts:
        if len(st) >= 2 and st[0] in ("source", "."):
            rel = re.sub(r"^\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/", "", st[1])
            f = base / rel
            if f.is_file():
                try:
                    sub, variables = _shell_statements(read_user_text(f, str(f), "a shell script"))
                except TunerError:
                    continue
                out |= _sourced(sub, f.parent, depth + 1) | variables
    return out


def _launch_args(text: str, base: Path | None = None) -> tuple[list[str], list[str]]:
    """(the launcher's arguments, the training arguments) of the script's command with the most ``--`` arguments; a
    variable the script uses there but neither sets nor sources stays as it is (``${MODEL_ARGS[@]}``), to be named."""
    stmts, own = _shell_statements(text)
    if not stmts:
        raise TunerError("it holds no command")
    variables = _sourced(stmts, base) | own
    def score(stmt: list[str]) -> int:
        return sum(x.startswith("--") for w in stmt for x in _expand(w, variables))

    best = max(stmts, key=score)
    words = [x for w in best for x in _expand(w, variables)]
    cut = next((i + 1 for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")), None)
    if cut is None and "-m" in words:
        cut = words.index("-m") + 2
    launcher = words[:cut] if cut else []
    rest = words[cut:] if cut else words
    first = next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))
    unset = [w for w in rest[:first] if (v := _VAR.match(w)) and v.group(2)]  # ${MODEL_ARGS[@]} before the first flag: named
    return launcher, unset + rest[first:]


# ---- arguments ------------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, prog="launch", exit_on_error=False)
    ints = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
            "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--virtual-pipeline-model-parallel-size",
            "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--micro-batch-size",
            "--global-batch-size", "--seq-length", "--max-tokens-per-gpu", "--recompute-num-layers", "--actor-num-nodes",
            "--actor-num-gpus-per-node", "--cpu-offloading-num-layers")
    for a in ints:
        p.add_argument(a, type=int)
    for a in ("--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method", "--exp-avg-dtype",
              "--exp-avg-sq-dtype", "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--fp8-format",
              "--fp8-recipe", "--cross-entropy-fusion-impl", "--cuda-graph-impl", "--cp-comm-type", "--transformer-impl",
              "--optimizer"):
        p.add_argument(a)
    p.add_argument("--optimizer-offload-fraction", type=float)
    p.add_argument("--recompute-modules", nargs="+")
    p.add_argument("--cuda-graph-scope", "--cuda-graph-modules", nargs="+", dest="cuda_graph_scope")
    for a in ("--sequence-parallel", "--use-dynamic-batch-size", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
              "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--moe-enable-deepep", "--bf16", "--fp16",
              "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
              "--moe-permute-fusion", "--fp8-param-gather", "--overlap-grad-reduce", "--overlap-moe-expert-parallel-comm",
              "--tp-comm-overlap", "--moe-router-force-load-balancing", "--use-megatron-fsdp", "--no-rope-fusion",
              "--no-bias-swiglu-fusion", "--enable-cuda-graph", "--external-cuda-graph", "--rope-fusion", "--bias-swiglu-fusion"):
        p.add_argument(a, action="store_true", default=None)
    for a in ("--sequence-parallel", "--use-distributed-optimizer", "--use-precision-aware-optimizer", "--optimizer-cpu-offload",
              "--cross-entropy-loss-fusion", "--moe-permute-fusion", "--fp8-param-gather", "--overlap-grad-reduce",
              "--overlap-moe-expert-parallel-comm", "--tp-comm-overlap", "--moe-router-force-load-balancing", "--use-megatron-fsdp",
              "--moe-enable-deepep", "--overlap-cpu-optimizer-d2h-h2d", "--fp16"):
        p.add_argument("--no-" + a[2:], dest=a[2:].replace("-", "_"), action="store_false")  # a Megatron-Bridge YAML's false
    return p


def _numbers(v: Sequence[str]) -> list[str]:
    """An argument's values with numbers in one spelling (``7.0`` and ``7`` alike)."""
    out = []
    for x in v:
        try:
            out.append(repr(float(x)))
        except ValueError:
            out.append(x)
    return out


@functools.lru_cache(maxsize=1)
def _model_flags() -> frozenset[str]:
    """Every architecture argument the exports write for some preset (:func:`launch.exporters._flags.model_args`)."""
    from launch.exporters._flags import model_args
    from specs import list_models, load_model

    names = {"--yarn-correction-range-round-to-int"}
    for n in list_models():
        names |= {x for x in model_args(load_model(n)) if x.startswith("--")}
    return frozenset(names - set(_parser()._option_string_actions) - NO_EFFECT_ARGS)


def _flag_values(argv: Sequence[str], names: set[str] | frozenset[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The arguments of ``argv`` named in ``names`` with their values, and the rest in order."""
    found: dict[str, list[str]] = {}
    rest: list[str] = []
    current: list[str] | None = None
    for w in argv:
        if w.startswith("--"):
            name, eq, val = w.partition("=")
            if name in names:
                current = found.setdefault(name, [])
                current.clear()
                if eq:
                    current.append(val)
                continue
            current = None
            rest.append(w)
        elif current is not None:
            current.append(w)
        else:
            rest.append(w)
    return found, rest


def _identify_model(arch: Mapping[str, list[str]], given: str | None) -> tuple[str | None, int | None, tuple[str, ...]]:
    """(preset, slice layers, notes) the architecture arguments ``arch`` name; ``given`` (``--model``) wins.

    Raises:
        TunerError: architecture arguments that match no preset (and no ``--model``).
    """
    from launch.exporters._flags import model_args
    from specs import list_models, load_model

    def dest(flag: str) -> str:
        return flag[2:].replace("-", "_")

    file_arch = {dest(k): v for k, v in arch.items()}
    if "num_experts" not in file_arch:  # a dense model: its MoE settings (a dumped config's defaults) do not name it
        file_arch = {k: v for k, v in file_arch.items() if not k.startswith("moe_")}
    if not given and not any(k in file_arch for k in _IDENTITY):
        return None, None, ()
    names = [given] if given else list_models()
    best: tuple[str, dict[str, list[str]]] | None = None
    for n in names:
        try:
            m = load_model(n)
        except TunerError:
            return given, None, ()  # a config.json path: the file's architecture is not compared
        pre, _ = _flag_values(model_args(m), set(arch) | {"--num-layers"})
        pre_d = {dest(k): v for k, v in pre.items()}
        if given or all(_numbers(pre_d.get(k, ())) == _numbers(v) for k, v in file_arch.items() if k in _IDENTITY):
            best = (m.name, pre_d)
            break
    if best is None:
        if not file_arch:
            return None, None, ()
        shown = ", ".join(f"--{k.replace('_', '-')} {' '.join(v)}" for k, v in file_arch.items() if k in _IDENTITY)
        raise TunerError(f"its model ({shown or 'no --hidden-size / --num-attention-heads'}) is none of the presets "
                         f"({', '.join(list_models())}); give --model with a preset or a Hugging Face config.json")
    name, pre_d = best
    layers = None
    notes: list[str] = []
    if "num_layers" in file_arch:
        n_file, n_pre = int(file_arch["num_layers"][0]), int(pre_d["num_layers"][0])
        if n_file < n_pre:
            layers = n_file
        elif n_file != n_pre:
            notes.append(f"--num-layers {n_file}: {name} has {n_pre}; the preset's is used")
    for k, v in file_arch.items():
        if k != "num_layers" and (k not in pre_d or _numbers(pre_d[k]) != _numbers(v)):
            notes.append(f"--{k.replace('_', '-')} {' '.join(v)}".strip() + f": {name}'s is "
                         + (" ".join(pre_d[k]) or "set" if k in pre_d else "unset") + "; the preset's is used")
    return name, layers, tuple(notes)


def _layout_of(ns: argparse.Namespace, slime: bool) -> dict[str, Any]:
    """:class:`tuner.cli._layout.LayoutFlags` fields of the parsed launch (``slime``: a stack that turns the distributed
    optimizer on unless told otherwise: slime, Megatron-Bridge's recipes)."""
    d: dict[str, Any] = {}
    for k, a in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"), ("cp", "context_parallel_size"),
                 ("ep", "expert_model_parallel_size"), ("etp", "expert_tensor_parallel_size"),
                 ("first_stage_layers", "decoder_first_pipeline_num_layers"), ("last_stage_layers", "decoder_last_pipeline_num_layers"),
                 ("recompute_method", "recompute_method"), ("recompute_num_layers", "recompute_num_layers"),
                 ("exp_avg_dtype", "exp_avg_dtype"), ("pipeline_layout", "pipeline_model_parallel_layout")):
        if getattr(ns, a) is not None:
            d[k] = getattr(ns, a)
    vpp = ns.num_virtual_stages_per_pipeline_rank or ns.virtual_pipeline_model_parallel_size
    if vpp:
        d["vpp"] = vpp
    d["sequence_parallel"] = bool(ns.sequence_parallel)
    if ns.recompute_granularity:
        d["recompute"] = ns.recompute_granularity
    if ns.recompute_modules:
        d["recompute_modules"] = ",".join(ns.recompute_modules)
    if ns.micro_batch_size:
        d["micro_batch_size"] = ns.micro_batch_size
    if ns.optimizer_cpu_offload:
        d["optimizer_offload_fraction"] = 1.0 if ns.optimizer_offload_fraction is None else ns.optimizer_offload_fraction
    disp = ns.moe_token_dispatcher_type
    if ns.moe_enable_deepep or disp == "flex":
        d["dispatcher"] = f"flex+{ns.moe_flex_dispatcher_backend or 'deepep'}"
    elif disp:
        d["dispatcher"] = disp
    d["no_precision_aware_optimizer"] = not ns.use_precision_aware_optimizer
    d["no_distributed_optimizer"] = ns.use_distributed_optimizer is False or not (ns.use_distributed_optimizer or slime)
    return d


def _run_flags_of(ns: argparse.Namespace) -> RunFlags:
    impl = ns.cuda_graph_impl or ("local" if ns.enable_cuda_graph else "transformer_engine" if ns.external_cuda_graph else None)
    return RunFlags(
        accumulate_allreduce_grads_in_fp32=ns.accumulate_allreduce_grads_in_fp32, grad_reduce_in_bf16=ns.grad_reduce_in_bf16,
        cross_entropy_loss_fusion=ns.cross_entropy_loss_fusion, cross_entropy_fusion_impl=ns.cross_entropy_fusion_impl,
        cuda_graph_impl=impl, cuda_graph_scope=tuple(ns.cuda_graph_scope) if ns.cuda_graph_scope and impl != "none" else None,
        moe_permute_fusion=ns.moe_permute_fusion, fp8_recipe=ns.fp8_recipe, fp8_param_gather=ns.fp8_param_gather,
        overlap_grad_reduce=ns.overlap_grad_reduce, overlap_moe_expert_parallel_comm=ns.overlap_moe_expert_parallel_comm,
        tp_comm_overlap=ns.tp_comm_overlap, moe_router_force_load_balancing=ns.moe_router_force_load_balancing,
        cp_comm_type=ns.cp_comm_type, use_megatron_fsdp=ns.use_megatron_fsdp,
        apply_rope_fusion=False if ns.no_rope_fusion else (True if ns.rope_fusion else None),
        bias_swiglu_fusion=False if ns.no_bias_swiglu_fusion else (True if ns.bias_swiglu_fusion else None),
        transformer_impl=ns.transformer_impl, cpu_offloading_num_layers=ns.cpu_offloading_num_layers,
        optimizer=None if ns.optimizer in (None, "adam") else ns.optimizer,
    )


def _read_args(path: Path, kind: str, launcher: Sequence[str], argv: Sequence[str], model: str | None, gpu: str | None,
               names: Mapping[str, str] | None = None) -> LaunchFile:
    label = f"--from {str(path)!r}"
    parser = _parser()
    arch_names = _model_flags()
    arch, rest = _flag_values(argv, arch_names)
    try:
        ns, extras = parser.parse_known_args(rest)
    except SystemExit:  # argparse reports a bad value (e.g. --tensor-model-parallel-size two) and exits
        raise TunerError(f"{label}: an argument has a value of the wrong type (e.g. a word where a number goes); "
                         "fix it in the file") from None
    except argparse.ArgumentError as e:
        flag = (e.argument_name or "").split("/")[0]
        raise TunerError(f"{label}: {(names or {}).get(flag, flag) or 'an argument'}: {e.message}; fix it in the file") from None
    if ns.fp16:
        raise TunerError(f"{label}: --fp16 training is not modelled; accepted bf16 (--bf16) or fp8 (--fp8-format)")
    try:
        name, layers, notes = _identify_model(arch, model)
    except TunerError as e:
        raise TunerError(f"{label}: {e}") from None
    slime = any(w.split("=")[0] in _SLIME_ONLY for w in argv)
    if kind == "shell" and not slime and name is not None and not (ns.bf16 or ns.fp8_format):
        # Megatron-LM's arguments.py: without --bf16 / --fp16 the run trains in fp32 (slime turns --bf16 on itself)
        raise TunerError(f"{label}: no --bf16 (or --fp8-format): Megatron-LM would train in fp32, which is not modelled; "
                         "accepted bf16 (--bf16) or fp8 (--fp8-format)")
    understood = sorted({w.split("=")[0] for w in argv if w.startswith("--")} - {w.split("=")[0] for w in extras if w.startswith("--")})
    if names:
        understood = sorted({names.get(n, n) for n in understood})
    no_effect: list[str] = []
    not_understood: list[str] = []
    understood_empty: list[str] = []
    user_args: list[str] = []
    keep = False
    for w in extras:
        if w.startswith("--"):
            n = w.split("=")[0]
            if n.startswith("--empty:"):
                understood_empty.append(names.get(n, n) if names else n)
                continue
            positive = "--" + n[5:] if n.startswith("--no-") else n
            without = n in NO_EFFECT_ARGS or (names is not None and (positive in _BRIDGE_NO_EFFECT or "." in n))
            if names and n.startswith("--nemo-rl."):
                without = True
            (no_effect if without else not_understood).append(names.get(n, n) if names else n)
            keep = True
        elif (v := _VAR.match(w)) and v.group(2):  # an array the file uses but neither sets nor sources: arguments unknown
            not_understood.append(f"{w} (not set in the file)")
            continue
        elif not keep:
            not_understood.append(w)
            continue
        user_args.append(w)
    understood = sorted({*understood, *understood_empty})
    nodes, per_node = ns.actor_num_nodes, ns.actor_num_gpus_per_node
    if nodes is None and launcher:  # torchrun --nnodes N --nproc-per-node G
        lp = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        lp.add_argument("--nnodes")
        lp.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc")
        lns, _ = lp.parse_known_args(list(launcher))
        if lns.nnodes and str(lns.nnodes).isdigit() and lns.nproc and str(lns.nproc).isdigit():
            nodes, per_node = int(lns.nnodes), int(lns.nproc)
    lay = _layout_of(ns, slime or kind in ("megatron-bridge", "nemo-rl"))  # Bridge's recipes turn the distributed optimizer on
    if ns.use_dynamic_batch_size and ns.max_tokens_per_gpu and ns.seq_length and "micro_batch_size" not in lay:
        lay["micro_batch_size"] = max(1, ns.max_tokens_per_gpu * (ns.context_parallel_size or 1) // ns.seq_length)
    return LaunchFile(
        path=path, kind=kind, stack=kind if kind in ("megatron-bridge", "nemo-rl") else "slime" if slime else "megatron-lm", model=name, num_layers=layers, model_notes=notes,
        gpu=gpu, nodes=nodes, gpus_per_node=per_node, seq_length=ns.seq_length, global_batch_size=ns.global_batch_size,
        precision="fp8" if ns.fp8_format else ("bf16" if ns.bf16 or argv else None), layout=lay, run_flags=_run_flags_of(ns),
        understood=tuple(understood), no_effect=tuple(dict.fromkeys(no_effect)), not_understood=tuple(dict.fromkeys(not_understood)),
        user_args=tuple(user_args) if kind in ("shell", "recipe") else (),
    )


#: Sections of a Megatron-Bridge ``ConfigContainer`` (``training/config.py``) whose settings do not change the estimate.
_BRIDGE_NO_EFFECT_SECTIONS = frozenset({"scheduler", "logger", "checkpoint", "rng", "tokenizer", "validation", "profiling",
                                         "rerun_state_machine", "ft", "straggler", "nvrx_straggler", "inprocess_restart",
                                         "tensor_inspect", "env_vars"})
#: Sections read setting by setting.
_BRIDGE_SECTIONS = frozenset({"model", "train", "dataset", "optimizer", "ddp", "dist", "comm_overlap", "mixed_precision", "peft"})
#: Megatron-Bridge settings whose Megatron-LM argument is spelled otherwise.
_BRIDGE_RENAMED = {"num_moe_experts": "num-experts", "virtual_pipeline_model_parallel_size": "num-virtual-stages-per-pipeline-rank",
                   "num_layers_in_first_pipeline_stage": "decoder-first-pipeline-num-layers",
                   "num_layers_in_last_pipeline_stage": "decoder-last-pipeline-num-layers", "bias_activation_fusion": "bias-swiglu-fusion",
                   "apply_rope_fusion": "rope-fusion"}
#: Megatron-Bridge settings without effect on the estimate beside :data:`NO_EFFECT_ARGS` (as flags).
_BRIDGE_NO_EFFECT = frozenset({"--train-iters", "--eval-iters", "--eval-interval", "--finetune-lr", "--average-in-collective",
                               "--check-for-nan-in-grad", "--check-for-large-grads", "--data-parallel-sharding-strategy",
                               "--gradient-accumulation-fusion", "--use-torch-fsdp2", "--bf16", "--params-dtype", "--pipeline-dtype",
                               "--autocast-dtype", "--grad-reduce-in-fp32", "--overlap-param-gather", "--data-path", "--blend",
                               "--split", "--num-workers", "--dataloader-type", "--random-seed", "--use-custom-fsdp"})


def _bridge_args(doc: Mapping[str, Any], label: str) -> tuple[list[str], dict[str, str]]:
    """A Megatron-Bridge override YAML as Megatron-LM arguments, and each argument's ``section.key`` (for messages).

    ``ddp`` / ``mixed_precision`` ``grad_reduce_in_fp32`` becomes ``--accumulate-allreduce-grads-in-fp32`` or
    ``--grad-reduce-in-bf16``; a false boolean ``--no-KEY``; ``mixed_precision.fp8`` ``--fp8-format``; sections without
    effect on the estimate (:data:`_BRIDGE_NO_EFFECT_SECTIONS`) become ``--no-effect:section.key`` placeholders; a null
    (Megatron's default) is understood where the argument is one the estimate reads, else named.
    """
    argv: list[str] = []
    names: dict[str, str] = {}
    empties: list[str] = []
    known = set(_parser()._option_string_actions) | _model_flags()

    def put(flag: str, where: str, *values: str) -> None:
        if flag in names and names[flag] != where:  # a second section sets the same argument: named too
            positive = "--" + flag[5:] if flag.startswith("--no-") else flag
            if flag in known:
                empties.append(where)
            elif positive in _BRIDGE_NO_EFFECT or positive in NO_EFFECT_ARGS:
                names[f"--{where}"] = where  # a placeholder without effect (its name has a dot)
                argv.append(f"--{where}")
            else:
                names[f"--also-{len(names)}-{flag[2:]}"] = where
                argv.append(f"--also-{len(names) - 1}-{flag[2:]}")
        argv.append(flag)
        argv.extend(values)
        names.setdefault(flag, where)

    # mixed_precision last: Megatron-Bridge applies it over the model's settings (training/mixed_precision.py)
    for section, body in sorted(doc.items(), key=lambda kv: str(kv[0]) == "mixed_precision"):
        sec = str(section)
        if sec == "_target_":  # the dumped config's class
            put("--config._target_", sec)
            continue
        if sec in _BRIDGE_NO_EFFECT_SECTIONS:
            for k in body if isinstance(body, Mapping) else [None]:
                put(f"--{sec}.{k}" if k is not None else f"--{sec}.", f"{sec}.{k}" if k is not None else sec)
            continue
        if sec in _BRIDGE_SECTIONS and body is None:  # a section left unset (e.g. comm_overlap: null in a dumped config)
            empties.append(sec)
            continue
        if sec == "mixed_precision" and isinstance(body, str):
            if "fp8" in body:
                put("--fp8-format", f"{sec}: {body}", "hybrid")
                if "cs" in body or "current" in body:
                    put("--fp8-recipe", f"{sec}: {body}", "tensorwise")
            else:
                put("--bf16", f"{sec}: {body}")
            continue
        if sec not in _BRIDGE_SECTIONS or not isinstance(body, Mapping):
            put(f"--{sec}", sec)
            continue
        for k, v in body.items():
            key = str(k)
            where = f"{sec}.{key}"
            if key == "_target_":  # the section's class
                put(f"--{sec}._target_", where)
                continue
            if isinstance(v, Mapping) and str(v.get("_target_", "")).startswith("torch."):  # a dumped dtype
                v = _TORCH_DTYPES.get(str(v["_target_"]), str(v["_target_"]))
            if key == "grad_reduce_in_fp32" and isinstance(v, bool):  # the later section's wins (mixed_precision's last)
                argv[:] = [a for a in argv if a not in ("--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16")]
                put("--accumulate-allreduce-grads-in-fp32" if v else "--grad-reduce-in-bf16", where)
                continue
            if sec == "mixed_precision" and key == "fp8":
                if v:
                    put("--fp8-format", where, str(v))
                else:
                    empties.append(where)
                continue
            flag = "--" + _BRIDGE_RENAMED.get(key, key.replace("_", "-"))
            if isinstance(v, bool):
                put(flag if v else "--no-" + flag[2:], where)
            elif isinstance(v, list) and not v:  # an empty list: nothing of it (e.g. no CUDA graph modules)
                empties.append(where)
            elif isinstance(v, list):
                put(flag, where, *(str(x) for x in v))
            elif v is None:  # unset, so Megatron's default: understood when the estimate reads the argument
                if flag in known:
                    empties.append(where)
                else:
                    put(flag, where)
            elif isinstance(v, Mapping):  # a nested config: named, not read
                put(flag if flag not in known else f"--nested-{flag[2:]}", where)
            else:
                put(flag, where, str(v))
    for where in empties:
        names[f"--empty:{where}"] = where
        argv.append(f"--empty:{where}")
    return argv, names


#: The dtypes of a dumped Megatron-Bridge config (``{_target_: torch.float32, _call_: false}``) as Megatron-LM names them.
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "uint8",
                 "torch.float8_e4m3fn": "fp8"}

#: A Megatron-Bridge performance config's ``perf_matrix`` settings (``scripts/performance/configs/*/*.yaml``) as
#: Megatron-LM's arguments.
_PERF_MATRIX_ARGS = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size", "cp": "--context-parallel-size",
                     "vp": "--num-virtual-stages-per-pipeline-rank", "ep": "--expert-model-parallel-size",
                     "etp": "--expert-tensor-parallel-size", "mbs": "--micro-batch-size", "gbs": "--global-batch-size",
                     "seq_length": "--seq-length", "use_megatron_fsdp": "--use-megatron-fsdp"}
#: ``perf_matrix`` settings Megatron-Bridge's performance scripts set beyond the layout
#: (NVIDIA-NeMo/Megatron-Bridge 22a838d7 ``scripts/performance/utils/helpers.py`` l.114-135, the same since v0.1.0rc3):
#: ``cuda_graphs`` is ``model.enable_cuda_graph``, which megatron-core's ``TransformerConfig`` turns into
#: ``cuda_graph_impl="local"`` (whole-layer graphs); ``recompute_num_layers`` is full recompute, method block;
#: ``cpu_offloading_num_layers`` offloads that many layers' activations (``cpu_offloading_weights=False``). A value
#: of None, False or 0 sets nothing.
_PERF_MATRIX_SETTINGS = {"cuda_graphs": lambda v: ["--enable-cuda-graph"],
                         "recompute_num_layers": lambda v: ["--recompute-granularity", "full", "--recompute-method", "block",
                                                            "--recompute-num-layers", str(v)],
                         "cpu_offloading_num_layers": lambda v: ["--cpu-offloading-num-layers", str(v)]}
#: ``perf_matrix`` keys of the performance configs that those scripts never read (``fsdp``: only ``use_megatron_fsdp``
#: is read; ``nccl_ub`` is set by ``run_script.py`` from the model, not from the file): without effect.
_PERF_MATRIX_UNREAD = frozenset({"fsdp", "nccl_ub", "keep_fp8_transpose_cache_when_using_custom_fsdp"})
#: The ``perf_matrix`` precision entry each ``--precision`` (and ``--fp8-recipe``) selects, with its arguments.
_PERF_PRECISIONS = {("bf16", None): ("bf16", ["--bf16"]), ("fp8", None): ("fp8_cs", ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]),
                    ("fp8", "tensorwise"): ("fp8_cs", ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"])}


def _gpu_words(gpus: str | None) -> tuple[int | None, str | None]:
    """(GPU count or None, GPU name or None) of a ``--gpus`` value: ``16xH100``, ``2x8xH100`` or ``H100``."""
    if not gpus:
        return None, None
    parts = gpus.strip().split("x")
    nums = [int(x) for x in parts[:-1] if x.isdigit()]
    count = 1
    for n in nums:
        count *= n
    return (count if nums else None), parts[-1]


def _perf_matrix_args(matrix: Mapping[str, Any], label: str, gpus: str | None, precision: str | None,
                      fp8_recipe: str | None) -> tuple[list[str], dict[str, str], str, int, int | None]:
    """One entry of a Megatron-Bridge performance config's ``perf_matrix`` (``{gpu: {num_gpus_N: {common: {...},
    bf16: {...}, fp8_cs: {...}}}}``) as Megatron-LM arguments: the entry of ``--gpus`` (its GPU, and its count where
    given or the only one), its ``common`` settings and those of the precision ``--precision`` selects
    (:data:`_PERF_PRECISIONS`).

    Returns:
        (arguments, each argument's ``perf_matrix.gpu.num_gpus_N.key``, the GPU, the GPU count, GPUs per node).

    Raises:
        TunerError: no entry for the GPU, the count or the precision (each names those the file has), or a malformed
            matrix.
    """
    have = {str(g).lower(): body for g, body in matrix.items() if isinstance(body, Mapping)}
    menu = "; ".join(f"{g}: {', '.join(str(k).removeprefix('num_gpus_') for k in b)} GPUs" for g, b in have.items())
    count, gpu = _gpu_words(gpus)
    if gpu is None:
        if len(have) != 1:
            raise TunerError(f"{label}: its perf_matrix has several GPUs ({menu}); give --gpus, e.g. --gpus H100")
        gpu = next(iter(have))
    if gpu.lower() not in have:
        raise TunerError(f"{label}: its perf_matrix has no entry for {gpu} ({menu}); give --gpus with one of them")
    entries = {str(k): v for k, v in have[gpu.lower()].items()}
    if count is None:
        if len(entries) != 1:
            raise TunerError(f"{label}: its perf_matrix has several GPU counts for {gpu} ({menu}); give --gpus COUNTx{gpu}")
        key = next(iter(entries))
    else:
        key = f"num_gpus_{count}"
        if key not in entries:
            raise TunerError(f"{label}: its perf_matrix has no entry for {count} x {gpu} ({menu})")
    if not key.removeprefix("num_gpus_").isdigit() or not isinstance(entries[key], Mapping):
        raise TunerError(f"{label}: perf_matrix.{gpu.lower()}.{key} is not a num_gpus_N entry with settings")
    entry = entries[key]
    where = f"perf_matrix.{gpu.lower()}.{key}"
    choice = (precision or "bf16", fp8_recipe if precision == "fp8" else None)
    if choice not in _PERF_PRECISIONS:
        raise TunerError(f"{label}: {where} has no entry for --precision {choice[0]} with --fp8-recipe {fp8_recipe}; "
                         "accepted: --precision bf16, or fp8 with the tensorwise recipe (its fp8_cs)")
    block, prec_args = _PERF_PRECISIONS[choice]
    if block not in entry:
        raise TunerError(f"{label}: {where} has no {block} entry (it has {', '.join(k for k in entry if k != 'common')}); "
                         "give --precision with one it has")
    argv: list[str] = list(prec_args)
    names = {a: f"{where}.{block}" for a in prec_args if a.startswith("--")}
    per_node: int | None = None
    for part in ("common", block):
        body = entry.get(part) or {}
        if not isinstance(body, Mapping):
            raise TunerError(f"{label}: {where}.{part} is not a mapping of settings")
        for k, v in body.items():
            at = f"{where}.{part}.{k}"
            if k == "num_gpus_per_node" and isinstance(v, int):
                per_node = v
                argv.append(f"--empty:{at}")  # understood: sets the GPUs per node
                names[f"--empty:{at}"] = at
            elif k in _PERF_MATRIX_SETTINGS and v in (None, False, 0):
                argv.append(f"--empty:{at}")  # understood: the script sets nothing
                names[f"--empty:{at}"] = at
            elif k in _PERF_MATRIX_SETTINGS and (v is True if k == "cuda_graphs" else type(v) is int and v > 0):
                flags = _PERF_MATRIX_SETTINGS[k](v)
                argv += flags
                names.update({f: at for f in flags if f.startswith("--")})
            elif k in _PERF_MATRIX_UNREAD:
                argv.append(f"--{at}")  # a placeholder without effect (its name has a dot)
                names[f"--{at}"] = at
            elif k in _PERF_MATRIX_ARGS and isinstance(v, bool):
                flag = _PERF_MATRIX_ARGS[k]
                argv.append(flag if v else "--no-" + flag[2:])
                names[argv[-1]] = at
            elif k in _PERF_MATRIX_ARGS and v is None:  # unset: Megatron's default (e.g. vp: null, no virtual stages)
                argv.append(f"--empty:{at}")
                names[f"--empty:{at}"] = at
            elif k in _PERF_MATRIX_ARGS:
                argv += [_PERF_MATRIX_ARGS[k], str(v)]
                names[_PERF_MATRIX_ARGS[k]] = at
            else:  # a key the performance scripts do not read, or a value they would not accept
                flag = f"--perf-matrix-{k.replace('_', '-')}"
                argv += [flag, str(v)]
                names[flag] = at
    return argv, names, gpu, int(key.removeprefix("num_gpus_")), per_node


#: NeMo-RL ``policy.megatron_cfg`` settings without effect on the estimate (RL bookkeeping, conversion, logging).
_NEMO_RL_NO_EFFECT = frozenset({"enabled", "empty_unused_memory_level", "force_reconvert_from_hf", "freeze_moe_router",
                                "moe_router_bias_update_rate", "moe_per_layer_logging", "defer_fp32_logits", "use_gloo_process_groups",
                                "pipeline_dtype", "converter_type", "track_moe_metrics", "moe_router_dtype",
                                "moe_router_load_balancing_type", "moe_shared_expert_overlap", "mtp_loss_scaling_factor",
                                "mtp_use_repeated_layer", "mtp_detach_heads", "cuda_graph_warmup_steps", "fused_linear_logprobs_chunk_size",
                                "use_fused_linear_logprobs", "use_fused_weighted_squared_relu", "gradient_accumulation_fusion",
                                "fine_grained_activation_offloading", "offload_modules", "bias_activation_fusion_checks"})


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _nemo_rl_doc(p: Path, doc: Mapping[str, Any], label: str, depth: int = 0) -> dict[str, Any]:
    """``doc`` with its ``defaults:`` files (relative to ``p``) merged under it, as NeMo-RL's config loader does.

    Raises:
        TunerError: a ``defaults`` file that cannot be read, or a chain deeper than 8.
    """
    from specs._data import read_user_yaml

    parent = doc.get("defaults")
    if not isinstance(parent, str):
        return dict(doc)
    if depth >= 8:
        raise TunerError(f"{label}: its defaults: chain is deeper than 8 files")
    f = (p.parent / parent).resolve()
    try:
        text = read_user_text(f, f"{label}: its defaults: file {parent!r}", "a NeMo-RL YAML beside the file")
    except TunerError as e:
        raise TunerError(f"{e}; put it beside the file") from None
    base = read_user_yaml(text, f"{label} (defaults {parent})")
    if not isinstance(base, Mapping):
        raise TunerError(f"{label}: its defaults: file {parent!r} is not a mapping")
    return _deep_merge(_nemo_rl_doc(f, base, label, depth + 1), {k: v for k, v in doc.items() if k != "defaults"})


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``doc[key]`` when it is a mapping, else an empty one."""
    v = doc.get(key)
    return v if isinstance(v, Mapping) else {}

def _nemo_rl_args(doc: Mapping[str, Any], label: str) -> tuple[list[str], dict[str, str], str | None, int | None, int | None,
                                                                LaunchTask | None]:
    """A NeMo-RL config (its Megatron trainer, ``policy.megatron_cfg``) as Megatron-LM arguments: (argv, names, the
    model's Hugging Face id, nodes, GPUs per node, the LoRA settings as :class:`tuner.cli._common.RunChoice` task fields or
    None).

    Raises:
        TunerError: the config trains with NeMo-RL's DTensor / AutoModel path (``policy.megatron_cfg.enabled`` false).
    """
    policy = _section(doc, "policy")
    mcfg = _section(policy, "megatron_cfg")
    if not mcfg.get("enabled"):
        raise TunerError(f"{label}: policy.megatron_cfg.enabled is not true: it trains with NeMo-RL's DTensor / AutoModel path, "
                         "which tune --from does not read (its Megatron trainer only)")
    model_keys = {k: v for k, v in mcfg.items() if not isinstance(v, Mapping) and k not in _NEMO_RL_NO_EFFECT}
    if not mcfg.get("activation_checkpointing"):
        for k in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"):
            model_keys.pop(k, None)
    model_keys.pop("activation_checkpointing", None)
    bridge: dict[str, Any] = {
        "model": model_keys, "optimizer": mcfg.get("optimizer") or {}, "ddp": mcfg.get("distributed_data_parallel_config") or {},
        "train": {k: policy[f"train_{k}"] for k in ("global_batch_size", "micro_batch_size") if isinstance(policy.get(f"train_{k}"), int)},
        "dataset": {"seq_length": policy["max_total_sequence_length"]} if isinstance(policy.get("max_total_sequence_length"), int) else {},
    }
    fp8 = _section(mcfg, "fp8_cfg")
    if fp8.get("enabled"):
        bridge["mixed_precision"] = {"fp8": fp8.get("fp8") or "hybrid", "fp8_recipe": fp8.get("fp8_recipe"),
                                     "fp8_param_gather": bool(fp8.get("fp8_param"))}
    argv, names = _bridge_args(bridge, label)
    where_of = {"model": "policy.megatron_cfg", "optimizer": "policy.megatron_cfg.optimizer",
                "ddp": "policy.megatron_cfg.distributed_data_parallel_config", "mixed_precision": "policy.megatron_cfg.fp8_cfg",
                "train": "policy.train", "dataset": "policy.max_total_sequence_length"}
    for flag, where in list(names.items()):
        sec, _, key = where.partition(".")
        names[flag] = f"{where_of.get(sec, sec)}{'_' if sec == 'train' else '.'}{key}" if sec != "dataset" else where_of[sec]
    for k in mcfg:
        if k in _NEMO_RL_NO_EFFECT or (isinstance(mcfg[k], Mapping) and k in ("scheduler", "env_vars")):
            flag = f"--nemo-rl.megatron_cfg.{k}"
            argv.append(flag)
            names[flag] = f"policy.megatron_cfg.{k}"
    if str(policy.get("precision", "bfloat16")).lower() in ("bfloat16", "bf16"):
        argv.append("--bf16")
        names["--bf16"] = "policy.precision"
    for k in policy:
        if k not in ("megatron_cfg", "model_name", "train_global_batch_size", "train_micro_batch_size", "max_total_sequence_length",
                     "precision"):
            flag = f"--nemo-rl.policy.{k}"
            argv.append(flag)
            names[flag] = f"policy.{k}"
    for k in doc:
        if k not in ("policy", "cluster", "defaults"):
            argv.append(f"--nemo-rl.{k}")
            names[f"--nemo-rl.{k}"] = str(k)
    cluster = _section(doc, "cluster")
    nodes, per_node = cluster.get("num_nodes"), cluster.get("gpus_per_node")
    peft = _section(mcfg, "peft")
    task: LaunchTask | None = None
    if peft.get("enabled"):  # NeMo-RL's peft block is Megatron-Bridge's LoRA (dim, target_modules; empty = Bridge's default)
        task = {"task": "lora", "lora_rank": int(peft.get("dim") or 32),
                **({"lora_target_modules": ",".join(peft["target_modules"])} if peft.get("target_modules") else {})}
    argv.append("--nemo-rl.megatron_cfg.peft")
    names["--nemo-rl.megatron_cfg.peft"] = "policy.megatron_cfg.peft"
    hf = policy.get("model_name")
    return (argv, names, str(hf) if hf else None, nodes if isinstance(nodes, int) else None,
            per_node if isinstance(per_node, int) else None, task)


def _preset_of_hf(hf: str | None) -> str | None:
    """The model preset whose name is the Hugging Face id's last part (``Qwen/Qwen3-30B-A3B`` -> ``Qwen3-30B-A3B``)."""
    from specs import list_models

    if not hf:
        return None
    tail = hf.rstrip("/").split("/")[-1].lower()
    return next((n for n in list_models() if n.lower() == tail), None)


def read_launch(path: str | Path, *, model: str | None = None, gpus: str | None = None, precision: str | None = None,
                fp8_recipe: str | None = None) -> LaunchFile:
    """Read the launch file ``path`` (see the module docstring); ``model`` (``--model``) names the model when given;
    ``gpus``, ``precision`` and ``fp8_recipe`` (``--gpus``, ``--precision``, ``--fp8-recipe``) pick the entry of a
    Megatron-Bridge performance config's ``perf_matrix`` (:func:`_perf_matrix_args`).

    Raises:
        TunerError: the file cannot be read, is none of the accepted forms (a shell script or argument list with a
            command that has ``--`` arguments, or a ``recipe.yaml`` with a ``run`` block), or names a model that is
            neither a preset nor given with ``--model``.
    """
    p = Path(path)
    label = f"--from {str(p)!r}"
    accepted = ("accepted: a Megatron-LM / slime argument list or shell script, a Megatron-Bridge override YAML, or a recipe.yaml "
                "written by tune")
    text = read_user_text(p, label, "a launch script, argument list or YAML")
    with parse_errors(label, "a launch script, argument list or YAML"):
        return _read_launch(p, text, label, accepted, model, gpus, precision, fp8_recipe)


def _read_launch(p: Path, text: str, label: str, accepted: str, model: str | None, gpus: str | None, precision: str | None,
                 fp8_recipe: str | None) -> LaunchFile:
    if p.suffix in (".yaml", ".yml"):
        from specs._data import read_user_yaml

        doc = read_user_yaml(text, label)
        if isinstance(doc, Mapping) and isinstance(doc.get("policy"), Mapping):
            from dataclasses import replace

            argv, names, hf, nodes, per_node, task = _nemo_rl_args(_nemo_rl_doc(p, doc, label), label)
            given = model or _preset_of_hf(hf)
            if given is None:
                raise TunerError(f"{label}: policy.model_name {hf!r} is none of the presets; give --model with a preset or a "
                                 "Hugging Face config.json")
            lf = _read_args(p, "nemo-rl", [], argv, given, None, names=names)
            return replace(lf, stack="nemo-rl", nodes=nodes or lf.nodes, gpus_per_node=per_node or lf.gpus_per_node,
                           task=task or lf.task)
        if isinstance(doc, Mapping) and isinstance(doc.get("ConfigContainer"), Mapping):  # a performance config
            from dataclasses import replace

            argv, names = _bridge_args(doc["ConfigContainer"], label)
            others = [k for k in doc if k not in ("ConfigContainer", "perf_matrix")]
            for k in others:
                argv.append(f"--{k}")
                names[f"--{k}"] = str(k)
            if not isinstance(doc.get("perf_matrix"), Mapping):
                return _read_args(p, "megatron-bridge", [], argv, model, None, names=names)
            more, more_names, pgpu, count, pper = _perf_matrix_args(doc["perf_matrix"], label, gpus, precision, fp8_recipe)
            lf = _read_args(p, "megatron-bridge", [], argv + more, model, None, names={**names, **more_names})
            from specs.hardware import load_gpu

            spec = load_gpu(pgpu)
            per_node = min(pper or spec.gpus_per_node, count)
            if count % per_node:
                raise TunerError(f"{label}: perf_matrix: {count} GPUs are not whole nodes of {per_node}")
            return replace(lf, gpu=spec.name, nodes=count // per_node, gpus_per_node=per_node)
        if isinstance(doc, Mapping) and any(k in doc for k in ("model", "train", "ddp", "optimizer")) and "schema_version" not in doc:
            argv, names = _bridge_args(doc, label)
            return _read_args(p, "megatron-bridge", [], argv, model, None, names=names)
        if not (isinstance(doc, Mapping) and isinstance(doc.get("run"), str) and "schema_version" in doc):
            raise TunerError(f"{label}: a YAML file that is neither a recipe.yaml (schema_version, run) nor a Megatron-Bridge "
                             f"override (model, train, ddp, optimizer sections) or performance config (ConfigContainer, "
                             f"perf_matrix); {accepted}")
        gpu = _section(doc, "gpu")
        launcher, argv = _safe_args(doc["run"], label, accepted)
        given = model or (str(doc["model"]) if doc.get("model") else None)
        lf = _read_args(p, "recipe", launcher, argv, given, str(gpu.get("type")) if gpu.get("type") else None)
        from dataclasses import replace

        if lf.nodes is None and gpu.get("count") and gpu.get("per_node"):
            lf = replace(lf, nodes=int(gpu["count"]) // int(gpu["per_node"]), gpus_per_node=int(gpu["per_node"]))
        return _recipe_blocks(lf, doc)
    launcher, argv = _safe_args(text, label, accepted, p.parent)
    return _read_args(p, "shell", launcher, argv, model, None)


def _recipe_blocks(lf: LaunchFile, doc: Mapping[str, Any]) -> LaunchFile:
    """A ``recipe.yaml``'s own blocks over what its ``run`` command says: the stack preset it was tuned with
    (``stack.preset``), the dispatcher it chose (``layout.dispatcher``: slime's command asks for alltoall where the
    layout is allgather) and the task (``workload.task``, ``workload.lora``), which the command cannot carry."""
    from dataclasses import replace

    stack, layout, work = (_mapping(doc.get(k)) for k in ("stack", "layout", "workload"))
    if isinstance(stack.get("preset"), str):
        lf = replace(lf, stack=stack["preset"])
    if isinstance(layout.get("dispatcher"), str):
        lf = replace(lf, layout={**lf.layout, "dispatcher": layout["dispatcher"]})
    if work.get("task") in ("sft", "lora"):
        lora = _mapping(work.get("lora"))
        task: LaunchTask = {"task": work["task"]}
        if work["task"] == "lora" and lora.get("rank") is not None:
            task["lora_rank"] = lora["rank"]
        if work["task"] == "lora" and lora.get("target_modules"):
            task["lora_target_modules"] = ",".join(map(str, lora["target_modules"]))
        lf = replace(lf, task=task)
    return lf


def _mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a mapping (a YAML block), else an empty one."""
    return value if isinstance(value, Mapping) else {}


def _safe_args(text: str, label: str, accepted: str, base: Path | None = None) -> tuple[list[str], list[str]]:
    try:
        launcher, argv = _launch_args(text, base)
    except TunerError as e:
        raise TunerError(f"{label}: {e}; {accepted}") from None
    if not any(w.startswith("--") for w in argv):
        raise TunerError(f"{label}: no command with -- arguments in it; {accepted}")
    return launcher, argv
