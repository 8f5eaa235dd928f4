"""Training-stack presets and the run flags of a command line, resolved to :class:`~specs.RunOptions`.

A stack preset (:class:`StackPreset`, one YAML file each under ``specs/data/stacks/``, citing the upstream file it was
read from at a commit) is the :class:`RunOptions` a stack sets when the user says nothing: ``slime`` (the seed's run,
the default), ``megatron-lm`` (``megatron`` is its alias), ``megatron-bridge`` (its performance recipes) and
``nemo-rl`` (its Megatron trainer). :class:`RunFlags` are the run options as Megatron-LM's arguments name them, each
None when not given; :func:`resolve_run_options` lays them over a preset, refuses contradictions and says which
flags changed the preset (:attr:`StackRun.line`). Every command that estimates and the ``--from`` reader use it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specs._data import data_files, read_user_yaml
from specs.errors import TunerError
from specs.workload import CROSS_ENTROPY_IMPLS, CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES, FP8_RECIPES, OPTIMIZERS, RunOptions

STACK_DIR = "data/stacks"
#: The stack every command assumes unless ``--stack`` says otherwise: the seed's.
DEFAULT_STACK = "slime"
#: Older names still accepted.
STACK_ALIASES = {"megatron": "megatron-lm"}
#: ``--transformer-impl`` values.
TRANSFORMER_IMPLS = ("transformer_engine", "local")


@dataclass(frozen=True, kw_only=True, slots=True)
class StackPreset:
    """One stack's defaults, from ``specs/data/stacks/<name>.yaml``."""

    name: str
    description: str
    framework: str
    """``slime`` or ``megatron``: the launch the stack's users write (``--from`` and the exports)."""
    drops_allgather: bool
    """The stack rewrites the allgather dispatcher to alltoall (slime), so the search leaves it out."""
    run_options: tuple[tuple[str, Any], ...]
    """:class:`RunOptions` fields the stack sets other than their defaults."""
    sources: tuple[str, ...]
    """``repo@commit path l.lines: what was read there``, one per upstream file."""
    notes: tuple[str, ...] = ()


def list_stacks() -> list[str]:
    """Names of the bundled stack presets, sorted."""
    return sorted(data_files(STACK_DIR, ".yaml"))


