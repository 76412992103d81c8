"""Real link shaping for distributed runs: each rank in a network namespace of its own, its link
limited in both directions by a ``tc`` token bucket (tbf) at its device profile's bandwidth.

The layout: ``size`` rank namespaces and one switch namespace holding a bridge. Each rank is joined to
the bridge by a veth pair whose rank end has the same name in every rank (:attr:`ShapedNetwork.interface`,
so one ``GLOO_SOCKET_IFNAME`` fits all) and an address in 10.231.0.0/24. The tbf on the rank end's egress
shapes the rank's uplink, the one on the switch end's egress its downlink. Latency is not shaped here (the
kernel has no netem): the application emulates it.

Nothing is left behind after a crash, by construction. The namespaces are unnamed (``ip netns add`` would
bind-mount them under /run/netns, where they outlive every process); each is held only by a holder process
(``sleep`` under ``unshare --net``) that the kernel kills when its parent dies (``PR_SET_PDEATHSIG``). When
the last process in a namespace ends the kernel removes the namespace with its interfaces, and a veth pair
goes with either end. Every interface is made inside the switch namespace or moved straight into a rank's,
so none ever exists in the host's, not even while the network is being built. Workers started with
:meth:`ShapedNetwork.prefix` keep their namespace alive until they end: stop them before closing.

This module does not import torch.
"""
from __future__ import annotations

import math
import numbers
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

from workbench.errors import WorkbenchError
from workbench.workers import _spawn

MAX_SIZE = 64
MIN_BANDWIDTH_MBIT = 0.1
MAX_BANDWIDTH_MBIT = 100_000.0
"""The bandwidths a link may be given, in Mbit/s (10^6 bit/s)."""
SUBNET = "10.231.0"
MIN_BURST_BYTES = 32 * 1024
BURST_S = 0.001
"""The bucket holds ``max(MIN_BURST_BYTES, rate * BURST_S)``; see :func:`burst_bytes`."""
QUEUE_LATENCY_MS = 50
"""How long a packet may wait in a link's queue before tbf drops it (tc's ``latency``)."""
PROGRAMS = {"ip": "iproute2", "tc": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
            "sleep": "coreutils"}
START_TIMEOUT_S = 10.0

_HOLDER = ("import ctypes, os, signal, sys\n"
           "ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
           "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
           "os.execvp('unshare', ['unshare', '--net', '--', 'sleep', 'infinity'])\n")
"""A namespace holder: SIGKILL when the parent dies (PR_SET_PDEATHSIG is 1, kept across exec), then a new
network namespace held by ``sleep``."""

_RECEIVER = ("import socket, sys, time\n"
             "server = socket.create_server((sys.argv[1], 0))\n"
             "print(server.getsockname()[1], flush=True)\n"
             "conn, _ = server.accept()\n"
             "buf = bytearray(1 << 20)\n"
             "first = total = conn.recv_into(buf)\n"
             "start = end = time.perf_counter()\n"
             "while (n := conn.recv_into(buf)):\n"
             "    total += n\n"
             "    end = time.perf_counter()\n"
             "print(total, first, end - start, flush=True)\n")

_SENDER = ("import socket, sys\n"
           "left = int(sys.argv[3])\n"
           "chunk = memoryview(bytes(1 << 20))\n"
           "with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4])) as conn:\n"
           "    while left > 0:\n"
           "        conn.sendall(chunk[:left])\n"
           "        left -= len(chunk)\n")


class ShapingError(WorkbenchError):
    """Link shaping cannot be set up here (not root, a program or the tbf qdisc missing) or a step failed."""


