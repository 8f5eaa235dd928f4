"""Every use of Optuna's private API in this project, in one module, written against Optuna 5.1.0 (checked against
5.0.0 too: the same names, signatures and RDB schema). The rest of the project uses Optuna's public API only.

1. **A trial's storage id** (``Study._storage``, ``Study._study_id``, ``Trial._trial_id``): to set an attribute or
   a state on a trial no :class:`optuna.Trial` is held for (one left RUNNING by an interrupted run; a claim of the
   predicted path, :mod:`tuner.study.predicted`).
2. **Atomic state changes on an RDB storage** (:class:`ThreadSafeRDBStorage`): ``Study._pop_waiting_trial_id``
   pops a queued trial when ``set_trial_state_values(RUNNING)`` returns True; on SQLite that check-and-set is atomic
   neither between threads (two ``--parallel-trials`` threads popped one trial: "Cannot tell a PRUNED trial") nor
   between processes (SQLite ignores ``SELECT ... FOR UPDATE``), so the call holds a lock and, on a SQLite file, an
   ``flock`` of the file.
3. **A heartbeat for the journal storage** (:class:`HeartbeatJournalStorage`): ``RDBStorage`` implements
   ``optuna.storages._heartbeat.BaseHeartbeat``, ``JournalStorage`` does not; with it ``Study.optimize`` runs its
   heartbeat thread and ``fail_stale_trials`` for the journal too.
4. **Many finished trials in one transaction** (:func:`add_finished_trials`): ``RDBStorage.create_new_trial`` costs
   ~50 SQL statements (~15 ms) a trial. For schema :data:`RDB_SCHEMA_VERSION` / :data:`RDB_ALEMBIC_REVISION` the rows
   go into Optuna's tables (``optuna.storages._rdb.models``) in one session; other storages take ``Study.add_trial``.
5. **A new study file without alembic** (:func:`create_sqlite_schema`): the tables, rows and stamp ``RDBStorage``
   would write, written directly, then opened without ``_VersionManager._init_alembic`` (:class:`ThreadSafeRDBStorage`
   ``stamped``): no import of alembic nor walk of its scripts (~0.5 s).
6. **One NSGA-II generation per trial** (:func:`pin_generation`) and **whether a trial was queued**
   (:func:`is_queued`, the ``fixed_params`` system attribute): the candidate sampler draws many times in one trial,
   so the generation ``BaseGASampler.get_trial_generation`` finds on the first draw is kept on the trial
   (``_get_generation_key``).

``tests/tuner_tests/test_optuna_internals.py`` fails when any of these names, signatures or the schema change.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

#: The Optuna releases (major.minor) whose private API this module was checked against, item by item.
OPTUNA_CHECKED_RELEASES = ("5.0", "5.1")
#: ``optuna.storages._rdb.models.SCHEMA_VERSION`` and the alembic revision of that schema (Optuna 5.0.0 and 5.1.0).
RDB_SCHEMA_VERSION = 12
RDB_ALEMBIC_REVISION = "v3.2.0.a"
#: The trial system attribute :class:`HeartbeatJournalStorage` keeps a trial's last heartbeat in (seconds since the
#: epoch).
HEARTBEAT_ATTR = "tune:heartbeat"


def retry_history(trial: FrozenTrial) -> list[int]:
    """``RetryHeartbeatStaleTrialCallback.retry_history`` without its ExperimentalWarning."""
    return list(trial.system_attrs.get("retry_history", []))


def retried_trial_number(trial: FrozenTrial) -> int | None:
    """``RetryHeartbeatStaleTrialCallback.retried_trial_number`` without its ExperimentalWarning."""
    return trial.system_attrs.get("failed_trial", None)


def trial_id_of(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (``_trial_id``)."""
    return trial._trial_id


def is_queued(trial: FrozenTrial) -> bool:
    """The trial was queued with its parameters (``Study.enqueue_trial``, a heartbeat retry)."""
    return "fixed_params" in trial.system_attrs