def load_stack(name: str) -> StackPreset:
    """The bundled preset ``name`` (case-insensitive; ``megatron`` is ``megatron-lm``).

    Raises TunerError: an unknown name (the accepted ones listed)."""
    key = STACK_ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    files = data_files(STACK_DIR, ".yaml")
    if key not in files:
        raise TunerError(f"--stack {str(name)[:40]!r}: accepted {', '.join(list_stacks())} (megatron = megatron-lm)")
    d = read_user_yaml(files[key].read_text(encoding="utf-8"), f"stack preset {key}.yaml")
    sources = tuple(f"{s['repo']}@{str(s['commit'])[:8]} {s['path']} l.{s['lines']}: "
                    f"{' '.join(str(s['reads']).split())}"
                    for s in d.get("sources") or ())
    return StackPreset(name=key, description=str(d.get("description", key)), framework=d["framework"],
                       drops_allgather=bool(d.get("drops_allgather", False)),
                       run_options=tuple(sorted(d["run_options"].items())),
                       sources=sources, notes=tuple(str(n) for n in d.get("notes") or ()))


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFlags:
    """The run options of a command line as Megatron-LM's arguments name them; None = not given (the preset's).

    Each field is the argparse ``dest`` of the Megatron-LM argument in :data:`RUN_FLAG_NAMES`."""

    accumulate_allreduce_grads_in_fp32: bool | None = None
    grad_reduce_in_bf16: bool | None = None
    cross_entropy_loss_fusion: bool | None = None
    cross_entropy_fusion_impl: str | None = None
    cuda_graph_impl: str | None = None
    cuda_graph_scope: tuple[str, ...] | None = None
    moe_permute_fusion: bool | None = None
    fp8_recipe: str | None = None
    fp8_param_gather: bool | None = None
    overlap_grad_reduce: bool | None = None
    overlap_moe_expert_parallel_comm: bool | None = None
    tp_comm_overlap: bool | None = None
    moe_router_force_load_balancing: bool | None = None
    cp_comm_type: str | None = None
    use_megatron_fsdp: bool | None = None
    apply_rope_fusion: bool | None = None
    bias_swiglu_fusion: bool | None = None
    transformer_impl: str | None = None
    cpu_offloading_num_layers: int | None = None
    optimizer: str | None = None

    def given(self) -> dict[str, Any]:
        """The fields given (not None)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


#: The Megatron-LM spelling of each :class:`RunFlags` field (for a bool: the spelling that turns it on; ``no_`` the
#: off).
RUN_FLAG_NAMES: dict[str, str] = {**{f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(RunFlags)},
                                  "apply_rope_fusion": "--rope-fusion"}


def _spell(name: str, value: Any) -> str:
    flag = RUN_FLAG_NAMES[name]
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    if isinstance(value, tuple):
        return f"{flag} {' '.join(value)}"
    return f"{flag} {value}"


def _choice(name: str, value: str | None, accepted: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    v = str(value).strip().lower()
    if v not in accepted:
        raise TunerError(f"{RUN_FLAG_NAMES[name]} {str(value)[:40]!r}: accepted {', '.join(accepted)}")
    return v


@dataclass(frozen=True, kw_only=True, slots=True)
class StackRun:
    """The run options a command estimates with, and where they came from."""

    preset: StackPreset
    options: RunOptions
    overrides: tuple[str, ...]
    """The flags that changed the preset's value, as given (``--grad-reduce-in-bf16``)."""
    flags: tuple[str, ...] = ()
    """Every run flag given, as given (those that repeat the preset's value too)."""

    @property
    def line(self) -> str:
        """One line: the preset (its source) and the flags that override it."""
        over = ", ".join(self.overrides) if self.overrides else "none"
        return f"stack {self.preset.name} (specs/data/stacks/{self.preset.name}.yaml); overrides: {over}"


