"""Hardware: :class:`GPUSpec` (bundled datasheets) and the :class:`Cluster` a job runs on.

SI units (bytes, FLOP/s, bytes/s); the YAML datasheets name their units and are converted once, here."""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from specs._data import GPU_DIR, data_files
from specs.errors import TunerError
from specs.network import Network, list_networks, load_network
from specs.precision import Precision

#: Per-node network bandwidth of the seed's cluster: AWS p5en.48xlarge, 3.2 Tb/s EFA
#: per node (seeds/001 ``stack.network``) = 400e9 bytes/s.
DEFAULT_INTER_NODE_BYTES_PER_S = 3.2e12 / 8

#: Price per GPU-hour that the seed implies: $1.08 per 1M tokens at 2,034.42
#: tokens/s/GPU (seeds/001 ``result``): 1.08 * 2034.42 * 3600 / 1e6 = 7.91 $/GPU-h.
DEFAULT_USD_PER_GPU_HOUR = round(1.08 * 2034.42 * 3600 / 1e6, 2)


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator, from a bundled YAML datasheet file (``specs/data/gpus``)."""

    name: str
    hbm_bytes: float
    """Memory the framework can use (bytes), as ``nvidia-smi`` reports it."""
    peak_flops_bf16: float
    """Dense (non-sparse) bf16 tensor-core peak, FLOP/s."""
    peak_flops_fp8: float
    """Dense fp8 peak, FLOP/s (0 if the GPU has no fp8)."""
    peak_flops_fp4: float = 0.0
    """Dense fp4 (NVFP4) peak, FLOP/s (0 if the GPU has no fp4 tensor cores)."""
    network_bytes_per_s_per_gpu: float = 0.0
    """Scale-out NIC bandwidth per GPU per direction in the reference system (bytes/s; DGX / NVL72
    racks have one NIC per GPU); 0 = unknown. Used by ``tune validate`` for published runs."""
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    """NVLink bandwidth per GPU per direction (bytes/s)."""
    pcie_bytes_per_s: float
    """Host <-> GPU bandwidth per direction (bytes/s)."""
    gpus_per_node: int
    """GPUs per server in the usual system (HGX / DGX)."""
    nvlink_domain: int
    """GPUs that share one NVLink domain (8 for HGX, 72 for an NVL72 rack)."""
    family: str
    """Architecture family (ampere, hopper, blackwell) for calibration constants."""
    generation: str = ""
    """A chip generation within the family that has its own calibration factor (``blackwell_ultra``: B300, GB300,
    a different die from B200 / GB200 at the same bf16 / fp8 datasheet peaks); "" = the family's own."""
    source: str
    server: str = ""
    """The server type the datasheet's system numbers are of (e.g. ``AWS p5en.48xlarge``, ``DGX H100``)."""
    network: str = ""
    """That server's default scale-out fabric (a :func:`specs.network.load_network` name); "" = none known."""
    host_memory_bytes: float = 0.0
    """That server's host memory per node, bytes (``--host-memory-gib`` default); 0 = unknown."""

    def peak_flops(self, precision: Precision) -> float:
        """Dense tensor-core peak (FLOP/s) of the GEMMs at ``precision``; 0 if the GPU lacks it."""
        if precision == Precision.bf16:
            return self.peak_flops_bf16
        if precision == Precision.nvfp4:
            return self.peak_flops_fp4
        if precision == Precision.mxfp8 and self.family != "blackwell":
            return 0.0  # MX formats need Blackwell tensor cores
        return self.peak_flops_fp8


def list_gpus() -> list[str]:
    return sorted(data_files(GPU_DIR, ".yaml"))


def load_gpu(name: str) -> GPUSpec:
    """A bundled GPU by name (case-insensitive, e.g. ``H200``).

    Raises TunerError: unknown GPU, with the known ones listed; a datasheet that is not valid YAML, lacks a key or has a
    value of the wrong kind (``specs/data/gpu.schema.json``; e.g. a ``family`` other than ampere / hopper / blackwell),
    naming the file and the key."""
    files = data_files(GPU_DIR, ".yaml")
    by_lower = {k.lower(): k for k in files}
    key = by_lower.get(name.lower())
    if key is None:
        close = difflib.get_close_matches(name.lower(), list(by_lower), n=2, cutoff=0.5)
        hint = f" Did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""
        raise TunerError(f"unknown GPU {name!r:.60}.{hint} Known GPUs: {', '.join(sorted(files))}")
    d = _checked_datasheet(files[key].name, files[key].read_text())
    return GPUSpec(
        name=d["name"], hbm_bytes=float(d["hbm_mib"]) * 2**20,
        peak_flops_bf16=float(d["peak_tflops_bf16_dense"]) * 1e12,
        peak_flops_fp8=float(d.get("peak_tflops_fp8_dense") or 0) * 1e12,
        peak_flops_fp4=float(d.get("peak_tflops_fp4_dense") or 0) * 1e12,
        network_bytes_per_s_per_gpu=float(d.get("network_gb_per_s_per_gpu") or 0) * 1e9,
        hbm_bytes_per_s=float(d["hbm_tb_per_s"]) * 1e12,
        nvlink_bytes_per_s=float(d["nvlink_gb_per_s_per_direction"]) * 1e9,
        pcie_bytes_per_s=float(d["pcie_gb_per_s_per_direction"]) * 1e9, gpus_per_node=int(d["gpus_per_node"]),
        nvlink_domain=int(d["nvlink_domain"]), family=str(d["family"]), generation=str(d.get("generation") or ""),
        source=str(d["source"]), server=str(d.get("server") or ""), network=str(d.get("network") or ""),
        host_memory_bytes=float(d.get("host_memory_gib") or 0) * 2**30)


