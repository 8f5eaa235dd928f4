"""Megatron-Bridge YAML: an override or dumped ``ConfigContainer`` and a performance config's ``perf_matrix``, as
Megatron-LM arguments."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Set
from typing import Any

from specs.errors import TunerError
from specs.precision import TORCH_DTYPES
from tuner.launch_file.args import _BRIDGE_NO_EFFECT, NO_EFFECT_ARGS, LaunchTask, _model_flags, _parser

#: Sections of a Megatron-Bridge ``ConfigContainer`` (``training/config.py``) whose settings do not change the estimate.
_BRIDGE_NO_EFFECT_SECTIONS = frozenset({"scheduler", "logger", "checkpoint", "rng", "tokenizer", "validation",
                                        "profiling", "rerun_state_machine", "ft", "straggler", "nvrx_straggler",
                                        "inprocess_restart", "tensor_inspect", "env_vars"})
#: Sections read setting by setting.
_BRIDGE_SECTIONS = frozenset({"model", "train", "dataset", "optimizer", "ddp", "dist", "comm_overlap",
                              "mixed_precision", "peft"})
#: Megatron-Bridge settings whose Megatron-LM argument is spelled otherwise.
_BRIDGE_RENAMED = {"num_moe_experts": "num-experts",
                   "virtual_pipeline_model_parallel_size": "num-virtual-stages-per-pipeline-rank",
                   "num_layers_in_first_pipeline_stage": "decoder-first-pipeline-num-layers",
                   "num_layers_in_last_pipeline_stage": "decoder-last-pipeline-num-layers",
                   "bias_activation_fusion": "bias-swiglu-fusion", "apply_rope_fusion": "rope-fusion"}


def _understood_keys(known: Set[str]) -> frozenset[str]:
    """The Megatron-Bridge setting names the reader turns into an argument the estimate reads: each of ``known``
    (Megatron-LM flags) spelled as a setting, and :data:`_BRIDGE_RENAMED`'s settings."""
    keys = {f[2:].replace("-", "_") for f in known if f.startswith("--") and not f.startswith("--no-")}
    renamed = {"--" + v: k for k, v in _BRIDGE_RENAMED.items()}
    return frozenset(keys | {k for f, k in renamed.items() if f in known} | {"grad_reduce_in_fp32"})


def _near_miss(key: str, where: str, keys: frozenset[str], label: str) -> None:
    """Refuse a setting ``key`` (at ``where``) the reader does not know that is a typo of one it reads: a close match
    (:func:`difflib.get_close_matches`, cutoff 0.85) at most two letters off; a typo would silently leave the setting at
    Megatron's default. Real settings beside a read one (``fp4_recipe``, ``tp_comm_overlap_ag``,
    ``sequence_parallel_size`` in a dumped ``ConfigContainer``) differ by a digit or by more letters, and stay named as
    not understood. Raises TunerError: ``key`` is a typo of one of ``keys``."""
    for close in difflib.get_close_matches(key, keys - {key}, n=1, cutoff=0.85):
        ops = [op for op in difflib.SequenceMatcher(None, key, close).get_opcodes() if op[0] != "equal"]
        changed = key[ops[0][1]:ops[-1][2]] + close[ops[0][3]:ops[-1][4]] if ops else ""
        if sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops) <= 2 and not changed.isdigit():
            raise TunerError(f"{label}: {where} is not a Megatron-Bridge setting the tuner reads; did you mean "
                             f"{close}? Fix it in the file")


