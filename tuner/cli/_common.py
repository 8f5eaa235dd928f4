"""What every ``tune`` command area shares: the consoles, the error boundary, shell-safe suggested commands, the
study loading helpers and the shared options. Nothing here imports an area module (no import cycle)."""

from __future__ import annotations

import functools
import inspect
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer
import typer.main
from rich.markup import escape
from typer.core import TyperGroup

from specs.console import Col, err, fitted_table, out, say
from specs.errors import InfeasibleLayout, TunerError

__all__ = [
    "GIB", "DEBUG_ENV", "CliState", "TuneGroup", "out", "err", "error_message", "require", "shell_command",
    "study_flags",
    "check_study_name", "load_study", "recorded_storage", "study_context", "fmt_int", "Col", "fitted_table", "say",
]


GIB = 2**30

#: ``TUNE_DEBUG=1`` in the environment works as ``--debug`` on the command line.
DEBUG_ENV = "TUNE_DEBUG"
DEBUG_FLAG = "--debug"
DEFAULT_RESULTS = Path("results")


# ---- the error boundary ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CliState:
    """The command line as ``tune`` received it (``ctx.obj`` of every command)."""

    argv: tuple[str, ...]
    """The arguments after the program name, ``--debug`` removed."""
    debug: bool
    """``--debug`` was given (anywhere before a ``--``) or ``TUNE_DEBUG`` is set."""


def _take_debug(args: Sequence[str]) -> tuple[list[str], bool]:
    """``args`` without ``--debug`` (accepted anywhere before a ``--``) and whether it was there."""
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    head = [a for a in args[:end] if a != DEBUG_FLAG]
    return head + args[end:], len(head) < end


def error_message(e: BaseException) -> str:
    """The one line a user error is shown as (an :class:`InfeasibleLayout` names its rule)."""
    if isinstance(e, InfeasibleLayout):
        return f"the layout breaks rule {e.rule_id}: {e.reason}"
    return str(e).strip() or type(e).__name__


def _red(text: str) -> None:
    """``error: text`` on stderr, wrapped at the terminal's width under its first word."""
    say(escape(text), label="[bold red]error:[/]", indent=0, console=err)


def _traceback(e: BaseException) -> None:
    sys.stderr.write("".join(traceback.format_exception(type(e), e, e.__traceback__)))
    sys.stderr.flush()


