"""What the backend tests share: one simulated Ray cluster for this package's tests (starting one costs
seconds on a 2-core machine), shut down after its last test (``scope="package"``: no other test finds Ray
connected), with its session folders under pytest's temporary folder, removed with it."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class RayCluster:
    """The session's simulated Ray cluster."""

    cluster: Any
    """The :class:`ray.cluster_utils.Cluster`."""
    nodes: list[Any]
    """Its worker nodes (the head node is not among them)."""
    gpu: str = "fake_gpu"
    """The Ray resource that stands for a GPU."""


@pytest.fixture(scope="package")
def ray_cluster(tmp_path_factory):
    """Three simulated nodes of 2 'GPUs' each (a :class:`RayCluster`), the driver connected to it.

    Ray writes its session folders (logs, sockets) under ``RAY_TMPDIR``: a folder under pytest's temporary
    folder (or a short one of the system's when that path is long: Unix socket paths must stay under 108
    bytes), removed with the cluster. (Ray refuses a folder inside a virtual environment.)"""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    tmp = tmp_path_factory.mktemp("ray", numbered=True)
    if (
        len(str(tmp)) > 40
    ):  # a long --basetemp: Ray's socket paths (session_<date>_<pid>/sockets/plasma_store) would not fit
        tmp = Path(tempfile.mkdtemp(prefix="pytest-ray-"))
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(tmp)
    c = None
    try:
        gpu = RayCluster.gpu
        c = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 3, "resources": {gpu: 2}, "include_dashboard": False}
        )
        nodes = [c.add_node(num_cpus=3, resources={gpu: 2}) for _ in range(2)]
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False, include_dashboard=False)
        yield RayCluster(c, nodes)
    finally:
        ray.shutdown()
        if c is not None:
            c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        shutil.rmtree(tmp, ignore_errors=True)
