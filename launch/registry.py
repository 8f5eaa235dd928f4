"""The registry of trial backends: name -> what it does and where its class lives.

A backend is registered by name with a one-line description and the import path of its
:class:`~launch.base.TrialBackend` subclass; the class is imported only when the backend is
opened, so the analytical path never imports Ray (or anything a real-trial backend needs).
Adding a backend: write the class (override the hooks it supports), add one entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from launch.base import BackendSettings, TrialBackend
from specs.errors import TunerError

__all__ = ["BACKENDS", "BackendEntry", "backend_class", "backends_where", "get_backend", "register_backend"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendEntry:
    """One registered backend."""

    name: str
    description: str
    """What it does, for ``--help`` and error messages."""
    target: str
    """``module:Class`` of its :class:`TrialBackend` subclass."""


_REGISTRY: dict[str, BackendEntry] = {}


def register_backend(name: str, description: str, target: str) -> None:
    """Register (or replace) a backend.

    Raises:
        ValueError: ``target`` is not of the form ``module:Class``.
    """
    if ":" not in target:
        raise ValueError(f"backend {name!r}: target must be 'module:Class', got {target!r}")
    _REGISTRY[name] = BackendEntry(name=name, description=description, target=target)


register_backend("model", "analytical cost model (no GPU; every number is a prediction)", "launch.model_backend:ModelBackend")
register_backend("local", "torchrun of the megatron-core trial harness on this machine's GPUs (measured)", "launch.local_backend:LocalBackend")
register_backend(
    "ray",
    "the trial harness under torchrun on the nodes of a Ray cluster, one placement group per trial (measured)",
    "launch.ray_backend:RayBackend",
)
register_backend(
    "command",
    "your slime / Megatron-LM launch command from a template (--command-template FILE), its log parsed (measured)",
    "launch.command_backend:CommandBackend",
)


def backends() -> dict[str, str]:
    """Registered backend names and their descriptions, in registration order."""
    return {n: e.description for n, e in _REGISTRY.items()}


#: Backend names the command line accepts, and what each does (a snapshot at import).
BACKENDS = backends()


def backend_class(name: str) -> type[TrialBackend]:
    """The class registered as ``name`` (imported now).

    Raises:
        TunerError: no backend of that name (the registered ones are listed).
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise TunerError(f"--backend {name!r}: unknown backend; accepted: {', '.join(_REGISTRY)}")
    module, _, cls_name = entry.target.partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    if not (isinstance(cls, type) and issubclass(cls, TrialBackend)):
        raise TypeError(f"backend {name!r}: {entry.target} is not a TrialBackend subclass")
    return cls


def backends_where(has: Callable[[type[TrialBackend]], bool]) -> str:
    """The registered backends whose class ``has`` a trait, e.g. ``lambda b: "--ray-address" in b.own_flags``, as
    ``a``, ``a or b`` or ``a, b or c`` (for messages such as "--ray-address is for --backend ray")."""
    names = [n for n in _REGISTRY if has(backend_class(n))]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def get_backend(name: str, settings: BackendSettings | None = None) -> TrialBackend:
    """Open the backend called ``name`` with ``settings`` (:meth:`TrialBackend.from_settings`).

    Raises:
        TunerError: unknown name, or settings the backend refuses ((local) no GPU, (command) no or
            a bad template, (ray) no Ray cluster to connect to).
    """
    return backend_class(name).from_settings(settings if settings is not None else BackendSettings())