def resolve_run_options(flags: RunFlags, stack: str | None = None, *, precision: str = "bf16",
                        megatron_core: str | None = None) -> StackRun:
    """Lay ``flags`` over the ``stack`` preset (None: :data:`DEFAULT_STACK`): the one mapping from run flags to
    :class:`RunOptions`.

    Megatron-LM's meanings (``arguments.py`` l.1209-1217 at d98e8a64): ``--grad-reduce-in-bf16`` keeps the main
    gradients in bf16, ``--accumulate-allreduce-grads-in-fp32`` in fp32; ``--fp8-recipe`` is the GEMMs' recipe with
    ``--precision fp8`` and, with bf16, the optimizer's (``OptimizerConfig.fp8_recipe``); ``--cuda-graph-impl`` without
    ``--cuda-graph-scope`` captures whole layers, ``full_iteration`` the whole step.

    Raises TunerError: an unknown stack or value, or contradicting flags: both main-gradient dtypes, ``--cuda-graph-impl
    none`` with a scope, ``--cross-entropy-fusion-impl`` with the loss fusion off, ``--fp8-param-gather`` with bf16,
    per-layer CUDA graphs with ``--cpu-offloading-num-layers`` (transformer_config.py at d98e8a64)."""
    preset = load_stack(stack or DEFAULT_STACK)
    base = RunOptions(**dict(preset.run_options))
    if megatron_core is not None:
        base = dataclasses.replace(base, megatron_core=megatron_core)
    g = flags.given()
    if g.get("accumulate_allreduce_grads_in_fp32") and g.get("grad_reduce_in_bf16"):
        raise TunerError("--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other (main "
                         "gradients in bf16 or in fp32): give one")
    kw: dict[str, Any] = {}
    if "grad_reduce_in_bf16" in g:
        kw["grad_reduce_in_fp32"] = not g["grad_reduce_in_bf16"]
    if "accumulate_allreduce_grads_in_fp32" in g:
        kw["grad_reduce_in_fp32"] = bool(g["accumulate_allreduce_grads_in_fp32"])
    for f in ("cross_entropy_loss_fusion", "moe_permute_fusion", "overlap_grad_reduce",
              "overlap_moe_expert_parallel_comm",
              "tp_comm_overlap", "moe_router_force_load_balancing", "use_megatron_fsdp", "apply_rope_fusion"):
        if f in g:
            kw[f] = bool(g[f])
    if "bias_swiglu_fusion" in g:
        kw["bias_activation_fusion"] = bool(g["bias_swiglu_fusion"])
    impl = _choice("cross_entropy_fusion_impl", flags.cross_entropy_fusion_impl, CROSS_ENTROPY_IMPLS)
    if impl is not None:
        if not kw.get("cross_entropy_loss_fusion", base.cross_entropy_loss_fusion):
            off = "--no-cross-entropy-loss-fusion" if "cross_entropy_loss_fusion" in g else "stack " + preset.name
            raise TunerError(f"--cross-entropy-fusion-impl {impl}: the cross-entropy loss fusion is off ({off}), "
                             "so no fused implementation runs; add --cross-entropy-loss-fusion or leave the impl out")
        kw["cross_entropy_fusion_impl"] = impl
    graph_impl = _choice("cuda_graph_impl", flags.cuda_graph_impl, CUDA_GRAPH_IMPLS)
    scope = None
    if flags.cuda_graph_scope is not None:
        scope = tuple(s.strip().lower() for v in flags.cuda_graph_scope for s in str(v).replace(",", " ").split()
                      if s.strip())
        bad = [s for s in scope if s not in CUDA_GRAPH_SCOPES]
        if bad or not scope:
            raise TunerError(f"--cuda-graph-scope {(bad[0] if bad else '')[:40]!r}: accepted "
                             f"{', '.join(CUDA_GRAPH_SCOPES)} (turn CUDA graphs off with --cuda-graph-impl none)")
    if graph_impl == "none" and scope:
        raise TunerError(f"--cuda-graph-impl none with --cuda-graph-scope {' '.join(scope)}: no graph is captured with "
                         "impl none; give one of them")
    if graph_impl is not None:
        kw["cuda_graph_impl"] = graph_impl
    if graph_impl == "none":
        kw["cuda_graph_scope"] = ()
    elif scope:
        kw["cuda_graph_scope"] = scope
    elif graph_impl == "full_iteration":
        kw["cuda_graph_scope"] = ("full_iteration",)
    elif graph_impl is not None and not base.cuda_graph_scope:
        kw["cuda_graph_scope"] = ("full",)
    recipe = _choice("fp8_recipe", flags.fp8_recipe, FP8_RECIPES)
    if recipe is not None:
        kw["fp8_recipe" if precision == "fp8" else "optimizer_fp8_recipe"] = recipe
    if g.get("fp8_param_gather") and precision != "fp8":
        raise TunerError("--fp8-param-gather keeps fp8 weights, but --precision is bf16: use --precision fp8 or leave "
                         "it out")
    if "fp8_param_gather" in g:
        kw["fp8_param_gather"] = bool(g["fp8_param_gather"])
    cp = _choice("cp_comm_type", flags.cp_comm_type, ("p2p", "a2a"))
    if cp is not None:
        kw["cp_comm_type"] = cp
    ti = _choice("transformer_impl", flags.transformer_impl, TRANSFORMER_IMPLS)
    if ti is not None:
        kw["te_attention"] = ti == "transformer_engine"
    if flags.cpu_offloading_num_layers is not None:
        n = flags.cpu_offloading_num_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TunerError(f"--cpu-offloading-num-layers {n!r}: accepted a whole number of layers, 0 or more")
        kw["cpu_offloading_num_layers"] = n
    opt = _choice("optimizer", flags.optimizer, OPTIMIZERS)
    if opt is not None:
        kw["optimizer"] = opt
    options = dataclasses.replace(base, **kw)
    if options.cpu_offloading_num_layers and options.cuda_graph_effective_impl in ("local", "transformer_engine"):
        raise TunerError(f"--cuda-graph-impl {options.cuda_graph_impl} with --cpu-offloading-num-layers "
                         f"{options.cpu_offloading_num_layers}: Megatron refuses CUDA graphs with CPU offloading "
                         "(transformer_config.py); use --cuda-graph-impl full_iteration, or drop one of them")
    overrides = tuple(_spell(n, v) for n, v in g.items() if _changes(n, v, base, options))
    return StackRun(preset=preset, options=options, overrides=overrides,
                    flags=tuple(_spell(n, v) for n, v in g.items()))


