"""The registry of trial backends: name -> description and the ``module:Class`` of its
:class:`~launch.base.TrialBackend`, imported only when opened (the analytical path never imports Ray)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from launch.base import BackendSettings, TrialBackend, or_list
from specs.errors import TunerError

__all__ = ["BACKENDS", "backend_class", "backends_where", "get_backend", "register_backend"]

#: name -> (description for --help and error messages, ``module:Class``)
_REGISTRY: dict[str, tuple[str, str]] = {}


def register_backend(name: str, description: str, target: str) -> None:
    _REGISTRY[name] = (description, target)


register_backend("model", "analytical cost model (no GPU; every number is a prediction)",
                 "launch.model_backend:ModelBackend")
register_backend("local", "torchrun of the megatron-core trial harness on this machine's GPUs (measured)",
                 "launch.local_backend:LocalBackend")
register_backend("ray", "the trial harness under torchrun on the nodes of a Ray cluster, one placement group per "
                 "trial (measured)", "launch.ray_backend:RayBackend")
register_backend("command", "your slime / Megatron-LM launch command from a template (--command-template FILE), its "
                 "log parsed (measured)", "launch.command_backend:CommandBackend")


def backends() -> dict[str, str]:
    """Registered backend names and their descriptions, in registration order."""
    return {n: d for n, (d, _) in _REGISTRY.items()}


#: Backend names the command line accepts, and what each does (a snapshot at import).
BACKENDS = backends()


def backend_class(name: str) -> type[TrialBackend]:
    """The class registered as ``name`` (imported now).

    Raises:
        TunerError: no backend of that name.
    """
    if name not in _REGISTRY:
        raise TunerError(f"--backend {name!r}: unknown backend; accepted: {', '.join(_REGISTRY)}")
    module, _, cls_name = _REGISTRY[name][1].partition(":")
    cls: type[TrialBackend] = getattr(importlib.import_module(module), cls_name)
    return cls


def backends_where(has: Callable[[type[TrialBackend]], bool]) -> str:
    """The backends whose class ``has`` a trait, as ``a``, ``a or b`` or ``a, b or c``."""
    return or_list([n for n in _REGISTRY if has(backend_class(n))])


def get_backend(name: str, settings: BackendSettings | None = None) -> TrialBackend:
    """Open the backend ``name`` with ``settings``.

    Raises:
        TunerError: unknown name, or settings the backend refuses.
    """
    return backend_class(name).from_settings(settings if settings is not None else BackendSettings())
