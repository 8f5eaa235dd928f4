"""Scale-out fabrics (``--network``) and what each MoE token dispatcher does on them, from ``specs/data/networks.yaml``.

A :class:`Network` is the fabric between NVLink domains (nodes, or NVL72 racks): its per-GPU bandwidth and, per
:class:`specs.layout.Dispatcher`, whether its inter-node kernels run there and the fraction of the NIC bandwidth
they reach (:class:`DispatcherOnFabric`). The data and their sources: ``docs/network_fabrics.md``. The NVLink side
(the NVLink domain of a GB200 / GB300 rack, or an 8-GPU node) is the GPU's (:attr:`specs.GPUSpec.nvlink_domain`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import yaml

from specs._data import NETWORKS_FILE, data_file
from specs.errors import TunerError
from specs.layout import Dispatcher


@dataclass(frozen=True, kw_only=True, slots=True)
class DispatcherOnFabric:
    """One dispatcher across one fabric (between NVLink domains)."""

    runs: str
    """``true``, ``false`` (its inter-node kernels do not run on this fabric) or ``unknown`` (not tested by its
    authors there: allowed)."""
    efficiency: float | None
    """Fraction of the per-GPU NIC bandwidth its kernels reach (its own published measurement); None = NCCL's,
    the calibration's ``network_efficiency``."""
    source: str
    counted: str = "per_gpu"
    """What bytes the efficiency is counted on: ``per_gpu``, one copy per remote GPU that holds one
    of a token's experts; ``per_node``, one copy per NVLink domain that does, the token's own included (how DeepEP's
    and HybridEP's benchmarks count their RDMA bytes: ``num_rdma_token_sent`` / ``count_rdma_send_from_routing_map``
    over the (token, node) pairs)."""

    @property
    def runs_across(self) -> bool:
        """The dispatcher may span NVLink domains on this fabric (``runs`` is not ``false``)."""
        return self.runs != "false"


@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    """A scale-out fabric."""

    key: str
    """``--network`` name, e.g. ``efa-v3``."""
    name: str
    """Human name, e.g. ``AWS EFA v3``."""
    per_gpu_bytes_per_s: float
    """NIC bandwidth per GPU per direction, bytes/s (one NIC per GPU)."""
    dispatchers: dict[str, DispatcherOnFabric]
    """Per :class:`Dispatcher` value, across the fabric."""
    intra_domain_efficiency: dict[str, float | None]
    """Per dispatcher value, the fraction of NVLink bandwidth its kernels reach inside an NVLink domain; None = NCCL's
    (the calibration's ``alltoall_nvlink_efficiency``)."""
    source: str

    def dispatcher(self, d: Dispatcher | str) -> DispatcherOnFabric:
        """What ``d`` does across this fabric (a dispatcher the data file does not list runs at NCCL's efficiency)."""
        key = Dispatcher(d).value
        return self.dispatchers.get(key, DispatcherOnFabric(runs="unknown", efficiency=None,
                                                            source="not in specs/data/networks.yaml"))

    @property
    def not_across(self) -> tuple[str, ...]:
        """Dispatcher values whose inter-node kernels do not run on this fabric."""
        return tuple(k for k, v in self.dispatchers.items() if not v.runs_across)


@functools.lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    d: dict[str, Any] = yaml.safe_load(data_file(NETWORKS_FILE).read_text())
    return d


def list_networks() -> list[str]:
    """The ``--network`` names the data file knows."""
    return sorted(_data()["fabrics"])


def _efficiency(v: Any) -> float | None:
    return None if v is None else float(v)


def intra_domain_efficiency() -> dict[str, float | None]:
    """Per dispatcher value, the fraction of NVLink bandwidth its kernels reach inside an NVLink domain (any fabric;
    ``intra_domain`` of the data file); None = NCCL's (the calibration's ``alltoall_nvlink_efficiency``)."""
    return {Dispatcher(k).value: _efficiency(v.get("efficiency")) for k,
            v in (_data().get("intra_domain") or {}).items()}


@functools.lru_cache(maxsize=32)
def load_network(key: str) -> Network:
    """The fabric named ``key`` (case-insensitive).

    Raises TunerError: unknown name, with the known ones."""
    fabrics = _data()["fabrics"]
    by_lower = {k.lower(): k for k in fabrics}
    real = by_lower.get(str(key).strip().lower())
    if real is None:
        raise TunerError(f"--network {key!r}: unknown network; known: {', '.join(list_networks())} "
                         "(specs/data/networks.yaml)")
    f = fabrics[real]
    disp = {}
    for name, v in (f.get("dispatchers") or {}).items():
        disp[Dispatcher(name).value] = DispatcherOnFabric(
            runs=str(v.get("runs")).lower(), efficiency=_efficiency(v.get("efficiency")),
            source=str(v.get("source", "")), counted=str(v.get("counted", "per_gpu")))
    intra = intra_domain_efficiency()
    return Network(key=real, name=str(f["name"]), per_gpu_bytes_per_s=float(f["per_gpu_gbps"]) * 1e9 / 8,
                   dispatchers=disp,
                   intra_domain_efficiency=intra, source=str(f.get("source", "")))