def pin_generation(sampler: optuna.samplers.BaseSampler, study: optuna.Study, trial: FrozenTrial) -> None:
    """For a genetic sampler (NSGA-II): the trial's generation, found once and kept on ``trial`` for its next draws."""
    if isinstance(sampler, optuna.samplers.BaseGASampler):
        trial.system_attrs[sampler._get_generation_key()] = sampler.get_trial_generation(study, trial)


def set_trial_user_attr(study: optuna.Study, trial_id: int, key: str, value: Any) -> None:
    """Raises ``optuna.exceptions.UpdateFinishedTrialError`` when the trial has finished meanwhile."""
    study._storage.set_trial_user_attr(trial_id, key, value)


def set_trial_state(study: optuna.Study, trial_id: int, state: TrialState,
                    values: Sequence[float] | None = None) -> bool:
    """False if another worker changed the trial's state first; raises ``UpdateFinishedTrialError`` as above."""
    return study._storage.set_trial_state_values(trial_id, state, values)


def create_trial(study: optuna.Study, template: FrozenTrial) -> tuple[int, int]:
    """(storage id, number) of ``template`` (any state; validated as ``Study.add_trial`` does), added in one write."""
    template._validate()
    tid = study._storage.create_new_trial(study._study_id, template_trial=template)
    return tid, study._storage.get_trial_number_from_id(tid)


def local_sqlite_engine_kwargs(path: str | Path) -> dict[str, Any]:
    """SQLAlchemy engine arguments for a study's own SQLite file on a local disk: ``journal_mode=WAL`` with
    ``synchronous=NORMAL``, so a commit waits for no fsync (~11 ms); a power loss can lose the last commits, never the
    file (SQLite's "PRAGMA synchronous"). Not for a network filesystem: ``--storage`` URLs are opened as given."""
    import sqlite3

    db = str(path)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(db, timeout=60.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return {"creator": connect}


def create_sqlite_schema(path: str | Path) -> bool:
    """Create a new study file as ``RDBStorage`` leaves one (item 5): True if created; False (nothing done) if it
    exists or Optuna's schema is not :data:`RDB_SCHEMA_VERSION`."""
    import sqlalchemy
    from optuna.storages._rdb import models

    if Path(path).exists() or models.SCHEMA_VERSION != RDB_SCHEMA_VERSION:
        return False
    engine = sqlalchemy.create_engine(f"sqlite:///{path}", **local_sqlite_engine_kwargs(path))
    try:
        models.BaseModel.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.insert(models.VersionInfoModel.__table__).values(
                version_info_id=1, schema_version=models.SCHEMA_VERSION, library_version=optuna.__version__))
            conn.execute(sqlalchemy.text("CREATE TABLE alembic_version (\n\tversion_num VARCHAR(32) NOT NULL, \n\t"
                                         "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)\n)"))
            conn.execute(sqlalchemy.text("INSERT INTO alembic_version (version_num) VALUES (:v)"),
                         {"v": RDB_ALEMBIC_REVISION})
    finally:
        engine.dispose()
    return True


#: Attempts at creating Optuna's tables when workers start together on a fresh database.
SCHEMA_ATTEMPTS = 5

#: The SQLAlchemy engines of this process's :class:`ThreadSafeRDBStorage` objects (:func:`close_storages`): engines,
#: since a dropped storage can leave its engine in a cycle the collector never scans after ``gc.freeze``.
_LIVE_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def close_storages() -> None:
    """``Engine.dispose`` of every :class:`ThreadSafeRDBStorage` of this process: the last close of a WAL-mode SQLite
    file writes the log into it and removes ``-wal`` and ``-shm``. A storage stays usable."""
    for engine in list(_LIVE_ENGINES):
        engine.dispose()


class _StampedVersionManager(optuna.storages._rdb.storage._VersionManager):
    """Optuna's ``_VersionManager`` for a file :func:`create_sqlite_schema` made (its ``alembic_version`` row is
    there)."""

    def _init_alembic(self) -> None:
        return None  # Optuna's reads the row through alembic and returns when it is there


