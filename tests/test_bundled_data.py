"""The bundled data: GPU datasheets are checked on load, and every data file ships in the wheel."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from specs import TunerError, list_gpus, load_gpu
from specs.hardware import _checked_datasheet

ROOT = Path(__file__).resolve().parents[1]
H200 = (ROOT / "specs/data/gpus/H200.yaml").read_text()


def test_every_bundled_gpu_loads():
    names = list_gpus()
    assert "H200" in names and len(names) >= 5
    for n in names:
        assert load_gpu(n).hbm_bytes > 0


def test_missing_key_is_named():
    text = "\n".join(line for line in H200.splitlines() if not line.startswith("hbm_mib:"))
    with pytest.raises(TunerError, match=r"GPU datasheet my\.yaml: .*'hbm_mib' is a required property"):
        _checked_datasheet("my.yaml", text)


def test_unknown_family_lists_the_accepted_ones():
    text = H200.replace("family: hopper", "family: volta")
    with pytest.raises(TunerError, match=r"family is 'volta'; accepted: ampere, hopper, blackwell"):
        _checked_datasheet("my.yaml", text)


def test_blackwell_ultra_is_named_by_its_generation():
    assert [load_gpu(n).generation for n in ("B300", "GB300")] == ["blackwell_ultra", "blackwell_ultra"]
    assert [load_gpu(n).generation for n in ("B200", "GB200", "H200")] == ["", "", ""]
    assert {load_gpu(n).family for n in ("B200", "GB200", "B300", "GB300")} == {"blackwell"}  # mxfp8 stays allowed
    with pytest.raises(TunerError, match=r"generation is 'rubin'; accepted: blackwell_ultra"):
        _checked_datasheet("my.yaml", H200 + "generation: rubin\n")


def test_wrong_kind_and_bad_yaml():
    with pytest.raises(TunerError, match=r"gpus_per_node: 'eight' is not of type 'integer'"):
        _checked_datasheet("my.yaml", H200.replace("gpus_per_node: 8", "gpus_per_node: eight"))
    with pytest.raises(TunerError, match=r"not valid YAML"):
        _checked_datasheet("my.yaml", "name: [unclosed")


def test_package_data_covers_every_data_file():
    """A data file the code reads but the wheel leaves out breaks a non-editable install."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the project supports 3.10, where this check is skipped)
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = cfg["tool"]["setuptools"]["package-data"]
    missing = []
    for pkg in cfg["tool"]["setuptools"]["packages"]["find"]["include"]:
        base = ROOT / pkg.rstrip("*")
        for f in base.rglob("*"):
            if not f.is_file() or f.suffix in (".py", ".pyc", ".typed") or "__pycache__" in f.parts:
                continue
            # the file's own package is the nearest folder with an __init__.py
            owner = f.parent
            while not (owner / "__init__.py").exists():
                owner = owner.parent
            rel = f.relative_to(owner).as_posix()
            dotted = owner.relative_to(ROOT).as_posix().replace("/", ".")
            if not any(fnmatch.fnmatch(rel, g) for g in globs.get(dotted, [])):
                missing.append(f"{dotted}: {rel}")
    assert not missing, f"data files not in [tool.setuptools.package-data]: {missing}"
