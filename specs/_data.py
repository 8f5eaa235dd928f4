"""The bundled data files (model presets and GPU datasheets) of the ``specs`` package."""

from __future__ import annotations

from importlib import resources
from typing import Any

MODEL_DIR = "data/models"
GPU_DIR = "data/gpus"
NETWORKS_FILE = "data/networks.yaml"


def data_files(sub: str, suffix: str) -> dict[str, Any]:
    """Bundled files under ``specs/<sub>`` whose names end in ``suffix``, by name without the suffix."""
    base = resources.files("specs").joinpath(sub)
    return {p.name[: -len(suffix)]: p for p in base.iterdir() if p.name.endswith(suffix)}


def data_file(sub: str) -> Any:
    """The bundled file ``specs/<sub>``."""
    return resources.files("specs").joinpath(sub)
