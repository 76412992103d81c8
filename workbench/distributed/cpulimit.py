"""Devices emulated by real CPU limits: a process in a CPU cgroup of its own, whose quota makes it compute at a
device's speed, calibrated by a probe run inside the group.

Interfaces: cgroup v1's cpu controller (``cpu.cfs_period_us`` / ``cpu.cfs_quota_us``, mounted at
``/sys/fs/cgroup/cpu``) and cgroup v2 (``cpu.max``, with ``cpu`` enabled in the root's ``cgroup.subtree_control``).
Groups are made directly under the controller's root, named ``workbench-<pid>-<n>`` (the pid of the process
that made them), and removed when closed: the processes still inside go back to the root first. Nothing else
in the hierarchy is read or written; groups left by a process that died are removed by the next one.

The kernel hands out the quota per period, so a limited process runs at full speed, then stalls until the
next period: :data:`PERIOD_US` (6 ms) keeps the stalls far below a layer's compute. A quota is at least 1 ms,
so shares under a sixth of a core get a longer period.

Calibration (:func:`calibrate`): a probe process (:func:`matmul_gflops`, a one-thread float32 matrix product
loop, or :func:`layer_gflops`, a transformer layer counted as a cost model counts it) is put in the group, measured without a limit, given the share
``target / unlimited`` of a core, measured again and corrected until it computes within :data:`STOP` of the
target (or the rounds run out; the result says how close it came). A device faster than one core of
this host cannot be emulated: the result says so and the group stays unlimited.
"""
from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import WorkbenchError

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")
PREFIX = "workbench-"
PERIOD_US = 6000
MIN_QUOTA_US = 1000
MAX_PERIOD_US = 1_000_000
MIN_SHARE = MIN_QUOTA_US / MAX_PERIOD_US
"""The smallest share of a core a group can be given (1 ms a second)."""
TOLERANCE = 0.15
"""A calibrated group computes within this of its target speed (the probe's measure)."""
PROBE_SIZE = 256
PROBE_S = 0.3
LAYER_PROBE_S = 0.5
"""A layer takes tens of ms at a device's speed: its probe measures longer, to average over many calls."""
MEASURES = 3
"""Each measure of a calibration is the median of this many (a throttled process's speed varies by about
10 % from one half second to the next)."""
ROUNDS = 5
STOP = 0.04
"""A calibration stops this close to the target: well inside the tolerance, since a share found at its edge
leaves a run of many layers that far off (a run's compute follows the share, the probe's noise averages out)."""

_counter = itertools.count()


@dataclass(frozen=True)
class Controller:
    version: int                    # 1 or 2
    root: Path


def find_controller(v1: Path = V1_ROOT, v2: Path = V2_ROOT) -> Controller | None:
    """The cpu controller this machine mounts (v1 first, as here), or None."""
    if (v1 / "cpu.cfs_quota_us").exists():
        return Controller(1, v1)
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return Controller(2, v2)
    return None


def limit_problem(controller: Controller | None = None) -> str | None:
    """Why CPU limits cannot be set here (None: they can)."""
    c = controller or find_controller()
    if c is None:
        return "this machine has no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)"
    if not os.access(c.root, os.W_OK):
        return f"{c.root} is not writable: emulating devices by CPU limits needs root"
    if c.version == 2 and "cpu" not in (c.root / "cgroup.subtree_control").read_text().split():
        return f"the cpu controller is not enabled for {c.root}'s children (cgroup.subtree_control)"
    return None


def quota_for(share: float) -> tuple[int, int]:
    """(quota, period) in microseconds giving ``share`` of a core."""
    if not (isinstance(share, (int, float)) and math.isfinite(share) and share >= MIN_SHARE):
        raise WorkbenchError(f"a CPU share is a fraction of a core >= {MIN_SHARE:g}, got {share!r}")
    period = PERIOD_US
    if share * period < MIN_QUOTA_US:
        period = min(MAX_PERIOD_US, math.ceil(MIN_QUOTA_US / share))
    return max(MIN_QUOTA_US, round(share * period)), period


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(controller: Controller | None = None) -> list[str]:
    """Remove the empty groups that processes now gone left behind; their names."""
    c = controller or find_controller()
    if c is None or not os.access(c.root, os.W_OK):
        return []
    gone = []
    for path in c.root.glob(PREFIX + "*"):
        try:
            owner = int(path.name[len(PREFIX):].split("-")[0])
        except ValueError:
            continue
        if owner != os.getpid() and not _alive(owner):
            try:
                path.rmdir()
                gone.append(path.name)
            except OSError:
                pass
    return gone


