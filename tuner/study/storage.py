"""Where a study lives: opening its storage (SQLite file, RDB URL, journal file; with Optuna's heartbeat when
workers share it), one ``tune`` process at a time on the default SQLite file, and checking that a resumed study
was made with the same inputs."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.storages import RetryHeartbeatStaleTrialCallback

from cost_model.calibration import BASE_CALIBRATION, Calibration
from specs import ModelSpec
from specs.errors import TunerError
from specs.files import write_output
from tuner.study.config import (
    RECORD_ERRORS,
    STUDY_OUTPUT_FILES,
    TuneConfig,
    _mask,
    read_study_record,
    storage_file,
    storage_place,
    trial_warmup_steps,
)
from tuner.study.prepare import Prepared

__all__ = ["METRIC_NAMES", "Heartbeat", "StudyLock", "model_spec_from_dict", "model_spec_to_dict", "open_storage",
           "open_study", "resolved", "storage_url"]

log = logging.getLogger("tuner.study")

#: The study's objectives by name (Optuna's ``Study.set_metric_names``; optuna-dashboard labels its charts with them):
#: tokens/s/GPU (maximised), peak memory per GPU in GiB (minimised).
METRIC_NAMES = ("tokens_per_s_per_gpu", "peak_gib")


@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat:
    """Optuna's heartbeat for a storage workers share (seconds); :func:`retry_dead_worker_trial` retries."""

    interval_s: int
    grace_s: int


#: ModelSpec fields that reach only the exported command (YaRN's details), not the estimate or the trials: a study
#: recorded before one existed resumes whatever the model's value (its trials did not depend on it).
_EXPORT_ONLY_MODEL_FIELDS = frozenset({"rope_scaling_original_max_position_embeddings", "rope_scaling_beta_fast",
                                       "rope_scaling_beta_slow", "rope_scaling_truncate"})

#: Times a layout whose worker stopped is queued again (a layout that kills its worker every time stays failed).
MAX_RETRIES = 2


def retry_dead_worker_trial(grace_s: int) -> Any:
    """Optuna's ``RetryHeartbeatStaleTrialCallback``, the retry's record saying why (``retried``)."""
    from tuner.study import _optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        again = copy.copy(trial)
        attrs = {k: v for k, v in trial.user_attrs.items() if k not in ("intermediate_tokens_per_s_per_gpu", "retried")}
        first = _optuna.retried_trial_number(trial)
        attrs["retried"] = (f"trial {trial.number}{f' (a retry of trial {first})' if first is not None else ''} was "
                            f"left RUNNING by a worker that sent no heartbeat for over {grace_s} s (killed or lost); "
                            "its layout is run again")
        again.user_attrs = attrs
        history = _optuna.retry_history(trial)
        if len(history) + 1 > MAX_RETRIES:
            log.warning("trial %d: its worker stopped (no heartbeat for over %d s), for the %d. time with this layout; "
                        "it stays failed", trial.number, grace_s, len(history) + 1)
        else:
            log.warning("trial %d was left RUNNING by a worker that stopped (no heartbeat for over %d s): failed, and "
                        "its layout queued again", trial.number, grace_s)
        retry(study, again)

    return callback


