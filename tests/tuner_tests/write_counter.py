"""Counts what reaches an Optuna RDB storage (tests and benchmarks/bench_main_job.py have one each):

* ``calls``: calls of ``RDBStorage``'s write methods, by name (each is one transaction);
* ``transactions``: SQL transactions that wrote (INSERT / UPDATE / DELETE) and committed, however they were made
  (Optuna's storage methods, or ``tuner.study._optuna.add_finished_trials``'s one transaction for many trials).
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Iterator

from optuna.storages import RDBStorage
from sqlalchemy import event
from sqlalchemy.engine import Engine

#: RDBStorage's write methods; a trial is created and a parameter set through the private ``_create_new_trial`` and
#: ``_set_trial_param`` (what the public ``create_new_trial`` / ``set_trial_param`` and Optuna's ``_CachedStorage``
#: call).
WRITE_METHODS = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "_create_new_trial",
    "_set_trial_param", "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
    "set_trial_system_attr", "record_heartbeat",
)


class StorageWrites:
    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.transactions = 0
        self._dirty: set[int] = set()

    @property
    def n_calls(self) -> int:
        return sum(self.calls.values())

    def _statement(self, conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if statement.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
            self._dirty.add(id(conn))

    def _commit(self, conn) -> None:  # noqa: ANN001
        if id(conn) in self._dirty:
            self._dirty.discard(id(conn))
            self.transactions += 1

    def _rollback(self, conn) -> None:  # noqa: ANN001
        self._dirty.discard(id(conn))


@contextlib.contextmanager
def count_storage_writes() -> Iterator[StorageWrites]:
    """Count every write to any RDB storage while the block runs."""
    w = StorageWrites()
    originals = {name: RDBStorage.__dict__[name] for name in WRITE_METHODS if name in RDBStorage.__dict__}

    def counted(name, f):  # noqa: ANN001, ANN202
        @functools.wraps(f)
        def g(self, *a, **k):  # noqa: ANN001, ANN202
            w.calls[name] += 1
            return f(self, *a, **k)

        return g

    for name, f in originals.items():
        setattr(RDBStorage, name, counted(name, f))
    event.listen(Engine, "before_cursor_execute", w._statement)
    event.listen(Engine, "commit", w._commit)
    event.listen(Engine, "rollback", w._rollback)
    try:
        yield w
    finally:
        for name, f in originals.items():
            setattr(RDBStorage, name, f)
        event.remove(Engine, "before_cursor_execute", w._statement)
        event.remove(Engine, "commit", w._commit)
        event.remove(Engine, "rollback", w._rollback)