def _checked_datasheet(file: str, text: str) -> dict[str, Any]:
    """A GPU datasheet's YAML, checked against ``specs/data/gpu.schema.json``.

    Raises TunerError: not YAML, or the first schema error, with the file, the key and what is accepted."""
    import jsonschema

    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as ex:
        raise TunerError(f"GPU datasheet {file}: not valid YAML ({ex})") from None
    schema = json.loads(data_files("data", ".schema.json")["gpu"].read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(d), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.path) or "(top level)"
        if e.validator == "enum":
            accepted = ", ".join(str(v) for v in e.validator_value)
            raise TunerError(f"GPU datasheet {file}: {where} is {e.instance!r}; accepted: {accepted}")
        raise TunerError(f"GPU datasheet {file}: {where}: {e.message}")
    return dict(d)


#: The slowest scale-out network per node modelled (Gb/s): below it the communication times overflow; real training
#: fabrics are 100-3,200 Gb/s per node.
MIN_NETWORK_GBPS = 1.0
#: The fastest (Gb/s per node): 8 NICs of 1.6 Tb/s (InfiniBand XDR) is 12,800; beyond 100,000 a figure is a typo
#: (bits for bytes, Mb/s for Gb/s), and the network would vanish from every estimate.
MAX_NETWORK_GBPS = 100_000.0


