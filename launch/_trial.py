"""The trial skeleton the real-trial backends (``local``, ``ray``, ``command``) share.

A trial starts its processes, each in a process group of its own, hands the throughput of every new step to the
study's reporter (which may stop it), enforces the timeout, and ends in a :class:`~launch.base.Measurement`,
:class:`~launch.base.TrialStopped`, :class:`~launch.base.TrialFailed` or ``KeyboardInterrupt``, with no process left
running. :class:`TrialProcesses` (one local group, or one per Ray node) and :class:`StepSource` (the harness's JSON
lines, or Megatron's log) hold what differs between the backends."""

from __future__ import annotations

import abc
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.base import FailureKind, Measurement, StepReporter, TrialBackend, TrialFailed, TrialStopped
from launch.harness.results import HarnessResult, StepRecord, classify_failure, parse_results
from launch.megatron_log import MegatronLogReader
from specs.errors import TunerError
from specs.layout import Layout

__all__ = ["INTERRUPT_GRACE_S", "SAFE_ENV", "STOP_GRACE_S", "HarnessLines", "LocalProcess", "MeasuredBackend",
           "MegatronLogSteps", "StepSource", "Trial", "TrialProcesses", "TrialSteps", "free_port", "kill_group",
           "running_trials", "start_watchdog", "tail"]

#: Environment every trial gets: NVLink multicast off (it can take a shared host's GPUs
#: out of service), one CUDA connection (Megatron's overlap needs it), unbuffered output.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "PYTHONUNBUFFERED": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}

#: Seconds between SIGTERM and SIGKILL: a trial pruned or timed out (torchrun forwards SIGTERM), interrupted.
STOP_GRACE_S = 10.0
INTERRUPT_GRACE_S = 5.0
#: Seconds (at most four polls) the other processes get to write their lines after one failed.
SETTLE_S = 5.0


# --------------------------------------------------------------------------- process helpers


