"""The Optuna private API that tuner/study/_optuna.py is written against (Optuna 5.1.0, checked against 5.0.0): these
tests fail when a
name, a signature, a behaviour or the RDB schema it relies on changes, so an Optuna upgrade is checked here first."""

from __future__ import annotations

import datetime
import inspect
import time

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState, create_trial

from tuner.study import _optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_written_against_this_optuna_release():
    assert ".".join(optuna.__version__.split(".")[:2]) in _optuna.OPTUNA_CHECKED_RELEASES, (
        f"tuner/study/_optuna.py was checked against Optuna {', '.join(_optuna.OPTUNA_CHECKED_RELEASES)}; "
        f"{optuna.__version__} "
        "is installed: check every item of its docstring, then add the release to OPTUNA_CHECKED_RELEASES"
    )


def test_the_private_names_used_exist():
    study = optuna.create_study(directions=["maximize", "minimize"])
    trial = study.ask()
    assert isinstance(study._storage, optuna.storages.BaseStorage) and isinstance(study._study_id, int)
    assert isinstance(trial._trial_id, int) and _optuna.trial_id_of(trial) == trial._trial_id
    frozen = study.tell(trial, [1.0, 2.0])
    assert frozen._trial_id == trial._trial_id and callable(frozen._validate)
    # the storage methods the module calls by id, with their parameters
    for name, params in [
        ("set_trial_user_attr", ["trial_id", "key", "value"]),
        ("set_trial_state_values", ["trial_id", "state", "values"]),
        ("create_new_trial", ["study_id", "template_trial"]), ("get_trial_number_from_id", ["trial_id"]),
        ("set_trial_system_attr", ["trial_id", "key", "value"]),
    ]:
        assert list(inspect.signature(getattr(optuna.storages.BaseStorage, name)).parameters)[1:] == params, name


def test_popping_a_queued_trial_relies_on_the_state_change():
    """ThreadSafeRDBStorage locks set_trial_state_values because Study._pop_waiting_trial_id takes a queued trial by
    it."""
    src = inspect.getsource(optuna.study.Study._pop_waiting_trial_id)
    assert "set_trial_state_values" in src and "TrialState.RUNNING" in src
    assert "set_trial_state_values" in _optuna.ThreadSafeRDBStorage.__dict__


def test_the_heartbeat_interface_and_where_optimize_uses_it():
    assert set(BaseHeartbeat.__abstractmethods__) == {
        "record_heartbeat",
        "_get_stale_trial_ids",
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
    }
    assert not issubclass(JournalStorage, BaseHeartbeat), (
        "Optuna's journal storage has a heartbeat now: use it instead of ours"
    )
    src = inspect.getsource(optuna.study._optimize._run_trial)
    assert "fail_stale_trials" in src and "get_heartbeat_thread" in src
    assert list(inspect.signature(RDBStorage.__init__).parameters)[1:] == [
        "url", "engine_kwargs", "skip_compatibility_check", "heartbeat_interval", "grace_period",
        "heartbeat_stale_trial_callback", "failed_trial_callback", "skip_table_creation",
    ]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_the_journal_heartbeat_fails_a_stale_trial_and_retries_it(tmp_path):
    failed = []
    storage = _optuna.HeartbeatJournalStorage(
        JournalFileBackend(str(tmp_path / "j.log")),
        heartbeat_interval=1,
        grace_period=5,
        heartbeat_stale_trial_callback=lambda st, t: failed.append(t.number),
    )
    assert is_heartbeat_enabled(storage)
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"])
    dist = {"tp": CategoricalDistribution(["1", "2"])}
    tid, number = _optuna.create_trial(
        study, create_trial(state=TrialState.RUNNING, params={"tp": "2"}, distributions=dist)
    )
    storage.record_heartbeat(tid)
    optuna.storages.fail_stale_trials(study)
    assert study.trials[number].state == TrialState.RUNNING and not failed  # beating
    storage.set_trial_system_attr(tid, _optuna.HEARTBEAT_ATTR, time.time() - 10)  # last beat 10 s ago (grace 5 s)
    other = _optuna.HeartbeatJournalStorage(
        JournalFileBackend(str(tmp_path / "j.log")), heartbeat_interval=1, grace_period=5
    )
    assert other._get_stale_trial_ids(study._study_id) == [tid]  # another worker sees it from the journal
    optuna.storages.fail_stale_trials(study)
    assert study.trials[number].state == TrialState.FAIL and failed == [number]
    storage.record_heartbeat(tid)  # a late beat of the dead trial's thread is ignored, not an error


def test_the_retry_callback_attributes():
    """records.retried_numbers and the retry's record read Optuna's retry attributes without its ExperimentalWarning."""
    study = optuna.create_study()
    dist = {"tp": CategoricalDistribution(["1", "2"])}
    study.add_trial(
        create_trial(state=TrialState.FAIL, params={"tp": "2"}, distributions=dist, user_attrs={"key": "k"})
    )
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        cb = RetryHeartbeatStaleTrialCallback(max_retry=2)
    cb(study, study.trials[0])
    retry = study.trials[1]
    assert retry.state == TrialState.WAITING and retry.user_attrs == {"key": "k"} and retry.params == {"tp": "2"}
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        assert RetryHeartbeatStaleTrialCallback.retry_history(retry) == _optuna.retry_history(retry) == [0]
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        assert RetryHeartbeatStaleTrialCallback.retried_trial_number(retry) == _optuna.retried_trial_number(retry) == 0