class CpuGroup:
    """One CPU cgroup under the controller's root (see the module docstring); a context manager."""

    def __init__(self, share: float | None = None, *, controller: Controller | None = None):
        c = controller or find_controller()
        problem = limit_problem(c)
        if problem:
            raise WorkbenchError(f"cannot limit CPU: {problem}")
        sweep(c)
        self.controller = c
        self.path = c.root / f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.path.mkdir()
        self.share: float | None = None
        if share is not None:
            self.set_share(share)

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def set_share(self, share: float) -> None:
        quota, period = quota_for(share)
        if self.controller.version == 1:
            self._write("cpu.cfs_quota_us", "-1")
            self._write("cpu.cfs_period_us", str(period))
            self._write("cpu.cfs_quota_us", str(quota))
        else:
            self._write("cpu.max", f"{quota} {period}")
        self.share = quota / period

    def unlimit(self) -> None:
        if self.controller.version == 1:
            self._write("cpu.cfs_quota_us", "-1")
        else:
            self._write("cpu.max", f"max {PERIOD_US}")
        self.share = None

    def limits(self) -> tuple[int, int]:
        """(quota, period) in microseconds as the kernel holds them; quota -1 when unlimited."""
        if self.controller.version == 1:
            return (int((self.path / "cpu.cfs_quota_us").read_text()),
                    int((self.path / "cpu.cfs_period_us").read_text()))
        quota, period = (self.path / "cpu.max").read_text().split()
        return (-1 if quota == "max" else int(quota)), int(period)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) and the processes it started into the group."""
        for one in [pid, *_descendants(pid)]:
            try:
                self._write("cgroup.procs", str(one))
            except ProcessLookupError:
                pass

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def close(self) -> None:
        """Move what is left back to the root and remove the group."""
        if not self.path.exists():
            return
        for _ in range(50):
            for pid in self.pids():
                try:
                    (self.controller.root / "cgroup.procs").write_text(str(pid))
                except (ProcessLookupError, OSError):
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.02)
        raise WorkbenchError(f"could not remove the CPU group {self.path}: processes {self.pids()} are in it")

    def __enter__(self) -> "CpuGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(children)
            todo.extend(children)
    return out


# -- the probe

def matmul_gflops(seconds: float = PROBE_S, size: int = PROBE_SIZE) -> float:
    """GFLOP/s of this process on one thread: float32 products of two ``size`` x ``size`` matrices for about
    ``seconds`` (2 size^3 FLOPs each; the cost model's 2 x Gamma)."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    a @ b
    n, start = 0, time.perf_counter()
    while True:
        a @ b
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * size ** 3 * n / elapsed / 1e9


def layer_gflops(seconds: float = PROBE_S, *, hidden: int = 384, heads: int = 12, ffn: int = 1536,
                 positions: int = 128) -> float:
    """GFLOP/s of this process on one thread running one transformer encoder layer of this shape (random
    weights) on ``positions`` positions, counted as 2 x its multiply-adds: Q, K, V and the output projection
    (4 N F^2), the scores and the weighted values (2 N^2 F), the FFN (2 N F d_ff). The speed a cost model that
    counts a layer's multiply-adds means by a device's FLOP/s."""
    import torch

    from workbench.models.config import EncoderConfig
    from workbench.models.encoder import EncoderLayer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = EncoderLayer(EncoderConfig(hidden=hidden, num_heads=heads, ffn=ffn)).eval()
    x = torch.randn(1, positions, hidden)
    flops = 2 * (4 * positions * hidden ** 2 + 2 * positions ** 2 * hidden + 2 * positions * hidden * ffn)
    with torch.no_grad():
        layer(x)
        n, start = 0, time.perf_counter()
        while True:
            layer(x)
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return flops * n / elapsed / 1e9


WORKLOADS = ("matmul", "layer")


class Probe:
    """A probe process (``python -m workbench.distributed.cpulimit WORKLOAD [hidden heads ffn positions]``): each
    line it reads is a measure in seconds, each it writes the GFLOP/s measured. ``workload``: "matmul"
    (:func:`matmul_gflops`) or "layer" (:func:`layer_gflops` of the shape ``layer``: hidden, heads, ffn,
    positions)."""

    def __init__(self, workload: str = "matmul", layer: tuple[int, int, int, int] = (384, 12, 1536, 128)):
        if workload not in WORKLOADS:
            raise WorkbenchError(f"a probe's workload is one of {', '.join(WORKLOADS)}, got {workload!r}")
        self.workload, self.layer = workload, tuple(layer)
        self.process = subprocess.Popen([sys.executable, "-m", "workbench.distributed.cpulimit", workload,
                                         *(str(int(v)) for v in layer)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid

    def measure(self, seconds: float | None = None) -> float:
        seconds = seconds if seconds is not None else LAYER_PROBE_S if self.workload == "layer" else PROBE_S
        self.process.stdin.write(f"{seconds}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise WorkbenchError("the CPU probe ended before answering")
        return float(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Calibration:
    """A group's share of a core for a target speed, and what the probe measured there."""
    target_gflops: float
    unlimited_gflops: float         # the probe in the group before any limit (nan: a known share was reused)
    share: float | None             # of a core; None: unlimited (the target is not below this host's speed)
    measured_gflops: float          # the probe at that share
    rounds: int

    @property
    def error(self) -> float:
        return self.measured_gflops / self.target_gflops - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= TOLERANCE

    def describe(self) -> str:
        if self.share is None:
            return (f"unlimited: the device's {self.target_gflops:.1f} GFLOP/s is not below this host's "
                    f"{self.unlimited_gflops:.1f}")
        return (f"{self.share:.3f} of a core: {self.measured_gflops:.1f} GFLOP/s for {self.target_gflops:.1f} "
                f"({100 * self.error:+.1f} %)")


_known: dict[tuple, float] = {}
"""Shares found before in this process, by (workload, target): where the next calibration starts."""


def calibrate(group: CpuGroup, target_gflops: float, *, rounds: int = ROUNDS, seconds: float | None = None,
              probe: Probe | None = None) -> Calibration:
    """Find ``group``'s share of a core at which the probe computes ``target_gflops`` (see the module
    docstring); each measure is the median of :data:`MEASURES`. A share found before in this process for the
    same probe and target is tried first. The probe is moved back out of the group when done."""
    import statistics

    if not (isinstance(target_gflops, (int, float)) and math.isfinite(target_gflops) and target_gflops > 0):
        raise WorkbenchError(f"a device's speed is GFLOP/s > 0, got {target_gflops!r}")
    own = probe is None
    probe = probe or Probe()
    key = (probe.workload, getattr(probe, "layer", None), round(float(target_gflops), 6))

    def measure() -> float:
        return statistics.median(probe.measure(seconds) for _ in range(MEASURES))
    try:
        group.add(probe.pid)
        group.unlimit()
        unlimited = measure() if key not in _known else math.nan
        if target_gflops >= unlimited:
            return Calibration(target_gflops, unlimited, None, unlimited, 0)
        share = _known.get(key) or max(MIN_SHARE, target_gflops / unlimited)
        got, done = math.nan, 0
        for done in range(1, rounds + 1):
            group.set_share(share)
            got = measure()
            if abs(got / target_gflops - 1) <= STOP:
                break
            share = min(1.0, max(MIN_SHARE, share * target_gflops / got))
        _known[key] = group.share
        return Calibration(target_gflops, unlimited, group.share, got, done)
    finally:
        if probe.process.poll() is None:
            try:
                (group.controller.root / "cgroup.procs").write_text(str(probe.pid))
            except OSError:
                pass
        if own:
            probe.close()


def _serve_probe(args: list[str]) -> None:
    workload = args[0] if args else "matmul"
    hidden, heads, ffn, positions = (int(v) for v in args[1:5]) if len(args) >= 5 else (384, 12, 1536, 128)
    for line in sys.stdin:
        seconds = float(line)
        got = (layer_gflops(seconds, hidden=hidden, heads=heads, ffn=ffn, positions=positions)
               if workload == "layer" else matmul_gflops(seconds))
        print(got, flush=True)



def limit_speed(device, seq_len: int) -> float:
    """The FLOP/s a rank's CPU limit is calibrated to: ``device``'s speed on the probe's layer, which computes
    all ``seq_len`` rows (below the profile's peak by its ``half_peak_tokens``, as the cost model counts)."""
    return device.flops_per_s / (1 + device.half_peak_tokens / seq_len)


def limits_problem() -> str | None:
    """Why a measured run (ranks under CPU limits, links shaped by ``tc``) cannot happen here; None: it can."""
    from workbench.distributed.shaping import shaping_problem

    return limit_problem() or shaping_problem()


if __name__ == "__main__":
    _serve_probe(sys.argv[1:])