def _check_journal_lines(url: str, path: Path, *, read_only: bool = False) -> str | None:
    """Refuse (TunerError) a journal file with a line that is not JSON before anything is appended to it: a record
    after a cut line makes the whole file unreadable to Optuna. A ``read_only`` command reads one whose last line is
    cut: returns the note saying so."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    bad = _first_bad_journal_line(url, path)
    last = bad is not None and bad == _journal_line_count(path)
    if last and read_only:
        return (f"note: the last line of {path} is cut (a worker killed while writing); the study is read without it. "
                "Remove that line (keep a copy) before a run appends to the journal")
    if last:  # maybe another worker is appending it now
        time.sleep(1.0)
        bad = _first_bad_journal_line(url, path)
    if bad is not None:
        raise TunerError(
            f"--storage {_mask(url)!r}: {path} is not an Optuna journal file: line {bad} is not a JSON record; the "
            "file was left as it is. If a worker was killed while writing, remove that last line (keep a copy) and run "
            "again; otherwise give a new path or an existing journal")
    return None


def _journal_line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _first_bad_journal_line(url: str, path: Path) -> int | None:
    """The number (from 1) of the first line of ``path`` that is not a JSON object, or None."""
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    ok = isinstance(json.loads(raw), dict)
                except ValueError:
                    ok = False
                if not ok:
                    return n
    except OSError as e:
        raise TunerError(f"--storage {_mask(url)!r}: cannot read the journal file ({e.strerror or e})") from None
    return None


def open_storage(url: str, *, create: bool = True, heartbeat: Heartbeat | None = None) -> Any:
    """An Optuna storage for an RDB URL or ``journal:PATH`` (Optuna's ``JournalFileBackend``). Without ``heartbeat``
    an RDB URL is returned as is; with it, a storage with Optuna's heartbeat (ValueError, ImportError: a malformed
    URL or a missing driver)."""
    from tuner.study import _optuna

    if url.startswith("journal:"):
        file = storage_file(url)
        if file is None:
            raise TunerError("--storage journal:PATH needs a file path, e.g. journal:/shared/tune/study.log")
        path = str(file)
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        if create and not Path(path).parent.is_dir():
            # not created here: on a shared filesystem a mistyped folder would give one worker a journal of its own
            raise TunerError(f"--storage {url!r}: the folder {str(Path(path).parent)!r} does not exist; create it (on "
                             "the filesystem the workers share) and run again")
        note = _check_journal_lines(url, Path(path), read_only=not create)
        if note is not None:
            print(note, file=sys.stderr)
        try:
            if heartbeat is None:
                return JournalStorage(JournalFileBackend(path))
            return _optuna.HeartbeatJournalStorage(JournalFileBackend(path), heartbeat_interval=heartbeat.interval_s,
                                                   grace_period=heartbeat.grace_s,
                                                   heartbeat_stale_trial_callback=retry_dead_worker_trial(heartbeat.grace_s))
        except OSError as e:
            raise TunerError(f"--storage {url!r}: cannot open the journal file ({e.strerror or e})") from None
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            # JSON lines that are not Optuna's operations (no 'op_code') fail in the journal's replay
            raise TunerError(f"--storage {url!r}: {path} is not an Optuna journal file (JSON lines); give a new path "
                             "or an existing journal") from None
    if heartbeat is None:
        return url
    with warnings.catch_warnings():
        # heartbeat_interval is "experimental" since 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _optuna.ThreadSafeRDBStorage(url, heartbeat_interval=heartbeat.interval_s,
                                            grace_period=heartbeat.grace_s,
                                            heartbeat_stale_trial_callback=retry_dead_worker_trial(heartbeat.grace_s))


def storage_url(config: TuneConfig, out_dir: Path) -> str:
    """``--storage``, or the study's own SQLite file ``results/<study>/study.db``."""
    if config.store.storage:
        return config.store.storage
    return f"sqlite:///{(out_dir / 'study.db').as_posix()}"


def is_own_store(cfg: TuneConfig, out_dir: Path) -> bool:
    """The run's storage is the study folder's own ``study.db``, however ``--storage`` names it."""
    return storage_place(storage_url(cfg, out_dir)) == storage_place(f"sqlite:///{(out_dir / 'study.db').as_posix()}")


def resolved(prep: Prepared) -> dict[str, Any]:
    """The inputs that decide a study's numbers, resolved (so 64xH200 and 8x8xH200 compare equal)."""
    c, w, cfg = prep.cluster, prep.workload, prep.config
    lora = w.task == "lora"
    return {
        "model": prep.model.name, "gpu": c.gpu.name, "num_gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node,
        "inter_node_bytes_per_s": c.inter_node_bytes_per_s, "network": c.network.key if c.network else None,
        "host_memory_gib": round(c.host_memory_bytes_per_node / 2**30, 3), "megatron_core": prep.options.megatron_core,
        "usd_per_gpu_hour": c.usd_per_gpu_hour, "seq_length": w.seq_length, "global_batch_size": w.global_batch_size,
        "precision": w.precision.value, "backend": cfg.search.backend, "stack": cfg.run.stack, "task": w.task,
        "lora_rank": w.lora_rank if lora else None,
        "lora_target_modules": list(w.lora_target_modules) if lora else None,
        "run_options": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(prep.options).items()},
        "memory_headroom": cfg.search.memory_headroom, "layers": prep.model.num_layers,
        # real trials: steps and warm-up decide what a measurement is (step times drift for ~10 steps)
        "trial_steps": cfg.trial.trial_steps if cfg.measured else None,
        "trial_warmup_steps": trial_warmup_steps(cfg) if cfg.measured else None,
    }


