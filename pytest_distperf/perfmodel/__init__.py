"""Predicted tokens/sec per strategy, as a sum of named per-token terms; pure functions.

No torch and no I/O here: the plugin, the `distperf predict` command and the unit tests all call
the same functions with plain values (a model `Config`, a strategy name, a `Calibration` measured
in the ranks or a `Topology` loaded from a file).

The per-token time
------------------
One "token" is one forward of the model: a generation of `max_new_tokens` tokens runs the
prefill (which yields the first token) and `max_new_tokens - 1` decode steps, and the seed's
tokens/sec counts all of them over the whole time. With short prompts the prefill costs about one
decode step, so the time per token is the time per forward. Terms (seconds per token):

``compute``  (measured)
    The single-process time per token measured in the same run, in every rank (the slowest
    rank's figure is used): the whole model alone, no collectives. A replicated model is timed
    unwrapped right after each timed generation (median of those), so that a host whose speed
    drifts moves both alike; a sharded one only exists whole before it is wrapped, and is timed
    then, until the figure stops improving (`workload.reference_token_time`, median of the
    steady stretch).
    It holds weights streaming, kernels *and* eager-mode launch overhead, which a roofline misses
    (measurements.md: eager decode on an H200 reaches ~25% of the copy bandwidth). With it, the
    threshold becomes a statement about the strategy's *scaling on these links*, the seed's
    question, and regressions of the model's own compute are left to the baselines.
``weights`` and ``launch``  (roofline, when no measured compute is given)
    ``weights``: bytes streamed from device memory per token (every block's weights, lm_head,
    the KV cache read by attention) over the memory bandwidth (measured copy bandwidth, or a
    nominal one). ``launch``: an eager per-layer launch overhead (`Overheads.launch_per_layer_s`)
    times the layer count. The two add up rather than overlap: fitted on the H200 rows of
    measurements.md, the sum reproduces eager pythia-2.8b and llama-2-7b within ~6%.
``all_gather``
    Per-token collective traffic: for every all-gather of the step, the time the link needs for
    that message size, minus the latency part. From a `Calibration` the time at each size is
    interpolated between the sizes measured in the ranks (the sizes the model really uses, each
    into a newly allocated output as FSDP does); from a topology alone it is the bytes a rank
    receives, (n-1)/n of the gathered bytes, over a nominal bus bandwidth.
``latency``
    Per-collective latency times the number of collectives in the step: the smallest-message
    all-gather time of the calibration (host-timed: ~60 us over an H200 pair's NVLink, ~0.25 ms
    for gloo over loopback), or a nominal figure per link class.
``fsdp_overhead``
    A fixed cost per FSDP unit per forward (hooks, parameter views, stream waits), per
    implementation (`Overheads`). It is what the real-size latency term does *not* explain:
    measured at a block's size (157 MB) an NVLink all-gather takes 0.41 ms, of which only
    ~0.1 ms is over the 1 GiB bus bandwidth, yet FSDP1 loses ~0.9 ms more per block, and about
    as much with SHARD_GRAD_OP, which gathers nothing after the first step. Fitted once on the
    reference rows; without it FSDP over NVLink would be predicted twice too fast.
``gather_copies``
    FSDP2 copies the local shards into the all-gather input and the gathered buffer out into
    per-parameter tensors, both newly allocated: 2 x bytes x (1 + 1/n) over the bandwidth of a
    copy into new memory (a GPU's own; a CPU's is several times lower, page faults).

``overlap``  (negative)
    The part of the two paths that hides behind the other. The host path (``compute``,
    ``weights``, ``launch``, ``fsdp_overhead``) is work the host issues in order; the transfer
    path (``all_gather``, ``latency``, ``gather_copies``) runs on the collective's own stream.
    FSDP starts a unit's all-gather and the host goes on issuing work while it runs, so when
    nothing makes the host wait for the device (this project's decode loop never does within a
    generation) a token costs about the longer path, not the sum: ``overlap = -f x min(host
    path, transfer path)``, where f is measured in the ranks (`calibrate`: a large all-gather
    and host-issued small kernels, alone and at once). Measured f: ~1 on 2 x H200, 0.03-0.15
    for gloo ranks on a 2-core host (the backend's thread finds no free core). Without a
    calibration f = 0 and the terms add up, which errs slow, the safe side for a threshold.
    The reference host of measurements.md added up (host-staged FSDP1 7.05 tok/s, additive
    prediction 7.0); this project's H200 host hid its per-unit work behind the transfer
    (9.81 measured, 9.79 predicted with f = 1, 6.86 added up).

Strategies (a registry, `STRATEGY_MODELS`; tensor and pipeline parallel add an entry each):

* ``auto`` / ``ddp``: replicated. DDP communicates in backward only; inference has no per-token
  collective (the worker builds buffers after wrapping, so there is no buffer broadcast).
* ``fsdp`` on CUDA is FSDP1 FULL_SHARD with one unit per block (the seed's setup). Each block's
  flat parameter is all-gathered in its pre-forward and freed in its post-forward, so every
  forward gathers every block: each rank receives (n-1)/n of the block weights per token. The
  root unit (embedding, final norm, head) is *not* freed after forward
  (torch/distributed/fsdp/_runtime_utils.py `_post_forward_reshard` skips the root "with the
  intention that they are immediately used for backward") and inference never runs the
  post-backward reshard, so the root is gathered once, in warm-up, and kept.
* ``fsdp`` on CPU, and ``fsdp2``: FSDP2 `fully_shard` per block and on the root, all with an
  explicit ``reshard_after_forward=True`` (distperf_model.parallelize). Torch only keeps the
  root unsharded when that argument is left at None (`_auto_reshard_after_forward`); an explicit
  True reshards the root too, so the root is gathered every forward as well.
* ``fsdp-noreshard``: FSDP2 with ``reshard_after_forward=False``: gathered once in warm-up and
  kept (only backward would reshard), so no per-token collective; the units' hooks still run.

Link bandwidth without a calibration (`nominal_links`)
-----------------------------------------------------
NVLink: links x per-link GB/s by NVLink version x `NVLINK_EFFICIENCY` (NCCL's all-gather bus
bandwidth reached 264-272 GB/s over an H200 pair's 18 links of 26.56 GB/s: 0.56). PCIe: effective
GB/s per direction by generation for x16 (Gen3 12, Gen4 24, Gen5 48), scaled by width; devices
that can talk directly (PIX, PXB) get it whole; paths through the host (PHB, NODE) get
`HOST_STAGED_FACTOR` of it, since without peer-to-peer NCCL stages traffic through host memory
(an H200 pair with NCCL_P2P_DISABLE=1 reached 25.2 GB/s of a Gen5 x16 link's 48), and SYS,
which also crosses the socket interconnect, 0.4. Unknown PCIe
generation or width: Gen4 x16. Every such choice is written into `Prediction.assumptions`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distperf_model.config import Config

    from pytest_distperf.topology import Topology

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_OVERHEADS",
    "GPU_MEMORY_BANDWIDTH",
    "STRATEGY_MODELS",
    "TERM_DESCRIPTIONS",
    "Calibration",
    "CollectiveFigure",
    "Links",
    "MessageSizes",
    "Overheads",
    "Prediction",
    "StrategyCost",
    "bus_factor",
    "describe_prediction",
    "failure_message",
    "link_figures",
    "links_from_calibration",
    "message_sizes",
    "nominal_links",
    "predict",
    "predict_all",
    "threshold",
]

GB = 1e9
MB = 1e6

OPS = ("all_gather", "all_reduce")

# What each term means, for messages and the CLI; keys are the `Prediction.terms` names.
TERM_DESCRIPTIONS = {
    "compute": "single-rank compute (measured)",
    "weights": "weights and KV streaming from memory",
    "launch": "eager per-layer launch overhead",
    "all_gather": "all-gather traffic",
    "latency": "per-collective latency",
    "fsdp_overhead": "FSDP per-unit overhead",
    "gather_copies": "FSDP2 copy-in/copy-out of gathered weights",
    "overlap": "transfer and host work hidden behind each other (negative)",
}


# --------------------------------------------------------------------------- calibration values


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw: (n-1)/n for all-gather, 2(n-1)/n for all-reduce."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if op == "all_gather":
        return (world_size - 1) / world_size
    if op == "all_reduce":
        return 2 * (world_size - 1) / world_size
    raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


@dataclass(frozen=True)
class CollectiveFigure:
    """One measured collective, nccl-tests style; `bytes` is an all-gather's OUTPUT size."""

    op: str
    bytes: int
    time_s: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s

    @classmethod
    def from_time(cls, op: str, nbytes: int, time_s: float, world_size: int) -> CollectiveFigure:
        algbw = nbytes / time_s if time_s > 0 else 0.0
        return cls(op, int(nbytes), float(time_s), algbw, algbw * bus_factor(op, world_size))

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "bytes": self.bytes,
            "time_s": self.time_s,
            "algbw": self.algbw,
            "busbw": self.busbw,
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], where: str = "collective figure"
    ) -> CollectiveFigure:
        op = _field(data, "op", str, where)
        if op not in OPS:
            raise ValueError(f"{where}: unknown op {op!r}")
        return cls(
            op=op,
            bytes=int(_field(data, "bytes", (int,), where)),
            time_s=float(_field(data, "time_s", (int, float), where)),
            algbw=float(_field(data, "algbw", (int, float), where)),
            busbw=float(_field(data, "busbw", (int, float), where)),
        )