def check_shaping_available() -> None:
    """Raise a :class:`ShapingError` naming what is missing for link shaping (root, a program, network
    namespaces, the tbf qdisc). The probes run in a throwaway namespace that ends with them."""
    if os.geteuid() != 0:
        raise ShapingError("link shaping needs root (network namespaces and tc); run as root")
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        packages = sorted({PROGRAMS[name] for name in missing})
        raise ShapingError(f"link shaping needs programs that are missing: {', '.join(missing)}; install "
                           f"{', '.join(packages)} (e.g. apt-get install {' '.join(packages)})")
    probe = _run(["unshare", "--net", "--", "ip", "link", "set", "lo", "up"])
    if probe.returncode != 0:
        raise ShapingError(f"cannot create a network namespace: {_first_line(probe.stderr)}")
    probe = _run(["unshare", "--net", "--", "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit",
                  "burst", str(MIN_BURST_BYTES), "latency", f"{QUEUE_LATENCY_MS}ms"])
    if probe.returncode != 0:
        raise ShapingError(f"the kernel has no tbf qdisc (CONFIG_NET_SCH_TBF): tc said {_first_line(probe.stderr)}")


def shaping_problem() -> str | None:
    """None when links can be shaped here, else why not (:func:`check_shaping_available`'s message)."""
    try:
        check_shaping_available()
    except ShapingError as exc:
        return str(exc)
    return None


def ensure_iproute2() -> None:
    """Install ``iproute2`` with apt-get when ``ip`` or ``tc`` is missing; do nothing when both are there."""
    if shutil.which("ip") and shutil.which("tc"):
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise ShapingError("the programs ip and tc are missing; install the package iproute2 as root")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "iproute2"]):
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode != 0:
            raise ShapingError(f"{' '.join(command)} failed: {_first_line(done.stderr)}")
    if not (shutil.which("ip") and shutil.which("tc")):
        raise ShapingError("apt-get installed iproute2 but ip or tc is still not on PATH")


def burst_bytes(bandwidth_bytes_per_s: float) -> int:
    """The token bucket's size for a link: what it may send at once, at line speed.

    At least the bytes the rate brings in 1 ms (tbf refills on high-resolution timers, so the bucket need
    not cover a whole 1/HZ tick, but a smaller one loses rate to the timer's slack) and at least 32 KiB (a
    few full-size packets and half a 64 KiB GSO packet, which tbf would otherwise have to cut up). Larger
    buckets let more of a short message through unshaped: 32 KiB is 1.3 ms at 200 Mbit/s."""
    return max(MIN_BURST_BYTES, math.ceil(bandwidth_bytes_per_s * BURST_S))


def _check_size(size) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise ShapingError(f"a shaped network has 1 to {MAX_SIZE} ranks, got {size!r}")
    return size


def _check_bandwidths(bandwidth, size: int) -> tuple[float, ...]:
    values = [bandwidth] * size if isinstance(bandwidth, numbers.Real) else list(bandwidth)
    if len(values) != size:
        raise ShapingError(f"{len(values)} bandwidths for {size} ranks; give one per rank or one for all")
    for rank, value in enumerate(values):
        mbit = float(value) * 8 / 1e6
        if not (math.isfinite(mbit) and MIN_BANDWIDTH_MBIT <= mbit <= MAX_BANDWIDTH_MBIT):
            raise ShapingError(f"rank {rank}'s bandwidth must be {MIN_BANDWIDTH_MBIT:g} to "
                               f"{MAX_BANDWIDTH_MBIT:g} Mbit/s, got {mbit:g} Mbit/s")
    return tuple(float(v) for v in values)


def _check_name(name) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9]{0,7}", name):
        raise ShapingError(f"a shaped network's name is 1 to 8 lower-case letters or digits starting with a "
                           f"letter (it prefixes interface names), got {name!r}")
    return name


