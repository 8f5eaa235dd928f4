"""Megatron-LM / slime argument lists: parsed with :mod:`argparse` and sorted into understood, without effect
and not understood (:class:`LaunchFile`); the model preset the architecture arguments name."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from specs.errors import TunerError
from specs.stacks import RunFlags
from tuner.launch_file.shell import _VAR

#: Arguments of Megatron-LM and slime that do not change the estimate (optimizer hyperparameters, data, checkpoints,
#: logging, RL rollout and generation settings, numerics that cost nothing the model prices).
NO_EFFECT_ARGS = frozenset("""
--lr --min-lr --lr-decay-style --lr-warmup-fraction --lr-warmup-iters --lr-decay-iters --lr-warmup-init --weight-decay
--start-weight-decay --end-weight-decay --weight-decay-incr-style --adam-beta1 --adam-beta2 --adam-eps --clip-grad
--sgd-momentum --init-method-std --seed --attention-dropout --hidden-dropout --attention-softmax-in-fp32
--attention-backend --distributed-timeout-minutes --distributed-backend --tensorboard-dir --wandb-project --wandb-group
--wandb-exp-name --log-interval --log-throughput --log-timers-to-tensorboard --eval-iters --eval-interval
--save-interval --train-iters --train-samples --exit-interval --hf-checkpoint --ref-load --load --save --data-path
--split --tokenizer-type --tokenizer-model --vocab-file --merge-file --data-cache-path --no-load-optim --no-load-rng
--finetune --use-checkpoint-args --ckpt-format --model-name --prompt-data --input-key --label-key --metadata-key
--apply-chat-template --rollout-shuffle --num-rollout --rollout-batch-size --n-samples-per-prompt
--rollout-max-response-len --rollout-max-prompt-len --rollout-temperature --rollout-top-p --rollout-function-path
--over-sampling-batch-size --balance-data --num-steps-per-rollout --loss-type --calculate-per-token-loss
--disable-compute-advantages-and-returns --debug-train-only --advantage-estimator --use-kl-loss --kl-loss-coef
--kl-loss-type --kl-coef --entropy-coef --eps-clip --eps-clip-high --rollout-num-gpus-per-engine --rollout-num-gpus
--sglang-mem-fraction-static --sglang-ep-size --colocate --async --use-wandb --actor-num-nodes-for-rollout
--moe-router-bias-update-rate --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-dropout-fusion
--manual-gc --manual-gc-interval --overlap-param-gather --check-for-nan-in-loss-and-grad
--no-check-for-nan-in-loss-and-grad --use-mcore-models --transformer-impl-checks --moe-router-dtype --moe-grouped-gemm
--moe-aux-loss-coeff --moe-router-load-balancing-type --moe-router-pre-softmax --moe-z-loss-coeff
--moe-token-drop-policy --moe-per-layer-logging --spec --mock-data --no-create-attention-mask-in-dataloader
--max-position-embeddings --make-vocab-size-divisible-by --use-flash-attn --empty-unused-memory-level --cpu-offloading
--cuda-graph-warmup-steps --te-rng-tracker --use-te-rng-tracker
""".split())

#: torchrun's arguments (torch/distributed/run.py), both spellings: ``--nnodes`` x ``--nproc-per-node`` is the GPU
#: count, the others have no effect on the estimate.
_TORCHRUN_ARGS = frozenset(f"--{a}" for n in ("nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port",
                                             "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts")
                           for a in {n, n.replace("-", "_")})

#: Model-architecture arguments: they identify the model preset (``--num-layers`` below the preset's slices it).
_IDENTITY = ("hidden_size", "num_attention_heads", "num_experts", "moe_ffn_hidden_size", "vocab_size",
             "moe_router_topk", "num_query_groups", "kv_channels", "kv_lora_rank", "q_lora_rank")

#: Architecture arguments a Megatron-Bridge YAML's ``model`` section must agree on with ``--model``'s preset (where
#: the file sets them); ``--num-layers`` may be fewer (a slice).
_BRIDGE_IDENTITY = ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                    "num_experts", "moe_ffn_hidden_size", "moe_router_topk", "kv_lora_rank", "q_lora_rank")

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
    """``shell``, ``recipe``, ``megatron-bridge`` or ``nemo-rl``."""
    stack: str
    """The stack the launch is written for (a :mod:`specs.stacks` preset)."""
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

    @property
    def summary(self) -> str:
        """``N understood; K without effect on the estimate: ...; M not understood: ...`` (each name listed once)."""
        return self.short_summary(limit=None)

    def short_summary(self, limit: int | None = 6) -> str:
        """:attr:`summary` with at most ``limit`` names of those not understood and none of those without effect."""
        def names(xs: tuple[str, ...]) -> str:
            shown = xs if limit is None else xs[:limit]
            return " ".join(shown) + (f" and {len(xs) - len(shown)} more" if len(xs) > len(shown) else "")

        s = f"{len(self.understood)} arguments understood"
        if self.no_effect:
            s += f"; {len(self.no_effect)} without effect on the estimate" + (f": {names(self.no_effect)}"
                                                                              if limit is None else "")
        s += (f"; {len(self.not_understood)} not understood: {names(self.not_understood)}" if self.not_understood
              else "; none not understood")
        return s


#: Megatron-Bridge settings without effect on the estimate beside :data:`NO_EFFECT_ARGS` (as flags).
_BRIDGE_NO_EFFECT = frozenset({
    "--train-iters", "--eval-iters", "--eval-interval", "--finetune-lr", "--average-in-collective",
    "--check-for-nan-in-grad", "--check-for-large-grads", "--data-parallel-sharding-strategy",
    "--gradient-accumulation-fusion", "--use-torch-fsdp2", "--bf16", "--params-dtype", "--pipeline-dtype",
    "--autocast-dtype", "--autocast-enabled", "--grad-reduce-in-fp32", "--overlap-param-gather", "--data-path",
    "--blend", "--split", "--num-workers", "--dataloader-type", "--random-seed", "--use-custom-fsdp"})


#: Megatron-LM's flags that count the embedding / the loss as one layer of the first / last pipeline rank's share.
_ACCOUNT_FLAGS = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False, prog="launch", exit_on_error=False)
    ints = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
            "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--virtual-pipeline-model-parallel-size",
            "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
            "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--micro-batch-size",
            "--global-batch-size", "--seq-length", "--max-tokens-per-gpu", "--recompute-num-layers",
            "--actor-num-nodes", "--actor-num-gpus-per-node", "--cpu-offloading-num-layers")
    for a in ints:
        p.add_argument(a, type=int)
    for a in ("--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method", "--exp-avg-dtype",
              "--exp-avg-sq-dtype", "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--fp8-format",
              "--fp8-recipe", "--cross-entropy-fusion-impl", "--cuda-graph-impl", "--cp-comm-type",
              "--transformer-impl", "--optimizer"):
        p.add_argument(a)
    p.add_argument("--optimizer-offload-fraction", type=float)
    p.add_argument("--recompute-modules", nargs="+")
    p.add_argument("--cuda-graph-scope", "--cuda-graph-modules", nargs="+", dest="cuda_graph_scope")
    negatable = ("--sequence-parallel", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
                 "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--moe-enable-deepep", "--fp16",
                 "--cross-entropy-loss-fusion", "--moe-permute-fusion", "--fp8-param-gather", "--overlap-grad-reduce",
                 "--overlap-moe-expert-parallel-comm", "--tp-comm-overlap", "--moe-router-force-load-balancing",
                 "--use-megatron-fsdp", *_ACCOUNT_FLAGS)
    for a in (*negatable, "--use-dynamic-batch-size", "--bf16", "--accumulate-allreduce-grads-in-fp32",
              "--grad-reduce-in-bf16", "--no-rope-fusion", "--no-bias-swiglu-fusion", "--enable-cuda-graph",
              "--external-cuda-graph", "--rope-fusion", "--bias-swiglu-fusion", "--recompute-activations"):
        p.add_argument(a, action="store_true", default=None)
    for a in negatable:  # a Megatron-Bridge YAML's false
        p.add_argument("--no-" + a[2:], dest=a[2:].replace("-", "_"), action="store_false")
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
    """(preset, slice layers, notes) the architecture arguments ``arch`` name; ``given`` (``--model``) wins. Raises
    TunerError: architecture arguments that match no preset (and no ``--model``)."""
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


def _other_model(arch: Mapping[str, list[str]], given: str, names: Mapping[str, str], label: str) -> None:
    """Refuse a Megatron-Bridge YAML whose architecture settings (:data:`_BRIDGE_IDENTITY`, ``num_layers`` above the
    preset's) are not those of the ``--model`` preset ``given``; a setting the preset leaves unset is compared only for
    ``num_experts`` (a MoE file against a dense preset). Settings the file does not give are not compared. Raises
    TunerError: a setting differs, naming each with the file's and the preset's value."""
    from launch.exporters._flags import model_args
    from specs import load_model

    try:
        m = load_model(given)
    except TunerError:
        return  # a config.json path: not a preset to compare with
    pre, _ = _flag_values(model_args(m), set(arch) | {"--num-layers"})
    wrong: list[str] = []
    for flag, v in arch.items():
        key = flag[2:].replace("-", "_")
        p = pre.get(flag)
        if key == "num_layers" and p and v and int(v[0]) > int(p[0]):
            wrong.append(f"{names.get(flag, flag)} {' '.join(v)} ({m.name}: {' '.join(p)})")
        elif key in _BRIDGE_IDENTITY and v and (p or key == "num_experts") and _numbers(p or []) != _numbers(v):
            wrong.append(f"{names.get(flag, flag)} {' '.join(v)} ({m.name}: {' '.join(p) if p else 'unset'})")
    if wrong:
        raise TunerError(f"{label}: its model settings are not {m.name}'s: {', '.join(wrong)}; give --model with the "
                         "preset of the file's model, or leave those settings out of the file")


def _layout_of(ns: argparse.Namespace, slime: bool) -> dict[str, Any]:
    """:class:`tuner.cli._layout.LayoutFlags` fields of the parsed launch (``slime``: a stack that turns the distributed
    optimizer on unless told otherwise: slime, Megatron-Bridge's recipes)."""
    d: dict[str, Any] = {}
    for k, a in (("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
                 ("cp", "context_parallel_size"), ("ep", "expert_model_parallel_size"),
                 ("etp", "expert_tensor_parallel_size"), ("first_stage_layers", "decoder_first_pipeline_num_layers"),
                 ("last_stage_layers", "decoder_last_pipeline_num_layers"), ("recompute_method", "recompute_method"),
                 ("recompute_num_layers", "recompute_num_layers"), ("exp_avg_dtype", "exp_avg_dtype"),
                 ("pipeline_layout", "pipeline_model_parallel_layout")):
        if getattr(ns, a) is not None:
            d[k] = getattr(ns, a)
    vpp = ns.num_virtual_stages_per_pipeline_rank or ns.virtual_pipeline_model_parallel_size
    if vpp:
        d["vpp"] = vpp
    d["sequence_parallel"] = bool(ns.sequence_parallel)
    if ns.recompute_granularity:
        d["recompute"] = ns.recompute_granularity
    if ns.recompute_activations:  # Megatron-LM's validate_args: selective, whatever --recompute-granularity says
        d["recompute"] = "selective"
    if ns.recompute_modules:
        d["recompute_modules"] = ",".join(ns.recompute_modules)
    if ns.micro_batch_size:
        d["micro_batch_size"] = ns.micro_batch_size
    if ns.optimizer_cpu_offload:
        d["optimizer_offload_fraction"] = (1.0 if ns.optimizer_offload_fraction is None
                                           else ns.optimizer_offload_fraction)
    disp = ns.moe_token_dispatcher_type
    if ns.moe_enable_deepep or disp == "flex":
        d["dispatcher"] = f"flex+{ns.moe_flex_dispatcher_backend or 'deepep'}"
    elif disp:
        d["dispatcher"] = disp
    d["no_precision_aware_optimizer"] = not ns.use_precision_aware_optimizer
    d["no_distributed_optimizer"] = ns.use_distributed_optimizer is False or not (ns.use_distributed_optimizer or slime)
    return d


def _vpp_of_stage_layers(ns: argparse.Namespace, arch: Mapping[str, list[str]], model: str | None, label: str) -> int:
    """The virtual pipeline size ``--num-layers-per-virtual-pipeline-stage N`` gives, as Megatron-LM's ``validate_args``
    computes it (megatron/training/arguments.py): ``L // pp // N``, ``L`` the launch's ``--num-layers`` (else the
    model's layer count), plus one for each of ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``. Raises TunerError: the layer count is unknown (no ``--num-layers`` and no
    model), another way of giving the virtual pipeline is given too, a first/last stage size is given, or the counts do
    not divide (Megatron's asserts)."""
    n, pp = ns.num_layers_per_virtual_pipeline_stage, ns.pipeline_model_parallel_size or 1
    flag = f"--num-layers-per-virtual-pipeline-stage {n}"
    others = [a for a, v in (("--num-virtual-stages-per-pipeline-rank", ns.num_virtual_stages_per_pipeline_rank),
                             ("--virtual-pipeline-model-parallel-size", ns.virtual_pipeline_model_parallel_size),
                             ("--pipeline-model-parallel-layout", ns.pipeline_model_parallel_layout)) if v is not None]
    if others:
        raise TunerError(f"{label}: {flag} and {others[0]} both set the virtual pipeline; Megatron-LM accepts one of "
                         "them")
    if ns.decoder_first_pipeline_num_layers is not None or ns.decoder_last_pipeline_num_layers is not None:
        raise TunerError(f"{label}: {flag} with an uneven pipeline (--decoder-first/last-pipeline-num-layers): "
                         "Megatron-LM asks for --num-virtual-stages-per-pipeline-rank there")
    layers = _layer_count(arch, model, f"{label}: {flag} needs the model's layer count to give the virtual pipeline "
                                       "size")
    total = layers + _accounted(ns)
    if n < 1 or total % pp or (total // pp) % n:
        raise TunerError(f"{label}: {flag}: {total} layers in {pp} pipeline stages are not whole virtual stages of {n} "
                         "layers (Megatron-LM refuses it); accepted: a divisor of the layers per pipeline stage")
    return int(total // pp // n)


def _layer_count(arch: Mapping[str, list[str]], model: str | None, why: str) -> int:
    """The launch's ``--num-layers``, else the model's layer count. Raises TunerError: neither is known (``why`` names
    what needs it)."""
    if "--num-layers" in arch and arch["--num-layers"]:
        return int(arch["--num-layers"][0])
    if model is not None:
        from specs import load_model

        try:
            return load_model(model, allow_config_args=True).num_layers  # its layer count only
        except TunerError:
            pass
    raise TunerError(f"{why}; add --num-layers to the file or give --model")


def _accounted(ns: argparse.Namespace) -> int:
    """How many of the embedding and the loss the launch counts as layers of the pipeline split (0, 1 or 2)."""
    return int(bool(ns.account_for_embedding_in_pipeline_split)) + int(bool(ns.account_for_loss_in_pipeline_split))


def _accounted_split(ns: argparse.Namespace, arch: Mapping[str, list[str]], model: str | None, vpp: int,
                     label: str) -> dict[str, int]:
    """The first and last pipeline ranks' decoder layers (``first_stage_layers``, ``last_stage_layers``) of a launch
    that counts the embedding and/or the loss as a layer (:data:`_ACCOUNT_FLAGS`), as Megatron-LM builds them
    (megatron/core/transformer/transformer_block.py ``get_num_layers_to_build`` at d98e8a64): each of the ``pp`` ranks
    holds ``(L + accounted) / pp`` of them, and the first rank's first virtual stage one decoder layer fewer for the
    embedding, the last rank's last one fewer for the loss. Empty when neither flag is set or pp is 1. Raises
    TunerError: an uneven split or layout string given too, counts that do not divide (Megatron-LM's asserts), or a rank
    left without decoder layers (not modelled)."""
    pp = ns.pipeline_model_parallel_size or 1
    if not _accounted(ns) or pp == 1:
        return {}
    given = [a for a, v in (("--decoder-first-pipeline-num-layers", ns.decoder_first_pipeline_num_layers),
                            ("--decoder-last-pipeline-num-layers", ns.decoder_last_pipeline_num_layers),
                            ("--pipeline-model-parallel-layout", ns.pipeline_model_parallel_layout)) if v is not None]
    if given:
        raise TunerError(f"{label}: --account-for-embedding/loss-in-pipeline-split with {given[0]}: Megatron-LM "
                         "accepts one way of splitting the layers")
    layers = _layer_count(arch, model, f"{label}: --account-for-embedding/loss-in-pipeline-split needs the model's "
                                       "layer count")
    total = layers + _accounted(ns)
    if total % pp or (total // pp) % vpp:
        raise TunerError(f"{label}: {layers} layers + {_accounted(ns)} (embedding, loss) do not split into {pp} "
                         f"pipeline ranks of {vpp} equal virtual stages (Megatron-LM refuses it)")
    per_rank = total // pp
    out = {}
    if ns.account_for_embedding_in_pipeline_split:
        out["first_stage_layers"] = per_rank - 1
    if ns.account_for_loss_in_pipeline_split:
        out["last_stage_layers"] = per_rank - 1
    if 0 in out.values():
        raise TunerError(f"{label}: with {per_rank} layers per pipeline rank the embedding or the loss takes a whole "
                         "rank's share, leaving it no decoder layer: not modelled")
    return out


def run_flags_of_args(argv: Sequence[str]) -> RunFlags:
    """The run flags a list of Megatron-LM arguments sets (e.g. a model preset's ``extra_megatron_args``)."""
    return _run_flags_of(_parser().parse_known_args(list(argv))[0])


def _run_flags_of(ns: argparse.Namespace) -> RunFlags:
    """The run flags of the parsed launch: each :class:`RunFlags` field is the argparse ``dest`` of its argument."""
    impl = ns.cuda_graph_impl or ("local" if ns.enable_cuda_graph else "transformer_engine"
                                  if ns.external_cuda_graph else None)
    same = {f.name: getattr(ns, f.name) for f in dataclasses.fields(RunFlags) if hasattr(ns, f.name)}
    return RunFlags(**{
        **same, "cuda_graph_impl": impl,
        "cuda_graph_scope": tuple(ns.cuda_graph_scope) if ns.cuda_graph_scope and impl != "none" else None,
        "apply_rope_fusion": False if ns.no_rope_fusion else (True if ns.rope_fusion else None),
        "bias_swiglu_fusion": False if ns.no_bias_swiglu_fusion else (True if ns.bias_swiglu_fusion else None),
        "optimizer": None if ns.optimizer in (None, "adam") else ns.optimizer})


def _read_args(path: Path, kind: str, launcher: Sequence[str], argv: Sequence[str], model: str | None, gpu: str | None,
               names: Mapping[str, str] | None = None) -> LaunchFile:
    label = f"--from {str(path)!r}"
    parser = _parser()
    arch_names = _model_flags()
    torch_run, argv = _flag_values(argv, _TORCHRUN_ARGS)  # torchrun's own, where the script's name was not found
    launcher = [*launcher, *(x for k, v in torch_run.items() for x in (k, *v))]
    arch, rest = _flag_values(argv, arch_names)
    try:
        ns, extras = parser.parse_known_args(rest)
    except SystemExit:  # argparse reports a bad value (e.g. --tensor-model-parallel-size two) and exits
        raise TunerError(f"{label}: an argument has a value of the wrong type (e.g. a word where a number goes); "
                         "fix it in the file") from None
    except argparse.ArgumentError as e:
        flag = (e.argument_name or "").split("/")[0]
        what = (names or {}).get(flag, flag) or "an argument"
        raise TunerError(f"{label}: {what}: {e.message}; fix it in the file") from None
    if ns.fp16:
        raise TunerError(f"{label}: --fp16 training is not modelled; accepted bf16 (--bf16) or fp8 (--fp8-format)")
    try:
        name, layers, notes = _identify_model(arch, model)
    except TunerError as e:
        raise TunerError(f"{label}: {e}") from None
    if model and kind in ("megatron-bridge", "nemo-rl"):
        _other_model(arch, model, names or {}, label)
    slime = any(w.split("=")[0] in _SLIME_ONLY for w in argv)
    if kind == "shell" and not slime and name is not None and not (ns.bf16 or ns.fp8_format):
        # Megatron-LM's arguments.py: without --bf16 / --fp16 the run trains in fp32 (slime turns --bf16 on itself)
        raise TunerError(f"{label}: no --bf16 (or --fp8-format): Megatron-LM would train in fp32, which is not "
                         "modelled; accepted bf16 (--bf16) or fp8 (--fp8-format)")
    rename = names or {}
    understood = [rename.get(n, n) for n in {w.split("=")[0] for w in argv if w.startswith("--")}
                  - {w.split("=")[0] for w in extras if w.startswith("--")}]
    no_effect: list[str] = []
    not_understood: list[str] = []
    understood_empty: list[str] = []
    user_args: list[str] = []
    keep = False
    for w in extras:
        if w.startswith("--"):
            n = w.split("=")[0]
            if n.startswith("--empty:"):
                understood_empty.append(rename.get(n, n))
                continue
            positive = "--" + n[5:] if n.startswith("--no-") else n
            without = n in NO_EFFECT_ARGS or (names is not None and (positive in _BRIDGE_NO_EFFECT or "." in n))
            (no_effect if without else not_understood).append(rename.get(n, n))
            keep = True
        # an array the file uses but neither sets nor sources: arguments unknown
        elif (v := _VAR.match(w)) and v.group(2):
            not_understood.append(f"{w} (not set in the file)")
            continue
        elif not keep:
            not_understood.append(w)
            continue
        user_args.append(w)
    gpu_count = {"--nnodes", "--nproc-per-node", "--nproc_per_node"}
    understood = sorted({*understood, *understood_empty, *(k for k in torch_run if k in gpu_count)})
    no_effect = [*(k for k in torch_run if k not in gpu_count), *no_effect]
    nodes, per_node = ns.actor_num_nodes, ns.actor_num_gpus_per_node
    if nodes is None and launcher:  # torchrun --nnodes N --nproc-per-node G
        lp = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        lp.add_argument("--nnodes")
        lp.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc")
        lns, _ = lp.parse_known_args(list(launcher))
        if lns.nnodes and str(lns.nnodes).isdigit() and lns.nproc and str(lns.nproc).isdigit():
            nodes, per_node = int(lns.nnodes), int(lns.nproc)
    # Bridge's recipes turn the distributed optimizer on
    lay = _layout_of(ns, slime or kind in ("megatron-bridge", "nemo-rl"))
    if ns.num_layers_per_virtual_pipeline_stage is not None:
        vpp = _vpp_of_stage_layers(ns, arch, name, label)
        lay.pop("vpp", None)
        if vpp > 1:
            lay["vpp"] = vpp
    lay |= _accounted_split(ns, arch, name, int(lay.get("vpp", 1)), label)
    if ns.use_dynamic_batch_size and ns.max_tokens_per_gpu and ns.seq_length and "micro_batch_size" not in lay:
        lay["micro_batch_size"] = max(1, ns.max_tokens_per_gpu * (ns.context_parallel_size or 1) // ns.seq_length)
    return LaunchFile(
        path=path, kind=kind,
        stack=kind if kind in ("megatron-bridge", "nemo-rl") else "slime" if slime else "megatron-lm", model=name,
        num_layers=layers, model_notes=notes,
        gpu=gpu, nodes=nodes, gpus_per_node=per_node, seq_length=ns.seq_length, global_batch_size=ns.global_batch_size,
        precision="fp8" if ns.fp8_format else ("bf16" if ns.bf16 or argv else None), layout=lay,
        run_flags=_run_flags_of(ns), understood=tuple(understood), no_effect=tuple(dict.fromkeys(no_effect)),
        not_understood=tuple(dict.fromkeys(not_understood)),
        user_args=tuple(user_args) if kind in ("shell", "recipe") else (),
    )