def test_the_rdb_schema_the_bulk_writer_writes(tmp_path):
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    assert models.SCHEMA_VERSION == _optuna.RDB_SCHEMA_VERSION
    storage = RDBStorage(f"sqlite:///{tmp_path / 'a.db'}")
    assert (
        storage._version_manager.get_head_version()
        == storage._version_manager.get_current_version()
        == _optuna.RDB_ALEMBIC_REVISION
    )
    assert list(inspect.signature(_create_scoped_session).parameters) == ["scoped_session", "ignore_integrity_error"]
    rels = set(models.TrialModel.__mapper__.relationships.keys())
    assert {"params", "values", "user_attributes", "system_attributes", "intermediate_values", "study"} <= rels
    cols = {
        m.__tablename__: set(m.__table__.columns.keys())
        for m in (
            models.TrialModel, models.TrialParamModel, models.TrialValueModel, models.TrialUserAttributeModel,
            models.TrialSystemAttributeModel,
        )
    }
    assert cols == {
        "trials": {"trial_id", "number", "study_id", "state", "datetime_start", "datetime_complete"},
        "trial_params": {"param_id", "trial_id", "param_name", "param_value", "distribution_json"},
        "trial_values": {"trial_value_id", "trial_id", "objective", "value", "value_type"},
        "trial_user_attributes": {"trial_user_attribute_id", "trial_id", "key", "value_json"},
        "trial_system_attributes": {"trial_system_attribute_id", "trial_id", "key", "value_json"},
    }


def _templates(n: int) -> list[optuna.trial.FrozenTrial]:
    dist = {
        "tp": CategoricalDistribution(["1", "2", "4"]),
        "dispatcher": CategoricalDistribution(["alltoall", "flex+deepep"]),
    }
    t0 = datetime.datetime(2026, 12, 1, 10, 0, 0, 123456)
    out = []
    for i in range(n):
        state = [TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED][i % 3]
        t = create_trial(
            state=state,
            values=[1000.0 + i, float("inf") if i == 3 else 40.5] if state == TrialState.COMPLETE else None,
            params={"tp": ["1", "2", "4"][i % 3], "dispatcher": "alltoall"},
            distributions=dist,
            user_attrs={"key": f"k{i}", "result": {"layout": {"tp": i}, "step_time_s": 1.5, "nan": float("nan")}},
            system_attrs={"NSGAIISampler:generation": 0},
        )
        t.datetime_start = t0 + datetime.timedelta(seconds=i)
        t.datetime_complete = t.datetime_start + datetime.timedelta(milliseconds=5)
        out.append(t)
    return out


def _same(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial) -> bool:
    def norm(d):
        return {k: (str(v) if v != v else v) for k, v in d.items()} if isinstance(d, dict) else d

    return (
        a.number, a.state, a.values, a.params, a.distributions, a.system_attrs, a.datetime_start, a.datetime_complete,
    ) == (
        b.number, b.state, b.values, b.params, b.distributions, b.system_attrs, b.datetime_start, b.datetime_complete,
    ) and {k: norm(v) for k, v in a.user_attrs.items()} == {k: norm(v) for k, v in b.user_attrs.items()}


