"""Megatron-core releases the validity rules know (``--megatron-core``), read in ``docs/megatron_versions.md``.

A version is kept as ``(major, minor)``; patch levels and release-candidate suffixes do not change a rule the
tuner checks (``0.16.0rc0``, slime's pin, is 0.16)."""

from __future__ import annotations

import re

from specs.errors import TunerError

#: Releases whose layout rules were read (NVIDIA/Megatron-LM tags core_v0.13.0 .. core_v0.19.0;
#: docs/megatron_versions.md).
KNOWN_MEGATRON_CORE: tuple[str, ...] = ("0.13", "0.14", "0.15", "0.16", "0.17", "0.18", "0.19")

#: The default of ``--megatron-core``: the newest release the project knows.
NEWEST_MEGATRON_CORE = KNOWN_MEGATRON_CORE[-1]

_VERSION_RE = re.compile(r"\s*(?:core_v|v)?(\d+)\.(\d+)(?:\.\d+)?(?:(?:rc|a|b|\.dev|\+)\S*)?\s*")


def megatron_core_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a megatron-core version string such as ``0.16``, ``0.16.0rc0`` or ``core_v0.19.2``.

    Raises TunerError: not a version, or a release the project does not know (the known ones are named)."""
    m = _VERSION_RE.fullmatch(str(text))
    known = ", ".join(KNOWN_MEGATRON_CORE)
    if not m:
        raise TunerError(f"--megatron-core {text!r}: not a version such as 0.16 or 0.16.0rc0; known: {known}")
    key = f"{int(m.group(1))}.{int(m.group(2))}"
    if key not in KNOWN_MEGATRON_CORE:
        raise TunerError(f"--megatron-core {text!r}: unknown release {key}; known: {known} (docs/megatron_versions.md)")
    return int(m.group(1)), int(m.group(2))
