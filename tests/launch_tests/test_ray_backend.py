"""The ray backend on a Ray cluster of simulated nodes (ray.cluster_utils.Cluster, a custom GPU resource),
with the fake trial program standing in for torchrun + the harness (no GPU, no torch)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from launch.base import FailureKind, TrialFailed
from launch.harness.spec import HarnessEnv, slice_model
from launch.ray_backend import RayBackend, node_plan, torchrun_node_command
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

FAKE = str(Path(__file__).with_name("fake_trial.py"))
WL = Workload(seq_length=8192, global_batch_size=8)
GPU = "fake_gpu"


def test_node_plan():
    assert node_plan(2, 8) == ([2], "STRICT_PACK")
    assert node_plan(8, 8) == ([8], "STRICT_PACK")
    assert node_plan(16, 8) == ([8, 8], "STRICT_SPREAD")
    with pytest.raises(TunerError, match="whole nodes"):
        node_plan(12, 8)
    cmd = torchrun_node_command(2, 1, 8, "10.0.0.1", 29500, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"] and "--node-rank=1" in cmd and "--master-addr=10.0.0.1" in cmd
    assert cmd[-2:] == ["-m", "launch.harness.train"]
    from launch.ray_backend import NODE_PYTHON

    assert torchrun_node_command(1, 0, 8, "h", 1)[0] == NODE_PYTHON  # each node uses its own Python


@pytest.fixture(scope="module")
def cluster():
    """Three simulated nodes of 2 'GPUs' each (the head node is node 0)."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "resources": {GPU: 2}})
    nodes = [c.add_node(num_cpus=3, resources={GPU: 2}) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, include_dashboard=False)
    yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def m2():
    return slice_model(load_model("MiniMax-M2"), 2)


def _backend(tmp_path, fake=None, **kw):
    """The backend with the fake program; ``fake``: its FAKE_* settings, passed as the user's extra environment
    (the driver's own environment does not reach the nodes, as on a real cluster)."""
    base = dict(trials_dir=tmp_path / "trials", gpus_per_node=2, steps=4, warmup_steps=1, timeout_s=60, launcher=[sys.executable, FAKE],
                gpu_resource=GPU, env=HarnessEnv(), poll_s=0.05, placement_timeout_s=60, extra_env={"FAKE_EXTRA": "yes", **(fake or {})})
    base.update(kw)
    return RayBackend(**base)


def _run(b, m2, world, n, **kw):
    lay = Layout(world_size=world, ep=2)
    return b.run(lay, model=m2, cluster=parse_gpus(f"{world}xH200"), workload=WL, trial_number=n, **kw)


def test_a_two_node_trial_spreads_and_every_node_sees_the_rendezvous(cluster, m2, tmp_path, monkeypatch):
    dump = tmp_path / "env"
    m = _run(_backend(tmp_path, {"FAKE_ENV_DUMP": str(dump), "FAKE_STEP_S": "0.05"}), m2, 4, 1)
    assert m.source == "measured" and m.tokens_per_s_per_gpu > 0 and m.extra["nodes"] == 2
    envs = sorted((json.loads(p.read_text())["env"] for p in dump.glob("1.node*.json")), key=lambda e: e["NODE_RANK"])
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert all(e["NNODES"] == "2" and e["NPROC_PER_NODE"] == "2" and e["FAKE_EXTRA"] == "yes" and e["NCCL_NVLS_ENABLE"] == "0" for e in envs)
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1  # one rendezvous: the first bundle's node
    pl = json.loads((tmp_path / "trials" / "1" / "placement.json").read_text())
    assert pl["strategy"] == "STRICT_SPREAD" and pl["bundles"] == [2, 2]
    assert len({n["node_id"] for n in pl["nodes"]}) == 2  # two distinct nodes
    assert ray.util.placement_group_table() and all(v["state"] == "REMOVED" for v in ray.util.placement_group_table().values())


