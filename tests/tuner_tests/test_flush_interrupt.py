"""A Ctrl-C that lands while the predicted trials are being written: the write finishes, the buffer is cleared with it,
and the interrupt is raised afterwards (so "finished trials are kept in the study" stays true)."""

from __future__ import annotations

import os
import signal

import pytest

from tuner.study import predicted


@pytest.fixture(autouse=True)
def python_sigint():
    """Python's own Ctrl-C handler for the test (a background run, e.g. under nohup, starts with SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_is_held_until_the_block_ends():
    ran_after_kill = []
    with pytest.raises(KeyboardInterrupt):
        with predicted._sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            ran_after_kill.append(True)
    assert ran_after_kill == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_interrupt_no_exception():
    with predicted._sigint_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with predicted._sigint_deferred():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_flush_interrupted_mid_write_keeps_the_batch(monkeypatch):
    written: list[list[object]] = []

    def add(study, batch):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives during the transaction
        written.append(list(batch))
        return 1

    monkeypatch.setattr(predicted._optuna, "add_finished_trials", add)
    buf = object.__new__(predicted.PredictedTrials)  # only the buffer's fields matter to flush()
    buf.pending, buf._next_number, buf.writes, buf.study = ["t1", "t2"], 5, 0, None
    with pytest.raises(KeyboardInterrupt):
        buf.flush()
    assert written == [["t1", "t2"]] and buf.pending == [] and buf._next_number == 7 and buf.writes == 1