def _lora_of(doc: Mapping[str, Any], label: str = "the file") -> LaunchTask | None:
    """The task of a ``peft`` section of Megatron-Bridge's LoRA (``_target_`` ``megatron.bridge.peft.lora.LoRA``, or
    none: an override of a recipe's LoRA): its ``dim`` (Bridge's default 32) and ``target_modules``; None for no
    ``peft`` section. Raises TunerError: another adapter class (priced as LoRA it would be wrong, as full training
    wronger), or ``exclude_modules`` (Bridge adapts every linear module but those; the tuner prices named targets)."""
    peft = doc.get("peft")
    if not isinstance(peft, Mapping):
        return None
    target = str(peft.get("_target_", "megatron.bridge.peft.lora.LoRA"))
    if target != "megatron.bridge.peft.lora.LoRA":
        raise TunerError(f"{label}: peft._target_ {target}: the tuner prices Megatron-Bridge's LoRA "
                         "(megatron.bridge.peft.lora.LoRA) only; use it, or leave the peft section out")
    if peft.get("exclude_modules"):
        raise TunerError(f"{label}: peft.exclude_modules: the tuner prices the adapters of named modules; give "
                         "peft.target_modules instead (of linear_qkv, linear_proj, linear_fc1, linear_fc2)")
    task: LaunchTask = {"task": "lora"}
    if isinstance(peft.get("dim"), int) and not isinstance(peft.get("dim"), bool):
        task["lora_rank"] = peft["dim"]
    if isinstance(peft.get("target_modules"), list) and peft["target_modules"]:
        task["lora_target_modules"] = ",".join(map(str, peft["target_modules"]))
    return task


def _bridge_args(doc: Mapping[str, Any], label: str) -> tuple[list[str], dict[str, str]]:
    """A Megatron-Bridge override YAML as Megatron-LM arguments, and each argument's ``section.key`` (for messages).
    ``grad_reduce_in_fp32`` becomes ``--accumulate-allreduce-grads-in-fp32`` or ``--grad-reduce-in-bf16``, a false
    boolean ``--no-KEY``, ``mixed_precision.fp8`` ``--fp8-format``; sections without effect on the estimate become
    ``--no-effect:section.key`` placeholders; a null is understood where the estimate reads the argument, else named."""
    argv: list[str] = []
    names: dict[str, str] = {}
    empties: list[str] = []
    known = set(_parser()._option_string_actions) | _model_flags()
    keys = _understood_keys(known)

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
        # a section left unset (e.g. comm_overlap: null in a dumped config)
        if sec in _BRIDGE_SECTIONS and body is None:
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
        if sec == "peft" and _lora_of(doc, label) is not None:  # read as the task (:func:`_lora_of`)
            empties.extend(f"{sec}.{k}" for k in body)
            continue
        for k, v in body.items():
            key = str(k)
            where = f"{sec}.{key}"
            if key == "_target_":  # the section's class
                put(f"--{sec}._target_", where)
                continue
            if isinstance(v, Mapping) and str(v.get("_target_", "")).startswith("torch."):  # a dumped dtype
                v = _TORCH_DTYPES.get(str(v["_target_"]), str(v["_target_"]))
            # the later section's wins (mixed_precision's last)
            if key == "grad_reduce_in_fp32" and isinstance(v, bool):
                argv[:] = [a for a in argv if a not in ("--accumulate-allreduce-grads-in-fp32",
                                                        "--grad-reduce-in-bf16")]
                put("--accumulate-allreduce-grads-in-fp32" if v else "--grad-reduce-in-bf16", where)
                continue
            if sec == "mixed_precision" and key == "fp8":
                if v:
                    put("--fp8-format", where, str(v))
                else:
                    empties.append(where)
                continue
            flag = "--" + _BRIDGE_RENAMED.get(key, key.replace("_", "-"))
            if flag not in known and flag not in NO_EFFECT_ARGS and flag not in _BRIDGE_NO_EFFECT:
                _near_miss(key, where, keys, label)
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


#: The dtypes of a dumped Megatron-Bridge config (``{_target_: torch.float32, _call_: false}``) as Megatron-LM names
#: them.
_TORCH_DTYPES = {f"torch.{t}": name for name, t in TORCH_DTYPES.items()}

#: A Megatron-Bridge performance config's ``perf_matrix`` settings (``scripts/performance/configs/*/*.yaml``) as
#: Megatron-LM's arguments.
_PERF_MATRIX_ARGS = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
                     "cp": "--context-parallel-size",
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
                         "recompute_num_layers": lambda v: ["--recompute-granularity", "full", "--recompute-method",
                                                            "block", "--recompute-num-layers", str(v)],
                         "cpu_offloading_num_layers": lambda v: ["--cpu-offloading-num-layers", str(v)]}