def test_trials_run_concurrently(cluster, m2, tmp_path, monkeypatch):
    dump = tmp_path / "env"
    b = _backend(tmp_path, {"FAKE_ENV_DUMP": str(dump), "FAKE_STEP_S": "0.6"})
    results = {}

    def go(n):
        results[n] = _run(b, m2, 2, n)

    threads = [threading.Thread(target=go, args=(n,)) for n in (10, 11)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    assert set(results) == {10, 11}
    starts = {json.loads(p.read_text())["out"].split("/")[-2]: json.loads(p.read_text())["t"] for p in dump.glob("*.json")}
    assert abs(starts["10"] - starts["11"]) < 2.0  # both started before either finished (each runs >= 2.4 s)
    assert wall < 2 * 4 * 0.6 + 8


def test_more_gpus_than_the_cluster_is_refused_before_anything_starts(cluster, m2, tmp_path):
    with pytest.raises(InfeasibleLayout, match="the Ray cluster has 6"):
        _run(_backend(tmp_path), m2, 8, 2)
    assert not (tmp_path / "trials" / "2").exists()


def test_out_of_memory_is_an_outcome(cluster, m2, tmp_path, monkeypatch):
    with pytest.raises(TrialFailed) as e:
        _run(_backend(tmp_path, {"FAKE_TRIAL_MODE": "oom"}), m2, 2, 3)
    assert e.value.kind == FailureKind.oom


def test_a_program_that_cannot_start_is_a_crash_not_an_exception(cluster, m2, tmp_path):
    with pytest.raises(TrialFailed) as e:
        _run(_backend(tmp_path, launcher=["/nonexistent/launcher"]), m2, 2, 6)
    assert e.value.kind == FailureKind.crash and "could not start" in str(e.value)
    assert all(v["state"] == "REMOVED" for v in ray.util.placement_group_table().values())


def test_interrupt_kills_every_node_and_removes_the_placement_group(cluster, m2, tmp_path, monkeypatch):
    steps = 20

    def reporter(tps):
        raise KeyboardInterrupt  # Ctrl-C while the trial runs

    with pytest.raises(KeyboardInterrupt):
        _run(_backend(tmp_path, {"FAKE_STEP_S": "0.3", "FAKE_ENV_DUMP": str(tmp_path / "env")}, steps=steps), m2, 4, 4, reporter=reporter)
    pids = [json.loads(p.read_text())["pid"] for p in (tmp_path / "env").glob("4.node*.json")]
    assert len(pids) == 2
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert all(v["state"] == "REMOVED" for v in ray.util.placement_group_table().values())


def test_a_study_runs_ray_trials_two_at_a_time(cluster, tmp_path):
    from tuner.study import TuneConfig, prepare, run_study, trial_rows

    cfg = TuneConfig(model="MiniMax-M2", gpus="2xH200", layers=2, global_batch_size=8, backend="ray", trials=4, stack="megatron",
                     results_dir=str(tmp_path), trial_steps=4, study="r", parallel_trials=2, prune_margin=None)
    dump = tmp_path / "env"
    res = run_study(prepare(cfg), backend=_backend(tmp_path / "r", {"FAKE_STEP_S": "1.0", "FAKE_ENV_DUMP": str(dump)}))
    rows = trial_rows(res.study)
    keys = [r["key"] for r in rows]
    assert len(rows) >= 2 and len(set(keys)) == len(keys) and all(r["source"] == "measured" for r in rows)
    spans = sorted(json.loads(p.read_text())["t"] for p in dump.glob("*.json"))
    # one after the other, starts would be a trial's length (4 steps x 1 s) apart; at once, much closer
    assert any(b - a < 3.0 for a, b in zip(spans, spans[1:])), spans


def test_ctrl_c_stops_parallel_trials_and_leaves_the_study_consistent(cluster, tmp_path):
    import signal

    import optuna

    from tuner.study import TuneConfig, prepare, run_study

    cfg = TuneConfig(model="MiniMax-M2", gpus="2xH200", layers=2, global_batch_size=8, backend="ray", trials=4, stack="megatron",
                     results_dir=str(tmp_path), trial_steps=60, study="c", parallel_trials=2, prune_margin=None)
    b = _backend(tmp_path / "c", {"FAKE_STEP_S": "0.5"}, steps=60, timeout_s=120)  # a trial would take 30 s
    threading.Timer(4.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_study(prepare(cfg), backend=b)
    assert time.monotonic() - t0 < 25  # stopped, not run to the end
    st = optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'c' / 'study.db'}")
    assert st.trials and not [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert all(v["state"] == "REMOVED" for v in ray.util.placement_group_table().values())


def test_a_lost_node_is_retried_once_on_the_others(cluster, m2, tmp_path, monkeypatch):
    """Runs last: it removes a node from the module's cluster."""
    c, nodes = cluster
    b = _backend(tmp_path, {"FAKE_STEP_S": "0.5"}, steps=8, timeout_s=90)
    box = {}

    def go():
        try:
            box["m"] = _run(b, m2, 4, 5)
        except BaseException as e:  # noqa: BLE001
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    pl_path = tmp_path / "trials" / "5" / "placement.json"
    for _ in range(200):
        if pl_path.exists():
            break
        time.sleep(0.1)
    used = {n["node_id"] for n in json.loads(pl_path.read_text())["nodes"]}
    victim = next(n for n in nodes if n.node_id in used)  # a worker node of this trial (never the head)
    time.sleep(1.0)
    c.remove_node(victim, allow_graceful=False)
    t.join(timeout=120)
    assert "m" in box, box.get("e")
    m = box["m"]
    assert m.tokens_per_s_per_gpu > 0 and m.log_path.endswith("attempt1")
    assert (tmp_path / "trials" / "5" / "lost.attempt0.txt").exists()
    pl2 = json.loads((tmp_path / "trials" / "5" / "attempt1" / "placement.json").read_text())
    assert victim.node_id not in {n["node_id"] for n in pl2["nodes"]}
