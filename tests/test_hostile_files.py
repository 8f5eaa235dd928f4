"""One guard for users' files (:mod:`specs.files`): every hostile file gets one :class:`TunerError` naming it, before
anything parses more than the size limit, whatever reader asks (``--model``, ``--space``, ``--calibration``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specs import load_model
from specs.errors import TunerError
from specs.files import MAX_CONFIG_BYTES

PRESET = Path(__file__).resolve().parents[1] / "specs" / "data" / "models" / "Qwen3-30B-A3B.json"


def _config(tmp_path: Path, folder: str = "m", text: str | None = None, **changes) -> Path:
    d = tmp_path / folder
    d.mkdir()
    cfg = {**json.loads(PRESET.read_text()), **changes}
    (d / "config.json").write_text(text if text is not None else json.dumps(cfg))
    return d / "config.json"


@pytest.mark.parametrize(("make", "needle"), [
    (lambda t: _config(t, folder="x\ntouch PWNED #"), "no control characters"),
    (lambda t: _config(t, tuner={"extra_megatron_args": ["--load", "/elsewhere"]}), "pass --allow-config-args"),
    (lambda t: _config(t, text='{"num_hidden_layers": ' + "9" * 5000 + "}"), "cannot read it"),
    (lambda t: _config(t, text="[" * 100_000 + "]" * 100_000), "nested too deeply"),
    (lambda t: _config(t, text='{"vocab_size": 1, "vocab_size": 2}'), "appears twice"),
    (lambda t: _config(t, text=" " * (MAX_CONFIG_BYTES + 1)), "is more than the"),
    (lambda t: Path("/dev/zero"), "not a regular file"),
    (lambda t: (os.mkfifo(t / "fifo.json"), t / "fifo.json")[1], "not a regular file"),
])
def test_a_hostile_model_file_is_refused_in_one_line(tmp_path, make, needle):
    with pytest.raises(TunerError, match=needle):
        load_model(str(make(tmp_path)))


def test_launch_arguments_of_a_config_are_used_only_when_allowed(tmp_path):
    p = _config(tmp_path, tuner={"extra_megatron_args": ["--load", "/elsewhere"]})
    assert load_model(str(p), allow_config_args=True).extra_megatron_args == ("--load", "/elsewhere")


@pytest.mark.parametrize(("text", "needle"), [
    ("a: " + "[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ("a: 1\na: 2\n", "appears twice"),
])
def test_a_hostile_space_file_is_refused_in_one_line(tmp_path, text, needle):
    from search_spaces.space import SearchSpace

    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(TunerError, match=needle):
        SearchSpace.load(str(tmp_path / "s.yaml"))
