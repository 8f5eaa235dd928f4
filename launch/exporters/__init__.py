"""Export formats: each an :class:`Exporter` that renders one layout of one study (or one `tune rl` plan) as one file.

``tune export --format NAME`` and the files ``tune`` writes for its best layout
(:func:`tuner.report.export_files`) both come from this registry, in registration order:

* ``recipe``: ``recipe.yaml`` (:class:`RecipeExporter`, the seed recipe's format, validated
  against ``launch/schema/recipe.schema.json``);
* ``slime``: ``run_slime.sh`` (:class:`SlimeScriptExporter`, executable);
* ``megatron``: ``megatron_args.sh`` (:class:`MegatronArgsExporter`, ``source`` it);
* ``bridge``: ``megatron_bridge.yaml`` (:class:`BridgeExporter`, Megatron-Bridge's keys; written by ``tune`` when
  ``--from`` is a Megatron-Bridge YAML).

The RL formats (``nemo-rl``, ``slime-rl``) live in :mod:`rl.exporters`, which registers them here
after these three when it is imported (``tune rl`` and ``tune export`` import it).

Adding a format: write one module with an
:class:`Exporter` subclass (``name``, ``file_name``, ``description``, ``executable``, ``main_job``
and ``render(context) -> str``) and add one :func:`register_exporter` line below.
The flag builders shared by the formats are in :mod:`launch.exporters._flags`.
"""

from __future__ import annotations

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._bridge import BridgeExporter, bridge_yaml
from launch.exporters._megatron import MegatronArgsExporter, megatron_args_script
from launch.exporters._recipe import RecipeExporter, dump_recipe, measurement_from_row, recipe_dict, recipe_schema, validate_recipe, write_recipe
from launch.exporters._registry import exporter_names, exporters, get_exporter, main_job_exporters, register_exporter
from launch.exporters._slime import SLIME_SCRIPT_ENV, SlimeScriptExporter, slime_script

__all__ = [
    "BridgeExporter",
    "ExportContext",
    "Exporter",
    "MegatronArgsExporter",
    "RecipeExporter",
    "SLIME_SCRIPT_ENV",
    "SlimeScriptExporter",
    "dump_recipe",
    "bridge_yaml",
    "exporter_names",
    "exporters",
    "get_exporter",
    "main_job_exporters",
    "measurement_from_row",
    "megatron_args_script",
    "recipe_dict",
    "recipe_schema",
    "register_exporter",
    "slime_script",
    "validate_recipe",
    "write_recipe",
]

register_exporter(RecipeExporter())
register_exporter(SlimeScriptExporter())
register_exporter(MegatronArgsExporter())
register_exporter(BridgeExporter())
