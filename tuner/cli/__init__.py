"""The ``tune`` command line (typer + rich), one ``typer.Typer`` per area, composed here.

* the main job, ``tune --model M --gpus G`` (:mod:`tuner.cli.main_job`, the root callback);
* one layout: ``estimate``, ``check`` (:mod:`tuner.cli.estimate`);
* a study: ``pareto``, ``export`` (:mod:`tuner.cli.studies`);
* where a step goes: ``timeline``, ``report`` (:mod:`tuner.cli.timeline`);
* the cost model against measurements: ``validate``, ``calibrate`` (:mod:`tuner.cli.fit`);
* numerics: ``verify`` (:mod:`tuner.cli.verify_cmd`);
* the catalogue: ``models``, ``gpus`` (:mod:`tuner.cli.catalogue`).
* RL post-training: ``rl`` (:mod:`rl.cli`, mounted as ``tune rl``, imported only when it runs).

Each area is imported when one of its commands runs or ``tune --help`` lists them (:class:`TuneGroup`), so the main
job does not build the other commands' options.

The areas share :mod:`tuner.cli._common` (consoles, the error boundary, study loading, option
aliases) and :mod:`tuner.cli._layout` (the layout options); none imports this package's
``__init__``. Errors: :class:`tuner.cli._common.TuneGroup` is the one boundary; a user error
(:class:`TunerError`) or a usage error prints one red line on stderr and exits 2, and
``--debug`` (anywhere on the line) or ``TUNE_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import gc
import sys

import typer

from tuner.cli._common import TuneGroup
from tuner.cli.main_job import main_job

__all__ = ["app", "main"]


class _Tune(TuneGroup):
    areas = {"tuner.cli.estimate:app": ("estimate", "check"), "tuner.cli.studies:app": ("pareto", "export"),
             "tuner.cli.timeline:app": ("timeline", "report"), "tuner.cli.fit:app": ("validate", "calibrate"),
             "tuner.cli.verify_cmd:app": ("verify",), "tuner.cli.catalogue:app": ("models", "gpus")}
    lazy = {"rl": "rl.cli:rl_app"}


app = typer.Typer(
    name="tune",
    cls=_Tune,
    help="Parallel-layout tuner for Megatron-core training: predicts, searches and exports the fastest layout that "
    "fits.",
    add_completion=False,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
)
app.callback(invoke_without_command=True)(main_job)


def main() -> None:
    """Console entry point (``tune``): run the app; it exits with the command's code (2 for a user error).

    What the imports built lives as long as the process: ``gc.freeze`` keeps it out of the collector's scans. At the
    end the study databases are closed (:func:`tuner.study._optuna.close_storages`) and everything is frozen, so the
    collection at exit has nothing to scan (0.1-0.3 s of the main job; ``docs/benchmarks.md``)."""
    gc.freeze()
    try:
        app()
    finally:
        if "tuner.study._optuna" in sys.modules:
            sys.modules["tuner.study._optuna"].close_storages()
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover - python -m tuner.cli runs __main__.py
    main()