_VERSION_MANAGER_SWAP = threading.Lock()


class ThreadSafeRDBStorage(RDBStorage):
    """``RDBStorage`` whose ``set_trial_state_values`` is atomic (item 2 above). Workers started together on a fresh
    database each create Optuna's tables and all but one fail (a unique violation, a table that exists, a locked
    file): such a worker tries again, up to :data:`SCHEMA_ATTEMPTS` times. ``stamped``: a file
    :func:`create_sqlite_schema` made (item 5 above)."""

    def __init__(self, *args: Any, stamped: bool = False, **kwargs: Any) -> None:
        from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

        if stamped:
            rdb: Any = optuna.storages._rdb.storage
            with _VERSION_MANAGER_SWAP:
                own, rdb._VersionManager = rdb._VersionManager, _StampedVersionManager
                try:
                    super().__init__(*args, **kwargs)
                finally:
                    rdb._VersionManager = own
        for attempt in range(1, 0 if stamped else SCHEMA_ATTEMPTS + 1):
            try:
                super().__init__(*args, **kwargs)
                break
            except (IntegrityError, OperationalError, ProgrammingError) as e:  # a concurrent creation's table or row
                if attempt == SCHEMA_ATTEMPTS or not any(w in str(e) for w in (
                        "already exists", "duplicate key", "UniqueViolation", "UNIQUE constraint failed",
                        "database is locked")):
                    raise
                time.sleep(0.2 * attempt)
        self._state_lock = threading.Lock()
        _LIVE_ENGINES.add(self.engine)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        """``RDBStorage.set_trial_state_values`` under this process's lock, and on a SQLite file under an exclusive
        ``flock`` of the file (the other processes' calls wait for it)."""
        import fcntl
        import os

        with self._state_lock:
            url = str(self.url)
            path = url[len("sqlite:///"):].split("?", 1)[0] if url.startswith("sqlite:///") else ""
            fd = os.open(path, os.O_RDONLY) if path and path != ":memory:" and os.path.isfile(path) else None
            try:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                return super().set_trial_state_values(trial_id, state, values)
            finally:
                if fd is not None:
                    os.close(fd)  # drops the flock

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state.pop("_state_lock", None)
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._state_lock = threading.Lock()
        _LIVE_ENGINES.add(self.engine)


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """Optuna's ``JournalStorage`` with Optuna's heartbeat (item 3 above), arguments as ``RDBStorage``'s: the writer's
    clock in the trial's system attribute :data:`HEARTBEAT_ATTR`; a RUNNING trial is stale when the checking worker's
    clock is ``grace_period`` (default twice the interval) seconds past it (the workers' clocks must agree)."""

    def __init__(self, log_storage: Any, *, heartbeat_interval: int, grace_period: int | None = None,
                 heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> None:
        super().__init__(log_storage)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.heartbeat_stale_trial_callback = heartbeat_stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        """Write this worker's clock as the trial's last heartbeat (a finished trial is left alone)."""
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # finished (or failed as stale by another worker) meanwhile

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        grace = self.grace_period if self.grace_period is not None else 2 * self.heartbeat_interval
        now = time.time()
        return [
            t._trial_id
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            if isinstance(t.system_attrs.get(HEARTBEAT_ATTR), (int, float))
            and now - t.system_attrs[HEARTBEAT_ATTR] > grace
        ]

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self.heartbeat_stale_trial_callback


_schema_checked: dict[int, bool] = {}
_schema_lock = threading.Lock()


def _alembic_revision(backend: RDBStorage) -> str | None:
    """The revision alembic stamped the database with (its ``alembic_version`` row, as alembic's
    ``MigrationContext.get_current_revision`` reads it, without importing alembic); None without one row."""
    import sqlalchemy

    with backend.engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalars().all()
    return str(rows[0]) if len(rows) == 1 else None


def _bulk_backend(study: optuna.Study) -> RDBStorage | None:
    """The study's RDB storage if its tables are of the schema :func:`add_finished_trials` writes, else None."""
    from optuna.storages import _CachedStorage
    from optuna.storages._rdb import models

    storage = study._storage
    backend = storage._backend if isinstance(storage, _CachedStorage) else storage
    if not isinstance(backend, RDBStorage) or models.SCHEMA_VERSION != RDB_SCHEMA_VERSION:
        return None
    with _schema_lock:
        ok = _schema_checked.get(id(backend))
        if ok is None:
            try:
                ok = _alembic_revision(backend) == RDB_ALEMBIC_REVISION
            except Exception:  # noqa: BLE001 - any doubt about the schema: the public path
                ok = False
            _schema_checked[id(backend)] = ok
    return backend if ok else None


def add_finished_trials(study: optuna.Study, trials: Sequence[FrozenTrial]) -> int:
    """Add finished trials (no intermediate values) to the study, numbered in order: on an RDB storage of the pinned
    schema in one transaction, else by ``Study.add_trial`` each (item 4). Returns the transactions written. Raises
    ValueError as ``Study.add_trial`` does (an unfinished or invalid trial, a parameter distribution the study's earlier
    trials contradict)."""
    if not trials:
        return 0
    for t in trials:
        if not t.state.is_finished() or t.intermediate_values:
            raise ValueError("add_finished_trials takes finished trials without intermediate values, got "
                             f"{t.state.name}")
        t._validate()
    backend = _bulk_backend(study)
    if backend is None:
        for t in trials:
            study.add_trial(t)
        return len(trials)
    import sqlalchemy
    from optuna import distributions as dists
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    directions = len(study.directions)
    with _create_scoped_session(backend.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study._study_id, session, for_update=True)
        number = session.query(models.TrialModel).filter(models.TrialModel.study_id == study._study_id).count()
        known: dict[str, Any] = {}
        for name in {n for t in trials for n in t.params}:
            prev = (session.query(models.TrialParamModel).join(models.TrialModel)
                    .filter(models.TrialModel.study_id == study._study_id)
                    .filter(models.TrialParamModel.param_name == name).first())
            if prev is not None:
                known[name] = dists.json_to_distribution(prev.distribution_json)
        for t in trials:
            if t.values is not None and len(t.values) != directions:
                raise ValueError(f"a trial has {len(t.values)} values; the study has {directions} objectives")
            for name, dist in t.distributions.items():
                if name in known:
                    dists.check_distribution_compatibility(known[name], dist)
                known[name] = dist
        # rows of Optuna's tables, inserted as SQLAlchemy Core statements: the ORM's unit of work took ~6x longer
        add_trial = sqlalchemy.insert(models.TrialModel.__table__)
        params: list[dict[str, Any]] = []
        values: list[dict[str, Any]] = []
        user: list[dict[str, Any]] = []
        system: list[dict[str, Any]] = []
        conn = session.connection()
        for t in trials:
            key = conn.execute(add_trial, {"study_id": study._study_id, "number": number, "state": t.state,
                                           "datetime_start": t.datetime_start,
                                           "datetime_complete": t.datetime_complete}).inserted_primary_key
            assert key is not None  # an INSERT of one row
            tid = key[0]
            number += 1
            params.extend({"trial_id": tid, "param_name": name,
                           "param_value": t.distributions[name].to_internal_repr(value),
                           "distribution_json": dists.distribution_to_json(t.distributions[name])}
                          for name, value in t.params.items())
            for objective, value in enumerate(t.values or ()):
                stored, kind = models.TrialValueModel.value_to_stored_repr(value)
                values.append({"trial_id": tid, "objective": objective, "value": stored, "value_type": kind})
            user.extend({"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in t.user_attrs.items())
            system.extend({"trial_id": tid, "key": k, "value_json": json.dumps(v)} for k, v in t.system_attrs.items())
        for model, rows in ((models.TrialParamModel, params), (models.TrialValueModel, values),
                            (models.TrialUserAttributeModel, user), (models.TrialSystemAttributeModel, system)):
            if rows:
                conn.execute(sqlalchemy.insert(model.__table__), rows)
    return 1