def free_port() -> int:
    """A TCP port that is free on this machine now (for torchrun's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session=True``), then SIGKILL what is left
    after ``grace_s`` seconds, or once the leader has exited. Never raises."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        return


def _die_with_parent() -> None:
    """``preexec_fn``: SIGTERM when the starting thread dies (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    import ctypes

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG


#: The watchdog of one trial's process group: a process of its own session, started by the driver, that polls
#: every half second; once its parent (the driver) is gone (it is re-parented: ``kill -9`` of ``tune``, a lost
#: shell) it sends the group SIGTERM, then SIGKILL after the grace; it exits when the group is gone.
_WATCHDOG = """
import os, signal, sys, time
driver, pgid, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while alive():
    if os.getppid() != driver:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait
            while alive() and time.monotonic() < end:
                time.sleep(0.1)
        break
    time.sleep(0.5)
"""


def start_watchdog(pgid: int, grace_s: float = INTERRUPT_GRACE_S) -> subprocess.Popen[bytes]:
    """Start the watchdog (:data:`_WATCHDOG`) that kills process group ``pgid`` when this process dies."""
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHDOG, str(os.getpid()), str(pgid), str(grace_s)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def record_process(trial_dir: Path, pgid: int, name: str = "process.json") -> None:
    """Write the host, the process group and the driver's pid to ``trial_dir/name``."""
    (trial_dir / name).write_text(json.dumps({"host": socket.gethostname(), "pgid": pgid,
                                              "driver": os.getpid()}) + "\n")


def running_trials(trials_dir: Path) -> list[str]:
    """The trials under ``trials_dir`` on this host whose process group still runs while their driver is gone, as
    ``"trial N (process group P)"``."""
    host, out = socket.gethostname(), []
    for rec in sorted(trials_dir.glob("*/process.json")):
        try:
            d = json.loads(rec.read_text())
            pgid, driver = int(d["pgid"]), int(d["driver"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if d.get("host") == host and not _alive(os.kill, driver) and _alive(os.killpg, pgid):
            out.append(f"trial {rec.parent.name} (process group {pgid})")
    return out


def _alive(send: Callable[[int, int], None], pid: int) -> bool:
    """Whether signal 0 reaches ``pid`` (``os.kill``) or process group ``pid`` (``os.killpg``)."""
    try:
        send(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def tail(path: str | Path, max_bytes: int = 200_000) -> str:
    """The last ``max_bytes`` bytes of a file as text (undecodable bytes replaced); "" if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- how the processes run


class TrialProcesses(abc.ABC):
    """The running process(es) of one trial: how they are polled, killed and their logs read."""

    @abc.abstractmethod
    def poll(self) -> list[int | None]:
        """The exit status of each process, None while it runs; the first writes the step results.

        Raises:
            Exception: a process can no longer be reached (Ray: a lost node).
        """

    @abc.abstractmethod
    def kill(self, grace_s: float) -> None:
        """Kill every group still running (SIGTERM, SIGKILL after ``grace_s``). Idempotent; never raises."""

    @abc.abstractmethod
    def collect(self) -> str:
        """The tail of the trial's logs, for :func:`launch.harness.results.classify_failure`."""


class LocalProcess(TrialProcesses):
    """One program on this machine in its own process group, stdout and stderr to ``log_path``, stdin closed; it dies
    with its driver (:func:`_die_with_parent`, :func:`start_watchdog`).

    Raises:
        TrialFailed: (``crash``) the program cannot be started.
        TunerError: an earlier trial's orphaned processes still run on this host.
    """

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str], trial_dir: Path) -> None:
        orphans = running_trials(trial_dir.parent)
        if orphans:
            raise TunerError(f"{', '.join(orphans)} of an earlier run still run on this host and may hold its GPUs; "
                             "stop them (kill -- -GROUP) or let them end, then run again")
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child writes through its own copy of the descriptor
            try:
                self.proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, env=dict(env), cwd=os.getcwd(),
                                             preexec_fn=_die_with_parent)
            except OSError as e:
                raise TrialFailed(FailureKind.crash, f"cannot start {argv[0]!r}: {e.strerror or e}",
                                  str(trial_dir)) from None
        record_process(trial_dir, self.proc.pid)
        self.watchdog = start_watchdog(self.proc.pid)

    def poll(self) -> list[int | None]:
        return [self.proc.poll()]

    def kill(self, grace_s: float) -> None:
        if self.proc.poll() is None:
            kill_group(self.proc, grace_s)
        if self.watchdog.poll() is None:  # the group is gone: so is its watchdog, within half a second
            self.watchdog.kill()
        self.watchdog.wait()

    def collect(self) -> str:
        return tail(self.log_path)


# --------------------------------------------------------------------------- where the step results come from


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialSteps:
    """What a trial's :class:`StepSource` read by the trial's end."""

    steps: list[StepRecord]  # warm-up included
    result: HarnessResult  # with the out-of-memory / error reports a failure is classified from
    measured: bool  # the run reported all a Measurement needs
    tokens_per_s_per_gpu: float = math.nan  # median step after warm-up
    peak_reserved_bytes: float = math.nan  # max over ranks, bytes
    peak_allocated_bytes: float = math.nan
    step_time_cv: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)


class StepSource(abc.ABC):
    """Where a trial's per-step results come from; read once per poll while the trial runs."""

    @abc.abstractmethod
    def read(self) -> list[StepRecord]:
        """Every step measured so far (reading what was added since the last call)."""

    @abc.abstractmethod
    def finish(self) -> TrialSteps:
        """Everything the run reported, read once more after its processes are gone."""


class HarnessLines(StepSource):
    """The trial harness's JSON lines; ``read_text`` returns the ``--out`` file so far ("" before it exists)."""

    def __init__(self, read_text: Callable[[], str]) -> None:
        self._read_text = read_text

    @classmethod
    def file(cls, path: Path) -> HarnessLines:
        """The JSON lines of a file on this machine."""
        return cls(lambda: path.read_text(errors="replace") if path.exists() else "")

    def read(self) -> list[StepRecord]:
        return parse_results(self._read_text()).steps

    def finish(self) -> TrialSteps:
        res = parse_results(self._read_text())
        measured = res.complete and bool(res.summary.get("tokens_per_s_per_gpu"))
        return TrialSteps(steps=res.steps, result=res, measured=measured,
                          tokens_per_s_per_gpu=float(res.summary["tokens_per_s_per_gpu"]) if measured else math.nan,
                          peak_reserved_bytes=res.peak_reserved_bytes, peak_allocated_bytes=res.peak_allocated_bytes,
                          step_time_cv=res.summary.get("step_time_cv"), summary=res.summary)