@dataclass(frozen=True)
class Calibration:
    """What the ranks measured: collectives at the model's message sizes and memory bandwidth.

    `memory_bandwidth` is a large device copy's bytes read + written per second; `latency_s` the
    smallest-message all-gather time (launch and synchronisation included);
    `fresh_copy_bandwidth` the same copy into a newly allocated tensor, what FSDP2's copies into
    new buffers cost (0: not measured, use `memory_bandwidth`); `overlap` the share of the
    shorter of (a large all-gather, host-issued small kernels) that is hidden when both run at
    once, in [0, 1] (0: not measured, nothing hidden).
    """

    world_size: int
    backend: str
    device_type: str
    all_gather: tuple[CollectiveFigure, ...]
    all_reduce: tuple[CollectiveFigure, ...]
    memory_bandwidth: float
    latency_s: float
    fresh_copy_bandwidth: float = 0.0
    overlap: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"calibration: overlap must be in [0, 1], got {self.overlap!r}")
        # Sorted by size so that interpolation can bisect; tuples whatever the caller passed.
        for op in OPS:
            figures = tuple(sorted(getattr(self, op), key=lambda f: f.bytes))
            if any(f.op != op for f in figures):
                raise ValueError(f"calibration: a figure in {op} is not an {op}")
            object.__setattr__(self, op, figures)

    def figures(self, op: str) -> tuple[CollectiveFigure, ...]:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
        return getattr(self, op)

    def time_at(self, op: str, nbytes: float) -> float:
        """Time of one `op` of `nbytes` at this world size, interpolated between measured sizes.

        Linear in bytes between two measured sizes (t = latency + bytes / bandwidth holds
        piecewise); below the smallest size, the smallest size's time; above the largest, the
        largest size's time plus the extra bytes at that size's algorithm bandwidth.
        """
        figures = self.figures(op)
        if not figures:
            raise ValueError(f"calibration has no {op} figures")
        sizes = [f.bytes for f in figures]
        if nbytes <= sizes[0]:
            return figures[0].time_s
        last = figures[-1]
        if nbytes >= sizes[-1]:
            extra = nbytes - last.bytes
            return last.time_s + (extra / last.algbw if last.algbw > 0 else 0.0)
        i = bisect.bisect_right(sizes, nbytes)
        lo, hi = figures[i - 1], figures[i]
        share = (nbytes - lo.bytes) / (hi.bytes - lo.bytes)
        return lo.time_s + share * (hi.time_s - lo.time_s)

    def busbw_at(self, op: str, nbytes: float) -> float:
        """Bus bandwidth (bytes/s) of an `op` of `nbytes`, latency included, as nccl-tests shows."""
        t = self.time_at(op, nbytes)
        return nbytes / t * bus_factor(op, self.world_size) if t > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "device_type": self.device_type,
            "all_gather": [f.to_dict() for f in self.all_gather],
            "all_reduce": [f.to_dict() for f in self.all_reduce],
            "memory_bandwidth": self.memory_bandwidth,
            "latency_s": self.latency_s,
            "fresh_copy_bandwidth": self.fresh_copy_bandwidth,
            "overlap": self.overlap,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        """Inverse of `to_dict`; raises ValueError naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"calibration: expected a JSON object, got {type(data).__name__}")
        figures = {}
        for op in OPS:
            raw = _field(data, op, (list, tuple), "calibration")
            figures[op] = tuple(
                CollectiveFigure.from_dict(
                    _mapping(item, f"calibration {op}[{i}]"), f"calibration {op}[{i}]"
                )
                for i, item in enumerate(raw)
            )
        return cls(
            world_size=int(_field(data, "world_size", (int,), "calibration")),
            backend=_field(data, "backend", str, "calibration"),
            device_type=_field(data, "device_type", str, "calibration"),
            all_gather=figures["all_gather"],
            all_reduce=figures["all_reduce"],
            memory_bandwidth=float(_field(data, "memory_bandwidth", (int, float), "calibration")),
            latency_s=float(_field(data, "latency_s", (int, float), "calibration")),
            fresh_copy_bandwidth=float(
                _field(data, "fresh_copy_bandwidth", (int, float), "calibration")
                if "fresh_copy_bandwidth" in data
                else 0.0
            ),
            # Reports written before the overlap was measured: nothing hidden, terms add up.
            overlap=float(
                _field(data, "overlap", (int, float), "calibration") if "overlap" in data else 0.0
            ),
        )


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in data:
        raise ValueError(f"{where}: missing field {name!r}")
    value = data[name]
    # JSON true is an int in Python; a boolean where a number belongs is a mistake worth naming.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: field {name!r} has the wrong type ({value!r})")
    return value


# --------------------------------------------------------------------------- message sizes


@dataclass(frozen=True)
class MessageSizes:
    """Byte sizes to calibrate: all-gather OUTPUT sizes and all-reduce sizes."""

    all_gather: tuple[int, ...]
    all_reduce: tuple[int, ...]


LATENCY_PROBE_BYTES = 4096  # small enough to be latency-bound on every link we know of


def _as_names(strategy: str | Iterable[str]) -> tuple[str, ...]:
    return (strategy,) if isinstance(strategy, str) else tuple(strategy)


def message_sizes(
    config: Config,
    strategy: str | Iterable[str],
    devices: int,
    dtype_bytes: int,
    batch: int = 1,
    latency_probe_bytes: int = LATENCY_PROBE_BYTES,
) -> MessageSizes:
    """The message sizes the model really uses under `strategy` (one name or several).

    Always: a latency probe and the per-token activation (batch x n_embd), the all-reduce a
    tensor-parallel layer would need. Sharded strategies add one block's gathered weights and
    the root's (embedding, final norm, head), the FSDP all-gathers of a forward.
    """
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    activation = batch * config.n_embd * dtype_bytes
    gather = {latency_probe_bytes, activation}
    reduce = {latency_probe_bytes, activation}
    for name in _as_names(strategy):
        if _strategy_model(name).sharded:
            gather.add(config.block_param_count() * dtype_bytes)
            gather.add(config.non_block_param_count() * dtype_bytes)
    return MessageSizes(tuple(sorted(gather)), tuple(sorted(reduce)))


# --------------------------------------------------------------------------- links


@dataclass(frozen=True)
class Links:
    """What a collective and a memory read cost on the run's devices, measured or nominal."""

    link_class: str  # the slowest link between the run's devices, as nvidia-smi writes it
    world_size: int
    busbw: float  # bytes/s at large messages: nominal, or the largest calibrated size
    latency_s: float  # one small collective
    memory_bandwidth: float | None  # bytes/s a device streams from its memory; None: unknown
    measured: bool
    calibration: Calibration | None = None
    assumptions: tuple[str, ...] = field(default=())
    copy_bandwidth: float | None = None  # copies into new buffers; None: memory_bandwidth
    overlap: float = 0.0  # share of transfer and host work hidden behind each other (measured)

    @property
    def fresh_copy_bandwidth(self) -> float | None:
        return self.copy_bandwidth or self.memory_bandwidth

    def collective_time(self, op: str, nbytes: float, world_size: int) -> tuple[float, float]:
        """(transfer, latency) seconds of one `op` of `nbytes` among `world_size` ranks."""
        if world_size <= 1:
            return 0.0, 0.0
        cal = self.calibration
        if cal is not None and cal.figures(op):
            total = cal.time_at(op, nbytes)
            transfer = max(total - self.latency_s, 0.0)
            if world_size != cal.world_size:
                # Measured at another size of group: the same link carries a different share.
                transfer *= bus_factor(op, world_size) / bus_factor(op, cal.world_size)
            return transfer, min(self.latency_s, total)
        if self.busbw <= 0:
            return math.inf, self.latency_s
        return nbytes * bus_factor(op, world_size) / self.busbw, self.latency_s

    def busbw_at(self, op: str, nbytes: float) -> float:
        if self.calibration is not None and self.calibration.figures(op):
            return self.calibration.busbw_at(op, nbytes)
        return self.busbw

    def describe(self) -> str:
        kind = "measured" if self.measured else "nominal"
        return f"{self.link_class} ({kind} {self.busbw / GB:.3g} GB/s bus bandwidth)"


