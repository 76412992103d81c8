"""Joining a Ray cluster: addresses, tokens and loopback heads are named in one line before Ray is joined;
GPU types become custom resources. A stand-in GCS (gRPC, in this process) plays the head."""
from __future__ import annotations

import socket
import subprocess
import sys
from concurrent import futures

import pytest

from workbench.earlyexit.raycluster import (check_head, local_resources, probe_head, split_address,
                                            type_resource, use_token_if_held)
from workbench.errors import WorkbenchError


def test_gpu_types_name_custom_resources():
    assert type_resource("v100") == "gpu_type_v100" and type_resource("A6000 (48GB)") == "gpu_type_a6000_48gb"
    with pytest.raises(WorkbenchError, match="letters or digits"):
        type_resource("--")
    local = local_resources({"gpu_type_custom": 2})
    assert {"gpu_type_v100", "gpu_type_p100", "gpu_type_host"} <= set(local) and local["gpu_type_custom"] == 2


@pytest.mark.parametrize("address", ["nowhere", "host:", ":6379", "host:99999", "a:b"])
def test_a_malformed_address_is_named(address):
    with pytest.raises(WorkbenchError, match="not HOST:PORT"):
        split_address(address)


@pytest.mark.integration
def test_address_checks_load_neither_ray_nor_torch():
    code = ("import sys\nfrom workbench.errors import WorkbenchError\nfrom workbench.earlyexit.raycluster import "
            "check_head\nfor a in ('nowhere', '127.0.0.1:1'):\n    try:\n        check_head(a)\n    except "
            "WorkbenchError as e:\n        print(e)\nprint('ray' in sys.modules, 'torch' in sys.modules)\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = got.stdout.strip().splitlines()
    assert "not HOST:PORT" in lines[0] and "no Ray cluster answers at 127.0.0.1:1" in lines[1]
    assert lines[2] == "False False"


def _routable_ipv4() -> str | None:
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


@pytest.fixture
def fake_head():
    """A gRPC server answering the GCS's node query: ``state["mode"]`` "token" refuses a wrong token,
    "loopback" lists one node advertised on 127.0.0.1, "ok" a routable one."""
    import grpc
    from ray.core.generated import gcs_pb2, gcs_service_pb2

    state = {"mode": "ok", "token": "right", "seen": []}

    def handler(request, context):
        sent = dict(context.invocation_metadata()).get("authorization")
        state["seen"].append(sent)
        if state["mode"] == "token" and sent != f"Bearer {state['token']}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: missing or incorrect")
        ip = "127.0.0.1" if state["mode"] == "loopback" else "10.9.9.9"
        node = gcs_pb2.GcsNodeInfo(node_manager_address=ip, state=gcs_pb2.GcsNodeInfo.ALIVE)
        return gcs_service_pb2.GetAllNodeInfoReply(node_info_list=[node])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    method = grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=gcs_service_pb2.GetAllNodeInfoRequest.FromString,
        response_serializer=gcs_service_pb2.GetAllNodeInfoReply.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "ray.rpc.NodeInfoGcsService", {"GetAllNodeInfo": method}),))
    port = server.add_insecure_port("0.0.0.0:0")
    server.start()
    yield state, port
    server.stop(0)


def test_a_refused_token_is_named_as_an_authentication_failure(fake_head, monkeypatch):
    state, port = fake_head
    state["mode"] = "token"
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "stale")
    with pytest.raises(WorkbenchError) as err:
        check_head(f"127.0.0.1:{port}")
    message = str(err.value)
    assert "Ray authentication failed" in message and "RAY_AUTH_TOKEN" in message and "\n" not in message
    assert state["seen"][-1] == "Bearer stale"           # the token held was sent
    monkeypatch.setenv("RAY_AUTH_TOKEN", "right")
    assert check_head(f"127.0.0.1:{port}") == ["10.9.9.9"]


def test_a_token_held_switches_the_driver_to_token_mode(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not use_token_if_held()
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("left-by-a-local-run\n")
    assert use_token_if_held()
    import os
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")        # an explicit mode is respected
    assert not use_token_if_held()


def test_a_head_advertised_on_loopback_is_named(fake_head):
    state, port = fake_head
    ip = _routable_ipv4()
    if ip is None:
        pytest.skip("no non-loopback IPv4 address on this host to reach the stand-in head by")
    state["mode"] = "loopback"
    with pytest.raises(WorkbenchError, match=rf"advertises its node on loopback.*--node-ip-address={ip}"):
        probe_head(f"{ip}:{port}")
    assert probe_head(f"127.0.0.1:{port}") == ["127.0.0.1"]     # a loopback address on one host is fine