def model_spec_to_dict(model: ModelSpec) -> dict[str, Any]:
    """A ModelSpec as plain JSON-able values (stored with a study, so reports survive a moved config file)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model).items()}


def model_spec_from_dict(d: dict[str, Any]) -> ModelSpec:
    """Inverse of :func:`model_spec_to_dict`; a YaRN model recorded without :data:`_EXPORT_ONLY_MODEL_FIELDS` takes
    them from its unchanged preset, else loses its YaRN (logged) rather than take defaults not its own."""
    spec: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    missing = _EXPORT_ONLY_MODEL_FIELDS - set(spec)
    if missing and spec.get("rope_scaling_type") == "yarn" and not spec.get("kv_lora_rank"):
        spec |= _recorded_yarn_details(spec, missing)
    return ModelSpec(**spec)


def _recorded_yarn_details(spec: dict[str, Any], missing: frozenset[str] | set[str]) -> dict[str, Any]:
    """The ``missing`` YaRN fields from the preset, or no YaRN (:func:`model_spec_from_dict`)."""
    from specs import load_model

    try:
        preset = model_spec_to_dict(load_model(str(spec.get("name", ""))))
    except TunerError:
        preset = None
    if preset is not None and all(json.loads(json.dumps(v)) == preset.get(k) for k, v in spec.items()
                                  if k not in ("name", "source")):
        return {k: preset[k] for k in missing}
    log.warning("model %r was recorded without YaRN's details (%s): its commands use plain RoPE "
                "(--position-embedding-type rope)", spec.get("name"), ", ".join(sorted(missing)))
    return {"rope_scaling_type": ""}


#: The command-line option (and its unit) of a resolved input, for messages.
_OPTION_OF: dict[str, tuple[str, float, str]] = {
    "inter_node_bytes_per_s": ("--network-gbps", 8e-9, "Gb/s per node"), "gpus_per_node": ("--gpus-per-node", 1.0, ""),
    "host_memory_gib": ("--host-memory-gib", 1.0, "GiB"), "usd_per_gpu_hour": ("--usd-per-gpu-hour", 1.0, ""),
    "memory_headroom": ("--memory-headroom", 1.0, ""), "seq_length": ("--seq-len", 1.0, ""),
    "global_batch_size": ("--global-batch", 1.0, ""), "layers": ("--layers", 1.0, "decoder layers"),
}


def _as_option(key: str, value: Any) -> str:
    """``key=value`` as the user gave it (``--network-gbps 3,200 Gb/s per node``), else ``key=value``."""
    if key in ("network", "megatron_core", "precision", "stack", "backend", "task", "lora_rank"):
        return f"--{key.replace('_', '-')} {value}"
    if key in _OPTION_OF and isinstance(value, (int, float)) and not isinstance(value, bool):
        opt, scale, unit = _OPTION_OF[key]
        v = value * scale
        return f"{opt} {v:,.6g}{(' ' + unit) if unit else ''}"
    return f"{key}={value!r}"


def check_study_config(study: optuna.Study, config: TuneConfig, name: str, calibration: Calibration,
                       now: dict[str, Any]) -> None:
    """Refuse (TunerError) to resume a study made with other resolved inputs or cost-model constants."""
    old_res = study.user_attrs.get("resolved")
    if old_res is not None:
        # Keys added in later versions (e.g. "layers", a run option) are compared only when the stored study has them.
        def same(k: str) -> bool:
            if k == "run_options" and isinstance(old_res[k], dict) and isinstance(now[k], dict):
                return all(old_res[k][f] == v for f, v in now[k].items() if f in old_res[k])
            return bool(old_res[k] == now[k])

        diff = [k for k in now if k in old_res and not same(k)]
        if diff:
            def shown(res: dict[str, Any], k: str) -> str:
                if k == "run_options" and isinstance(old_res.get(k), dict) and isinstance(now.get(k), dict):
                    fields = [f for f in now[k] if f in old_res[k] and old_res[k][f] != now[k][f]]
                    return "run options " + ", ".join(f"{f}={res[k].get(f)!r}" for f in fields)
                return _as_option(k, res.get(k))

            was = ", ".join(shown(old_res, k) for k in diff)
            new = ", ".join(shown(now, k) for k in diff)
            raise TunerError(
                f"study {name!r} already exists with {was}; this run asks for {new}. "
                "Use another --study name (or the same inputs to resume it)."
            )
    from cost_model.version import formula_digest, same_formulas

    old_digest = study.user_attrs.get("cost_model_digest")
    if old_digest is not None and not same_formulas(old_digest):
        raise TunerError(
            f"study {name!r} was evaluated by another version of the cost model (formulas {old_digest}, this one "
            f"{formula_digest()}); its predictions would mix with new ones. Use another --study name (the old study "
            "and its trials stay as they are: tune pareto / tune export read them)."
        )
    old_cal = study.user_attrs.get("calibration")
    cal_now = calibration.to_dict()
    # A constant added in a later version (a formerly inline constant made a named field) is absent from an
    # older study; it differs only if this run's value is not the one the formula used before (the base value).
    base = BASE_CALIBRATION.to_dict()
    changed = sorted(
        k for k in set(old_cal or {}) | set(cal_now)
        if (old_cal.get(k) if k in (old_cal or {}) else base.get(k)) != cal_now.get(k)
    ) if old_cal is not None else []
    if changed:
        raise TunerError(
            f"study {name!r} was evaluated with other cost-model constants ({', '.join(changed)} {_differ(changed)}); "
            "its predictions would mix with new ones. Use another --study name, or the same --calibration to resume."
        )


def quiet_optuna() -> None:
    """Optuna at WARNING, without its line on each failed trial (the run reports those itself)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna.study._optimize").setLevel(logging.ERROR)


