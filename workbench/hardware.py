"""What a device and a cluster are: a layer's shape, a device's profile, a link, a cluster of linked devices.

A :class:`DeviceProfile` predicts the time of one encoder layer that runs m of its M
shards (``layer_compute_s``) and of reading bytes from storage (``read_s``). Compute
follows ``overhead + FLOPs(m) / flops_per_s``: the fixed per-layer overhead is what makes
a GPU nearly flat in m (WRX: 12 shards only 0.7% slower than 3 on the Jetson Nano) while
a CPU grows in proportion. The papers' presets are in :mod:`workbench.devices`; this
machine's measured profile in :mod:`workbench.hostprofile`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from workbench.errors import UnknownNameError, WorkbenchError

GB = 1e9
MB = 1e6


@dataclass(frozen=True)
class LayerShape:
    """Dimensions that set a layer's cost: hidden d, heads (= shards) M, FFN d_ff, sequence T."""
    hidden: int = 768
    heads: int = 12
    ffn: int = 3072
    seq_len: int = 128

    def shard_flops(self) -> float:
        """FLOPs of one shard at sequence T: its Q/K/V/O projections, attention and FFN slice."""
        d, dh, f, T = self.hidden, self.hidden // self.heads, self.ffn // self.heads, self.seq_len
        return 2 * T * d * dh * 4 + 2 * 2 * T * T * dh + 2 * 2 * T * d * f

    def shard_params(self) -> int:
        return 4 * self.hidden * (self.hidden // self.heads) + 2 * self.hidden * (self.ffn // self.heads)


DISTILBERT = LayerShape(768, 12, 3072, 128)
MINILM = LayerShape(384, 12, 1536, 128)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    title: str
    kind: str                        # "cpu" or "gpu"
    flops_per_s: float               # marginal FLOP/s on transformer layer work (at large batches)
    layer_overhead_s: float          # fixed cost of running one layer, whatever its width
    read_bytes_per_s: float          # storage read bandwidth (cold reads)
    memory_bytes: float              # device memory
    net_bytes_per_s: float = 0.0     # network bandwidth to peers (0: not networked)
    net_latency_s: float = 0.0       # one-way network latency
    source: str = ""                 # where the numbers come from
    half_peak_tokens: float = 0.0    # rows (batch x sequence) at which FLOP/s reach half of flops_per_s
    price_per_s: float = 0.0         # dollars per second of use (0: not priced)
    clock_hz: float = 0.0            # CPU clock (0: not given)
    paper: str = ""                  # the paper whose set-up the preset emulates ("" for the host)
    preset: str = ""                 # the preset a cluster member copies ("" for a preset itself)

    def __post_init__(self):
        for field in ("flops_per_s", "read_bytes_per_s"):
            if not getattr(self, field) > 0:
                raise WorkbenchError(f"device {self.name!r}: {field} must be > 0, got {getattr(self, field)!r}")
        for field in ("layer_overhead_s", "memory_bytes", "net_bytes_per_s", "net_latency_s", "half_peak_tokens",
                      "price_per_s", "clock_hz"):
            if not getattr(self, field) >= 0:
                raise WorkbenchError(f"device {self.name!r}: {field} must be >= 0, got {getattr(self, field)!r}")

    def layer_compute_s(self, m: int, shape: LayerShape = DISTILBERT, batch: float = 1) -> float:
        """Seconds to compute one layer running m shards at ``shape`` on ``batch`` inputs.

        ``overhead + m FLOPs (batch + half_peak_tokens / T) / flops_per_s``: non-decreasing in the batch,
        and the seconds per input never grow with it."""
        if not 0 <= m <= shape.heads:
            raise ValueError(f"a layer has 0..{shape.heads} shards, got m={m}")
        if not batch >= 0:
            raise ValueError(f"batch must be >= 0, got batch={batch!r}")
        if not m or not batch:
            return 0.0
        rows = batch + self.half_peak_tokens / shape.seq_len
        return self.layer_overhead_s + m * shape.shard_flops() / self.flops_per_s * rows

    def work_s(self, flops: float, rows: float) -> float:
        """Seconds of ``flops`` FLOPs of matrix work over ``rows`` rows (batch x positions), without the
        per-layer overhead: few rows reach less of the peak (``half_peak_tokens``), as in
        :meth:`layer_compute_s`, which equals ``layer_overhead_s + work_s(m * shard_flops, batch * T)``."""
        if not flops:
            return 0.0
        if not rows > 0:
            raise ValueError(f"work over {rows!r} rows: give at least one row")
        return flops / self.flops_per_s * (1 + self.half_peak_tokens / rows)

    def read_s(self, nbytes: float) -> float:
        return nbytes / self.read_bytes_per_s

    def shard_read_s(self, bits: int, shape: LayerShape = DISTILBERT) -> float:
        """Seconds to read one shard stored with ``bits``-bit indexes (fp32 for 32)."""
        return self.read_s(shape.shard_params() * bits / 8)

    def send_s(self, nbytes: float) -> float:
        if self.net_bytes_per_s <= 0:
            raise ValueError(f"profile {self.name!r} has no network")
        return self.net_latency_s + nbytes / self.net_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> DeviceProfile:
        """Read :meth:`to_dict`'s output; a profile saved by another version (other fields) is refused."""
        names = {f.name for f in fields(cls)}
        if set(raw) != names:
            raise WorkbenchError(f"device profile fields {sorted(names ^ set(raw))} differ from this version's")
        return cls(**raw)


@dataclass(frozen=True)
class Link:
    """A link between two devices: a transfer of n bytes takes ``latency_s + n / bandwidth_bytes_per_s``."""
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = ""

    def __post_init__(self):
        if not self.bandwidth_bytes_per_s > 0:
            raise WorkbenchError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s!r}")
        if not self.latency_s >= 0:
            raise WorkbenchError(f"link latency must be >= 0 s, got {self.latency_s!r}")

    def transfer_s(self, nbytes: float) -> float:
        if not nbytes >= 0:
            raise WorkbenchError(f"bytes to transfer must be >= 0, got {nbytes!r}")
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