def test_bulk_written_trials_read_back_as_add_trial_writes_them(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    bulk = optuna.create_study(study_name="bulk", storage=url, directions=["maximize", "minimize"])
    one = optuna.create_study(study_name="one", storage=url, directions=["maximize", "minimize"])
    trials = _templates(7)
    assert _optuna.add_finished_trials(bulk, trials[:4]) == 1  # one transaction
    assert _optuna.add_finished_trials(bulk, trials[4:]) == 1
    for t in trials:
        one.add_trial(t)
    bulk_read = optuna.load_study(study_name="bulk", storage=url).trials
    assert [t.number for t in bulk_read] == list(range(7))
    assert all(_same(a, b) for a, b in zip(bulk_read, optuna.load_study(study_name="one", storage=url).trials))
    assert len(bulk.trials) == 7  # the study object that wrote them (its cache) sees them too


def test_the_bulk_writer_refuses_what_add_trial_refuses(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", directions=["maximize", "minimize"])
    _optuna.add_finished_trials(study, _templates(1))
    other = create_trial(
        state=TrialState.COMPLETE,
        values=[1.0, 2.0],
        params={"tp": "8"},
        distributions={"tp": CategoricalDistribution(["8", "16"])},
    )
    with pytest.raises(ValueError):
        _optuna.add_finished_trials(study, [other])  # tp's choices differ from the study's
    with pytest.raises(ValueError):
        _optuna.add_finished_trials(study, [create_trial(state=TrialState.RUNNING)])
    assert len(study.trials) == 1  # nothing of a refused batch is written
    mem = optuna.create_study(directions=["maximize", "minimize"])  # not an RDB: one add_trial each
    assert _optuna.add_finished_trials(mem, _templates(3)) == 3 and len(mem.trials) == 3


def test_a_new_study_file_is_the_one_rdb_storage_makes(tmp_path):
    import sqlite3

    def contents(path):
        with sqlite3.connect(path) as c:
            schema = sorted(c.execute("SELECT type, name, sql FROM sqlite_master"))
            return (
                schema,
                list(c.execute("SELECT * FROM version_info")),
                list(c.execute("SELECT * FROM alembic_version")),
            )

    RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert _optuna.create_sqlite_schema(tmp_path / "ours.db")
    assert not _optuna.create_sqlite_schema(tmp_path / "ours.db")  # an existing file is left alone
    assert contents(tmp_path / "ours.db") == contents(tmp_path / "optuna.db")
    storage = RDBStorage(f"sqlite:///{tmp_path / 'ours.db'}")
    assert storage._version_manager.get_current_version() == _optuna.RDB_ALEMBIC_REVISION
    study = optuna.create_study(storage=storage, study_name="s")
    study.add_trial(create_trial(value=1.0, params={"x": "a"}, distributions={"x": CategoricalDistribution(["a"])}))
    assert [t.value for t in optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'ours.db'}").trials] == [
        1.0
    ]


def test_closing_the_storages_writes_the_log_into_the_study_file(tmp_path):
    import sqlite3

    db = tmp_path / "study.db"
    assert _optuna.create_sqlite_schema(db)
    from optuna.storages._rdb import storage as rdb

    own = rdb._VersionManager
    storage = _optuna.ThreadSafeRDBStorage(
        f"sqlite:///{db}",
        engine_kwargs=_optuna.local_sqlite_engine_kwargs(db),
        skip_table_creation=True,
        skip_compatibility_check=True,
        stamped=True,
    )  # as open_study opens a file it made
    assert rdb._VersionManager is own and callable(own._init_alembic)  # swapped for the open only
    assert type(storage._version_manager).__bases__ == (own,)
    study = optuna.create_study(storage=storage, study_name="s")
    assert (
        _optuna._alembic_revision(storage)
        == storage._version_manager.get_current_version()
        == _optuna.RDB_ALEMBIC_REVISION
    )
    assert _optuna._bulk_backend(study) is storage  # the stamp read without alembic: the bulk writer's schema
    assert (
        _optuna.add_finished_trials(
            study, [create_trial(value=1.0, params={"x": "a"}, distributions={"x": CategoricalDistribution(["a"])})]
        )
        == 1
    )
    assert (tmp_path / "study.db-wal").exists()
    _optuna.close_storages()
    assert not (tmp_path / "study.db-wal").exists() and not (tmp_path / "study.db-shm").exists()
    with sqlite3.connect(db) as c:
        assert list(c.execute("SELECT value FROM trial_values")) == [(1.0,)]
    assert [t.value for t in study.trials] == [1.0]  # the storage stays usable


def test_closing_reaches_an_engine_its_storage_left_behind(tmp_path):
    """A storage dropped by its last reference can leave its engine (and its open connections) in a cycle the frozen
    collector never scans: the engine is still closed, and the log folded into study.db."""
    db = tmp_path / "study.db"
    assert _optuna.create_sqlite_schema(str(db))
    storage = _optuna.ThreadSafeRDBStorage(
        f"sqlite:///{db}", engine_kwargs=_optuna.local_sqlite_engine_kwargs(db), skip_table_creation=True,
        skip_compatibility_check=True, stamped=True,
    )
    study = optuna.create_study(storage=storage, study_name="s")
    study.add_trial(create_trial(value=1.0, params={"x": "a"}, distributions={"x": CategoricalDistribution(["a"])}))
    left_behind = storage.engine  # stands for the cycle that keeps it alive
    del study, storage
    assert (tmp_path / "study.db-wal").exists()
    _optuna.close_storages()
    assert not (tmp_path / "study.db-wal").exists() and left_behind is not None


def test_the_generation_of_a_trial_is_pinned_on_the_trial_it_is_handed():
    sampler = optuna.samplers.NSGAIISampler(seed=0, population_size=2)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    trial = study.ask()
    frozen = study._storage.get_trial(trial._trial_id)
    _optuna.pin_generation(sampler, study, frozen)
    key = sampler._get_generation_key()
    assert key == "NSGAIISampler:generation" and frozen.system_attrs[key] == 0
    assert study._storage.get_trial(trial._trial_id).system_attrs[key] == 0  # recorded as get_trial_generation does
    _optuna.pin_generation(optuna.samplers.RandomSampler(), study, frozen)  # not a genetic sampler: nothing
    assert not _optuna.is_queued(frozen)
    study.enqueue_trial({})
    assert _optuna.is_queued(study._storage.get_trial(study.ask()._trial_id))