class TuneGroup(TyperGroup):
    """The ``tune`` root group and the command line's one error boundary: ``--debug`` (anywhere before ``--``) or
    ``TUNE_DEBUG=1`` adds tracebacks; a :class:`TunerError` or usage error prints one red line and exits 2; Ctrl-C and
    SIGTERM exit 130; any other exception is a bug (exit 1). Areas (:attr:`areas`: ``"module:app" -> command names``)
    and sub-apps (:attr:`lazy`) are imported only when one of their commands runs or the commands are listed."""

    areas: ClassVar[dict[str, tuple[str, ...]]] = {}
    lazy: ClassVar[dict[str, str]] = {}

    def _load_area(self, spec: str) -> None:
        import importlib

        module, _, attr = spec.partition(":")
        built = typer.main.get_command(getattr(importlib.import_module(module), attr))
        for name, cmd in (built.commands if isinstance(built, TyperGroup) else {built.name or "": built}).items():
            self.commands.setdefault(name, cmd)

    def list_commands(self, ctx: Any) -> list[str]:
        """The commands: this group's own, each area's in the order :attr:`areas` names them, then the lazy sub-apps."""
        for spec in self.areas:
            self._load_area(spec)
        order = [n for names in self.areas.values() for n in names]
        rank = {n: i for i, n in enumerate(order)}
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: rank.get(n, len(order))) + [n for n in self.lazy if n not in self.commands]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, importing its area (all of them for a name no area lists) or lazy sub-app the first
        time it is asked for."""
        if cmd_name not in self.commands and cmd_name not in self.lazy:
            for spec in [s for s, names in self.areas.items() if cmd_name in names] or list(self.areas):
                self._load_area(spec)
        if cmd_name not in self.commands and cmd_name in self.lazy:
            import importlib

            module, _, attr = self.lazy[cmd_name].partition(":")
            group = typer.main.get_command(getattr(importlib.import_module(module), attr))
            group.name = cmd_name
            self.commands[cmd_name] = group
        return super().get_command(ctx, cmd_name)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        """Run the command line (``args``, default ``sys.argv[1:]``) and turn every error into an exit code. Returns the
        exit code when ``standalone_mode`` is False (else it exits the process with it)."""
        import signal
        import threading

        main = threading.current_thread() is threading.main_thread()
        # `kill`, a scheduler: as Ctrl-C
        old_term = signal.signal(signal.SIGTERM, signal.default_int_handler) if main else None
        try:
            code = self._run(args, prog_name, complete_var, windows_expand_args, **extra)
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        if standalone_mode:
            sys.exit(code)
        return code

    def _run(self, args: Sequence[str] | None, prog_name: str | None, complete_var: str | None,
             windows_expand_args: bool, **extra: Any) -> int:
        argv, flag = _take_debug(sys.argv[1:] if args is None else args)
        debug = flag or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
        extra.setdefault("obj", CliState(argv=tuple(argv), debug=debug))
        if "--help" in argv:  # typer's help tables, patched only for a help screen
            from tuner import help_tables

            help_tables.install()
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False,
                              windows_expand_args=windows_expand_args, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except TunerError as e:
            if debug:
                _traceback(e)
            _red(error_message(e))
            code = 2
        except typer.TyperException as e:  # typer's (click's) usage errors: unknown option, bad value, missing argument
            ctx = getattr(e, "ctx", None)  # UsageError carries the context of the command that refused it
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _red(f"{e.format_message()}{hint}")
            code = e.exit_code
        except KeyboardInterrupt:  # (typer itself turns a Ctrl-C inside a command into exit 130)
            err.print("interrupted")
            code = 130
        except typer.Abort:
            err.print("aborted")
            code = 1
        except Exception as e:  # noqa: BLE001 - a bug, not a user error
            if debug:
                _traceback(e)
            if _is_storage_error(e):  # a damaged study database found while reading it: the user's file, not a bug
                from tuner.study.config import _mask

                first = _mask(str(e).splitlines()[0]) if str(e) else ""
                _red(f"the study's storage cannot be read or reached ({type(e).__name__}: {first}): a damaged or "
                     "locked file, not an Optuna study, or a database server that does not answer; give another "
                     "--storage, or restore the file from a copy")
                code = 2
            else:
                say(escape(f"{type(e).__name__}: {e}")
                    + ("" if debug else " (re-run with --debug for the traceback, and report it)"),
                    label="[bold red]internal error:[/]", indent=0, console=err)
                code = 1
        return code


# ---- small helpers ---------------------------------------------------------------------


def _is_storage_error(e: BaseException) -> bool:
    """An error of the study's storage layer (Optuna's ``StorageInternalError``, SQLAlchemy's database errors)."""
    import optuna

    if isinstance(e, optuna.exceptions.StorageInternalError):
        return True
    return type(e).__module__.startswith("sqlalchemy") and type(e).__name__ in (
        "DatabaseError", "OperationalError", "IntegrityError", "InternalError", "ProgrammingError")


def require(value: Any, flag: str, example: str) -> Any:
    """``value``, unless it is missing. Raises TunerError: ``value`` is None or "" (the message shows ``flag
    example``)."""
    if value is None or value == "":
        raise TunerError(f"{flag} is required, e.g. {flag} {example}")
    return value


def fmt_int(x: float) -> str:
    """``1,096,704``."""
    return f"{x:,.0f}"


def shell_command(*words: Any) -> str:
    """A command to suggest to the user, every word ``shlex.quote``-d: safe to paste into a shell."""
    return shlex.join(str(w) for w in words)