class ShapedNetwork:
    """``size`` ranks, each in a network namespace of its own, joined by a bridge; rank ``r``'s link carries
    ``bandwidth_bytes_per_s`` (one for all, or one per rank) each way. Built when made; use it as a context
    manager or call :meth:`close`. A step that fails undoes what was built.

    ``addresses[r]``: rank ``r``'s IPv4 address; ``master_addr``: rank 0's; ``interface``: the name every
    rank's link has inside its namespace; ``holder_pids``: the processes holding the namespaces (the
    switch's first)."""

    def __init__(self, size: int, bandwidth_bytes_per_s: float | Sequence[float], *, name: str = "wb"):
        self.size = _check_size(size)
        self.bandwidth_bytes_per_s = _check_bandwidths(bandwidth_bytes_per_s, size)
        self.name = _check_name(name)
        check_shaping_available()
        self.interface = f"{name}net0"
        self.addresses = {rank: f"{SUBNET}.{rank + 1}" for rank in range(size)}
        self.master_addr = self.addresses[0]
        self._holders: list[subprocess.Popen] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "ShapedNetwork":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        rates = sorted({f"{b * 8 / 1e6:g}" for b in self.bandwidth_bytes_per_s})
        return f"ShapedNetwork({self.size} ranks, {'/'.join(rates)} Mbit/s, interface {self.interface})"

    @property
    def holder_pids(self) -> tuple[int, ...]:
        """The processes holding the namespaces: the switch's, then rank 0's, 1's, ..."""
        return tuple(p.pid for p in self._holders)

    def prefix(self, rank: int) -> list[str]:
        """A command prefix that runs a program inside ``rank``'s namespace."""
        if not 0 <= rank < self.size:
            raise ShapingError(f"rank {rank} is not in a network of {self.size} ranks")
        return _enter(self._holders[rank + 1].pid)

    def env(self) -> dict[str, str]:
        """What torch.distributed needs to use the shaped link: gloo's (and tensorpipe's) interface."""
        return {"GLOO_SOCKET_IFNAME": self.interface, "TP_SOCKET_IFNAME": self.interface}

    def wire_bytes(self) -> list[tuple[int, int]]:
        """Per rank: the bytes its link has carried so far, (from the rank, to the rank), read off the switch
        end of its veth pair (``/proc/<switch holder>/net/dev``): what really crossed the wire, TCP/IP and
        Ethernet framing, acknowledgements and every protocol message included."""
        counters: dict[str, tuple[int, int]] = {}
        with open(f"/proc/{self._holders[0].pid}/net/dev") as handle:
            for line in handle.readlines()[2:]:
                name, _, rest = line.partition(":")
                fields = rest.split()
                counters[name.strip()] = (int(fields[0]), int(fields[8]))        # received, transmitted
        return [counters[f"{self.name}sw{rank}"] for rank in range(self.size)]

    def close(self) -> None:
        """Kill the holders and wait for them: their namespaces and every interface in them go."""
        for holder in self._holders:
            if holder.returncode is None:
                try:
                    holder.send_signal(signal.SIGKILL)
                except OSError:
                    pass
        for holder in self._holders:
            holder.wait()
            if holder.stderr is not None:
                holder.stderr.close()

    def _build(self) -> None:
        own = os.stat("/proc/self/ns/net").st_ino
        for _ in range(self.size + 1):
            self._holders.append(_spawn(args=[sys.executable, "-S", "-c", _HOLDER, str(os.getpid())],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, start_new_session=True))
        deadline = time.monotonic() + START_TIMEOUT_S
        for holder in self._holders:
            _await_namespace(holder, own, deadline)
        switch, ranks = self._holders[0].pid, [h.pid for h in self._holders[1:]]
        bridge = f"{self.name}br"
        lines = ["link set lo up", f"link add name {bridge} type bridge", f"link set {bridge} addrgenmode none",
                 f"link set {bridge} up"]
        for rank, pid in enumerate(ranks):
            port = f"{self.name}sw{rank}"
            lines += [f"link add name {port} type veth peer name {self.interface} netns {pid}",
                      f"link set {port} addrgenmode none", f"link set {port} master {bridge}", f"link set {port} up"]
        _batch(switch, "ip", lines)
        _batch(switch, "tc", [self._tbf(f"{self.name}sw{rank}", rank) for rank in range(self.size)])
        for rank, pid in enumerate(ranks):
            _batch(pid, "ip", ["link set lo up", f"link set {self.interface} addrgenmode none",
                               f"addr add {self.addresses[rank]}/24 dev {self.interface}",
                               f"link set {self.interface} up"])
            _batch(pid, "tc", [self._tbf(self.interface, rank)])

    def _tbf(self, device: str, rank: int) -> str:
        rate = self.bandwidth_bytes_per_s[rank]
        return (f"qdisc add dev {device} root tbf rate {round(rate * 8)}bit burst {burst_bytes(rate)} "
                f"latency {QUEUE_LATENCY_MS}ms")


