from __future__ import annotations

import os

import pytest

# Piped output takes its width from COLUMNS (rich's default); the CLI tests read whole lines, so they run wide. The
# tests of the 80- and 120-column layouts set the console's width themselves.
os.environ["COLUMNS"] = "200"

from specs import Workload, load_model, parse_gpus
from specs.console import err
from specs.layout import Layout

# An error wraps at the terminal's width under its first word; the tests read its message whole.
err.width = 100_000


@pytest.fixture
def terminal(monkeypatch):
    """``terminal(width)`` sets the command line's consoles to ``width`` columns (as ``COLUMNS`` does when the output
    is piped) and returns a check of an output at that width: no line wider, none ending in a space (unless
    ``padded``: typer's ``--help`` panels pad theirs), no cell cut (no ``…``); it returns the output's lines."""

    def at(width: int):
        from tuner.cli._common import err, out

        for console in (out, err):
            monkeypatch.setattr(console, "width", width)
        monkeypatch.setenv("COLUMNS", str(width))  # typer's --help makes its console at each call

        def check(text: str, *, padded: bool = False) -> list[str]:
            lines = text.splitlines()
            assert max(map(len, lines)) <= width, "\n".join(ln for ln in lines if len(ln) > width)
            ragged = [repr(ln) for ln in lines if ln != ln.rstrip()]
            assert padded or not ragged, "\n".join(ragged)
            assert "…" not in text, "\n".join(ln for ln in lines if "…" in ln)
            return lines

        return check

    return at


@pytest.fixture(scope="session")
def minimax():
    return load_model("MiniMax-M2")


@pytest.fixture(scope="session")
def h200x64():
    return parse_gpus("64xH200")


@pytest.fixture(scope="session")
def seed_workload():
    return Workload(seq_length=8192, global_batch_size=128)


@pytest.fixture(scope="session")
def seed_tuned() -> Layout:
    """seeds/001: TP1 PP8 VPP4 EP8 ETP1 DP8, full uniform 1, precision-aware distopt, no offload, alltoall, 7/7."""
    return Layout(
        world_size=64, tp=1, pp=8, vpp=4, ep=8, etp=1, micro_batch_size=1, recompute_granularity="full",
        recompute_method="uniform", recompute_num_layers=1, num_layers_in_first_pipeline_stage=7,
        num_layers_in_last_pipeline_stage=7,
    )


@pytest.fixture(scope="session")
def seed_reference() -> Layout:
    """seeds/001 reference port: TP2 SP PP2 EP8 ETP1, full uniform 1, optimizer offload 1.0 (overlapped),
    precision-aware."""
    return Layout(
        world_size=64, tp=2, sequence_parallel=True, pp=2, ep=8, etp=1, micro_batch_size=1,
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
        optimizer_offload_fraction=1.0, overlap_cpu_optimizer_d2h_h2d=True,
    )