def print_command(*words: Any, indent: int = 2) -> None:
    """Print a suggested command, shell-quoted, wrapped at the console's width with `` \\`` continuations (a shell
    reads the lines as one command, so it pastes as printed)."""
    parts = [shlex.quote(str(w)) for w in words]
    width = max(out.width - 2, 40)
    lines, cur = [], " " * indent + parts[0]
    for p in parts[1:]:
        if len(cur) + 1 + len(p) > width:
            lines.append(cur + " \\")
            cur = " " * (indent + 2) + p
        else:
            cur += " " + p
    lines.append(cur)
    for ln in lines:
        out.print(ln, markup=False, soft_wrap=True)


def study_flags(study: str, results_dir: Path) -> list[str]:
    """``--study NAME`` and, when it is not the default, ``--results-dir DIR``: what a suggested
    ``tune pareto / export / verify`` needs to find the study (its ``--storage`` is in ``config.yaml``)."""
    return ["--study", study] + ([] if Path(results_dir) == DEFAULT_RESULTS else ["--results-dir", str(results_dir)])


# ---- studies ---------------------------------------------------------------------------


def check_study_name(name: str) -> str:
    """``name``, if it obeys the rule ``tune --study`` applies (the same rule, the same message). Raises TunerError: the
    name is not 1-128 letters, digits, '.', '_', '+' or '-' starting with a letter or digit."""
    from tuner.study import TuneConfig, _validate_config

    _validate_config(TuneConfig.from_dict({"model": "-", "gpus": "-", "study": name}))  # checks only the study name
    return name


def recorded_storage(config_yaml: Path) -> str | None:
    """The ``--storage`` a study was run with, as its ``results/<study>/config.yaml`` records it (None if none)."""
    import yaml

    from tuner.study.config import RECORD_ERRORS, read_study_record

    try:
        rec = read_study_record(config_yaml)
        cfg = (rec or {}).get("config") or {}
        st = cfg.get("storage")
    except RECORD_ERRORS + (yaml.YAMLError, AttributeError):
        return None
    if not (isinstance(st, str) and st):
        return None
    place = rec.get("storage_place")  # the same store made absolute when it was written: found from any folder
    return place if isinstance(place, str) and place else st


def load_study(study: str | None, storage: str | None, results_dir: Path, *, writes: bool = False) -> Any:
    """The Optuna study ``study`` (``--storage``, else the one ``config.yaml`` records, else
    ``results/<study>/study.db``), a SQLite file opened read-only unless the command ``writes`` to it. Raises
    TunerError: no or a bad ``--study``, no such database or study, or a storage that cannot be opened."""
    import optuna

    name = check_study_name(require(study, "--study", "MiniMax-M2-8x8xH200-s8192-gbs128"))
    db = results_dir / name / "study.db"
    storage_given = bool(storage) or db.exists()
    if not storage and not db.exists():
        from specs.study_files import _is_study_record

        rec = results_dir / name / "config.yaml"
        storage = recorded_storage(rec)
        if storage is None and rec.exists() and not _is_study_record(rec):
            raise TunerError(f"--study {name!r}: {rec} cannot be read as a study's record (it says where the study's "
                             "trials are kept, and the folder has no study.db); restore it, or give --storage")
    url = storage or f"sqlite:///{db.as_posix()}"
    if storage:
        from tuner.study.config import _check_storage_syntax

        _check_storage_syntax(storage)
    if not storage and not db.exists():
        first = shell_command("tune", "--model", "...", "--gpus", "...", *study_flags(name, results_dir))
        raise TunerError(f"--study {name!r}: no study database at {db}; run `{first}` first, or give --storage")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from tuner.study import _mask, open_storage
    from tuner.study.config import storage_file
    from tuner.study.storage import check_store_holds, sqlite_read_only

    # missing, empty or another study's: opened, not made
    check_store_holds(url, name, f"--study {name!r} is read from it")
    db_file = storage_file(url) if url.startswith("sqlite") else None
    try:
        # read only (a read-only filesystem too): reading a study changes no byte of it
        if db_file is not None and not writes:
            from optuna.storages import RDBStorage

            store = RDBStorage(url, engine_kwargs={"creator": lambda: sqlite_read_only(db_file)},
                               skip_table_creation=True)
        else:
            store = open_storage(url, create=False)
        return optuna.load_study(study_name=name, storage=store)
    except KeyError:
        raise TunerError(f"--study {name!r}: no such study in {_mask(url)}") from None
    except TunerError:
        raise
    except Exception as e:  # noqa: BLE001 - storage errors
        server = storage_file(url) is None and not url.startswith("journal:")
        hint = ("" if storage_given or not server else
                "; a recorded server URL has no password: give --storage with it, or set PGPASSWORD")
        raise TunerError(f"--study {name!r}: cannot open {_mask(url)} ({type(e).__name__}: "
                         f"{_mask(str(e).splitlines()[0]) if str(e) else ''}){hint}") from None