def _changes(name: str, value: Any, base: RunOptions, options: RunOptions) -> bool:
    """Whether the flag ``name`` moved a field away from the preset's value."""
    fields = {"accumulate_allreduce_grads_in_fp32": "grad_reduce_in_fp32", "grad_reduce_in_bf16": "grad_reduce_in_fp32",
              "bias_swiglu_fusion": "bias_activation_fusion",
              "cuda_graph_impl": ("cuda_graph_impl", "cuda_graph_scope"),
              "transformer_impl": "te_attention", "fp8_recipe": ("fp8_recipe", "optimizer_fp8_recipe")}.get(name, name)
    names = fields if isinstance(fields, tuple) else (fields,)
    return any(getattr(base, f) != getattr(options, f) for f in names)


def run_option_args(options: RunOptions, *, precision: str = "bf16", skip: tuple[str, ...] = ()) -> list[str]:
    """Megatron-LM arguments for the run options that differ from Megatron-LM's defaults (:data:`RUN_FLAG_NAMES`'
    spellings), for the exported commands; ``skip``: arguments the command writes already (a model's own, e.g.
    ``--moe-permute-fusion`` in MiniMax-M2's ``MODEL_ARGS``). ``--accumulate-allreduce-grads-in-fp32`` / bf16 reduction
    is left to the caller (it belongs with the numerics flags)."""
    d = RunOptions()
    a: list[str] = []
    if options.cross_entropy_loss_fusion:
        a += ["--cross-entropy-loss-fusion"]
        if options.cross_entropy_fusion_impl != "native":
            a += ["--cross-entropy-fusion-impl", options.cross_entropy_fusion_impl]
    if options.cuda_graph_scope:
        if options.cuda_graph_impl == "full_iteration":
            a += ["--cuda-graph-impl", "full_iteration"]
        elif options.cuda_graph_scope == ("full_iteration",):
            a += ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]
        else:
            a += ["--cuda-graph-impl", options.cuda_graph_impl]
            scopes = [s for s in options.cuda_graph_scope if s != "full"]
            if scopes:
                a += ["--cuda-graph-scope", *scopes]
    if options.moe_permute_fusion:
        a += ["--moe-permute-fusion"]
    if precision == "fp8" and options.fp8_recipe != d.fp8_recipe:
        a += ["--fp8-recipe", options.fp8_recipe]
    if precision != "fp8" and options.optimizer_fp8_recipe not in (None, "delayed"):
        a += ["--fp8-recipe", options.optimizer_fp8_recipe]
    if options.fp8_param_gather and precision == "fp8":
        a += ["--fp8-param-gather"]
    if options.overlap_grad_reduce:
        a += ["--overlap-grad-reduce", "--overlap-param-gather"]
    for f in ("overlap_moe_expert_parallel_comm", "tp_comm_overlap", "moe_router_force_load_balancing",
              "use_megatron_fsdp"):
        if getattr(options, f):
            a += [RUN_FLAG_NAMES[f]]
    if options.cp_comm_type != d.cp_comm_type:
        a += ["--cp-comm-type", options.cp_comm_type]
    if not options.apply_rope_fusion:
        a += ["--no-rope-fusion"]
    if not options.bias_activation_fusion:
        a += ["--no-bias-swiglu-fusion"]
    if not options.te_attention:
        a += ["--transformer-impl", "local"]
    if options.cpu_offloading_num_layers:
        a += ["--cpu-offloading", "--cpu-offloading-num-layers", str(options.cpu_offloading_num_layers)]
    if options.optimizer != d.optimizer:
        a += ["--optimizer", options.optimizer]
    return [x for x in a if x not in skip or not x.startswith("--")] if skip else a
