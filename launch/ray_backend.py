"""The ``ray`` backend: each trial is the trial harness under torchrun on the nodes of a Ray cluster.

One trial is one placement group with a bundle per node (``STRICT_SPREAD``, or ``STRICT_PACK`` within a node); on each
bundle a :class:`_NodeAgent` actor starts torchrun's static rendezvous in a process group of its own. The driver follows
the trial with :mod:`launch._trial`, reading the JSON lines through the first node's actor (no shared filesystem
needed). A lost node: the trial is retried once on a new placement group, then recorded as ``crash``.

Sources: Ray "Placement Groups" (docs.ray.io); PyTorch "torchrun (Elastic Launch)"."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launch._trial import (
    INTERRUPT_GRACE_S,
    SAFE_ENV,
    HarnessLines,
    MeasuredBackend,
    TrialProcesses,
    kill_group,
    record_process,
    start_watchdog,
    tail,
)
from launch.base import BackendSettings, FailureKind, Measurement, StepReporter, TrialFailed
from launch.harness.spec import HARNESS_MODULE, HarnessEnv, build_spec, harness_args, unsupported_reasons
from specs import Cluster, ModelSpec, Workload
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout

__all__ = ["RayBackend", "node_plan", "parse_ray_address", "torchrun_node_command"]

#: Stands for the node's own Python in a command (replaced by the actor: the driver's path may not exist there).
NODE_PYTHON = "<node-python>"


def node_plan(world_size: int, gpus_per_node: int) -> tuple[list[int], str]:
    """GPUs per bundle (one per node) and the placement strategy for ``world_size`` GPUs.

    Raises:
        TunerError: the world size does not fill whole nodes (torchrun starts as many processes on every node).
    """
    if world_size <= gpus_per_node:
        return [world_size], "STRICT_PACK"
    if world_size % gpus_per_node:
        raise TunerError(f"a trial of {world_size} GPUs does not fill whole nodes of {gpus_per_node} GPUs")
    return [gpus_per_node] * (world_size // gpus_per_node), "STRICT_SPREAD"


def torchrun_node_command(nnodes: int, node_rank: int, nproc_per_node: int, master_addr: str, master_port: int,
                          python: str = NODE_PYTHON) -> list[str]:
    """torchrun's static-rendezvous command for one node, without the harness's arguments."""
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc_per_node}",
        f"--master-addr={master_addr}", f"--master-port={master_port}",
        "-m", HARNESS_MODULE,
    ]


class _NodeAgent:
    """One node's part of a trial (a Ray actor): writes the spec, starts the launcher, reports, kills."""

    def __init__(self) -> None:
        self.proc: Any = None

    def where(self) -> dict[str, Any]:
        """This node's address, a free TCP port on it, and the GPUs Ray gave this actor."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        try:
            gpus = [str(int(g)) for g in ray.get_gpu_ids()]
        except Exception:  # noqa: BLE001
            gpus = []
        return {"ip": ray.util.get_node_ip_address(), "port": port, "gpu_ids": gpus,
                "node_id": ray.get_runtime_context().get_node_id(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def start(self, cmd: list[str], env: dict[str, str], tdir: str, spec_text: str, cwd: str) -> int:
        import subprocess

        d = Path(tdir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.json").write_text(spec_text)
        cmd = [sys.executable if c == NODE_PYTHON else c for c in cmd]
        if not Path(cwd).is_dir():  # the driver's folder does not exist on this node: paths are absolute anyway
            cwd = str(d)
        node = env.get("NODE_RANK", "0")
        (d / f"command.node{node}.txt").write_text(" ".join(cmd) + "\n")
        full = {**os.environ, **env}
        with open(d / f"log.node{node}.txt", "wb") as log:  # the child writes through its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=full, cwd=cwd)
        start_watchdog(self.proc.pid)  # the actor's process gone (the driver killed, its job ended): the group goes too
        record_process(d, self.proc.pid, "process.json" if node == "0" else f"process.node{node}.json")
        return int(self.proc.pid)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def read(self, path: str, max_bytes: int = 2_000_000) -> str:
        return tail(path, max_bytes)

    def kill(self, grace_s: float = INTERRUPT_GRACE_S) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, grace_s)


class _NodeLost(Exception):
    """A node or an actor of the trial was lost."""


class _RayNodes(TrialProcesses):
    """A trial's processes on its placement group's nodes, one :class:`_NodeAgent` each; after the trial the logs and
    JSON lines are copied to ``tdir`` on the driver where the nodes wrote them elsewhere."""

    def __init__(self, actors: list[Any], tdir: Path, out_path: str) -> None:
        self.actors = actors
        self.tdir = tdir
        self.out_path = out_path
        self.steps_text = ""
        self._dead: set[int] = set()  # agents found dead: not waited on again

    def _get(self, refs: Any) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(refs, timeout=60)
        except (RayActorError, GetTimeoutError) as e:
            raise _NodeLost(f"a node stopped answering during the trial ({type(e).__name__})") from None

    def poll(self) -> list[int | None]:
        """Raises _NodeLost: an agent died or did not answer within 60 s."""
        return list(self._get([a.poll.remote() for a in self.actors]))

    def read_steps(self) -> str:
        """The first node's JSON lines so far (raises _NodeLost as :meth:`poll`)."""
        self.steps_text = str(self._get(self.actors[0].read.remote(self.out_path)))
        return self.steps_text

    def kill(self, grace_s: float) -> None:
        import ray
        from ray.exceptions import RayActorError

        refs = {}
        for i, a in enumerate(self.actors):  # every node at once
            if i not in self._dead:
                try:
                    refs[i] = a.kill.remote(grace_s)
                except Exception:  # noqa: BLE001 - a dead actor has nothing left to kill
                    self._dead.add(i)
        for i, r in refs.items():
            try:
                ray.get(r, timeout=30)
            except RayActorError:  # its node is gone, and its processes with it
                self._dead.add(i)
            except Exception:  # noqa: BLE001
                pass

    def collect(self) -> str:
        import ray

        logs = []
        for i, a in enumerate(self.actors):
            try:
                logs.append(ray.get(a.read.remote(str(self.tdir / f"log.node{i}.txt"), 200_000), timeout=60))
            except Exception:  # noqa: BLE001
                logs.append("")
        if not Path(self.out_path).exists():
            Path(self.out_path).write_text(self.steps_text)
        for i, text in enumerate(logs):
            p = self.tdir / f"log.node{i}.txt"
            if not p.exists():
                p.write_text(text)
        return "\n".join(logs)

    def close(self) -> None:
        import ray

        self.kill(INTERRUPT_GRACE_S)
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a)