# Per-direction GB/s of one NVLink by NVLink version (NVIDIA's specifications).
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 26.5625, 5: 50.0}
NVLINK_UNKNOWN_GBPS = 25.0
# NCCL all-gather busbw over an H200 pair's 18 NVLinks: 264-272 GB/s of 478 nominal.
NVLINK_EFFICIENCY = 0.56
# Effective GB/s per direction of a x16 link after encoding and protocol overhead, by generation.
PCIE_X16_GBPS = {1: 3.0, 2: 6.0, 3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}
PCIE_DEFAULT = (4, 16)
# Without peer-to-peer NCCL relays through host memory: an H200 pair with NCCL_P2P_DISABLE=1
# reached 25.2 GB/s over Gen5 x16 (48 effective).
HOST_STAGED_FACTOR = 0.5
PCIE_CLASS_FACTOR = {"PIX": 1.0, "PXB": 1.0, "PHB": HOST_STAGED_FACTOR, "NODE": HOST_STAGED_FACTOR}
# Across sockets the relay also crosses the SMP interconnect, shared with everything else.
PCIE_CLASS_FACTOR["SYS"] = 0.4
# Host-timed small all-gather (launch + sync included), seconds, when nothing was measured.
NOMINAL_LATENCY_S = {
    "NV": 20e-6,
    "PIX": 30e-6,
    "PXB": 30e-6,
    "PHB": 50e-6,
    "NODE": 50e-6,
    "SYS": 60e-6,
    "LOOPBACK": 100e-6,
    "unknown": 50e-6,
}
# gloo over loopback between two 1-thread ranks; measured here with calibrate() on 2 cores.
LOOPBACK_GBPS = 0.3