def study_context(st: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(model, cluster, workload, config) a study made by ``tune`` was evaluated with (as stored in it). Raises
    TunerError: the study was not made by ``tune`` (its inputs are not stored in it)."""
    from specs import Workload, parse_gpus
    from tuner.study import model_spec_from_dict

    cfg = st.user_attrs.get("config") or {}
    res = st.user_attrs.get("resolved") or {}
    if not cfg or not res or "model_spec" not in st.user_attrs:
        raise TunerError(f"study {st.study_name!r} was not made by `tune` (its inputs are not stored in it)")
    # The study stores what it was evaluated with: a moved or edited config.json does not change it.
    m = model_spec_from_dict(st.user_attrs["model_spec"])
    c = parse_gpus(f"{res['num_gpus']}x{res['gpu']}", gpus_per_node=res["gpus_per_node"],
                   inter_node_bytes_per_s=res["inter_node_bytes_per_s"], usd_per_gpu_hour=res["usd_per_gpu_hour"],
                   network=res.get("network") or None, host_memory_gib=res.get("host_memory_gib") or None)
    lora = {"lora_rank": res["lora_rank"],
            "lora_target_modules": tuple(res["lora_target_modules"])} if res.get("task") == "lora" else {}
    w = Workload(seq_length=res["seq_length"], global_batch_size=res["global_batch_size"],
                 precision=res.get("precision", "bf16"), task=res.get("task") or "pretrain", **lora)
    return m, c, w, cfg


def stored_run(st: Any) -> tuple[Any, str, tuple[str, ...]]:
    """(run options, stack preset, the user's launch arguments) a study made by ``tune`` was estimated and exports with;
    the options are None for a study stored before they were recorded (its backend's then)."""
    from specs import RunOptions

    stored = (st.user_attrs.get("resolved") or {}).get("run_options")
    cfg = st.user_attrs.get("config") or {}
    opts = None
    if isinstance(stored, dict):
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
        opts = RunOptions(**fields)
    return opts, str(cfg.get("stack") or ""), tuple(str(a) for a in cfg.get("user_args") or ())


# ---- option aliases shared by the areas ------------------------------------------------

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", rich_help_panel="Job", help=(
    "Preset name (see `tune models`) or a Hugging Face config.json path."))]
GpusOpt = Annotated[str | None, typer.Option("--gpus", "-g", rich_help_panel="Job", help=(
    "GPUs as COUNTxGPU (64xH200) or NODESxPER_NODExGPU (8x8xH200)."))]
LayersOpt = Annotated[int | None, typer.Option("--layers", rich_help_panel="Job", help=(
    "Slice the model to its first N layers at full width, for the estimate and the trials."))]
PerNodeOpt = Annotated[int | None, typer.Option("--gpus-per-node", rich_help_panel="Cluster", help=(
    "GPUs per node (default: the GPU's usual server, 8 for HGX)."))]
NetOpt = Annotated[float | None, typer.Option("--network-gbps", rich_help_panel="Cluster", help=(
    "Network bandwidth per node, Gb/s: overrides the fabric's (--network; H200 default 3200, the seed's EFA)."))]