def open_study(cfg: TuneConfig, prep: Prepared, name: str, out_dir: Path, *,
               heartbeat: Heartbeat | None = None) -> tuple[optuna.Study, str]:
    """Create or load the study, check and store its inputs; a refused study leaves no folder."""
    _check_same_storage(cfg, name, out_dir)
    try:  # made by this run (not by a worker started beside it): only then is it this run's to remove
        out_dir.mkdir(parents=True)
        created = True
    except FileExistsError:
        created = False
    except OSError as e:
        raise TunerError(f"--results-dir {cfg.store.results_dir!r}: cannot create {out_dir} ({e.strerror})") from None
    try:
        return _open_study_in(cfg, prep, name, out_dir, heartbeat)
    except BaseException:
        if created:
            try:
                out_dir.rmdir()  # only if still empty: a refused study leaves no folder behind
            except OSError:
                pass
        raise


def _check_same_storage(cfg: TuneConfig, name: str, out_dir: Path) -> None:
    """Refuse (TunerError) a run that would fork a study folder's trials: another storage than the one its
    ``config.yaml`` records while that one exists, an unreadable record, or a new store beside a folder's outputs or
    database. A study whose recorded store is gone resumes from the one named."""
    import yaml

    if not out_dir.is_dir():
        return
    rec, db = out_dir / "config.yaml", out_dir / "study.db"
    now = storage_url(cfg, out_dir)
    here = storage_place(now)
    own = storage_place(f"sqlite:///{db.as_posix()}")  # the folder's own study.db
    new_file = storage_file(now)
    starts_new = new_file is not None and not new_file.exists()
    if not rec.exists():
        # a chart is not a study's
        outputs = [f for f in STUDY_OUTPUT_FILES if f != "pareto.png" and (out_dir / f).exists()]
        if db.exists() and cfg.store.storage and here != own:
            raise TunerError(f"study {name!r}: {out_dir} holds study.db but no config.yaml, and this run names "
                             f"{_mask(cfg.store.storage)!r}; resume it with no --storage, or give another --study name")
        if not db.exists() and not cfg.store.storage and outputs:
            raise TunerError(f"study {name!r}: {out_dir} holds a study's outputs ({', '.join(outputs)}) but no "
                             "config.yaml or study.db (they say where its trials are kept); resume it with its "
                             "--storage, or give another --study name")
        return
    fix = ("delete it to resume the folder's study.db with no --storage" if db.exists()
           else "delete it and resume with the study's --storage")
    try:
        old = read_study_record(rec)
        why = "" if isinstance(old, dict) and isinstance(old.get("config"), dict) else "not a study's record"
    except RECORD_ERRORS + (yaml.YAMLError,) as e:
        old, why = None, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    if why or not isinstance(old, dict):
        raise TunerError(f"study {name!r}: {rec} cannot be read ({why}); it says where the study's trials are kept. "
                         f"Restore it, or {fix}; or give another --study name")
    was = old["config"].get("storage")
    place = old.get("storage_place")
    if (was is not None and not isinstance(was, str)) or (place is not None and not isinstance(place, str)):
        raise TunerError(f"study {name!r}: {rec} records a storage that is not a URL ({was!r}); it says where the "
                         f"study's trials are kept. Restore it, or {fix}; or give another --study name")
    # the recorded store, resolved where it was written (older records: resolved now, as it was named)
    then = own if not was else (place or storage_place(was))
    then_file = storage_file(then)
    if then != here and (then_file is None or then_file.exists()):
        again = "no --storage" if not was else f"--storage {_mask(then)!r}"
        raise TunerError(f"study {name!r} in {out_dir} is kept in {_mask(then)!r} ({rec}); this run names "
                         f"{_mask(now)!r}. Resume it with {again}, or give another --study name")
    # the recorded store is still there and named, or gone (moved with its folder, or deleted): the run resumes from the
    # one it names, but does not start a new, empty store beside the folder's own study.db
    if db.exists() and here != own and starts_new:
        raise TunerError(f"study {name!r}: {out_dir} holds study.db, and this run would start a new store at "
                         f"{_mask(now)!r} instead; resume it with no --storage, or give another --study name")
    check_store_holds(now, name, f"{rec} records study {name!r}")