class MegatronLogSteps(StepSource):
    """Megatron's iteration and memory lines, read from ``log_path`` as it grows; the sizes turn a step time into
    tokens/s/GPU."""

    def __init__(self, log_path: Path, *, global_batch_size: int, seq_length: int, world_size: int,
                 warmup_steps: int) -> None:
        self.log_path = log_path
        self._sizes = {"global_batch_size": global_batch_size, "seq_length": seq_length, "world_size": world_size}
        self._warmup_steps = warmup_steps
        self._reader = MegatronLogReader()
        self._offset = 0

    def _feed(self) -> None:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        self._reader.feed(data)

    def read(self) -> list[StepRecord]:
        self._feed()
        return self._reader.log.as_harness_result(**self._sizes).steps

    def finish(self) -> TrialSteps:
        self._feed()
        parsed = self._reader.finish()
        result = parsed.as_harness_result(**self._sizes)
        its = parsed.iterations
        if not its:
            return TrialSteps(steps=result.steps, result=result, measured=False)
        summary: dict[str, Any] = parsed.summary(**self._sizes, warmup_steps=self._warmup_steps)
        summary |= {"iterations": len(its), "memory_reports": len(parsed.memory), "bad_lines": parsed.bad_lines}
        return TrialSteps(steps=result.steps, result=result, measured=True,
                          tokens_per_s_per_gpu=float(summary["tokens_per_s_per_gpu"]),
                          peak_reserved_bytes=parsed.peak_reserved_bytes,
                          peak_allocated_bytes=parsed.peak_allocated_bytes, step_time_cv=summary["step_time_cv"],
                          summary=summary)


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One real trial's settings, and the loop that follows it (:meth:`follow`)."""

    layout: Layout
    trial_dir: Path  # results/<study>/trials/<n>
    warmup_steps: int
    timeout_s: float
    poll_s: float
    logs: str  # where a failure's message points, e.g. "log: results/s/trials/3/log.txt"
    reporter: StepReporter | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)  # set by another thread to stop the trial
    no_result: str = ""  # before a crash's message when every process exited 0 without a result
    source: str = "measured"

    def follow(self, processes: TrialProcesses, steps: StepSource, *,
               extra: Callable[[TrialSteps], dict[str, Any]] | None = None) -> Measurement:
        """Follow ``processes`` until they exit, the reporter stops them, they time out or the trial is cancelled; kill
        what is left and turn what ``steps`` read into the outcome. When one process of several fails, the others get
        :data:`SETTLE_S` to write their lines.

        Returns the Measurement (its ``step_times_s`` without the warm-up steps) when every process exited 0 with a
        result.

        Raises:
            TrialStopped: the reporter returned a reason.
            TrialFailed: out of memory, the timeout, or a crash (non-zero exit, NCCL error, exit 0 without a result).
            KeyboardInterrupt: ``cancelled`` was set, or Ctrl-C.
        """
        t0 = time.monotonic()
        seen = 0
        stop_reason: str | None = None
        timed_out = False
        rcs: list[int | None] = []
        try:
            while True:
                rcs = processes.poll()
                so_far = steps.read()
                if self.reporter is not None and len(so_far) > seen and rcs[0] is None:
                    seen = len(so_far)
                    stop_reason = self.reporter([s.tokens_per_s_per_gpu for s in so_far])
                    if stop_reason:
                        processes.kill(STOP_GRACE_S)
                        break
                done = all(rc is not None for rc in rcs)
                failed = any(rc not in (None, 0) for rc in rcs)
                if done or failed:
                    if failed and not done:  # let the other nodes' ranks notice and write their lines
                        time.sleep(min(SETTLE_S, self.poll_s * 4))
                    break
                if time.monotonic() - t0 > self.timeout_s:
                    timed_out = True
                    processes.kill(STOP_GRACE_S)
                    break
                if self.cancelled.is_set():
                    raise KeyboardInterrupt("the study was interrupted")
                time.sleep(self.poll_s)
        finally:  # whatever happened (an interrupt, an error, one node failed), leave nothing running
            processes.kill(INTERRUPT_GRACE_S)
        wall_s = time.monotonic() - t0
        got = steps.finish()
        log_text = processes.collect()
        if stop_reason:
            raise TrialStopped(stop_reason, step_times_s=[s.step_time_s for s in got.steps],
                               tokens_per_s_per_gpu=[s.tokens_per_s_per_gpu for s in got.steps],
                               log_path=str(self.trial_dir))
        if not timed_out and all(rc == 0 for rc in rcs) and got.measured:
            kept = got.steps[self.warmup_steps:] or got.steps
            return Measurement(
                layout=self.layout, source=self.source, tokens_per_s_per_gpu=got.tokens_per_s_per_gpu,
                peak_bytes=got.peak_reserved_bytes, step_times_s=tuple(s.step_time_s for s in kept),
                losses=tuple(s.loss for s in got.steps), grad_norms=tuple(s.grad_norm for s in got.steps),
                log_path=str(self.trial_dir),
                extra={"summary": got.summary, "wall_s": wall_s, "peak_allocated_bytes": got.peak_allocated_bytes,
                       "step_time_cv": got.step_time_cv, **(extra(got) if extra is not None else {})},
            )
        bad = next((rc for rc in rcs if rc not in (None, 0)), rcs[0])
        kind, msg, reached = classify_failure(None if timed_out else bad, got.result, log_text, timed_out=timed_out)
        if kind == FailureKind.crash and bad == 0 and self.no_result:
            msg = self.no_result + msg
        raise TrialFailed(kind, f"{msg} ({self.logs})", str(self.trial_dir),
                          memory_reached_bytes=reached if math.isfinite(reached) else math.nan)


