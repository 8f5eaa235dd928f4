"""The ``command`` backend: each trial is the user's own launch command (slime, Megatron-LM), its log parsed.

A launch template (``--command-template FILE``, YAML or JSON; ``launch/templates/slime_command.yaml`` is one)::

    argv: [torchrun, --nproc-per-node, "{gpus_per_node}", pretrain_gpt.py, "{model_args}", "{layout_args}", ...]
    env: {NCCL_DEBUG: WARN}  # optional; values may hold placeholders too
    timeout_s: 1800          # optional; else --trial-timeout
    framework: megatron      # optional: megatron (default) or slime, for {layout_args}

Placeholders are substituted in each argv element on its own and the command runs without a shell, so a value is
never re-split (in a ``bash -c SCRIPT`` template's script each value is ``shlex.quote``-d). ``{model_args}`` and
``{layout_args}`` expand to several elements and must stand alone; ``{env:NAME}`` is the tuner's environment
variable; ``{{`` and ``}}`` are literal braces. A trial's folder gets ``command.txt`` and ``log.txt``; Megatron's
log, read as it grows (:mod:`launch.megatron_log`), is the source of the steps."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launch._trial import SAFE_ENV, LocalProcess, MeasuredBackend, MegatronLogSteps, free_port
from launch.base import BackendSettings, Measurement, StepReporter
from specs import Cluster, ModelSpec, Workload
from specs._data import load_user_yaml
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout

__all__ = ["CommandBackend", "CommandTemplate", "SCALAR_PLACEHOLDERS", "LIST_PLACEHOLDERS", "load_template",
           "SLIME_TEMPLATE"]

#: Placeholders that become (part of) one argv element.
SCALAR_PLACEHOLDERS = (
    "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size", "global_batch_size", "seq_length",
    "pipeline_layout", "num_nodes", "gpus_per_node", "world_size", "steps", "trial_dir", "trial_number", "master_port",
)  # fmt: skip
#: Placeholders that expand to several argv elements (alone in their element).
LIST_PLACEHOLDERS = ("model_args", "layout_args")

#: The slime template shipped with the package.
SLIME_TEMPLATE = Path(__file__).with_name("templates") / "slime_command.yaml"

_TOKEN_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYS = ("argv", "env", "timeout_s", "framework")


def _accepted() -> str:
    return ", ".join("{" + p + "}" for p in (*SCALAR_PLACEHOLDERS, *LIST_PLACEHOLDERS)) + ", {env:NAME}"


def _names(text: str) -> tuple[list[str], list[str]]:
    """Placeholder names in ``text`` and problems with its braces."""
    names, problems = [], []
    for m in _TOKEN_RE.finditer(text):
        tok = m.group(0)
        if tok in ("{{", "}}"):
            continue
        if m.group(1) is None:
            problems.append(f"a lone {tok!r} in {text!r} (write {{{{ or }}}} for a literal brace)")
        else:
            names.append(m.group(1))
    return names, problems


def _substitute(text: str, values: Mapping[str, str]) -> str:
    return _TOKEN_RE.sub(lambda m: {"{{": "{", "}}": "}"}.get(m.group(0)) or values[m.group(1)], text)


def _shell_script_index(argv: tuple[str, ...]) -> int | None:
    """The index of the script of a ``sh -c SCRIPT`` / ``bash -lc SCRIPT`` template, else None."""
    if not argv or os.path.basename(argv[0]) not in ("sh", "bash", "dash", "zsh", "ksh"):
        return None
    for i, a in enumerate(argv[1:], start=1):
        if not a.startswith("-"):
            return None
        if not a.startswith("--") and "c" in a:
            return i + 1 if i + 1 < len(argv) else None
    return None


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A checked launch template."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float | None = None
    framework: str = "megatron"
    source: str = ""

    @property
    def env_names(self) -> list[str]:
        out: list[str] = []
        for text in (*self.argv, *(v for _, v in self.env)):
            for n in _names(text)[0]:
                if n.startswith("env:") and n[4:] not in out:
                    out.append(n[4:])
        return out

    def check_env(self, environ: Mapping[str, str]) -> None:
        """Raises TunerError: an ``{env:NAME}`` variable is not set in ``environ``."""
        missing = [n for n in self.env_names if n not in environ]
        if missing:
            raise TunerError(f"--command-template {self.source}: set the environment variable(s) {', '.join(missing)} "
                             "it uses ({env:NAME})")

    def fill(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload, steps: int,
             trial_dir: str | Path = "", trial_number: int = 0, environ: Mapping[str, str] | None = None,
             megatron_core: str | None = None) -> tuple[list[str], dict[str, str]]:
        """The argv and the extra environment of one trial.

        Raises:
            TunerError: an ``{env:NAME}`` variable is not set, or the layout cannot be written as flags.
        """
        from launch.exporters._flags import _pipeline_layout_string, layout_args, model_args, model_for_release

        environ = os.environ if environ is None else environ
        self.check_env(environ)
        pls = _pipeline_layout_string(layout, model) or ""
        scalars: dict[str, object] = {
            "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep, "etp": layout.etp,
            "dp": layout.dp, "micro_batch_size": layout.micro_batch_size,
            "global_batch_size": workload.global_batch_size, "seq_length": workload.seq_length, "pipeline_layout": pls,
            "num_nodes": cluster.num_nodes,
            "gpus_per_node": cluster.gpus_per_node, "world_size": layout.world_size, "steps": steps,
            "trial_dir": str(trial_dir), "trial_number": trial_number,
        }  # fmt: skip
        values = {k: str(v) for k, v in scalars.items()}
        names = {n for text in (*self.argv, *(v for _, v in self.env)) for n in _names(text)[0]}
        if "master_port" in names:
            values["master_port"] = str(free_port())
        values |= {f"env:{n}": environ[n] for n in self.env_names}
        lists: dict[str, list[str]] = {}
        if "{model_args}" in self.argv:
            lists["{model_args}"] = model_args(model_for_release(model, megatron_core)[0])  # GPT YaRN only from 0.19
        if "{layout_args}" in self.argv:
            lists["{layout_args}"] = layout_args(layout, model, workload,
                                                 framework=self.framework)  # type: ignore[arg-type]
        script = _shell_script_index(self.argv)
        quoted = {k: shlex.quote(v) for k, v in values.items()}
        argv: list[str] = []
        for i, el in enumerate(self.argv):
            if el in lists:
                argv += lists[el]
            else:
                argv.append(_substitute(el, quoted if i == script else values))
        env = {k: _substitute(v, values) for k, v in self.env}
        return argv, env


def load_template(path: str | Path) -> CommandTemplate:
    """Read and check a launch template.

    Raises:
        TunerError: missing or not YAML/JSON, an empty or bad ``argv``, an unknown key or placeholder (the accepted ones
            listed), a list placeholder sharing its element, a bad ``env`` name or ``timeout_s``.
    """
    p = Path(path)
    where = f"--command-template {p}"
    doc = load_user_yaml(p, where, "a YAML or JSON command template")
    if not isinstance(doc, dict):
        raise TunerError(f"{where}: expected a mapping with argv: [...] (and optional env, timeout_s, framework)")
    unknown_keys = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown_keys:
        raise TunerError(f"{where}: unknown key(s) {', '.join(unknown_keys)}; accepted: {', '.join(_KEYS)}")
    argv = doc.get("argv")
    if not isinstance(argv, list) or not argv:
        raise TunerError(f"{where}: argv must be a non-empty list of strings (one per argument)")
    bad = [x for x in argv if isinstance(x, bool) or not isinstance(x, (str, int, float))]
    if bad:
        raise TunerError(f"{where}: argv elements must be strings or numbers, got {bad[0]!r}")
    argv_s = tuple(str(x) for x in argv)
    env_doc = doc.get("env") or {}
    if not isinstance(env_doc, dict):
        raise TunerError(f"{where}: env must be a mapping NAME: value")
    env: list[tuple[str, str]] = []
    for k, v in env_doc.items():
        if not isinstance(k, str) or not _ENV_NAME_RE.fullmatch(k):
            raise TunerError(f"{where}: env: {k!r} is not an environment variable name")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise TunerError(f"{where}: env: {k} must be a string or a number, got {v!r}")
        env.append((k, str(v)))
    timeout = doc.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise TunerError(f"{where}: timeout_s must be a positive number of seconds, got {timeout!r}")
    framework = doc.get("framework", "megatron")
    if framework not in ("megatron", "slime"):
        raise TunerError(f"{where}: framework must be megatron or slime, got {framework!r}")

    unknown: list[str] = []
    problems: list[str] = []
    for i, text in enumerate((*argv_s, *(v for _, v in env))):
        names, probs = _names(text)
        problems += probs
        for n in names:
            if n in LIST_PLACEHOLDERS:
                if text != "{" + n + "}" or i >= len(argv_s):
                    problems.append(f"{{{n}}} expands to several arguments, so it must be an argv element on its own "
                                    f"(got {text!r})")
            elif n.startswith("env:"):
                if not _ENV_NAME_RE.fullmatch(n[4:]):
                    problems.append(f"{{{n}}}: {n[4:]!r} is not an environment variable name")
            elif n not in SCALAR_PLACEHOLDERS and "{" + n + "}" not in unknown:
                unknown.append("{" + n + "}")
    if unknown:
        raise TunerError(f"{where}: unknown placeholder(s) {', '.join(unknown)}; accepted: {_accepted()}")
    if problems:
        raise TunerError(f"{where}: {problems[0]}")
    return CommandTemplate(argv=argv_s, env=tuple(env), timeout_s=float(timeout) if timeout is not None else None,
                           framework=framework, source=str(p))


class CommandBackend(MeasuredBackend):
    """Runs each layout as the user's launch command and parses Megatron's log; the template's ``timeout_s`` wins over
    ``timeout_s``.

    Raises:
        TunerError: no template, a bad template, an unset ``{env:NAME}``, or argv[0] not on PATH.
    """

    name = "command"
    own_flags = frozenset({"--command-template"})

    def __init__(self, *, command_template: str | Path | CommandTemplate | None = None,
                 trials_dir: str | Path = "results/trials", steps: int = 8, warmup_steps: int = 2,
                 timeout_s: float = 900.0, poll_s: float = 0.5, megatron_core: str | None = None) -> None:
        if command_template is None or command_template == "":
            raise TunerError(
                "--backend command needs --command-template FILE: a YAML or JSON file with argv: [...] and "
                f"placeholders such as {{tp}} and {{layout_args}} (the slime one ships as {SLIME_TEMPLATE})"
            )
        self.megatron_core = megatron_core
        tpl = command_template if isinstance(command_template, CommandTemplate) else load_template(command_template)
        tpl.check_env(os.environ)
        prog = tpl.argv[0]
        if "{" not in prog and shutil.which(prog) is None:
            raise TunerError(f"--command-template {tpl.source}: the program {prog!r} (argv[0]) is not found on PATH")
        super().__init__(Path(trials_dir), steps, warmup_steps,
                         float(tpl.timeout_s if tpl.timeout_s is not None else timeout_s), poll_s)
        self.template = tpl

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> CommandBackend:
        return cls(command_template=settings.command_template, trials_dir=settings.trials_dir, steps=settings.steps,
                   warmup_steps=settings.warmup_steps, timeout_s=settings.timeout_s,
                   megatron_core=settings.megatron_core)

    def run(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload,
            reporter: StepReporter | None = None, trial_number: int | None = None) -> Measurement:
        """Run ``layout`` with the template's command.

        Raises:
            TrialFailed: out of memory, timeout, NCCL error or crash, a run without any iteration line, or a program
                that cannot be started.
            TrialStopped: the reporter stopped the trial.
            KeyboardInterrupt: the backend was cancelled; the command's processes were killed.
            InfeasibleLayout: (rule ``command_template``) the layout cannot be written as flags; nothing was started.
        """
        n, tdir = self._trial_folder(trial_number)
        try:
            argv, extra_env = self.template.fill(layout, model=model, cluster=cluster, workload=workload,
                                                 steps=self.steps, trial_dir=tdir.resolve(), trial_number=n,
                                                 megatron_core=self.megatron_core)
        except InfeasibleLayout:
            raise
        except TunerError as e:  # the layout cannot be written as flags: nothing was started
            raise InfeasibleLayout("command_template", str(e)) from None
        log_path = tdir / "log.txt"
        (tdir / "command.txt").write_text(shlex.join(argv) + "\n")
        (tdir / "command.json").write_text(json.dumps({"argv": argv, "env": extra_env}, indent=1) + "\n")
        trial = self._trial(layout, tdir, reporter, logs=f"log: {log_path}",
                            no_result="the command exited without any Megatron iteration line "
                                      "(elapsed time per iteration): ")
        proc = LocalProcess(argv, log_path=log_path, env={**os.environ, **SAFE_ENV, **extra_env}, trial_dir=tdir)
        steps = MegatronLogSteps(log_path, global_batch_size=workload.global_batch_size, seq_length=workload.seq_length,
                                 world_size=layout.world_size, warmup_steps=self.warmup_steps)
        return trial.follow(proc, steps, extra=lambda got: {"notes": [f"command backend: {self.template.source}"]})
