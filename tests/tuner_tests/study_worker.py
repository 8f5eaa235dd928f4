"""A study worker for tests that kill one (test_workers.py): a fake real-trial backend and the study it runs.

    python study_worker.py STORAGE RESULTS_DIR    # runs a trial that hangs: killed by the test

Once its trial's heartbeat is in the storage, the worker prints ``running N`` (N: the trial number).
"""

from __future__ import annotations

import sys
import time

from launch.base import Measurement, TrialBackend

#: Heartbeat every second; a trial without one for 2 s is stale (the defaults are 60 s / 180 s).
HEARTBEAT = dict(heartbeat_interval_s=1, heartbeat_grace_s=2)


def config(storage: str, results_dir: str, trials: int):  # noqa: ANN201
    from tuner.study import TuneConfig

    return TuneConfig.from_dict(dict(
        model="MiniMax-M2",
        gpus="4xH200",
        layers=4,
        global_batch_size=8,
        stack="megatron",
        study="w",
        storage=storage,
        results_dir=results_dir,
        trials=trials,
        prune_margin=None,
        recalibrate_after=0,
        policy="queue",
        **HEARTBEAT,
    ))


class Sleepy(TrialBackend):
    """Measures a layout after ``step_s`` seconds; with ``hang_in``, a storage URL, it waits for the trial's
    heartbeat there, prints ``running N`` and never finishes."""

    name = "sleepy"
    source = "measured"

    def __init__(self, step_s: float = 0.0, hang_in: str | None = None) -> None:
        self.step_s = step_s
        self.hang_in = hang_in
        self.layouts: list[str] = []

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):  # noqa: ANN001, ANN201
        self.layouts.append(layout.key())
        if self.hang_in:
            # killed before its first heartbeat, a trial is never stale (Optuna's RDB storage and the journal's alike)
            for _ in range(3000):
                if has_heartbeat(self.hang_in, trial_number):
                    print(f"running {trial_number}", flush=True)
                    time.sleep(600)  # RUNNING until the test kills this process
                time.sleep(0.1)
            raise SystemExit(f"trial {trial_number} sent no heartbeat")
        time.sleep(self.step_s)
        return Measurement(
            layout=layout, source="measured", tokens_per_s_per_gpu=1000.0 + len(self.layouts), peak_bytes=50 * 2**30,
            step_times_s=(1.0,),
        )


def has_heartbeat(storage: str, number: int) -> bool:
    """Trial ``number`` of study "w" has a heartbeat recorded (journal: its system attribute; RDB: Optuna's heartbeat
    table)."""
    if storage.startswith("journal:"):
        import optuna

        from tuner.study import open_storage
        from tuner.study._optuna import HEARTBEAT_ATTR

        trials = optuna.load_study(study_name="w", storage=open_storage(storage)).trials
        return number < len(trials) and HEARTBEAT_ATTR in trials[number].system_attrs
    import sqlalchemy  # any RDB storage (SQLite, PostgreSQL): Optuna's heartbeat table

    q = "SELECT count(*) FROM trial_heartbeats h JOIN trials t ON h.trial_id = t.trial_id WHERE t.number = :n"
    engine = sqlalchemy.create_engine(storage)
    try:
        with engine.connect() as db:
            n = db.execute(sqlalchemy.text(q), {"n": number}).scalar()
    except sqlalchemy.exc.DBAPIError:  # no tables yet
        return False
    finally:
        engine.dispose()
    return bool(n)


if __name__ == "__main__":
    from tuner.study import prepare, run_study

    storage, results_dir = sys.argv[1:3]
    run_study(prepare(config(storage, results_dir, trials=3)), backend=Sleepy(hang_in=storage))
