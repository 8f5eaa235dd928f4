"""A user's launch as the tuner's inputs: ``tune --from FILE``.

:func:`read_launch` reads a Megatron-LM / slime argument list or shell script (:mod:`.shell`), this project's
``recipe.yaml``, a Megatron-Bridge override YAML or performance config (:mod:`.bridge`) or a NeMo-RL config
(:mod:`.nemo_rl`). Its arguments are sorted three ways (:class:`LaunchFile`): understood (what the cost model
prices), known without effect on the estimate (:data:`NO_EFFECT_ARGS`) and not understood (named, never dropped);
the last two are kept, in order, for the exported commands."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from specs._data import read_user_yaml
from specs.errors import TunerError
from specs.files import parse_errors, read_user_text
from specs.hardware import load_gpu
from tuner.launch_file.args import NO_EFFECT_ARGS, LaunchFile, LaunchTask, _read_args
from tuner.launch_file.bridge import _bridge_args, _lora_of, _perf_matrix_args
from tuner.launch_file.nemo_rl import _nemo_rl_args, _nemo_rl_doc, _section
from tuner.launch_file.shell import _launch_args

__all__ = ["NO_EFFECT_ARGS", "LaunchFile", "read_launch"]


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
    Megatron-Bridge performance config's ``perf_matrix`` (:func:`_perf_matrix_args`). Raises TunerError: the file cannot
    be read, is none of the accepted forms (a shell script or argument list with a command that has ``--`` arguments, a
    Megatron-Bridge YAML, a NeMo-RL config or a ``recipe.yaml`` with a ``run`` block), or names a model that is neither
    a preset nor given with ``--model``."""
    p = Path(path)
    label = f"--from {str(p)!r}"
    accepted = ("accepted: a Megatron-LM / slime argument list or shell script, a Megatron-Bridge override YAML "
                "(model, train, ddp, optimizer sections) or performance config (ConfigContainer, perf_matrix), a "
                "NeMo-RL config (policy section), or a recipe.yaml written by tune (schema_version, run)")
    text = read_user_text(p, label, "a launch script, argument list or YAML")
    with parse_errors(label, "a launch script, argument list or YAML"):
        return _read_launch(p, text, label, accepted, model, gpus, precision, fp8_recipe)


