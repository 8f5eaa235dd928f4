"""The ``tune`` command line (typer + rich): one ``typer.Typer`` per area, composed here.

The main job (:mod:`~tuner.cli.main_job`, the root callback); ``estimate``, ``check`` (:mod:`~tuner.cli.estimate`);
``pareto``, ``export`` (:mod:`~tuner.cli.studies`); ``timeline``, ``report`` (:mod:`~tuner.cli.timeline`);
``validate``, ``calibrate`` (:mod:`~tuner.cli.fit`); ``verify`` (:mod:`~tuner.cli.verify_cmd`); ``models``, ``gpus``
(:mod:`~tuner.cli.catalogue`); ``rl`` (:mod:`rl.cli`). An area is imported only when one of its commands runs or
``tune --help`` lists them (:class:`~tuner.cli._common.TuneGroup`, also the one error boundary).
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