# Spec-sheet memory bandwidth (GB/s) of common GPUs, matched against the device name; a device
# copy reaches ~85-90% of it (H200: 4.25 TB/s measured of 4.8).
GPU_MEMORY_BANDWIDTH = {
    "H200": 4800.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100": 1555.0,
    "A10G": 600.0,
    "A10": 600.0,
    "L40S": 864.0,
    "L40": 864.0,
    "L4": 300.0,
    "A40": 696.0,
    "RTX 6000 Ada": 960.0,
    "RTX A6000": 768.0,
    "RTX A5000": 768.0,
    "RTX 4090": 1008.0,
    "RTX 3090": 936.0,
    "V100": 900.0,
    "P100": 732.0,
    "T4": 320.0,
}
COPY_EFFICIENCY = 0.85
# With no device name: a box whose GPUs only meet over PCIe is taken for PCIe cards (A10/A10G,
# L4, A5000, 4090: 300-1000 GB/s), one with NVLink for SXM modules (V100 to H200).
UNKNOWN_PCIE_GPU_GBPS = 600.0
UNKNOWN_NVLINK_GPU_GBPS = 2000.0
# One core's share of host memory streaming, for CPU ranks with nothing measured.
CPU_RANK_MEMORY_GBPS = 20.0
CPU_RANK_FRESH_COPY_GBPS = 5.0


def gpu_memory_bandwidth(name: str) -> float | None:
    """Spec memory bandwidth in bytes/s for a device name, or None when not in the table."""
    text = name.upper()
    # Longest keys first: "A100-SXM4-80GB" before "A100", "A10G" before "A10", "L40S" before "L4".
    for key in sorted(GPU_MEMORY_BANDWIDTH, key=len, reverse=True):
        if key.upper() in text:
            return GPU_MEMORY_BANDWIDTH[key] * GB
    return None


def _nvlink_busbw(link: Any, notes: list[str]) -> float:
    version = link.nvlink_version
    if version in NVLINK_GBPS_PER_LINK:
        per_link = NVLINK_GBPS_PER_LINK[version]
    elif link.nvlinks >= 18:
        # Only NVLink 4 (H100/H200) has 18 links per GPU; parsed nvidia-smi output names no version.
        per_link = NVLINK_GBPS_PER_LINK[4]
        notes.append(f"{link.link_class}: NVLink version unknown, 18 links read as NVLink 4")
    else:
        per_link = NVLINK_UNKNOWN_GBPS
        notes.append(
            f"{link.link_class}: NVLink version unknown, assumed {per_link:g} GB/s per link"
        )
    busbw = link.nvlinks * per_link * NVLINK_EFFICIENCY
    notes.append(
        f"nominal {link.link_class} bus bandwidth: {link.nvlinks} links x {per_link:g} GB/s x "
        f"{NVLINK_EFFICIENCY} (NCCL's share on an H200 pair) = {busbw:.3g} GB/s"
    )
    return busbw * GB