class RayBackend(MeasuredBackend):
    """Runs each layout with the trial harness on a Ray cluster's nodes.

    ``address``: ``auto``, ``ray://...`` / ``HOST:PORT``, or None (a local Ray instance). ``launcher`` replaces torchrun
    (tests; it gets NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT), ``gpu_resource`` the Ray resource a
    GPU is (tests use a custom one), ``retries`` the attempts after a lost node.

    Raises:
        TunerError: Ray cannot connect or start.
    """

    name = "ray"
    runs_harness = True
    parallel_trials = True
    opened_by_study = True
    own_flags = frozenset({"--ray-address", "--parallel-trials", "--trial-env"})

    def __init__(self, *, trials_dir: str | Path = "results/trials", address: str | None = None, gpus_per_node: int = 8,
                 steps: int = 8, warmup_steps: int = 2, timeout_s: float = 900.0,
                 extra_env: Mapping[str, str] | None = None, launcher: Sequence[str] | None = None,
                 gpu_resource: str = "GPU", env: HarnessEnv | None = None, retries: int = 1,
                 placement_timeout_s: float = 600.0, poll_s: float = 0.5,
                 init_kwargs: Mapping[str, Any] | None = None) -> None:
        # trials_dir absolute: the nodes resolve it, not the driver's working folder
        super().__init__(Path(trials_dir).absolute(), steps, warmup_steps, timeout_s, poll_s)
        self.address = address
        self.gpus_per_node = int(gpus_per_node)
        self.extra_env = dict(extra_env or {})
        self.launcher = list(launcher) if launcher is not None else None
        self.gpu_resource = gpu_resource
        self.env = env if env is not None else HarnessEnv.detect()
        self.retries = int(retries)
        self.placement_timeout_s = float(placement_timeout_s)
        self._started_ray = False
        self._connect(dict(init_kwargs or {}))

    @classmethod
    def from_settings(cls, settings: BackendSettings) -> RayBackend:
        return cls(trials_dir=settings.trials_dir, address=settings.address, gpus_per_node=settings.gpus_per_node,
                   steps=settings.steps, warmup_steps=settings.warmup_steps, timeout_s=settings.timeout_s,
                   extra_env=settings.extra_env)

    # ---- Ray ----

    def _connect(self, init_kwargs: dict[str, Any]) -> None:
        try:
            import ray
        except ImportError:
            raise TunerError("--backend ray needs the ray package (a dependency of this project: reinstall "
                             "it)") from None
        if ray.is_initialized():
            return
        kw: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False, "include_dashboard": False}
        if self.address is not None:
            _reachable(self.address)  # Ray itself retries an unreachable address for minutes
            kw["address"] = self.address
        kw.update(init_kwargs)
        try:
            ray.init(**kw)
        except Exception as e:  # noqa: BLE001 - connection errors of every kind
            where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray instance"
            raise TunerError(f"--backend ray: cannot connect to {where} ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); start one with `ray start --head` (then "
                             "--ray-address auto), or leave --ray-address out") from None
        self._started_ray = True

    def cluster_gpus(self) -> float:
        import ray

        return float(ray.cluster_resources().get(self.gpu_resource, 0.0))

    def refusal(self, layout: Layout, model: ModelSpec, workload: Workload) -> str | None:
        have = self.cluster_gpus()
        if layout.world_size > have:
            return f"the layout needs {layout.world_size} GPUs; the Ray cluster has {have:g} ({self.gpu_resource})"
        try:
            node_plan(layout.world_size, self.gpus_per_node)
        except TunerError as e:
            return str(e)
        return "; ".join(unsupported_reasons(layout, model, workload, self.env)) or None

    def close(self) -> None:
        import ray

        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    # ---- one trial ----

    def run(self, layout: Layout, *, model: ModelSpec, cluster: Cluster, workload: Workload,
            reporter: StepReporter | None = None, trial_number: int | None = None) -> Measurement:
        """Run ``layout`` as the harness on the cluster.

        Raises:
            InfeasibleLayout: (rule ``harness_env``) the cluster cannot hold the layout; nothing was started.
            TrialFailed: out of memory, timeout, crash, a node that cannot start it, or a node lost twice.
            TrialStopped: the reporter stopped the trial.
            KeyboardInterrupt: the backend was cancelled; every node's processes were killed.
        """
        why = self.refusal(layout, model, workload)
        if why:
            raise InfeasibleLayout("harness_env", why)
        spec = build_spec(model, layout, workload, env=self.env, steps=self.steps, warmup_steps=self.warmup_steps)
        _, tdir = self._trial_folder(trial_number)
        attempts = 1 + max(0, self.retries)
        lost: list[str] = []
        for attempt in range(attempts):
            # A retry works in a folder of its own: a process left on a lost node must not write into it.
            adir = tdir if attempt == 0 else tdir / f"attempt{attempt}"
            adir.mkdir(parents=True, exist_ok=True)
            try:
                return self._attempt(layout, spec.to_json(), adir, reporter, attempt)
            except _NodeLost as e:
                lost.append(str(e))
                (tdir / f"lost.attempt{attempt}.txt").write_text(str(e) + "\n")
        raise TrialFailed(FailureKind.crash, f"node lost in {attempts} attempts ({'; '.join(lost)})", str(tdir))

    def _attempt(self, layout: Layout, spec_text: str, tdir: Path, reporter: StepReporter | None,
                 attempt: int) -> Measurement:
        import ray
        from ray.exceptions import RayActorError
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        sizes, strategy = node_plan(layout.world_size, self.gpus_per_node)
        pg = placement_group([{self.gpu_resource: float(g), "CPU": 1.0} for g in sizes], strategy=strategy)
        nodes = _RayNodes([], tdir, str(tdir / "steps.jsonl"))
        try:
            if not pg.wait(timeout_seconds=self.placement_timeout_s):
                raise TrialFailed(FailureKind.timeout,
                                  f"the Ray cluster did not place {len(sizes)} x {sizes[0]} {self.gpu_resource} "
                                  f"({strategy}) within {self.placement_timeout_s:.0f} s", str(tdir))
            agent_cls = ray.remote(_NodeAgent)
            for i, g in enumerate(sizes):
                where_i = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
                opts: dict[str, Any] = {"num_cpus": 1, "max_restarts": 0, "scheduling_strategy": where_i}
                if self.gpu_resource == "GPU":
                    opts["num_gpus"] = g
                else:
                    opts["resources"] = {self.gpu_resource: g}
                nodes.actors.append(agent_cls.options(**opts).remote())
            try:
                where = ray.get([a.where.remote() for a in nodes.actors], timeout=self.placement_timeout_s)
            except RayActorError as e:
                raise _NodeLost(f"an actor died before the start ({type(e).__name__})") from None
            master, port = where[0]["ip"], where[0]["port"]
            plan = {"strategy": strategy, "bundles": sizes, "attempt": attempt, "nodes": where}
            (tdir / "placement.json").write_text(json.dumps(plan, indent=1))
            pids = []
            for i, (a, g) in enumerate(zip(nodes.actors, sizes)):
                env = {**SAFE_ENV, **self.extra_env, "NNODES": str(len(sizes)), "NODE_RANK": str(i),
                       "NPROC_PER_NODE": str(g), "MASTER_ADDR": master, "MASTER_PORT": str(port),
                       "TUNE_TRIAL_ATTEMPT": str(attempt)}
                head = self.launcher if self.launcher is not None else torchrun_node_command(len(sizes), i, g, master,
                                                                                             port)
                cmd = [*head, *harness_args(tdir / "spec.json", nodes.out_path)]
                pids.append(a.start.remote(cmd, env, str(tdir), spec_text, os.getcwd()))
            try:
                ray.get(pids, timeout=60)
            except RayActorError as e:
                raise _NodeLost(f"an actor died at the start ({type(e).__name__})") from None
            except Exception as e:  # noqa: BLE001 - e.g. the program cannot be started on a node
                why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
                raise TrialFailed(FailureKind.crash, f"a node could not start the trial: {why}", str(tdir)) from None
            trial = self._trial(layout, tdir, reporter, logs=f"logs: {tdir}")
            return trial.follow(nodes, HarnessLines(nodes.read_steps),
                                extra=lambda got: {"nodes": len(nodes.actors),
                                                   "notes": list(got.result.start.get("notes", []))})
        finally:
            nodes.close()
            with contextlib.suppress(Exception):
                remove_placement_group(pg)


def parse_ray_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; None for ``auto``.

    Raises:
        TunerError: anything else.
    """
    if address == "auto":
        return None
    hp = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = hp.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise TunerError(f"--ray-address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT (port 1-65535)")
    return host, int(port)


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when the address does not accept a TCP connection (Ray retries for minutes).

    Raises:
        TunerError: the address is malformed or nothing listens there.
    """
    hp = parse_ray_address(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as e:
        raise TunerError(f"--ray-address {address!r}: nothing answers there ({e.strerror or e}); start the cluster "
                         "with `ray start --head` and use the address it prints, or --ray-address auto on one of its "
                         "nodes") from None