# --------------------------------------------------------------------------- the backends' base


class MeasuredBackend(TrialBackend):
    """The base of the backends whose trials run processes: trial folders, the cancel event, and the :class:`Trial`
    of each run."""

    source = "measured"

    def __init__(self, trials_dir: Path, steps: int, warmup_steps: int, timeout_s: float, poll_s: float) -> None:
        """Raises TunerError: ``steps`` < 1, warm-up outside ``[0, steps)``, or timeout <= 0 s."""
        if steps < 1 or not 0 <= warmup_steps < steps:
            raise TunerError(f"--backend {self.name}: steps must be >= 1 and warm-up steps in [0, steps), got {steps}, "
                             f"{warmup_steps}")
        if not timeout_s > 0:
            raise TunerError(f"--backend {self.name}: the trial timeout must be > 0 s, got {timeout_s}")
        self.trials_dir, self.steps, self.warmup_steps = trials_dir, steps, warmup_steps
        self.timeout_s, self.poll_s = float(timeout_s), poll_s
        self._count = 0
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Stop every running trial now (Ctrl-C); a later run raises KeyboardInterrupt at once."""
        self._cancel.set()

    def _trial_folder(self, trial_number: int | None, name: str | None = None) -> tuple[int, Path]:
        """The trial's number and its emptied folder under ``trials_dir``.

        Raises:
            KeyboardInterrupt: the backend was cancelled.
        """
        if self._cancel.is_set():
            raise KeyboardInterrupt("the study was interrupted")
        n = trial_number if trial_number is not None else self._count
        self._count += 1
        tdir = self.trials_dir / (name or str(n))
        if tdir.exists():
            shutil.rmtree(tdir)
        tdir.mkdir(parents=True)
        return n, tdir

    def _trial(self, layout: Layout, tdir: Path, reporter: StepReporter | None, *, logs: str,
               no_result: str = "") -> Trial:
        return Trial(layout=layout, trial_dir=tdir, warmup_steps=self.warmup_steps, timeout_s=self.timeout_s,
                     poll_s=self.poll_s, logs=logs, reporter=reporter, cancelled=self._cancel, no_result=no_result,
                     source=self.source)