class Cluster:
    """Devices and a :class:`Link` per linked pair; ``links`` maps (name, name), in either order, to a link."""

    def __init__(self, devices, links, *, name: str = "", title: str = "", source: str = "", network: str = "switch"):
        from workbench.network import check_network

        self.devices: tuple[DeviceProfile, ...] = tuple(devices)
        self.name, self.title, self.source = name, title, source
        self.network = check_network(network)
        """How collectives cross the links (:data:`workbench.network.NETWORKS`): every mechanism's cost
        model on this cluster reads it, so their predictions compare."""
        if not self.devices:
            raise WorkbenchError(f"cluster {name!r} has no devices; give at least one")
        self._by_name: dict[str, DeviceProfile] = {}
        for device in self.devices:
            if device.name in self._by_name:
                raise WorkbenchError(f"device {device.name!r} appears twice in cluster {name!r}; names must differ")
            self._by_name[device.name] = device
        self.links: dict[tuple[str, str], Link] = {}
        self._links: dict[frozenset, Link] = {}
        for (a, b), link in dict(links).items():
            self.device(a), self.device(b)
            if a == b:
                raise WorkbenchError(f"a link joins two devices, got {a!r} at both ends")
            if not isinstance(link, Link):
                raise WorkbenchError(f"link {a!r}-{b!r} must be a Link, got {type(link).__name__}")
            key = frozenset((a, b))
            if self._links.get(key, link) != link:
                raise WorkbenchError(f"link {a!r}-{b!r} is given twice with different figures")
            self._links[key] = self.links[(a, b)] = link

    def __repr__(self) -> str:
        return f"Cluster({self.name or 'unnamed'}: {len(self.devices)} devices, {len(self._links)} links)"

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def device(self, name: str) -> DeviceProfile:
        if name not in self._by_name:
            raise UnknownNameError(f"device of cluster {self.name or 'unnamed'}", name, self._by_name)
        return self._by_name[name]

    def link(self, a: str, b: str) -> Link:
        """The link between ``a`` and ``b`` (either order); a pair with none is an error naming both."""
        self.device(a), self.device(b)
        if frozenset((a, b)) not in self._links:
            raise WorkbenchError(f"no link between {a!r} and {b!r} in cluster {self.name or 'unnamed'}; "
                                 f"{a!r} is linked to {', '.join(map(repr, self.neighbours(a))) or 'nothing'}")
        return self._links[frozenset((a, b))]

    def neighbours(self, name: str) -> list[str]:
        self.device(name)
        return [other for other in self._by_name if frozenset((name, other)) in self._links]

    def transfer_s(self, src: str, dst: str, nbytes: float) -> float:
        """Seconds to send ``nbytes`` from ``src`` to ``dst`` over their link (0 from a device to itself)."""
        if src == dst:
            self.device(src)
            return 0.0
        return self.link(src, dst).transfer_s(nbytes)

    @property
    def price_per_s(self) -> float:
        return sum(d.price_per_s for d in self.devices)

    def counts(self) -> dict[str, int]:
        """How many devices of each preset the cluster holds."""
        counts: dict[str, int] = {}
        for d in self.devices:
            counts[d.preset or d.name] = counts.get(d.preset or d.name, 0) + 1
        return counts
