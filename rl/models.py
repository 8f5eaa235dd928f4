"""Models for RL plans: the bundled presets of :mod:`specs` (Qwen3-32B, the one NeMo-RL
performance-table model that was not a preset, is one now) or a ``config.json`` path."""

from __future__ import annotations

from specs import ModelSpec, load_model

__all__ = ["load_rl_model"]


def load_rl_model(name: str) -> ModelSpec:
    """A preset or a ``config.json`` path (:func:`specs.load_model`).

    Raises TunerError: an unknown name (every known one listed) or an unreadable config."""
    return load_model(name, allow_config_args=True)  # the RL plan's launches do not pass them