def sqlite_read_only(path: Path) -> Any:
    """A read-only ``sqlite3`` connection: ``mode=ro``, else ``immutable=1`` (a read-only folder)."""
    import sqlite3
    from urllib.parse import quote

    base = f"file:{quote(str(Path(path).resolve()))}"
    conn = sqlite3.connect(f"{base}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
        return sqlite3.connect(f"{base}?immutable=1", uri=True, check_same_thread=False)


def check_store_holds(url: str, name: str, why: str) -> None:
    """Refuse (TunerError) a file store that should hold study ``name`` (``why``: what says so) but is missing, empty,
    or a SQLite file without that study: opening it would start a new, empty study. Reads it only."""
    import sqlite3

    f = storage_file(url)
    if f is None:
        return
    fix = "restore it from a copy (or give the --storage that holds it), or give another --study name"
    if not f.is_file() or f.stat().st_size == 0:
        raise TunerError(f"study {name!r}: {why}, but its store {f} is {'empty' if f.is_file() else 'missing'}; {fix}")
    if url.startswith("journal:"):
        return
    try:
        conn = sqlite_read_only(f)
        try:
            names = [r[0] for r in conn.execute("SELECT study_name FROM studies")]
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise TunerError(f"study {name!r}: {why}, but its store {f} is not an Optuna study database "
                         f"({e}); {fix}") from None
    if name not in names:
        raise TunerError(f"study {name!r}: {why}, but its store {f} holds "
                         f"{', '.join(map(repr, names[:5])) or 'no study'} instead; {fix}")


def _open_study_in(cfg: TuneConfig, prep: Prepared, name: str, out_dir: Path,
                   heartbeat: Heartbeat | None) -> tuple[optuna.Study, str]:
    from tuner.study import _optuna

    url = storage_url(cfg, out_dir)
    quiet_optuna()
    try:
        if heartbeat is None and not url.startswith("journal:"):
            # --parallel-trials: atomic state changes among threads; the study's own file: commits without an fsync each
            kw: dict[str, Any] = ({} if cfg.store.storage
                                  else {"engine_kwargs": _optuna.local_sqlite_engine_kwargs(out_dir / "study.db")})
            # made here, of Optuna's schema
            if not cfg.store.storage and _optuna.create_sqlite_schema(out_dir / "study.db"):
                kw.update(skip_table_creation=True, skip_compatibility_check=True, stamped=True)
            storage: Any = _optuna.ThreadSafeRDBStorage(url, **kw)
        else:
            storage = open_storage(url, heartbeat=heartbeat)
        study = optuna.create_study(study_name=name, storage=storage, directions=["maximize", "minimize"],
                                    sampler=optuna.samplers.NSGAIISampler(seed=cfg.store.seed, population_size=16),
                                    load_if_exists=True)
    except TunerError:
        raise
    except (ValueError, ImportError) as e:  # bad storage URL, missing DB driver, unreadable journal
        if url.startswith("journal:"):
            raise TunerError(f"--storage {_mask(url)!r}: not an Optuna journal file (JSON lines) or unreadable; give a "
                             "new path or an existing journal") from None
        raise TunerError(f"--storage {_mask(url)!r}: cannot open the study ({_mask(str(e))})") from None
    except Exception as e:  # SQLAlchemy errors: unwritable path, locked or corrupt file
        if type(e).__module__.startswith("sqlalchemy") or isinstance(e, optuna.exceptions.StorageInternalError):
            raise TunerError(f"--storage {_mask(url)!r}: cannot open the study ({type(e).__name__}: "
                             f"{_mask(str(e).splitlines()[0])})") from None
        raise
    now = resolved(prep)
    check_study_config(study, cfg, name, prep.calibration, now)
    old_model = study.user_attrs.get("model_spec")
    new_model = json.loads(json.dumps(model_spec_to_dict(prep.model)))
    if isinstance(old_model, dict) and old_model != new_model:  # the same --model path, its config.json edited since
        # a field added to ModelSpec after the study was made counts as its default there
        defaults = json.loads(json.dumps({f.name: f.default for f in dataclasses.fields(ModelSpec)
                                          if f.default is not dataclasses.MISSING}))
        # its name and source are where it was read from: the same config.json by another path or moved is the same
        # model (a field that only reaches the exported command, not the estimate, counts as unrecorded there instead)
        unrecorded = {k for k in _EXPORT_ONLY_MODEL_FIELDS if k not in old_model}
        changed = sorted(k for k in (set(old_model) | set(new_model)) - {"name", "source"} - unrecorded
                         if old_model.get(k, defaults.get(k)) != new_model.get(k, defaults.get(k)))
    else:
        changed = []
    if changed:
        raise TunerError(
            f"study {name!r} was made with another definition of model {prep.model.name!r} ({', '.join(changed[:8])}"
            f"{', ...' if len(changed) > 8 else ''} {_differ(changed)}); its trials were predicted or measured for "
            "that one. Use another --study name, or restore the model's config to resume."
        )
    if study.metric_names != list(METRIC_NAMES):  # a resumed study keeps them: no write
        with warnings.catch_warnings():
            # set_metric_names: "experimental" since 3.2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(METRIC_NAMES))
    old_space = study.user_attrs.get("space")
    new_space = json.loads(json.dumps(prep.space.to_dict()))  # as the storage gives it back
    if old_space is not None and old_space != new_space:
        changed = sorted(k for k in set(old_space) | set(new_space) if old_space.get(k) != new_space.get(k))
        raise TunerError(
            f"study {name!r} was searched over another space ({', '.join(changed)} {_differ(changed)}); Optuna cannot "
            "change a study's choices. Use another --study name, or the same --space to resume."
        )
    stored = study.user_attrs
    from cost_model.version import formula_digest

    for key, value in (("config", cfg.to_dict()), ("resolved", now), ("model_spec", model_spec_to_dict(prep.model)),
                       ("calibration", prep.calibration.to_dict()), ("space", prep.space.to_dict()),
                       ("cost_model_digest", formula_digest())):
        if stored.get(key) != json.loads(json.dumps(value)):  # a resumed study with the same inputs: no write
            study.set_user_attr(key, value)
    write_output(out_dir / "config.yaml", yaml.safe_dump(
        {"config": cfg.to_dict(), "storage_place": storage_place(url) if storage_file(url) else None, "resolved": now,
         "space": prep.space.to_dict(), "calibration": prep.calibration.to_dict()}, sort_keys=False), force=True)
    return study, url


class StudyLock:
    """One ``tune`` process at a time on a study in its default SQLite file: an exclusive ``flock`` on
    ``results/<study>/.tune.lock`` for the run; a second run would take the first one's RUNNING trials for leftovers
    of an interrupt. TunerError: the folder or lock file cannot be written, or another process (named) holds it."""

    def __init__(self, out_dir: Path, name: str) -> None:
        import fcntl
        import os

        self.path = out_dir / ".tune.lock"
        made = not out_dir.exists()
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TunerError(f"cannot create the study folder {out_dir} ({e.strerror})") from None
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise TunerError(f"cannot write the study's lock file {self.path} ({e.strerror}): a run needs its study "
                             "folder writable") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                who = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            except OSError:
                who = ""
            os.close(self.fd)
            raise TunerError(
                f"study {name!r} is being run by another tune process{f' (pid {who})' if who else ''}; wait for it to "
                "finish, or let several workers share it through --storage journal:PATH or an RDB URL"
            ) from None
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        except OSError as e:
            from specs.files import write_error

            os.close(self.fd)
            if made:  # a full disk: the folder made for the lock goes too
                self.path.unlink(missing_ok=True)
                out_dir.rmdir()
            raise write_error(str(self.path), e) from None

    def release(self) -> None:
        """Drop the lock (the file stays)."""
        import os

        try:
            os.close(self.fd)  # closing the descriptor drops the flock
        except OSError:
            pass


def _differ(names: list[str]) -> str:
    """``differs`` after one name, ``differ`` after several."""
    return "differs" if len(names) == 1 else "differ"