NetworkOpt = Annotated[str | None, typer.Option("--network", rich_help_panel="Cluster", help=(
    "Scale-out fabric: ib-ndr, ib-xdr, ib-hdr, roce-v2, efa-v2, efa-v3 (default: the GPU's server type's; H200: "
    "efa-v3, AWS p5en). It decides which MoE dispatchers may cross nodes and at what efficiency."))]
MegatronCoreOpt = Annotated[str | None, typer.Option("--megatron-core", rich_help_panel="Cluster", help=(
    "megatron-core release whose validity rules apply (0.13 .. 0.19; default the newest)."))]
HostMemOpt = Annotated[float | None, typer.Option("--host-memory-gib", rich_help_panel="Cluster", help=(
    "Host memory per node, GiB (default: the server type's; H200 p5en 2,048): layouts whose predicted host memory (CPU "
    "optimizer offload) exceeds it are refused."))]
PriceOpt = Annotated[float | None, typer.Option("--usd-per-gpu-hour", rich_help_panel="Cluster", help=(
    "Price per GPU-hour (default 7.91, the seed's)."))]
SeqOpt = Annotated[int, typer.Option("--seq-len", "--seq-length", rich_help_panel="Workload", help=(
    "Tokens per row (Megatron's --seq-length)."))]
GbsOpt = Annotated[int,
                   typer.Option("--global-batch", "--global-batch-size",
                                help="Rows per optimizer step (Megatron's --global-batch-size).",
                                     rich_help_panel="Workload")]
PrecOpt = Annotated[str, typer.Option("--precision", help="bf16 or fp8.", rich_help_panel="Workload")]
HeadroomOpt = Annotated[float | None, typer.Option("--memory-headroom", rich_help_panel="Search", help=(
    "A fixed fraction of HBM to keep free. Default: the error bars' rule (a layout is out only if even its optimistic "
    "memory is over the GPU; docs/error_bars.md)."))]
CalOpt = Annotated[Path | None, typer.Option("--calibration", rich_help_panel="Search", help=(
    "Calibration YAML overriding the cost model's constants."))]
StudyOpt = Annotated[str | None, typer.Option("--study", rich_help_panel="Study", help=(
    "Study name (default: model-gpus-seq-gbs)."))]
StudyNameOpt = Annotated[str | None, typer.Option("--study", rich_help_panel="Study", help=(
    "Study name (required; `tune` prints it, e.g. MiniMax-M2-8x8xH200-s8192-gbs128)."))]
StorageOpt = Annotated[str | None, typer.Option("--storage", rich_help_panel="Study", help=(
    "Optuna storage URL (default sqlite:///results/<study>/study.db)."))]
ResultsOpt = Annotated[Path, typer.Option("--results-dir", help="Where study folders go.", rich_help_panel="Study")]


# ---- run options: the stack preset and Megatron-LM's run flags, shared by every command that estimates ------------

_RUN = "Run options (Megatron-LM's flags; default: the --stack preset's)"
StackOpt = Annotated[str | None, typer.Option("--stack", rich_help_panel=_RUN, help=(
    "Stack preset whose run options are the defaults: slime (default, the seed's), megatron-lm (alias megatron), "
    "megatron-bridge (its performance recipes) or nemo-rl (its Megatron trainer); specs/data/stacks/ cites each "
    "one's source. A flag below overrides it. slime also leaves out the allgather dispatcher, which it rewrites to "
    "alltoall."))]