def _read_launch(p: Path, text: str, label: str, accepted: str, model: str | None, gpus: str | None,
                 precision: str | None, fp8_recipe: str | None) -> LaunchFile:
    if p.suffix in (".yaml", ".yml"):
        doc = read_user_yaml(text, label)
        if not isinstance(doc, Mapping):
            raise TunerError(f"{label}: a YAML file of none of the accepted forms; {accepted}")
        if isinstance(doc.get("policy"), Mapping):
            argv, names, hf, nodes, per_node, task = _nemo_rl_args(_nemo_rl_doc(p, doc, label), label)
            given = model or _preset_of_hf(hf)
            if given is None:
                raise TunerError(f"{label}: policy.model_name {hf!r} is none of the presets; give --model with a "
                                 "preset or a Hugging Face config.json")
            lf = _read_args(p, "nemo-rl", [], argv, given, None, names=names)
            return replace(lf, stack="nemo-rl", nodes=nodes or lf.nodes, gpus_per_node=per_node or lf.gpus_per_node,
                           task=task or lf.task)
        if isinstance(doc.get("ConfigContainer"), Mapping):  # a performance config
            argv, names = _bridge_args(doc["ConfigContainer"], label)
            for k in (k for k in doc if k not in ("ConfigContainer", "perf_matrix")):
                argv.append(f"--{k}")
                names[f"--{k}"] = str(k)
            if not isinstance(doc.get("perf_matrix"), Mapping):
                return _some_understood(_read_args(p, "megatron-bridge", [], argv, model, None, names=names), label,
                                        accepted)
            more, more_names, pgpu, count, pper = _perf_matrix_args(doc["perf_matrix"], label, gpus, precision,
                                                                    fp8_recipe)
            lf = _read_args(p, "megatron-bridge", [], argv + more, model, None, names={**names, **more_names})
            spec = load_gpu(pgpu)
            per_node = min(pper or spec.gpus_per_node, count)
            if count % per_node:
                raise TunerError(f"{label}: perf_matrix: {count} GPUs are not whole nodes of {per_node}")
            return replace(lf, gpu=spec.name, nodes=count // per_node, gpus_per_node=per_node)
        if any(k in doc for k in ("model", "train", "ddp", "optimizer")) and "schema_version" not in doc:
            argv, names = _bridge_args(doc, label)
            lf = _some_understood(_read_args(p, "megatron-bridge", [], argv, model, None, names=names), label,
                                  accepted)
            return replace(lf, task=_lora_of(doc, label) or lf.task)
        if not (isinstance(doc.get("run"), str) and "schema_version" in doc):
            raise TunerError(f"{label}: a YAML file of none of the accepted forms; {accepted}")
        gpu = _section(doc, "gpu")
        launcher, argv = _safe_args(doc["run"], label, accepted)
        given = model or (str(doc["model"]) if doc.get("model") else None)
        lf = _read_args(p, "recipe", launcher, argv, given, str(gpu.get("type")) if gpu.get("type") else None)
        if lf.nodes is None and gpu.get("count") and gpu.get("per_node"):
            lf = replace(lf, nodes=int(gpu["count"]) // int(gpu["per_node"]), gpus_per_node=int(gpu["per_node"]))
        return _recipe_blocks(lf, doc)
    launcher, argv = _safe_args(text, label, accepted, p.parent)
    return _read_args(p, "shell", launcher, argv, model, None)


def _some_understood(lf: LaunchFile, label: str, accepted: str) -> LaunchFile:
    """``lf``, a Megatron-Bridge YAML read, when the tuner knows at least one of its settings (understood, or known to
    have no effect on the estimate). Raises TunerError: nothing in it is understood (e.g. a YAML with a ``model`` key
    that is no Bridge config)."""
    if not lf.understood and not lf.no_effect:
        raise TunerError(f"{label}: none of its settings is one the tuner reads ({lf.short_summary(limit=4)}); "
                         f"{accepted}")
    return lf


def _recipe_blocks(lf: LaunchFile, doc: Mapping[str, Any]) -> LaunchFile:
    """A ``recipe.yaml``'s own blocks over what its ``run`` command says: the stack preset it was tuned with
    (``stack.preset``), the dispatcher it chose (``layout.dispatcher``: slime's command asks for alltoall where the
    layout is allgather) and the task (``workload.task``, ``workload.lora``), which the command cannot carry."""
    stack, layout, work = (_section(doc, k) for k in ("stack", "layout", "workload"))
    if isinstance(stack.get("preset"), str):
        lf = replace(lf, stack=stack["preset"])
    if isinstance(layout.get("dispatcher"), str):
        lf = replace(lf, layout={**lf.layout, "dispatcher": layout["dispatcher"]})
    if work.get("task") in ("sft", "lora"):
        lora = _section(work, "lora")
        task: LaunchTask = {"task": work["task"]}
        if work["task"] == "lora" and lora.get("rank") is not None:
            task["lora_rank"] = lora["rank"]
        if work["task"] == "lora" and lora.get("target_modules"):
            task["lora_target_modules"] = ",".join(map(str, lora["target_modules"]))
        lf = replace(lf, task=task)
    return lf


def _safe_args(text: str, label: str, accepted: str, base: Path | None = None) -> tuple[list[str], list[str]]:
    try:
        launcher, argv = _launch_args(text, base)
    except TunerError as e:
        raise TunerError(f"{label}: {e}; {accepted}") from None
    if not any(w.startswith("--") for w in argv):
        raise TunerError(f"{label}: no command with -- arguments in it; {accepted}")
    return launcher, argv
