"""The exporter interface: an :class:`Exporter` renders one :class:`ExportContext` as the text of one file."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from specs import Cluster, ModelSpec, RunOptions, Workload
from specs.files import write_output
from specs.layout import Layout

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cost_model.types import Estimate
    from launch.base import Measurement

__all__ = ["ExportContext", "Exporter"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportContext:
    """Everything an exporter may need about one layout of one study."""

    model: ModelSpec
    cluster: Cluster  # the GPUs: its count must be ``layout.world_size``
    workload: Workload
    layout: Layout
    study: str = ""  # name of the study that chose the layout ("" when none)
    estimate: Estimate | None = None
    """The cost model's estimate of ``layout`` (the recipe's ``prediction`` block), or None."""
    measurement: Measurement | None = None
    """A trial's measurement of ``layout`` (``source == "measured"`` makes a recipe ``measured``), or None."""
    correctness: Mapping[str, Any] | None = None
    """The ``correctness`` block of ``tune verify`` (:func:`tuner.verify.correctness.correctness_block`), or None (not
    run)."""
    notes: tuple[str, ...] = ()
    """More notes for formats that carry notes (the recipe), e.g. the measured trials within noise of this one."""
    rl_plan: object | None = None
    """An RL post-training plan (:class:`rl.plan.RLPlan`, ``tune rl --out``; built by
    :func:`rl.exporters.plan_context`): what the RL formats (``nemo-rl``, ``slime-rl``) render; None for a
    training layout. ``layout`` is then the plan's trainer layout."""
    rl_job: object | None = None
    """The RL job (:class:`rl.plan.RLJob`) ``rl_plan`` was predicted for (model, cluster, lengths, batch)."""
    options: RunOptions | None = None
    """The run options the layout was estimated with (None: the default stack's); the commands write them."""
    stack: str = ""  # the stack preset of :attr:`options` (:mod:`specs.stacks`; "" when none was named)
    user_args: tuple[str, ...] = ()
    """The user's own launch arguments the commands keep (``tune --from``: those without effect or not understood)."""
    bridge_yaml: str = ""
    """The text of the user's Megatron-Bridge YAML (``tune --from``), which the ``bridge`` format writes the layout
    into; "" when the launch was none."""


class Exporter(abc.ABC):
    """One export format: a ``--format`` name, a file name and a renderer; register an instance in
    ``launch/exporters/__init__.py``."""

    name: ClassVar[str]  # ``--format`` value, e.g. ``"recipe"``
    file_name: ClassVar[str]  # file the main job writes under ``results/<study>/``, e.g. ``"recipe.yaml"``
    description: ClassVar[str]  # one line for ``--help``
    executable: ClassVar[bool] = False  # whether the file is a program (written with mode 0o755)
    trains_every_weight: ClassVar[bool] = False
    """Whether the file's launch has no LoRA arguments, so that with ``--task lora`` it trains every weight."""
    main_job: ClassVar[bool] = True
    """Whether ``tune`` writes this file for its best layout (False: only ``tune export --format``)."""

    def in_main_job(self, context: ExportContext) -> bool:
        """Whether ``tune`` writes this file for ``context``'s best layout (default: :attr:`main_job`)."""
        return self.main_job

    @abc.abstractmethod
    def render(self, context: ExportContext) -> str:
        """The file's text for ``context``.

        Raises:
            TunerError: the layout cannot be written in this format, or fails the format's checks.
        """

    def write(self, context: ExportContext, path: Path, *, force: bool = False) -> Path:
        """Render ``context`` and :meth:`save` it to ``path`` (nothing written on error)."""
        return self.save(self.render(context), path, force=force)

    def save(self, text: str, path: Path, *, force: bool = False) -> Path:
        """Write ``text`` atomically (mode 0o755 when :attr:`executable`; a link there only with ``force``).

        Raises:
            TunerError: as :func:`specs.files.write_output`.
        """
        return write_output(path, text, force=force, executable=self.executable)
