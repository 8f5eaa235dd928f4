"""Backends that turn a Layout into a Measurement, and the exporters of recipes and run commands."""

from __future__ import annotations

from launch.base import BackendSettings, FailureKind, Measurement, StepReporter, TrialBackend, TrialFailed, TrialStopped
from launch.registry import BACKENDS, backend_class, backends, get_backend, register_backend

__all__ = ["BACKENDS", "BackendSettings", "FailureKind", "Measurement", "StepReporter", "TrialBackend", "TrialFailed",
           "TrialStopped", "backend_class", "backends", "get_backend", "register_backend"]
