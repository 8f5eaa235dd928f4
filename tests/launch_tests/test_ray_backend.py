"""What is the ray backend's own, on the session's simulated Ray cluster (conftest.py: three nodes of 2 'GPUs',
a custom resource) with the fake trial program standing in for torchrun + the harness (no GPU, no torch):
the node plan, placement across nodes and the rendezvous, trials at once, refusals, an interrupt on every
node, a study of parallel trials and its Ctrl-C, the retry after a lost node. What every backend does
(a measurement, OOM, crash, timeout, a stop, cancel) is in test_backend_contract.py. Nothing here asserts
how long anything took: trials at once meet at a barrier of the fake program; kills are checked on its pid files.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest

from launch.harness.spec import HarnessEnv
from launch.ray_backend import NODE_PYTHON, RayBackend, node_plan, torchrun_node_command
from specs import Workload, load_model, parse_gpus
from specs.errors import InfeasibleLayout, TunerError
from specs.layout import Layout
from specs.model import slice_model

from .fake_trial import FAKE, recorded_pids, survivors, wait_until

pytestmark = pytest.mark.slow  # a simulated Ray cluster

ray = pytest.importorskip("ray")

WL = Workload(seq_length=8192, global_batch_size=8)


def test_node_plan():
    assert node_plan(2, 8) == ([2], "STRICT_PACK")
    assert node_plan(8, 8) == ([8], "STRICT_PACK")
    assert node_plan(16, 8) == ([8, 8], "STRICT_SPREAD")
    with pytest.raises(TunerError, match="whole nodes"):
        node_plan(12, 8)
    cmd = torchrun_node_command(2, 1, 8, "10.0.0.1", 29500, python="py")
    assert (
        cmd[:3] == ["py", "-m", "torch.distributed.run"] and "--node-rank=1" in cmd and "--master-addr=10.0.0.1" in cmd
    )
    assert cmd[-2:] == ["-m", "launch.harness.train"]
    assert torchrun_node_command(1, 0, 8, "h", 1)[0] == NODE_PYTHON  # each node uses its own Python


@pytest.fixture(scope="module")
def m2():
    return slice_model(load_model("MiniMax-M2"), 2)


def _backend(cluster, tmp_path, fake=None, **kw):
    """The backend with the fake program; ``fake``: its FAKE_* settings, passed as the user's extra environment
    (the driver's own environment does not reach the nodes, as on a real cluster)."""
    base = dict(
        trials_dir=tmp_path / "trials",
        gpus_per_node=2,
        steps=4,
        warmup_steps=1,
        timeout_s=60,
        launcher=[sys.executable, FAKE],
        gpu_resource=cluster.gpu,
        env=HarnessEnv(),
        poll_s=0.02,
        placement_timeout_s=60,
        extra_env={"FAKE_EXTRA": "yes", "FAKE_PID_DIR": str(tmp_path / "pids"), **(fake or {})},
    )
    base.update(kw)
    return RayBackend(**base)


def _run(b, m2, world, n, **kw):
    lay = Layout(world_size=world, ep=2)
    return b.run(lay, model=m2, cluster=parse_gpus(f"{world}xH200"), workload=WL, trial_number=n, **kw)


def _pgs_removed() -> bool:
    return all(v["state"] == "REMOVED" for v in ray.util.placement_group_table().values())


def test_a_two_node_trial_spreads_and_every_node_sees_the_rendezvous(ray_cluster, m2, tmp_path):
    dump = tmp_path / "env"
    m = _run(_backend(ray_cluster, tmp_path, {"FAKE_ENV_DUMP": str(dump)}), m2, 4, 1)
    assert m.source == "measured" and m.tokens_per_s_per_gpu > 0 and m.extra["nodes"] == 2
    envs = sorted((json.loads(p.read_text())["env"] for p in dump.glob("1.node*.json")), key=lambda e: e["NODE_RANK"])
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert all(
        e["NNODES"] == "2" and e["NPROC_PER_NODE"] == "2" and e["FAKE_EXTRA"] == "yes" and e["NCCL_NVLS_ENABLE"] == "0"
        for e in envs
    )
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1  # one rendezvous: the first bundle's node
    d = tmp_path / "trials" / "1"
    pl = json.loads((d / "placement.json").read_text())
    assert pl["strategy"] == "STRICT_SPREAD" and pl["bundles"] == [2, 2]
    assert len({n["node_id"] for n in pl["nodes"]}) == 2  # two distinct nodes
    assert {p.name for p in d.iterdir()} >= {
        "spec.json",
        "steps.jsonl",
        "log.node0.txt",
        "log.node1.txt",
        "command.node0.txt",
        "command.node1.txt",
        "process.json",
        "process.node1.json",
    }
    recs = [json.loads((d / f).read_text()) for f in ("process.json", "process.node1.json")]
    assert (
        all(r["host"] and r["pgid"] > 0 for r in recs) and recs[0]["pgid"] != recs[1]["pgid"]
    )  # each node's own group
    assert ray.util.placement_group_table() and _pgs_removed()


def test_trials_run_concurrently(ray_cluster, m2, tmp_path):
    # Each trial's program waits at a barrier until the other's has started: both finish only if they ran at once.
    b = _backend(ray_cluster, tmp_path, {"FAKE_BARRIER": f"{tmp_path / 'barrier'}:2"})
    results, errors = {}, {}

    def go(n):
        try:
            results[n] = _run(b, m2, 2, n)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[n] = e

    threads = [threading.Thread(target=go, args=(n,)) for n in (10, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and set(results) == {10, 11}, errors
    assert (
        all(m.tokens_per_s_per_gpu > 0 for m in results.values())
        and len(os.listdir(tmp_path / "barrier")) == 2
        and _pgs_removed()
    )


def test_more_gpus_than_the_cluster_is_refused_before_anything_starts(ray_cluster, m2, tmp_path):
    with pytest.raises(InfeasibleLayout, match="the Ray cluster has 6"):
        _run(_backend(ray_cluster, tmp_path), m2, 8, 2)
    assert not (tmp_path / "trials" / "2").exists()


def test_interrupt_kills_every_node_and_removes_the_placement_group(ray_cluster, m2, tmp_path):
    def reporter(tps):  # Ctrl-C while the trial runs on both nodes
        wait_until(lambda: len(recorded_pids(tmp_path / "pids")["fake"]) == 2)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # node 0 hangs with a child, node 1 sleeps: only the kill ends them
        _run(_backend(ray_cluster, tmp_path, {"FAKE_TRIAL_MODE": "hang"}), m2, 4, 4, reporter=reporter)
    pids = recorded_pids(tmp_path / "pids")
    assert len(pids["fake"]) == 2 and len(pids["child"]) == 1  # both nodes' programs ran, node 0's started its child
    assert not survivors(tmp_path / "pids") and _pgs_removed()


def test_a_study_runs_ray_trials_two_at_a_time(ray_cluster, tmp_path):
    import optuna

    from tuner.study import TuneConfig, prepare, run_study, trial_rows

    cfg = TuneConfig.from_dict(dict(
        model="MiniMax-M2", gpus="2xH200", layers=2, global_batch_size=8, backend="ray", trials=4, stack="megatron",
        results_dir=str(tmp_path), trial_steps=4, study="r", parallel_trials=2, prune_margin=None,
    ))
    # The first two trials meet at a barrier (the first waits until the second started): run one after the other,
    # the first would fail there.
    fake = {"FAKE_BARRIER": f"{tmp_path / 'barrier'}:2", "FAKE_REPORT_STEP_S": "1.0"}
    res = run_study(prepare(cfg), backend=_backend(ray_cluster, tmp_path / "r", fake))
    rows = trial_rows(res.study)
    keys = [r.key for r in rows]
    assert len(rows) >= 2 and len(set(keys)) == len(keys) and all(r.source == "measured" for r in rows)
    assert not [t for t in res.study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(os.listdir(tmp_path / "barrier")) >= 2


def test_ctrl_c_stops_parallel_trials_and_leaves_the_study_consistent(ray_cluster, tmp_path):
    import optuna

    from tuner.study import TuneConfig, prepare, run_study

    cfg = TuneConfig.from_dict(dict(
        model="MiniMax-M2", gpus="2xH200", layers=2, global_batch_size=8, backend="ray", trials=4, stack="megatron",
        results_dir=str(tmp_path), trial_steps=8, study="c", parallel_trials=2, prune_margin=None,
    ))
    pid_dir = tmp_path / "c" / "pids"
    b = _backend(
        ray_cluster, tmp_path / "c", {"FAKE_TRIAL_MODE": "hang"}, steps=8
    )  # every trial hangs: only Ctrl-C ends them
    seen = {}

    def ctrl_c_once_both_hang():
        seen["both"] = wait_until(lambda: len(recorded_pids(pid_dir)["child"]) >= 2, timeout_s=60)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=ctrl_c_once_both_hang)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        run_study(prepare(cfg), backend=b)
    watcher.join()
    assert seen["both"]  # two trials were running when Ctrl-C came
    st = optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'c' / 'study.db'}")
    assert st.trials and not [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert not survivors(pid_dir) and _pgs_removed()


def test_a_lost_node_is_retried_once_on_the_others(ray_cluster, m2, tmp_path):
    """Runs last: it removes a node from the session's cluster."""
    c, nodes = ray_cluster.cluster, ray_cluster.nodes
    pid_dir = tmp_path / "pids"
    b = _backend(
        ray_cluster, tmp_path, {"FAKE_TRIAL_MODE": "hang", "FAKE_HANG_ATTEMPT": "0"}, timeout_s=90
    )  # attempt 0 hangs, 1 runs
    box = {}

    def go():
        try:
            box["m"] = _run(b, m2, 4, 5)
        except BaseException as e:  # noqa: BLE001
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    try:
        pl_path = tmp_path / "trials" / "5" / "placement.json"
        assert wait_until(
            lambda: pl_path.exists() and len(recorded_pids(pid_dir)["fake"]) == 2, timeout_s=60
        )  # both nodes run
        used = {n["node_id"] for n in json.loads(pl_path.read_text())["nodes"]}
        victim = next(n for n in nodes if n.node_id in used)  # a worker node of this trial (never the head)
        c.remove_node(victim, allow_graceful=False)
        t.join(timeout=120)
        assert "m" in box, box.get("e")
        m = box["m"]
        assert m.tokens_per_s_per_gpu > 0 and m.log_path.endswith("attempt1")
        assert (tmp_path / "trials" / "5" / "lost.attempt0.txt").exists()
        pl2 = json.loads((tmp_path / "trials" / "5" / "attempt1" / "placement.json").read_text())
        assert victim.node_id not in {n["node_id"] for n in pl2["nodes"]}
    finally:
        # The program on the removed node outlives it (a real node takes its processes with it): end its group here.
        for pid in recorded_pids(pid_dir)["fake"]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        t.join(timeout=120)
    assert not survivors(pid_dir)
