"""Export formats: each an :class:`Exporter` rendering one layout (or one ``tune rl`` plan) as one file.

``tune export --format NAME`` and the files ``tune`` writes come from this registry, in registration order; the RL
formats register from :mod:`rl.exporters`. A new format: one :class:`Exporter` subclass and one entry in the
:func:`register_exporter` loop below."""

from __future__ import annotations

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._bridge import BridgeExporter, bridge_left_out, bridge_yaml
from launch.exporters._megatron import MegatronArgsExporter, megatron_args_script
from launch.exporters._recipe import (
    RecipeExporter,
    dump_recipe,
    recipe_dict,
    recipe_schema,
    validate_recipe,
)
from launch.exporters._registry import exporter_names, exporters, get_exporter, main_job_exporters, register_exporter
from launch.exporters._slime import SLIME_SCRIPT_ENV, SlimeScriptExporter, slime_script

__all__ = ["BridgeExporter", "ExportContext", "Exporter", "MegatronArgsExporter", "RecipeExporter", "SLIME_SCRIPT_ENV",
           "SlimeScriptExporter", "bridge_left_out", "dump_recipe", "bridge_yaml", "exporter_names", "exporters",
           "get_exporter", "main_job_exporters", "megatron_args_script", "recipe_dict",
           "recipe_schema", "register_exporter", "slime_script", "validate_recipe"]

for _format in (RecipeExporter(), SlimeScriptExporter(), MegatronArgsExporter(), BridgeExporter()):
    register_exporter(_format)
