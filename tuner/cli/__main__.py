"""``python -m tuner.cli``: the ``tune`` command line."""

from tuner.cli import main

main()
