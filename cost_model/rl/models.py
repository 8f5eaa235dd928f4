"""Models for RL plans: the bundled presets of :mod:`specs`, plus the few NeMo-RL performance-table
models that are not presets (``cost_model/rl/data/models/*.json``, Hugging Face ``config.json`` fields)."""

from __future__ import annotations

import json
from pathlib import Path

from specs import ModelSpec, list_models, load_model, model_from_hf_config
from specs.errors import TunerError

__all__ = ["load_rl_model", "rl_model_names"]

_DIR = Path(__file__).resolve().parent / "data" / "models"


def rl_model_names() -> list[str]:
    """Preset names plus this package's extra models."""
    return sorted({*list_models(), *(p.stem for p in _DIR.glob("*.json"))})


def load_rl_model(name: str) -> ModelSpec:
    """A preset, one of this package's extra models, or a ``config.json`` path.

    Raises:
        TunerError: an unknown name (every known one listed) or an unreadable config.
    """
    extra = {p.stem.lower(): p for p in _DIR.glob("*.json")}
    p = extra.get(name.lower())
    if p is not None:
        return model_from_hf_config(json.loads(p.read_text()), name=p.stem, where=str(p))
    try:
        return load_model(name)
    except TunerError:
        if Path(name).exists():
            raise
        raise TunerError(f"--model {name!r}: unknown; known models: {', '.join(rl_model_names())}, or a config.json path") from None