def _pcie_busbw(topology: Topology, link_class: str, notes: list[str]) -> float:
    gens = [d.pcie_gen_max for d in topology.devices if d.pcie_gen_max]
    widths = [d.pcie_width_max for d in topology.devices if d.pcie_width_max]
    gen = min(gens) if gens else PCIE_DEFAULT[0]
    width = min(widths) if widths else PCIE_DEFAULT[1]
    if not gens or not widths:
        notes.append(
            f"PCIe generation/width unknown ({topology.source}): assumed Gen{gen} x{width}"
        )
    per_x16 = PCIE_X16_GBPS.get(gen, PCIE_X16_GBPS[PCIE_DEFAULT[0]])
    factor = PCIE_CLASS_FACTOR[link_class]
    busbw = per_x16 * width / 16 * factor
    how = "direct peer-to-peer" if factor == 1.0 else f"staged through host memory, x{factor}"
    notes.append(
        f"nominal {link_class} bus bandwidth: PCIe Gen{gen} x{width} ~{per_x16 * width / 16:g} "
        f"GB/s effective, {how} = {busbw:.3g} GB/s"
    )
    return busbw * GB


def _nominal_memory_bandwidth(topology: Topology, notes: list[str]) -> float:
    if topology.accelerator == "cpu":
        notes.append(f"memory bandwidth: nominal {CPU_RANK_MEMORY_GBPS:g} GB/s per CPU rank")
        return CPU_RANK_MEMORY_GBPS * GB
    spec = gpu_memory_bandwidth(topology.device_model)
    if spec is not None:
        effective = spec * COPY_EFFICIENCY
        notes.append(
            f"memory bandwidth: {topology.device_model} spec {spec / GB:g} GB/s x "
            f"{COPY_EFFICIENCY} = {effective / GB:.4g} GB/s"
        )
        return effective
    nvlinked = any(link.is_nvlink for link in topology.links)
    spec_gbps = UNKNOWN_NVLINK_GPU_GBPS if nvlinked else UNKNOWN_PCIE_GPU_GBPS
    kind = "NVLink-connected (SXM) GPUs" if nvlinked else "PCIe cards"
    effective = spec_gbps * COPY_EFFICIENCY
    notes.append(
        f"memory bandwidth: GPU model {topology.device_model!r} not known, assumed {kind} with "
        f"{spec_gbps:g} GB/s spec x {COPY_EFFICIENCY} = {effective:.4g} GB/s"
    )
    return effective * GB


def link_figures(
    topology: Topology, link: Any, notes: list[str] | None = None
) -> tuple[float, float]:
    """Nominal (bus bandwidth bytes/s, latency s) of one link; appends why to `notes`."""
    notes = [] if notes is None else notes
    cls = link.link_class
    if link.is_nvlink:
        return _nvlink_busbw(link, notes), NOMINAL_LATENCY_S["NV"]
    if cls in PCIE_CLASS_FACTOR:
        return _pcie_busbw(topology, cls, notes), NOMINAL_LATENCY_S[cls]
    if cls == "LOOPBACK":
        notes.append(f"nominal LOOPBACK bus bandwidth: gloo, {LOOPBACK_GBPS:g} GB/s")
        return LOOPBACK_GBPS * GB, NOMINAL_LATENCY_S[cls]
    # A guessed link would make a threshold worse than none; PCIe Gen3 x16 through the host is
    # slow enough not to fail a healthy run.
    busbw = PCIE_X16_GBPS[3] * HOST_STAGED_FACTOR * GB
    notes.append(f"link class {cls}: assumed host-staged PCIe Gen3 x16, {busbw / GB:g} GB/s")
    return busbw, NOMINAL_LATENCY_S["unknown"]


def nominal_links(
    topology: Topology,
    devices: int | None = None,
    memory_bandwidth: float | None = None,
    bus_bandwidth: float | None = None,
) -> Links:
    """Link figures from a probed, parsed or loaded topology alone (nothing measured).

    `devices`: the run uses the first `devices` devices (default: all). `memory_bandwidth` and
    `bus_bandwidth` (bytes/s) override the nominal ones, e.g. from command-line flags.
    """
    n = topology.device_count if devices is None else devices
    if n < 1 or n > topology.device_count:
        raise ValueError(
            f"the run uses {n} device(s) but the topology ({topology.source}) has "
            f"{topology.device_count}"
        )
    notes: list[str] = []
    keep = set(topology.indices[:n])
    links = [link for link in topology.links if link.a in keep and link.b in keep]
    if memory_bandwidth is None:
        memory_bandwidth = _nominal_memory_bandwidth(topology, notes)
    else:
        notes.append(f"memory bandwidth: given, {memory_bandwidth / GB:.4g} GB/s")
    # On CPU a copy into new memory pays page faults: 5 GB/s against 22 for a warm copy, as
    # calibrate() measured on a 2-core CI-sized host; GPUs' caching allocators make them equal.
    copy_bandwidth = CPU_RANK_FRESH_COPY_GBPS * GB if topology.accelerator == "cpu" else None
    if not links:
        return Links("none", n, 0.0, 0.0, memory_bandwidth, False, None, tuple(notes))
    slowest = min(links, key=lambda link: (link.rank, link.a, link.b))
    cls = slowest.link_class
    busbw, latency = link_figures(topology, slowest, notes)
    if bus_bandwidth is not None:
        busbw = bus_bandwidth
        notes.append(f"{cls} bus bandwidth: given, {busbw / GB:.4g} GB/s")
    notes.append(f"collective latency: nominal {latency * 1e6:g} us for {cls}")
    notes.append(
        "overlap: none assumed (transfers and host work add up); only a calibration in the "
        "ranks can show a host that hides one behind the other"
    )
    return Links(
        cls, n, busbw, latency, memory_bandwidth, False, None, tuple(notes), copy_bandwidth
    )


