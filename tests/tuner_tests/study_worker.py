"""A study worker for tests that kill one (test_workers.py): a fake real-trial backend and the study it runs.

    python study_worker.py STORAGE RESULTS_DIR MARKER    # runs trials that hang: killed by the test
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from launch.base import Measurement, TrialBackend

#: Heartbeat every second; a trial without one for 2 s is stale (the defaults are 60 s / 180 s).
HEARTBEAT = dict(heartbeat_interval_s=1, heartbeat_grace_s=2)


def config(storage: str, results_dir: str, trials: int):  # noqa: ANN201
    from tuner.study import TuneConfig

    return TuneConfig(model="MiniMax-M2", gpus="4xH200", layers=4, global_batch_size=8, stack="megatron", study="w", storage=storage,
                      results_dir=results_dir, trials=trials, prune_margin=None, recalibrate_after=0, policy="queue", **HEARTBEAT)


class Sleepy(TrialBackend):
    """Measures a layout after ``step_s`` seconds; with ``marker``, writes the trial number there and never finishes."""

    name = "sleepy"
    source = "measured"

    def __init__(self, step_s: float = 0.0, marker: str | None = None) -> None:
        self.step_s = step_s
        self.marker = marker
        self.layouts: list[str] = []

    def run(self, layout, *, model, cluster, workload, reporter=None, trial_number=None):  # noqa: ANN001, ANN201
        self.layouts.append(layout.key())
        if self.marker:
            Path(self.marker).write_text(str(trial_number))
            time.sleep(600)  # RUNNING until the test kills this process
        time.sleep(self.step_s)
        return Measurement(layout=layout, source="measured", tokens_per_s_per_gpu=1000.0 + len(self.layouts), peak_bytes=50 * 2**30,
                           step_times_s=(1.0,))


if __name__ == "__main__":
    from tuner.study import prepare, run_study

    storage, results_dir, marker = sys.argv[1:4]
    run_study(prepare(config(storage, results_dir, trials=3)), backend=Sleepy(marker=marker))
