"""The registry of trial backends: name -> description and the ``module:Class`` of its
:class:`~launch.base.TrialBackend`, imported only when opened (the analytical path never imports Ray)."""

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
    description: str  # for --help and error messages
    target: str  # module:Class


_REGISTRY: dict[str, BackendEntry] = {}


def register_backend(name: str, description: str, target: str) -> None:
    _REGISTRY[name] = BackendEntry(name=name, description=description, target=target)


register_backend("model", "analytical cost model (no GPU; every number is a prediction)",
                 "launch.model_backend:ModelBackend")
register_backend("local", "torchrun of the megatron-core trial harness on this machine's GPUs (measured)",
                 "launch.local_backend:LocalBackend")
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
        TunerError: no backend of that name.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise TunerError(f"--backend {name!r}: unknown backend; accepted: {', '.join(_REGISTRY)}")
    module, _, cls_name = entry.target.partition(":")
    cls: type[TrialBackend] = getattr(importlib.import_module(module), cls_name)
    return cls


def backends_where(has: Callable[[type[TrialBackend]], bool]) -> str:
    """The backends whose class ``has`` a trait, as ``a``, ``a or b`` or ``a, b or c``."""
    names = [n for n in _REGISTRY if has(backend_class(n))]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def get_backend(name: str, settings: BackendSettings | None = None) -> TrialBackend:
    """Open the backend ``name`` with ``settings``.

    Raises:
        TunerError: unknown name, or settings the backend refuses.
    """
    return backend_class(name).from_settings(settings if settings is not None else BackendSettings())