def links_from_calibration(calibration: Calibration, link_class: str) -> Links:
    """Link figures measured in the ranks; `link_class` is the topology's slowest link."""
    gathers = calibration.all_gather
    busbw = gathers[-1].busbw if gathers else 0.0
    notes = (
        f"collectives measured in the ranks ({calibration.backend}, {calibration.world_size} "
        f"ranks) at {len(gathers)} all-gather sizes; memory bandwidth measured by a device copy",
    )
    return Links(
        link_class,
        calibration.world_size,
        busbw,
        calibration.latency_s,
        calibration.memory_bandwidth or None,
        True,
        calibration,
        notes,
        calibration.fresh_copy_bandwidth or None,
        calibration.overlap,
    )


# --------------------------------------------------------------------------- overheads


@dataclass(frozen=True)
class Overheads:
    """Fixed per-forward costs that no bandwidth explains, in seconds.

    Fitted once on the 2 x H200 rows (measurements.md and this project's runs; torch 2.11,
    eager) and used for every model and link. They are host-CPU costs: a much slower host CPU
    pays more (a 2-core CI host: ~0.6 ms per FSDP2 unit), which the measured compute term and
    the calibrated collectives dominate there anyway (tests/test_perfmodel.py, CPU rows).
    """

    # Eager decode launches ~30-40 kernels per layer; on top of weights streaming, 0.28 ms per
    # layer reproduces eager pythia-2.8b (98 vs 103.8 tok/s) and llama-2-7b (83 vs 79).
    launch_per_layer_s: float = 0.28e-3
    # FSDP1 FULL_SHARD, per unit. Where nothing overlaps (the reference host, measurements.md),
    # (measured - compute - all-gathers at their calibrated sizes) / units is 0.82 ms
    # (pythia-2.8b, NVLink), 0.93 (llama-2-7b, NVLink), 0.92 (pythia, host-staged); on this
    # project's host, which hides the NVLink gathers behind the host (overlap ~1),
    # (measured - compute) / units is 0.87 (pythia) and 1.09 (llama). SHARD_GRAD_OP, which
    # keeps its gathered weights, still pays ~0.9 ms per unit: hooks and views, not traffic.
    fsdp1_unit_s: float = 0.95e-3
    # FSDP2 per unit that does not gather (reshard_after_forward=False): 0.2-0.38 ms.
    fsdp2_unit_s: float = 0.3e-3
    # FSDP2 per unit that gathers, on top of the above and of `gather_copies`: 0.64 ms
    # (pythia-2.8b) and ~0 (llama-2-7b) on the reference host (no overlap); 0.76 ms (pythia,
    # NVLink) on this project's host once the hidden transfer is taken out.
    fsdp2_gather_s: float = 0.6e-3


DEFAULT_OVERHEADS = Overheads()


# --------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class StrategyInput:
    """Everything a strategy's cost function may look at."""

    config: Config
    devices: int
    device_type: str  # "cuda" or "cpu": picks the implementation of "fsdp"
    batch_size: int
    seq_length: int  # prompt + new tokens: the static KV cache's length
    dtype_bytes: int
    links: Links
    overheads: Overheads


@dataclass(frozen=True)
class StrategyCost:
    """A strategy's own per-token terms, on top of the compute terms every strategy pays."""

    implementation: str
    terms: dict[str, float]
    bytes_per_token: dict[str, float]
    collectives: int  # per token
    message_bytes: float  # the dominant message size, for the bandwidth that is reported
    assumptions: tuple[str, ...] = ()


@dataclass(frozen=True)
class StrategyModel:
    sharded: bool
    cost: Callable[[StrategyInput], StrategyCost]


def _replicated(x: StrategyInput) -> StrategyCost:
    return StrategyCost(
        "replicated",
        {},
        {},
        0,
        x.config.block_param_count() * x.dtype_bytes,
        ("replicated: no collective in an inference forward",),
    )


def _gathers(x: StrategyInput, sizes: Sequence[float]) -> tuple[dict[str, float], dict[str, float]]:
    """Terms and bytes of one all-gather per entry of `sizes` (gathered output bytes)."""
    transfer = latency = 0.0
    for size in sizes:
        t, lat = x.links.collective_time("all_gather", size, x.devices)
        transfer += t
        latency += lat
    out = float(sum(sizes))
    received = out * bus_factor("all_gather", x.devices) if x.devices > 1 else 0.0
    terms = {"all_gather": transfer, "latency": latency}
    return terms, {"all_gather_output": out, "all_gather_received": received}


def _fsdp1_full_shard(x: StrategyInput) -> StrategyCost:
    block = x.config.block_param_count() * x.dtype_bytes
    sizes = [block] * x.config.n_layer
    terms, moved = _gathers(x, sizes)
    units = x.config.n_layer + 1
    terms["fsdp_overhead"] = units * x.overheads.fsdp1_unit_s
    return StrategyCost(
        "FSDP1 FULL_SHARD",
        terms,
        moved,
        len(sizes),
        block,
        (
            f"FSDP1: every block gathered every forward ({x.config.n_layer} all-gathers of "
            f"{block / MB:.4g} MB); the root unit is kept after its first gather",
            f"FSDP1 per-unit overhead {x.overheads.fsdp1_unit_s * 1e3:g} ms x {units} units",
        ),
    )