#: Each :class:`specs.stacks.RunFlags` field: (its type, option names, help).
_RUN_FLAGS: dict[str, tuple[Any, str, str]] = {
    "accumulate_allreduce_grads_in_fp32": (bool, "--accumulate-allreduce-grads-in-fp32",
                                           "Main gradients and their reduction in fp32 (4 B per parameter)."),
    "grad_reduce_in_bf16": (bool, "--grad-reduce-in-bf16",
                            "Main gradients and their reduction in bf16 (2 B per parameter; Megatron-Bridge's perf "
                            "recipes)."),
    "cross_entropy_loss_fusion": (bool, "--cross-entropy-loss-fusion/--no-cross-entropy-loss-fusion",
                                  "A fused cross-entropy kernel (fewer logits bytes kept)."),
    "cross_entropy_fusion_impl": (str, "--cross-entropy-fusion-impl",
                                  "native or te (Transformer Engine's parallel cross-entropy); needs the loss fusion."),
    "cuda_graph_impl": (str, "--cuda-graph-impl", "none, local, transformer_engine or full_iteration (without "
                        "--cuda-graph-scope: whole layers, or the whole step)."),
    "cuda_graph_scope": (list[str], "--cuda-graph-scope --cuda-graph-modules", "What CUDA graphs capture (repeatable "
                         "or comma-separated): attn, mlp, moe, moe_router, moe_preprocess, mamba, full_iteration, "
                         "full."),
    "moe_permute_fusion": (bool, "--moe-permute-fusion/--no-moe-permute-fusion",
                           "TE's fused token permutation (recorded and exported; not priced)."),
    "fp8_recipe": (str, "--fp8-recipe", "delayed or tensorwise: the GEMMs' recipe with --precision fp8; with bf16 the "
                   "optimizer's (tensorwise keeps fp32 master weights)."),
    "fp8_param_gather": (bool, "--fp8-param-gather/--no-fp8-param-gather",
                         "fp8 weights only, no bf16 copy (--precision fp8)."),
    "overlap_grad_reduce": (bool, "--overlap-grad-reduce/--no-overlap-grad-reduce",
                            "DP gradient reduction and parameter gather overlapped with compute."),
    "overlap_moe_expert_parallel_comm": (bool,
                                         "--overlap-moe-expert-parallel-comm/--no-overlap-moe-expert-parallel-comm",
                                         "EP all-to-all overlapped with another micro-batch."),
    "tp_comm_overlap": (bool, "--tp-comm-overlap/--no-tp-comm-overlap",
                        "TP collectives overlapped with GEMMs (TE userbuffers)."),
    "moe_router_force_load_balancing": (bool, "--moe-router-force-load-balancing/--no-moe-router-force-load-balancing",
                                        "Uniform routing (benchmarks); default natural routing."),
    "cp_comm_type": (str, "--cp-comm-type", "p2p or a2a."),
    "use_megatron_fsdp": (bool, "--use-megatron-fsdp/--no-use-megatron-fsdp",
                          "Parameters, gradients and optimizer states sharded over DP."),
    "apply_rope_fusion": (bool, "--rope-fusion/--no-rope-fusion", "Fused RoPE (Megatron-LM's default on)."),
    "bias_swiglu_fusion": (bool, "--bias-swiglu-fusion/--no-bias-swiglu-fusion",
                           "Fused SwiGLU (Megatron-LM's default on)."),
    "transformer_impl": (str, "--transformer-impl", "transformer_engine (default) or local."),
    "cpu_offloading_num_layers": (int, "--cpu-offloading-num-layers",
                                  "Layers per pipeline rank whose activations go to host memory."),
    "optimizer": (str, "--optimizer", "adam or dist_muon."),
}
#: The command parameter of each :class:`specs.stacks.RunFlags` field and its option.
RUN_FLAG_OPTIONS: dict[str, Any] = {
    n: Annotated[t | None, typer.Option(*names.split(), help=h, rich_help_panel=_RUN)]
    for n, (t, names, h) in _RUN_FLAGS.items()}

_TASK = "Workload"
TaskOpt = Annotated[str | None, typer.Option("--task", rich_help_panel=_TASK, help=(
    "pretrain (default), sft (packed sequences, loss on the responses: the same compute) or lora (frozen base weights, "
    "low-rank adapters with their own gradients and optimizer state; predictions only)."))]
LoraRankOpt = Annotated[int | None, typer.Option("--lora-rank", rich_help_panel=_TASK, help=(
    "--task lora: the adapters' rank r (default 32, Megatron-Bridge's)."))]
LoraTargetsOpt = Annotated[str | None, typer.Option("--lora-target-modules", rich_help_panel=_TASK, help=(
    "--task lora: comma-separated linear layers to adapt (default Megatron-Bridge's: "
    "linear_qkv,linear_proj,linear_fc1,linear_fc2; an MLA model's leaves linear_qkv out)."))]


