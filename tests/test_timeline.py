import json

import pytest

from workbench.timeline import Counter, Span, Timeline


def make_timeline():
    return Timeline([
        Span("io", "io", 0.0, 0.010, "layer 0", {"bytes": 1000}),
        Span("compute", "stall", 0.0, 0.010, "wait"),
        Span("compute", "compute", 0.010, 0.025, "layer 0"),
        Span("link", "comm", 0.002, 0.004, "all-gather", device="edge-1"),
    ], "measured", [Counter("AIB layer 1 (ms)", 0.01, 3.5)], name="demo")


def test_chrome_trace_has_a_process_per_device_and_a_thread_per_lane():
    trace = make_timeline().to_chrome_trace()
    json.dumps(trace)
    events = trace["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert procs == {"host (measured)": 1, "edge-1 (measured)": 2}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(1, "io"), (1, "compute"), (2, "link")}
    spans = [e for e in events if e["ph"] == "X"]
    assert [(e["name"], e["cat"], e["ts"], e["dur"]) for e in spans][2] == ("layer 0", "compute", 10000.0, 15000.0)
    assert spans[0]["args"]["bytes"] == 1000
    counters = [e for e in events if e["ph"] == "C"]
    assert counters == [{"ph": "C", "name": "AIB layer 1 (ms)", "pid": 1, "tid": 0, "ts": 10000.0,
                         "args": {"value": 3.5}}]


def test_summaries():
    t = make_timeline()
    assert t.end == pytest.approx(0.025)
    assert t.busy("stall") == pytest.approx(0.010)
    assert t.lanes == ["io", "compute", "link"]


def test_save_chrome_trace(tmp_path):
    path = make_timeline().save_chrome_trace(tmp_path / "trace.json")
    assert json.loads(path.read_text())["otherData"] == {"source": "measured", "name": "demo"}


def test_invalid_spans_are_refused():
    with pytest.raises(ValueError, match="span kind 'think' is not one of io, compute"):
        Span("cpu", "think", 0, 1)
    with pytest.raises(ValueError, match="ends .* before it starts"):
        Span("cpu", "compute", 2, 1, "layer 3")
    with pytest.raises(ValueError, match="timeline source 'guess'"):
        Timeline([], "guess")