#: ``perf_matrix`` keys of the performance configs that those scripts never read (``fsdp``: only ``use_megatron_fsdp``
#: is read; ``nccl_ub`` is set by ``run_script.py`` from the model, not from the file): without effect.
_PERF_MATRIX_UNREAD = frozenset({"fsdp", "nccl_ub", "keep_fp8_transpose_cache_when_using_custom_fsdp"})
#: The ``perf_matrix`` precision entry each ``--precision`` (and ``--fp8-recipe``) selects, with its arguments.
_PERF_PRECISIONS = {("bf16", None): ("bf16", ["--bf16"]),
                    ("fp8", None): ("fp8_cs", ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]),
                    ("fp8", "tensorwise"): ("fp8_cs", ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"])}


def _gpu_words(gpus: str | None) -> tuple[int | None, str | None]:
    """(GPU count or None, GPU name or None) of a ``--gpus`` value: ``16xH100``, ``2x8xH100`` or ``H100``."""
    if not gpus:
        return None, None
    parts = gpus.strip().split("x")
    nums = [int(x) for x in parts[:-1] if x.isdigit()]
    return (math.prod(nums) if nums else None), parts[-1]


def _perf_matrix_args(matrix: Mapping[str, Any], label: str, gpus: str | None, precision: str | None,
                      fp8_recipe: str | None) -> tuple[list[str], dict[str, str], str, int, int | None]:
    """The ``perf_matrix`` entry (``{gpu: {num_gpus_N: {common, bf16, fp8_cs}}}``) of ``--gpus`` and ``--precision`` as
    Megatron-LM arguments: (arguments, each one's ``perf_matrix.gpu.num_gpus_N.key``, GPU, GPU count, GPUs per node).
    Raises TunerError: no entry for the GPU, the count or the precision (naming those the file has), or a malformed
    matrix."""
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
            raise TunerError(f"{label}: its perf_matrix has several GPU counts for {gpu} ({menu}); give --gpus "
                             f"COUNTx{gpu}")
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
        raise TunerError(f"{label}: {where} has no {block} entry (it has "
                         f"{', '.join(str(k) for k in entry if k != 'common')}); give --precision with one it has")
    argv: list[str] = list(prec_args)
    names = {a: f"{where}.{block}" for a in prec_args if a.startswith("--")}
    per_node: int | None = None

    def put(at: str, flag: str, *values: str) -> None:
        argv.extend((flag, *values))
        names[flag] = at

    for part in ("common", block):
        body = entry.get(part) or {}
        if not isinstance(body, Mapping):
            raise TunerError(f"{label}: {where}.{part} is not a mapping of settings")
        for k, v in ((str(k), v) for k, v in body.items()):  # YAML may give a number as a key
            at = f"{where}.{part}.{k}"
            if k == "num_gpus_per_node" and isinstance(v, int):
                per_node = v
                put(at, f"--empty:{at}")  # understood: sets the GPUs per node
            elif k in _PERF_MATRIX_SETTINGS and v in (None, False, 0):
                put(at, f"--empty:{at}")  # understood: the script sets nothing
            elif k in _PERF_MATRIX_SETTINGS and (v is True if k == "cuda_graphs" else type(v) is int and v > 0):
                flags = _PERF_MATRIX_SETTINGS[k](v)
                argv += flags
                names.update({f: at for f in flags if f.startswith("--")})
            elif k in _PERF_MATRIX_UNREAD:
                put(at, f"--{at}")  # a placeholder without effect (its name has a dot)
            elif k in _PERF_MATRIX_ARGS and isinstance(v, bool):
                put(at, _PERF_MATRIX_ARGS[k] if v else "--no-" + _PERF_MATRIX_ARGS[k][2:])
            elif k in _PERF_MATRIX_ARGS and v is None:  # unset: Megatron's default (e.g. vp: null, no virtual stages)
                put(at, f"--empty:{at}")
            elif k in _PERF_MATRIX_ARGS:
                put(at, _PERF_MATRIX_ARGS[k], str(v))
            else:  # a key the performance scripts do not read, or a value they would not accept
                put(at, f"--perf-matrix-{k.replace('_', '-')}", str(v))
    return argv, names, gpu, int(key.removeprefix("num_gpus_")), per_node
