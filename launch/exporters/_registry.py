"""The registry of export formats: ``--format`` name -> :class:`Exporter`, in registration order."""

from __future__ import annotations

from launch.base import or_list
from launch.exporters._base import Exporter
from specs.errors import TunerError

__all__ = ["register_exporter", "get_exporter", "exporters", "exporter_names", "main_job_exporters"]

_REGISTRY: dict[str, Exporter] = {}


def register_exporter(exporter: Exporter) -> Exporter:
    """Register (or replace) ``exporter`` under its name.

    Raises:
        ValueError: another format writes the same file name.
    """
    clash = next((e.name for e in _REGISTRY.values() if e.file_name == exporter.file_name and e.name != exporter.name),
                 None)
    if clash is not None:
        raise ValueError(f"exporter {exporter.name!r}: format {clash!r} already writes {exporter.file_name}")
    _REGISTRY[exporter.name] = exporter
    return exporter


def exporters() -> dict[str, Exporter]:
    """The registered formats by name, in registration order."""
    return dict(_REGISTRY)


def exporter_names() -> list[str]:
    """The ``--format`` names, in registration order."""
    return list(_REGISTRY)


def main_job_exporters() -> list[Exporter]:
    """The formats ``tune`` writes for its best layout (:attr:`Exporter.main_job`), in registration order."""
    return [e for e in _REGISTRY.values() if e.main_job]


def get_exporter(name: str) -> Exporter:
    """The exporter registered as ``name``.

    Raises:
        TunerError: no format of that name.
    """
    e = _REGISTRY.get(name)
    if e is None:
        raise TunerError(f"--format {name!r}: accepted {or_list(list(_REGISTRY))}")
    return e