def _enter(pid: int) -> list[str]:
    return ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]


def _run(command: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=30)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no message"


def _batch(pid: int, program: str, lines: list[str]) -> None:
    """Run ``program -batch -`` (ip or tc) with ``lines`` in the namespace held by ``pid``."""
    done = _run(_enter(pid) + [program, "-batch", "-"], input="\n".join(lines) + "\n")
    if done.returncode != 0:
        raise ShapingError(f"setting up the shaped network failed: {program}: {_first_line(done.stderr)}")


def _await_namespace(holder: subprocess.Popen, own: int, deadline: float) -> None:
    """Wait until ``holder`` is in a namespace other than ours (its /proc link names ours until unshare ran)."""
    while True:
        if holder.poll() is not None:
            why = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
            raise ShapingError(f"a namespace holder exited with status {holder.returncode}: {_first_line(why)}")
        try:
            if os.stat(f"/proc/{holder.pid}/ns/net").st_ino != own:
                holder.stderr.close()
                holder.stderr = None
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ShapingError(f"a namespace holder (pid {holder.pid}) had no namespace of its own after "
                               f"{START_TIMEOUT_S:g} s")
        time.sleep(0.005)


def measure_throughput(net: ShapedNetwork, src: int, dst: int, nbytes: int = 8 << 20, *,
                       timeout_s: float = 60.0) -> float:
    """Bytes per second of a real TCP transfer of ``nbytes`` from rank ``src`` to rank ``dst``, timed by the
    receiver from its first read to the last (so process start-up and the first bucketful do not count)."""
    if src == dst or not (0 <= src < net.size and 0 <= dst < net.size):
        raise ShapingError(f"measure between two different ranks of {net.size}, got {src} and {dst}")
    if nbytes < 4 * MIN_BURST_BYTES:
        raise ShapingError(f"transfer at least {4 * MIN_BURST_BYTES} bytes to measure throughput, got {nbytes}")
    receiver = subprocess.Popen(net.prefix(dst) + [sys.executable, "-S", "-c", _RECEIVER, net.addresses[dst]],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([receiver.stdout], [], [], timeout_s)
        port = receiver.stdout.readline().strip() if ready else ""
        if not port.isdigit():
            receiver.kill()
            raise ShapingError(f"the receiver in rank {dst}'s namespace did not start: "
                               f"{_first_line(receiver.communicate()[1])}")
        sender = subprocess.run(net.prefix(src) + [sys.executable, "-S", "-c", _SENDER, net.addresses[dst], port,
                                                   str(nbytes), str(timeout_s)],
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
        if sender.returncode != 0:
            raise ShapingError(f"the sender in rank {src}'s namespace failed: {_first_line(sender.stderr)}")
        out, err = receiver.communicate(timeout=timeout_s)
        if receiver.returncode != 0:
            raise ShapingError(f"the receiver in rank {dst}'s namespace failed: {_first_line(err)}")
        total, first, seconds = out.split()
    except subprocess.TimeoutExpired:
        raise ShapingError(f"a {nbytes}-byte transfer from rank {src} to rank {dst} took over {timeout_s:g} s") \
            from None
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    if int(total) != nbytes:
        raise ShapingError(f"rank {dst} received {total} of {nbytes} bytes from rank {src}")
    return (int(total) - int(first)) / float(seconds)
