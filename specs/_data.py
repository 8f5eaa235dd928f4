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
    """Parse a user's YAML file (``label`` names it in messages) with PyYAML's safe loader, refusing a key written twice
    in one mapping (PyYAML keeps the last silently). Returns the document (None for an empty file).

    Raises TunerError: not YAML (where and what, from PyYAML's mark), or a repeated key (named, with its lines)."""
    import yaml

    from specs.errors import TunerError

    class _Loader(yaml.SafeLoader):
        pass

    def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
        seen: dict[Any, int] = {}
        for k, _ in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                continue  # PyYAML merges it below
            key = loader.construct_object(k, deep=True)
            line = k.start_mark.line + 1
            try:
                first = seen.get(key)
                seen.setdefault(key, line)
            except TypeError:  # an unhashable key: PyYAML's own constructor refuses it below
                continue
            if first is not None:
                where = f"lines {first} and {line}" if first != line else f"both on line {line}"
                raise TunerError(f"{label}: key {key!r:.60} appears twice ({where}); PyYAML keeps only the last, so "
                                 "write it once")
        return loader.construct_mapping(node, deep=True)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise TunerError(f"{label}: not valid YAML ({where}{e.problem or e.context or 'unreadable'})") from None
    except yaml.YAMLError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TunerError(f"{label}: not valid YAML ({why})") from None


def load_user_yaml(path: Any, label: str, expected: str) -> Any:
    """Read and parse the user's YAML file ``path`` with :func:`read_user_yaml`; ``label`` names it in messages
    (``--space PATH``), ``expected`` says what it should be ("a YAML search space").

    Raises TunerError: the file cannot be read, is not UTF-8 text, or is not accepted by :func:`read_user_yaml`."""
    from specs.files import parse_errors, read_user_text

    text = read_user_text(path, label, expected)
    with parse_errors(label, expected):
        return read_user_yaml(text, label)


def dump_user_yaml(doc: Any) -> str:
    """YAML text of ``doc`` that :func:`read_user_yaml` reads back: PyYAML's safe dumper, without the anchors and
    aliases it would write for an object referenced twice (``&id001`` / ``*id001``): every value written out."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False)