def _fsdp2(x: StrategyInput, reshard: bool) -> StrategyCost:
    block = x.config.block_param_count() * x.dtype_bytes
    root = x.config.non_block_param_count() * x.dtype_bytes
    units = x.config.n_layer + 1
    o = x.overheads
    if not reshard:
        return StrategyCost(
            "FSDP2 reshard_after_forward=False",
            {"fsdp_overhead": units * o.fsdp2_unit_s},
            {"all_gather_output": 0.0, "all_gather_received": 0.0},
            0,
            block,
            (
                "FSDP2 no reshard: weights gathered once in warm-up and kept (no backward "
                "reshards them), so no per-token collective",
                f"FSDP2 per-unit overhead {o.fsdp2_unit_s * 1e3:g} ms x {units} units",
            ),
        )
    sizes = [block] * x.config.n_layer + [root]
    terms, moved = _gathers(x, sizes)
    per_unit = o.fsdp2_unit_s + o.fsdp2_gather_s
    terms["fsdp_overhead"] = units * per_unit
    # FSDP2 copies the local shards into the all-gather input (S/n) and the gathered buffer out
    # into per-parameter tensors (S), both newly allocated; a copy of S bytes moves 2S.
    copied = 2 * sum(sizes) * (1 + 1 / x.devices)
    bandwidth = x.links.fresh_copy_bandwidth
    terms["gather_copies"] = copied / bandwidth if bandwidth else 0.0
    moved["gather_copies"] = copied
    return StrategyCost(
        "FSDP2 reshard_after_forward=True",
        terms,
        moved,
        len(sizes),
        block,
        (
            f"FSDP2: every block ({block / MB:.4g} MB) and the root ({root / MB:.4g} MB) "
            "gathered every forward (an explicit reshard_after_forward=True reshards the root)",
            f"FSDP2 per-unit overhead ({o.fsdp2_unit_s * 1e3:g} + {o.fsdp2_gather_s * 1e3:g} "
            f"ms gathering) x {units} units",
        ),
    )


def _fsdp(x: StrategyInput) -> StrategyCost:
    # The strategy registry builds FSDP1 on CUDA (the seed's setup) and FSDP2 elsewhere.
    return _fsdp1_full_shard(x) if x.device_type == "cuda" else _fsdp2(x, reshard=True)


STRATEGY_MODELS: dict[str, StrategyModel] = {
    "auto": StrategyModel(False, _replicated),
    "ddp": StrategyModel(False, _replicated),
    "fsdp": StrategyModel(True, _fsdp),
    "fsdp2": StrategyModel(True, lambda x: _fsdp2(x, reshard=True)),
    "fsdp-noreshard": StrategyModel(True, lambda x: _fsdp2(x, reshard=False)),
}


def _strategy_model(name: str) -> StrategyModel:
    try:
        return STRATEGY_MODELS[name]
    except KeyError:
        valid = ", ".join(STRATEGY_MODELS)
        raise ValueError(f"no performance model for strategy {name!r}; modelled: {valid}") from None


# --------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Prediction:
    strategy: str
    devices: int
    tokens_per_sec: float
    time_per_token_s: float
    terms: dict[str, float]  # seconds per token, by name (TERM_DESCRIPTIONS)
    bound: str  # the largest term's name
    bytes_per_token: dict[str, float]
    link_class: str
    bandwidth_used: float  # bytes/s: bus bandwidth at the strategy's main message size
    assumptions: tuple[str, ...]
    implementation: str = ""
    measured_links: bool = False
    collectives_per_token: int = 0

    @property
    def bound_description(self) -> str:
        text = TERM_DESCRIPTIONS.get(self.bound, self.bound)
        if self.bound in ("all_gather", "latency"):
            text += f" over {self.link_class}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "devices": self.devices,
            "implementation": self.implementation,
            "tokens_per_sec": self.tokens_per_sec,
            "time_per_token_s": self.time_per_token_s,
            "terms": dict(self.terms),
            "bound": self.bound,
            "bound_description": self.bound_description,
            "bytes_per_token": dict(self.bytes_per_token),
            "collectives_per_token": self.collectives_per_token,
            "link_class": self.link_class,
            "bandwidth_used": self.bandwidth_used,
            "measured_links": self.measured_links,
            "assumptions": list(self.assumptions),
        }


def _kv_bytes(config: Config, batch: int, seq_length: int, dtype_bytes: int) -> float:
    # The static cache is read whole every step (attention over all positions, masked).
    per_layer = 2 * batch * config.n_query_groups * config.head_size * seq_length * dtype_bytes
    return float(config.n_layer * per_layer)


def _compute_terms(
    x: StrategyInput, compute_time_s: float | None
) -> tuple[dict[str, float], dict[str, float], tuple[str, ...]]:
    cfg = x.config
    weights = (cfg.n_layer * cfg.block_param_count() + cfg.padded_vocab_size * cfg.n_embd) * (
        x.dtype_bytes
    )  # the embedding is a lookup of a few rows; lm_head is read whole
    kv = _kv_bytes(cfg, x.batch_size, x.seq_length, x.dtype_bytes)
    moved = {"weights_read": float(weights), "kv_read": kv}
    if compute_time_s is not None:
        note = f"compute: measured single-rank {compute_time_s * 1e3:.4g} ms per token"
        return {"compute": compute_time_s}, moved, (note,)
    bw = x.links.memory_bandwidth
    if not bw:
        raise ValueError("no memory bandwidth known and no measured compute time given")
    launch = cfg.n_layer * x.overheads.launch_per_layer_s
    notes = (
        f"compute: roofline, {(weights + kv) / GB:.3g} GB per token at {bw / GB:.4g} GB/s "
        f"+ eager launch {x.overheads.launch_per_layer_s * 1e3:g} ms x {cfg.n_layer} layers "
        "(no single-rank measurement given)",
    )
    return {"weights": (weights + kv) / bw, "launch": launch}, moved, notes


# Work that the host issues in order on the compute stream; everything else (all-gathers, their
# latency, FSDP2's copies around them) runs on the collective's own stream.
HOST_PATH_TERMS = frozenset({"compute", "weights", "launch", "fsdp_overhead"})