def fold_options(func: Any, param: str, kind: str, added: list[inspect.Parameter],
                 build: Callable[[dict[str, Any]], Any], what: str) -> Any:
    """``func`` with the options ``added`` in place of its parameter ``param``, which gets ``build(their values by
    name)`` (a ``kind``): how a command takes many options as one object. Raises TypeError: ``func`` has no ``param``,
    or a parameter named as an added option."""
    sig = inspect.signature(func, eval_str=True)
    if param not in sig.parameters:
        raise TypeError(f"{func.__name__}: @{what.replace(' ', '_')} needs a `{param}: {kind}` parameter")
    own = [p for p in sig.parameters.values() if p.name != param]
    names = tuple(p.name for p in added)
    clash = {p.name for p in own} & set(names)
    if clash:
        raise TypeError(f"{func.__name__}: parameters {sorted(clash)} clash with the {what}")

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        return func(**{param: build({k: kwargs.pop(k) for k in names})}, **kwargs)

    params = own + added
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": sig.return_annotation}
    return command


def run_options(func: Any) -> Any:
    """Give a command ``--stack`` and every run flag (:data:`RUN_FLAG_OPTIONS`); the command takes them as one ``run:
    RunChoice`` (the preset's name and the :class:`specs.stacks.RunFlags` given). Raises TypeError: ``func`` has no
    ``run`` parameter, or one of its own parameters has a run flag's name."""
    from specs.stacks import RunFlags

    task_names = ("task", "lora_rank", "lora_target_modules")
    options = {"stack": StackOpt, "task": TaskOpt, "lora_rank": LoraRankOpt, "lora_target_modules": LoraTargetsOpt,
               **RUN_FLAG_OPTIONS}
    added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=a)
             for n, a in options.items()]

    def build(v: dict[str, Any]) -> RunChoice:
        given = {n: v[n] for n in RUN_FLAG_OPTIONS}
        if given["cuda_graph_scope"] is not None:
            given["cuda_graph_scope"] = tuple(given["cuda_graph_scope"])
        return RunChoice(stack=v["stack"], flags=RunFlags(**given), **{k: v[k] for k in task_names})

    return fold_options(func, "run", "RunChoice", added, build, "run options")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunChoice:
    """``--stack`` and the run flags of one command line, before they are resolved (:meth:`resolve`)."""

    stack: str | None
    flags: Any
    """:class:`specs.stacks.RunFlags`."""
    task: str | None = None
    lora_rank: int | None = None
    lora_target_modules: str | None = None

    def workload_kw(self) -> dict[str, Any]:
        """``--task``, ``--lora-rank`` and ``--lora-target-modules`` as :class:`specs.Workload` fields (those given).
        Raises TunerError: ``--lora-rank`` or ``--lora-target-modules`` without ``--task lora``."""
        kw: dict[str, Any] = {}
        if self.task is not None:
            kw["task"] = self.task.strip().lower()
        if (self.lora_rank is not None or self.lora_target_modules is not None) and kw.get("task") != "lora":
            raise TunerError("--lora-rank and --lora-target-modules need --task lora")
        if self.lora_rank is not None:
            kw["lora_rank"] = self.lora_rank
        if self.lora_target_modules is not None:
            kw["lora_target_modules"] = tuple(m for m in self.lora_target_modules.replace(" ", ",").split(",") if m)
        return kw

    def resolve(self, precision: str = "bf16", megatron_core: str | None = None) -> Any:
        """:func:`specs.stacks.resolve_run_options` of these flags: a :class:`specs.stacks.StackRun`. Raises TunerError:
        an unknown stack or value, or contradictory flags."""
        from specs.stacks import resolve_run_options

        return resolve_run_options(self.flags, self.stack, precision=precision, megatron_core=megatron_core)


ForceOpt = Annotated[bool, typer.Option("--force", help=(
    "Replace an output that is a link (the link, not its target) or another kind of file."))]
