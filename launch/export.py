"""Export a layout as something a person can run: flags, scripts and a recipe YAML.

The code lives in :mod:`launch.exporters` (one module per format, a registry of formats, and
the flag builders in :mod:`launch.exporters._flags`); this module keeps the names other code
imports (``from launch.export import layout_args, model_args, validate_recipe, ...``).
"""

from __future__ import annotations

from launch.exporters import (
    dump_recipe,
    measurement_from_row,
    megatron_args_script,
    recipe_dict,
    recipe_schema,
    slime_script,
    validate_recipe,
    write_recipe,
)
from launch.exporters._flags import (
    MISC_ARGS,
    OPTIMIZER_HPARAMS,
    SEED_ENV,
    _pipeline_layout_string,
    layout_args,
    megatron_args,
    model_args,
    model_for_release,
)

__all__ = ["SEED_ENV", "OPTIMIZER_HPARAMS", "MISC_ARGS", "model_args", "model_for_release", "layout_args",
           "megatron_args", "megatron_args_script", "slime_script", "recipe_dict", "dump_recipe", "write_recipe",
           "validate_recipe", "recipe_schema", "measurement_from_row", "_pipeline_layout_string"]
