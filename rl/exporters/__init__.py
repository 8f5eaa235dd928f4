"""The RL export formats, registered in :mod:`launch.exporters` on import: ``nemo-rl`` (``nemo_rl_grpo.yaml``,
:class:`NemoRLRecipeExporter`, validated against ``rl/schema/nemo_rl_grpo.schema.json``) and ``slime-rl``
(``run_slime_rl.sh``, :class:`SlimeRLExporter`). They render :func:`plan_context` (``tune rl --out DIR``) and refuse a
training layout's context."""

from __future__ import annotations

from launch.exporters import register_exporter
from rl.exporters._describe import plan_context
from rl.exporters._nemo_rl import NemoRLRecipeExporter, nemo_rl_config, nemo_rl_schema, render_nemo_rl_yaml
from rl.exporters._slime_rl import SlimeRLExporter, render_slime_script, slime_rl_args

__all__ = [
    "NemoRLRecipeExporter", "SlimeRLExporter", "nemo_rl_config", "nemo_rl_schema", "plan_context",
    "render_nemo_rl_yaml", "render_slime_script", "slime_rl_args",
]

register_exporter(NemoRLRecipeExporter())
register_exporter(SlimeRLExporter())
