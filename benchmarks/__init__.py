"""The project's benchmarks and device measurements: scripts run with the repository root on the import path
(``PYTHONPATH=. python benchmarks/NAME.py``); they and the tests import one another as ``benchmarks.NAME``.
Not part of the installed package."""
