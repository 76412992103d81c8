"""The Ray that E3's serving runs on: a local one started here, or a cluster joined by address.

- **GPU types are Ray custom resources.** A split of GPU type ``v100`` asks each replica for one unit of
  ``gpu_type_v100`` (:func:`type_resource`), so on a cluster it lands only on nodes started with that resource
  (``ray start ... --resources='{"gpu_type_v100": 4}'``). A local Ray started here is one node standing in for
  every GPU type the workbench knows (E3's presets and ``host``), holding :data:`LOCAL_TYPE_UNITS` of each.
- **Token authentication.** Ray 2.60 turns token authentication on for every local ``ray.init`` and leaves the
  token in ``~/.ray/auth_token``; ``ray start --head`` then runs with tokens while ``ray start --address`` and a
  driver given an explicit address do not, and the worker is refused (``InvalidAuthToken``). So a driver here
  joins with token mode whenever it holds a token (a head without authentication accepts it too), the
  README's cluster commands set ``RAY_AUTH_MODE=token`` explicitly, and before ``ray.init`` one RPC to the
  head's GCS says in one line whether it refused our token, instead of Ray retrying for 20 s.
- **Loopback heads.** On a host whose name resolves to 127.0.0.1 and that has no default route, ``ray start
  --head`` advertises 127.0.0.1 and no other machine can reach its node; the same RPC lists the nodes and a
  head advertised on loopback behind a non-loopback address is named, with ``--node-ip-address`` as the fix.
"""
from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from workbench.errors import WorkbenchError

TYPE_PREFIX = "gpu_type_"
LOCAL_TYPE_UNITS = 64
"""Units of each GPU-type resource a local node holds: more replicas than any plan here asks for."""
REACH_TIMEOUT_S = 3.0
START_ATTEMPTS = 2
OBJECT_STORE_BYTES = 512 * 1024 ** 2
_GCS_INFO = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"

_SERVE_STARTED_HERE = False
"""Whether this process started Ray Serve on the Ray it is connected to (then closing the session stops it)."""


def type_resource(gpu_type: str) -> str:
    """The custom resource standing for one GPU of ``gpu_type`` (``"V100"`` -> ``"gpu_type_v100"``)."""
    name = re.sub(r"[^a-z0-9]+", "_", str(gpu_type).strip().lower()).strip("_")
    if not name:
        raise WorkbenchError(f"GPU type {gpu_type!r} has no letters or digits to name a Ray resource by")
    return TYPE_PREFIX + name


def known_gpu_types() -> list[str]:
    """The GPU types a local node stands in for: E3's device presets and ``host``."""
    try:
        from workbench.devices import PRESETS
        types = [n for n, p in PRESETS.items() if getattr(p, "paper", None) == "e3"]
    except Exception:  # noqa: BLE001 - the registry is a convenience here, "host" always works
        types = []
    return types + ["host"]


def local_resources(extra: Mapping[str, float] | None = None) -> dict[str, float]:
    """Custom resources of a local node: every known GPU type, plus ``extra`` (resource name -> units)."""
    out = {type_resource(t): float(LOCAL_TYPE_UNITS) for t in known_gpu_types()}
    for name, units in (extra or {}).items():
        if not (isinstance(units, (int, float)) and math.isfinite(units) and units > 0):
            raise WorkbenchError(f"resource {name!r} needs a number of units > 0, got {units!r}")
        out[str(name)] = float(units)
    return out


# -- the session -------------------------------------------------------------------------------------