def _hidden_by_overlap(terms: Mapping[str, float], overlap: float) -> float:
    """Seconds per token that the two paths hide behind each other.

    FSDP issues each unit's all-gather on its own stream and the host goes on issuing compute
    while it runs, so where the host is never made to wait for the device (this project's
    decode loop) a token costs about the longer of the two paths, not their sum. How much a
    machine really hides is `overlap`, measured in the ranks (`calibrate`).
    """
    host = sum(v for k, v in terms.items() if k in HOST_PATH_TERMS)
    transfer = sum(v for k, v in terms.items() if k not in HOST_PATH_TERMS)
    return overlap * min(host, transfer)


def predict(
    config: Config,
    strategy: str,
    devices: int,
    links: Links,
    *,
    device_type: str = "cuda",
    batch_size: int = 1,
    prompt_length: int = 8,
    max_new_tokens: int = 50,
    dtype_bytes: int = 2,
    compute_time_s: float | None = None,
    overheads: Overheads = DEFAULT_OVERHEADS,
) -> Prediction:
    """Predicted tokens/sec of one rank's stream under `strategy` on `devices` devices.

    `compute_time_s`: the measured single-rank time per token (see the module docstring);
    without it the compute comes from the memory bandwidth in `links` (a roofline).
    """
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if prompt_length < 0 or dtype_bytes < 1:
        raise ValueError(f"bad prompt_length={prompt_length} or dtype_bytes={dtype_bytes}")
    if compute_time_s is not None and not compute_time_s > 0:
        raise ValueError(f"compute_time_s must be > 0, got {compute_time_s}")
    model = _strategy_model(strategy)
    x = StrategyInput(
        config,
        devices,
        device_type,
        batch_size,
        prompt_length + max_new_tokens,
        dtype_bytes,
        links,
        overheads,
    )
    terms, moved, notes = _compute_terms(x, compute_time_s)
    cost = model.cost(x) if devices > 1 else _replicated(x)
    terms.update(cost.terms)
    moved.update(cost.bytes_per_token)
    hidden = _hidden_by_overlap(terms, links.overlap)
    if hidden:
        terms["overlap"] = -hidden
        notes += (
            f"overlap: {links.overlap:.0%} of the shorter of host path and transfer path "
            f"hidden (measured), {_ms(hidden)} per token",
        )
    total = sum(terms.values())
    bound = max(terms, key=lambda k: terms[k])
    return Prediction(
        strategy=strategy,
        devices=devices,
        tokens_per_sec=1.0 / total if total > 0 else math.inf,
        time_per_token_s=total,
        terms=terms,
        bound=bound,
        bytes_per_token=moved,
        link_class=links.link_class,
        bandwidth_used=links.busbw_at("all_gather", cost.message_bytes),
        assumptions=notes + cost.assumptions + links.assumptions,
        implementation=cost.implementation,
        measured_links=links.measured,
        collectives_per_token=cost.collectives,
    )


def predict_all(
    config: Config,
    devices: int,
    links: Links,
    strategies: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[Prediction]:
    """`predict` for every modelled strategy (or the ones named), in registry order."""
    names = list(STRATEGY_MODELS) if strategies is None else list(strategies)
    return [predict(config, name, devices, links, **kwargs) for name in names]


# --------------------------------------------------------------------------- verdict text


# Healthy runs land at 0.86-1.4 x the prediction (docs/benchmarks: the H200 rows, where the
# model errs to the slow side by up to 31%, and CPU cpu-110m fsdp, measured 1.26 vs predicted
# 0.95 tok/s). 0.7 keeps ~20% headroom under the worst healthy ratio, and still fails a run that
# the knob slows by half on every row (1.33 x 0.5 = 0.67 at worst). The threshold is the coarse
# gate ("the links cannot explain this"); drops of 5-15% are the baselines' job.
DEFAULT_EFFICIENCY = 0.7


def threshold(prediction: Prediction, efficiency: float) -> float:
    """The lowest tokens/sec a run may reach: `efficiency` x predicted, efficiency in (0, 1]."""
    if isinstance(efficiency, bool) or not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    return efficiency * prediction.tokens_per_sec


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _gbps(value: float) -> str:
    return f"{value / GB:.3g} GB/s"


def describe_prediction(prediction: Prediction) -> str:
    """One line: predicted rate, its bound, the link and the bytes moved."""
    p = prediction
    kind = "measured" if p.measured_links else "nominal"
    received = p.bytes_per_token.get("all_gather_received", 0.0)
    terms = ", ".join(f"{k} {_ms(v)}" for k, v in p.terms.items())
    return (
        f"predicted {p.tokens_per_sec:.3g} tok/s ({_ms(p.time_per_token_s)}/token), bound by "
        f"{p.bound} ({p.bound_description}, {_ms(p.terms[p.bound])}); link {p.link_class} at "
        f"{kind} {_gbps(p.bandwidth_used)} bus bandwidth; {received / MB:.4g} MB received per "
        f"token per rank in {p.collectives_per_token} collectives; terms: {terms}"
    )


def failure_message(
    prediction: Prediction, measured_tokens_per_sec: float, efficiency: float
) -> str:
    """Why a run below `threshold(prediction, efficiency)` failed, in terms a user can act on."""
    p = prediction
    limit = threshold(p, efficiency)
    ratio = measured_tokens_per_sec / p.tokens_per_sec if p.tokens_per_sec else 0.0
    impl = f" ({p.implementation})" if p.implementation else ""
    return (
        f"{p.strategy}{impl} on {p.devices} device(s): measured {measured_tokens_per_sec:.3g} "
        f"tok/s is below the threshold {limit:.3g} tok/s ({efficiency:.0%} of the predicted "
        f"{p.tokens_per_sec:.3g} tok/s); measured/predicted = {ratio:.2f}.\n"
        f"  {describe_prediction(p)}"
    )
