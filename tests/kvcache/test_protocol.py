"""The wire protocol and the light client, without a model."""
import socket
import subprocess
import sys
import threading

import pytest

from workbench.kvcache.errors import ProtocolError
from workbench.kvcache.protocol import PROTOCOL_VERSION, CallStats, LineReader, check_version


@pytest.mark.integration
def test_the_client_imports_neither_torch_nor_scipy():
    code = ("import sys, workbench.kvcache.client\n"
            "from workbench.kvcache.client import CtxStub, CallStats, StubError, MemoryBudgetError, connect\n"
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_service_still_exports_its_errors_and_types():
    from workbench.kvcache import client, errors, protocol, service

    assert service.StubError is errors.StubError is client.StubError
    assert service.CtxStub is protocol.CtxStub and service.CallStats is protocol.CallStats


def test_lines_are_read_whole_and_an_over_long_one_is_refused_without_shifting_the_next():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = LineReader(ours)
        sender = threading.Thread(target=theirs.sendall, args=(b"a" * (3 << 20) + b"\n" + b'{"id": 2}\n',))
        sender.start()
        assert len(reader.readline()) == (3 << 20) + 1
        assert reader.readline() == b'{"id": 2}\n'
        sender.join()
        theirs.sendall(b"b" * 5000 + b"\n" + b"ok\n")
        with pytest.raises(ProtocolError, match="at most 100 bytes"):
            reader.readline(limit=100)
        assert reader.readline(limit=100) == b"ok\n"
        theirs.close()
        assert reader.readline() == b""


def test_a_timeout_mid_line_loses_nothing():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(0.05)
        reader = LineReader(ours)
        theirs.sendall(b'{"half": ')
        with pytest.raises(TimeoutError):
            reader.readline()
        theirs.sendall(b'"line"}\n')
        assert reader.readline() == b'{"half": "line"}\n'


def test_versions_of_another_major_are_refused_naming_both():
    check_version(PROTOCOL_VERSION.split(".")[0] + ".9", "client")
    with pytest.raises(ProtocolError, match=r"client speaks protocol 2\.0 and the service speaks protocol 3\.0"):
        check_version("3.0", "service")
    with pytest.raises(ProtocolError, match=r"no version \(protocol 1\)"):
        check_version(None, "client")


def test_call_stats_from_a_newer_service_keep_the_fields_this_client_knows():
    values = {f: 0 for f in CallStats.__dataclass_fields__} | {"ctx": "c", "app": "a", "loader": "l", "new": 1}
    assert CallStats.from_dict(values).ctx == "c"