@dataclass
class RaySession:
    """The Ray this process uses: the address asked for (None: a local one), its CPUs, and whether this
    call started (or joined) it, in which case :meth:`close` disconnects, after stopping the Serve this
    process started on it."""
    address: str | None
    num_cpus: float
    started: bool
    start_s: float
    resources: dict = field(default_factory=dict)     # the cluster's total resources when the session began

    def close(self) -> None:
        """Stop the Serve this process started (its controller and proxies), then leave or stop Ray."""
        global _SERVE_STARTED_HERE
        import ray

        if not ray.is_initialized():
            return
        if _SERVE_STARTED_HERE and self.address is not None:
            shutdown_serve()         # a cluster's Serve controller is detached: it would outlive this driver
        if self.started:
            ray.shutdown()           # a local Ray takes its Serve actors with it
            _SERVE_STARTED_HERE = False

    def nodes(self) -> list[dict]:
        """Alive nodes: id, IP and resources."""
        import ray

        return [{"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "resources": dict(n["Resources"])}
                for n in ray.nodes() if n.get("Alive")]


def start_serve() -> bool:
    """Start Ray Serve (no HTTP proxy) unless it runs already; returns whether this call started it."""
    global _SERVE_STARTED_HERE
    from ray import serve

    running = _serve_running()
    serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING", "enable_access_log": False})
    quiet()
    if not running:
        _SERVE_STARTED_HERE = True
    return not running


def shutdown_serve() -> None:
    """Stop Serve (its controller actor) on the connected Ray."""
    global _SERVE_STARTED_HERE
    from ray import serve

    try:
        serve.shutdown()
    except Exception:  # noqa: BLE001 - Ray may already be going down; nothing left to stop then
        pass
    _SERVE_STARTED_HERE = False


def _serve_running() -> bool:
    import ray

    try:
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return True
    except Exception:  # noqa: BLE001 - no controller actor (or an older layout): Serve is not running
        return False


class _WarningsOnly(logging.Filter):
    """Warnings and worse, except Serve's line per request refused by a full queue: the run counts those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and "dropped due to backpressure" not in record.getMessage()


def quiet() -> None:
    """No INFO lines from Ray or Serve in the driver (Serve resets its logger's level when it starts, so a
    filter, which it leaves alone, does the work)."""
    for name in ("ray", "ray.serve"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if not any(isinstance(f, _WarningsOnly) for f in logger.filters):
            logger.addFilter(_WarningsOnly())


# -- addresses, tokens, the head's nodes -------------------------------------------------------------

def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``host:port`` address; None for "auto", "local" and ``ray://`` addresses. A
    malformed one raises."""
    text = str(address).strip()
    if text in ("auto", "local") or text.startswith("ray://"):
        return None
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WorkbenchError(f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.1:6379, as `ray start --head` "
                             f"prints)")
    return host, int(port)


def check_reachable(address: str) -> None:
    """A host:port address must accept a TCP connection within REACH_TIMEOUT_S."""
    parts = split_address(address)
    if parts is None:
        return
    host, port = parts
    try:
        with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as err:
        raise WorkbenchError(
            f"no Ray cluster answers at {address} ({err.strerror or err}); start one on that machine with "
            f"`ray start --head --port={port}`, or pass address=None to start a local Ray") from None


def auth_token() -> str | None:
    """The Ray token this process would send: RAY_AUTH_TOKEN, the file at RAY_AUTH_TOKEN_PATH, or
    ~/.ray/auth_token (Ray's own order)."""
    value = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if value:
        return value
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if path:
            try:
                text = Path(path).read_text().strip()
            except OSError:
                continue
            if text:
                return text
    return None


def use_token_if_held() -> bool:
    """Join with token authentication when a token is at hand and RAY_AUTH_MODE is unset (a head without
    authentication accepts a token; a head with it refuses a driver without one). Returns whether on."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.strip().lower() == "token"
    if auth_token() is None:
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        from ray._raylet import Config
        Config.initialize("")        # Ray caches the mode: re-read it, as its own switch to token mode does
    except Exception:  # noqa: BLE001 - older layouts read the environment on init
        pass
    return True


def probe_head(address: str, token: str | None = None) -> list[str]:
    """One RPC to the GCS at ``address``: the alive nodes' advertised IPs. A refused token, an unanswering
    head, or a head advertised on loopback behind a routable address each raise a one-line WorkbenchError."""
    parts = split_address(address)
    if parts is None:
        return []
    host, port = parts
    import grpc
    from ray.core.generated import gcs_service_pb2

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary(_GCS_INFO,
                                   request_serializer=gcs_service_pb2.GetAllNodeInfoRequest.SerializeToString,
                                   response_deserializer=gcs_service_pb2.GetAllNodeInfoReply.FromString)
        try:
            reply = call(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=REACH_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as err:
            code = err.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                held = ("this machine's token" if token else "no token") + (
                    " (RAY_AUTH_TOKEN)" if os.environ.get("RAY_AUTH_TOKEN") else
                    f" ({os.environ.get('RAY_AUTH_TOKEN_PATH') or '~/.ray/auth_token'})" if token else "")
                raise WorkbenchError(
                    f"Ray authentication failed at {address}: the head requires a token and refused {held}; "
                    f"set RAY_AUTH_TOKEN to the head's token (`ray get-auth-token` on the head)") from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise WorkbenchError(f"no Ray GCS answers at {address} ({code.name.lower()}): start a head there "
                                     f"with `ray start --head --port={port}`") from None
            raise WorkbenchError(f"the Ray head at {address} failed a node query: {code.name} {err.details()}") \
                from None
    alive = [n.node_manager_address for n in reply.node_info_list if n.state == n.ALIVE]
    if not _is_loopback(host) and any(_is_loopback(ip) for ip in alive):
        raise WorkbenchError(
            f"the Ray head at {address} advertises its node on loopback ({', '.join(sorted(set(alive)))}), so no "
            f"other machine reaches it (this host's name resolves to 127.0.0.1): restart it with "
            f"`ray start --head --node-ip-address={host}`")
    return alive


def check_head(address: str) -> list[str]:
    """Everything about ``address`` that can be known without joining: it is HOST:PORT, answers, accepts the
    token this process holds (switching to token mode when one is held) and advertises routable nodes."""
    check_reachable(address)
    token = auth_token() if use_token_if_held() else None
    return probe_head(address, token)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_same_cluster(address: str | None) -> None:
    """This process is already connected to a Ray: an explicit host:port must name that one (same port)."""
    import ray

    if address is None or split_address(address) is None:
        return
    current = ray.get_runtime_context().gcs_address
    if current.rpartition(":")[2] != str(address).rpartition(":")[2]:
        raise WorkbenchError(f"this process is already connected to the Ray at {current}, not {address}: "
                             f"call ray.shutdown() first (or pass address=None to use the current one)")


# -- starting a local Ray ------------------------------------------------------------------------------

_LAUNCHER = None


def _launcher():
    """One thread that lives as long as the process, for starting Ray: Ray's head processes die with the
    *thread* that forked them (PR_SET_PDEATHSIG), so a Ray started from a page's background run would vanish
    when that run's thread ends, and take the kernel's connection with it."""
    global _LAUNCHER
    if _LAUNCHER is None:
        from concurrent.futures import ThreadPoolExecutor

        _LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-ray")
    return _LAUNCHER


def start_local(num_cpus: float, resources: Mapping[str, float] | None = None,
                attempts: int = START_ATTEMPTS) -> None:
    if threading.current_thread() is threading.main_thread():
        start_local_here(num_cpus, resources, attempts)
    else:
        _launcher().submit(start_local_here, num_cpus, resources, attempts).result()


def start_local_here(num_cpus: float, resources: Mapping[str, float] | None = None,
                     attempts: int = START_ATTEMPTS) -> None:
    """``ray.init`` of a new local Ray (address "local": never someone else's cluster on this host) holding
    ``resources``, tried again when its node does not register in time (Ray allows 30 s, which a loaded 2-core
    host can miss)."""
    import ray

    for attempt in range(attempts):
        try:
            ray.init(address="local", num_cpus=num_cpus, resources=dict(resources or {}), include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False, object_store_memory=OBJECT_STORE_BYTES)
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception when its node does not come up
            if "timed out during startup" not in str(err):
                raise
            ray.shutdown()
            if attempt == attempts - 1:
                raise WorkbenchError(
                    f"the local Ray did not come up in {attempts} tries: its node must register within 30 s "
                    f"({err}); the machine is probably overloaded: retry when it is quieter, or start Ray once "
                    f"with `ray start --head --num-cpus={num_cpus:g}` and pass address='127.0.0.1:6379'") from None


def ray_session(address: str | None = None, num_cpus: float = 2,
                resources: Mapping[str, float] | None = None) -> RaySession:
    """Connect to the Ray at ``address`` (host:port, ray://host:port or "auto"), or start a local one with
    ``num_cpus`` CPUs holding every known GPU type's resource plus ``resources`` (address None); a Ray already
    initialised in this process is reused as it is."""
    import ray

    quiet()
    begin = time.perf_counter()
    if address is not None:
        address = str(address).strip()
        check_head(address)
    if ray.is_initialized():
        check_same_cluster(address)
        return RaySession(address, float(ray.cluster_resources().get("CPU", 0.0)), False, 0.0,
                          dict(ray.cluster_resources()))
    if address is None:
        if not (isinstance(num_cpus, (int, float)) and not isinstance(num_cpus, bool) and num_cpus > 0):
            raise WorkbenchError(f"num_cpus {num_cpus!r} must be a number of CPUs > 0")
        start_local(num_cpus, local_resources(resources))
    else:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as err:
            raise WorkbenchError(f"could not join the Ray at {address}: {err}") from None
    return RaySession(address, float(ray.cluster_resources().get("CPU", 0.0)), True,
                      time.perf_counter() - begin, dict(ray.cluster_resources()))


def check_type_resources(needs: Mapping[str, int], address: str | None = None) -> None:
    """Each GPU type's replicas must fit the units of its resource the cluster holds."""
    import ray

    have = ray.cluster_resources()
    for gpu_type, count in needs.items():
        name = type_resource(gpu_type)
        held = have.get(name, 0.0)
        if held + 1e-9 < count:
            where = f"the Ray at {address}" if address else "this process's Ray"
            raise WorkbenchError(
                f"the plan puts {count} replica(s) on GPU type {gpu_type} but {where} holds {held:g} unit(s) of "
                f"resource {name}: start the nodes with that GPU with "
                f"`ray start ... --resources='{{\"{name}\": N}}'`")
