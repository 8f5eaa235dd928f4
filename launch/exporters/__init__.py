"""Export formats: each an :class:`Exporter` that renders one layout of one study (or one `tune rl` plan) as one file.

``tune export --format NAME`` and the files ``tune`` writes for its best layout
(:func:`tuner.report.export_files`) both come from this registry, in registration order:

* ``recipe``: ``recipe.yaml`` (:class:`RecipeExporter`, the seed recipe's format, validated
  against ``launch/schema/recipe.schema.json``);
* ``slime``: ``run_slime.sh`` (:class:`SlimeScriptExporter`, executable);
* ``megatron``: ``megatron_args.sh`` (:class:`MegatronArgsExporter`, ``source`` it);
* ``nemo-rl``: ``nemo_rl_grpo.yaml`` (:class:`NemoRLRecipeExporter`, an RL plan as a NeMo-RL GRPO recipe);
* ``slime-rl``: ``run_slime_rl.sh`` (:class:`SlimeRLExporter`, an RL plan as a slime launch, executable).

The two RL formats render an :class:`ExportContext` built by :meth:`ExportContext.for_rl_plan`
(``tune rl --out DIR``); they are not main-job formats, and refuse a training layout's context.

Adding a format: write one module with an
:class:`Exporter` subclass (``name``, ``file_name``, ``description``, ``executable``, ``main_job``
and ``render(context) -> str``) and add one :func:`register_exporter` line below.
The flag builders shared by the formats are in :mod:`launch.exporters._flags`.
"""

from __future__ import annotations

from launch.exporters._base import ExportContext, Exporter
from launch.exporters._megatron import MegatronArgsExporter, megatron_args_script
from launch.exporters._nemo_rl import NemoRLRecipeExporter, nemo_rl_config, nemo_rl_schema, render_nemo_rl_yaml
from launch.exporters._recipe import RecipeExporter, dump_recipe, measurement_from_row, recipe_dict, recipe_schema, validate_recipe, write_recipe
from launch.exporters._registry import exporter_names, exporters, get_exporter, main_job_exporters, register_exporter
from launch.exporters._slime import SLIME_SCRIPT_ENV, SlimeScriptExporter, slime_script
from launch.exporters._slime_rl import SlimeRLExporter, render_slime_script, slime_rl_args

__all__ = [
    "ExportContext",
    "Exporter",
    "MegatronArgsExporter",
    "NemoRLRecipeExporter",
    "RecipeExporter",
    "SLIME_SCRIPT_ENV",
    "SlimeRLExporter",
    "SlimeScriptExporter",
    "dump_recipe",
    "exporter_names",
    "exporters",
    "get_exporter",
    "main_job_exporters",
    "measurement_from_row",
    "megatron_args_script",
    "nemo_rl_config",
    "nemo_rl_schema",
    "recipe_dict",
    "recipe_schema",
    "register_exporter",
    "render_nemo_rl_yaml",
    "render_slime_script",
    "slime_rl_args",
    "slime_script",
    "validate_recipe",
    "write_recipe",
]

register_exporter(RecipeExporter())
register_exporter(SlimeScriptExporter())
register_exporter(MegatronArgsExporter())
register_exporter(NemoRLRecipeExporter())
register_exporter(SlimeRLExporter())