def network_bytes_per_s(gbps: float) -> float:
    """``--network-gbps`` (Gb/s per node) as bytes/s, checked first in its own unit (1e308 Gb/s overflows as bytes).

    Raises TunerError: not finite, or outside [MIN_NETWORK_GBPS, MAX_NETWORK_GBPS] (one message naming
    ``--network-gbps`` and the range)."""
    if not (math.isfinite(gbps) and MIN_NETWORK_GBPS <= gbps <= MAX_NETWORK_GBPS):
        raise TunerError(f"--network-gbps must be a number of at least {MIN_NETWORK_GBPS:g} and at most "
                         f"{MAX_NETWORK_GBPS:,.0f} Gb/s per node, got {gbps:g}")
    return gbps * 1e9 / 8


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The GPUs a job runs on."""

    gpu: GPUSpec
    num_gpus: int
    gpus_per_node: int
    inter_node_bytes_per_s: float = DEFAULT_INTER_NODE_BYTES_PER_S
    """Network bandwidth per node per direction (bytes/s), shared by its GPUs."""
    usd_per_gpu_hour: float = DEFAULT_USD_PER_GPU_HOUR
    network: Network | None = None
    """The scale-out fabric (``--network``); None = not named (no dispatcher-availability rule; NCCL's efficiencies
    for every dispatcher)."""
    host_memory_bytes_per_node: float = 0.0
    """Host memory per node, bytes (``--host-memory-gib``); 0 = not checked."""

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise TunerError(f"--gpus: the GPU count must be at least 1, got {self.num_gpus}")
        if self.gpus_per_node <= 0:
            raise TunerError(f"--gpus-per-node must be at least 1, got {self.gpus_per_node}")
        if self.gpus_per_node > self.num_gpus:
            raise TunerError(f"--gpus-per-node {self.gpus_per_node} exceeds the {self.num_gpus} GPUs of --gpus")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            lo = self.num_gpus // self.gpus_per_node * self.gpus_per_node
            raise TunerError(
                f"--gpus {self.num_gpus}x{self.gpu.name}: {self.num_gpus} GPUs are not a whole number of "
                f"{self.gpus_per_node}-GPU nodes; use {lo or self.gpus_per_node} or {lo + self.gpus_per_node}, "
                "or set --gpus-per-node")
        network_bytes_per_s(self.inter_node_bytes_per_s * 8 / 1e9)  # the --network-gbps range
        if not (math.isfinite(self.usd_per_gpu_hour) and self.usd_per_gpu_hour >= 0):
            raise TunerError("--usd-per-gpu-hour must be a finite number of US dollars, at least 0, got "
                             f"{self.usd_per_gpu_hour:g}")
        if not math.isfinite(self.host_memory_bytes_per_node) or self.host_memory_bytes_per_node < 0:
            raise TunerError("--host-memory-gib must be a finite, non-negative number of GiB, got "
                             f"{self.host_memory_bytes_per_node / 2**30:g}")

    @property
    def network_label(self) -> str:
        """The network as the main job prints it: the NVLink domain and the fabric with its per-node bandwidth."""
        gbps = self.inter_node_bytes_per_s * 8 / 1e9
        fabric = f"{self.network.key} ({self.network.name})" if self.network else "unnamed fabric"
        return f"NVLink domain {self.nvlink_size} GPUs; {fabric}, {gbps:,.0f} Gb/s per node"

    @property
    def nvlink_size(self) -> int:
        """GPUs that reach each other over NVLink: the node, or the rack for rack-scale NVLink (GB200 NVL72)."""
        if self.gpu.nvlink_domain > self.gpu.gpus_per_node:
            return min(self.gpu.nvlink_domain, self.num_gpus)
        return min(self.gpus_per_node, self.gpu.nvlink_domain)

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def label(self) -> str:
        if self.num_nodes > 1:
            return f"{self.num_nodes}x{self.gpus_per_node}x{self.gpu.name}"
        return f"{self.num_gpus}x{self.gpu.name}"


_GPUS_RE = re.compile(r"\s*(?:(\d+)\s*[xX*]\s*)?(\d+)\s*[xX*]\s*([A-Za-z][A-Za-z0-9_-]*)\s*", re.ASCII)


def parse_gpus(text: str, *, gpus_per_node: int | None = None, inter_node_bytes_per_s: float | None = None,
               usd_per_gpu_hour: float | None = None, network: str | None = None, host_memory_gib: float | None = None,
               require_network: bool = False, name: str = "--gpus") -> Cluster:
    """Parse ``64xH200`` (GPUs) or ``8x8xH200`` (nodes x GPUs per node); ``name`` is what messages call the text.

    ``network`` names the scale-out fabric (:func:`specs.network.load_network`; default the GPU's server type's); the
    per-node bandwidth is its per-GPU bandwidth x GPUs per node unless ``inter_node_bytes_per_s`` (``--network-gbps``)
    overrides it. ``host_memory_gib`` defaults to the server's.

    Raises TunerError: malformed text, unknown GPU, zero GPUs, a count that is not a whole number of nodes, an unknown
    network, or (``require_network``) a GPU whose server type has no default network and no ``network``."""
    shown = repr(text) if len(text or "") <= 80 else repr(text[:77] + "...")
    m = _GPUS_RE.fullmatch(text or "")
    if not m:
        raise TunerError(f"{name} {shown}: expected COUNTxGPU such as 64xH200, or NODESxPER_NODExGPU such as 8x8xH200 "
                         f"(GPUs: {', '.join(list_gpus())})")
    nodes = int(m.group(1)) if m.group(1) is not None else None
    count, gname = int(m.group(2)), m.group(3)
    try:
        gpu = load_gpu(gname)
    except TunerError as e:
        raise TunerError(f"{name} {shown}: {e}") from None
    if gpus_per_node is not None and gpus_per_node <= 0:
        raise TunerError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    if nodes is not None:
        per = count
        total = nodes * count
        if gpus_per_node is not None and gpus_per_node != per:
            raise TunerError(f"{name} {shown} says {per} GPUs per node but --gpus-per-node is {gpus_per_node}")
    else:
        total = count
        per = gpus_per_node or min(gpu.gpus_per_node, max(count, 1))
    if nodes is not None and (nodes <= 0 or per <= 0):
        what = "the node count" if nodes <= 0 else "the GPUs per node"
        raise TunerError(f"{name} {shown}: {what} must be at least 1 (NODESxPER_NODExGPU such as 8x8xH200)")
    if total <= 0 or per <= 0:
        raise TunerError(f"{name} {shown}: the GPU count must be at least 1")
    net: Network | None = None
    if network is not None:
        net = load_network(network)
    elif gpu.network:
        net = load_network(gpu.network)
    elif require_network:
        raise TunerError(
            f"{name} {shown}: {gpu.name}'s server type ({gpu.server or 'not named in its datasheet'}) has no default "
            f"network; name it with --network (known: {', '.join(list_networks())})")
    if inter_node_bytes_per_s is None:
        inter_node_bytes_per_s = net.per_gpu_bytes_per_s * per if net is not None else DEFAULT_INTER_NODE_BYTES_PER_S
    if host_memory_gib is not None and not (math.isfinite(host_memory_gib) and host_memory_gib > 0):
        raise TunerError(f"--host-memory-gib must be a finite positive number of GiB, got {host_memory_gib:g}")
    return Cluster(
        gpu=gpu, num_gpus=total, gpus_per_node=per, inter_node_bytes_per_s=inter_node_bytes_per_s,
        usd_per_gpu_hour=DEFAULT_USD_PER_GPU_HOUR if usd_per_gpu_hour is None else usd_per_gpu_hour, network=net,
        host_memory_bytes_per_node=gpu.host_memory_bytes if host_memory_gib is None else host_memory_gib * 2**30)
