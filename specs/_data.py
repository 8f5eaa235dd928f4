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


def read_user_yaml(text: str, label: str) -> Any:
    """Parse a user's YAML file (a calibration, a search space, a command template): PyYAML's safe loader, with a key
    written twice in one mapping refused (PyYAML keeps the last one silently, so an edit above it would be lost).

    Args:
        text: the file's text.
        label: how the file is named in messages (``--calibration PATH``).

    Returns:
        The document (None for an empty file).

    Raises:
        TunerError: not YAML (one line: where and what, from PyYAML's mark and problem), or a repeated key (named, with
            both lines).
    """
    import yaml

    from specs.errors import TunerError

    class _Loader(yaml.SafeLoader):
        pass

    def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
        seen: dict[Any, int] = {}
        for k, _ in node.value:
            key = loader.construct_object(k, deep=True)
            try:
                first = seen.setdefault(key, k.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own constructor refuses it below
                continue
            if first != k.start_mark.line + 1:
                raise TunerError(f"{label}: key {key!r} appears twice (lines {first} and {k.start_mark.line + 1}); "
                                 "PyYAML keeps only the last, so write it once")
        return loader.construct_mapping(node, deep=True)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise TunerError(f"{label}: not valid YAML ({where}{e.problem or e.context or 'unreadable'})") from None
    except yaml.YAMLError as e:
        raise TunerError(f"{label}: not valid YAML ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
