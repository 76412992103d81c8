"""The LLMS page's live view of a running service: on a real service in this process (its snapshot handed
straight to the panel), then over a served socket with the operator's token (integration)."""
import threading

import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.errors import IdentityError
from workbench.kvcache.server import LLMServer
from workbench.kvcache.service import LLMService
from workbench.models.decoder import load_decoder
from workbench.ui.kvcache import LiveMonitor, counters_html, metric
from workbench.viz.kvcache import STATE_LABELS, live_state

CHUNK_BUDGET = 1_200_000


@pytest.fixture(scope="module")
def model():
    return load_decoder()


@pytest.fixture
def service(model, tmp_path):
    from dataclasses import replace

    from workbench.kvcache.config import ServiceConfig

    config = replace(ServiceConfig(), max_context_tokens=256)
    reserve = 256 * 2 * 30 * 3 * 64 * 2
    with LLMService(model, tmp_path / "swap", memory_budget_bytes=reserve + CHUNK_BUDGET, config=config) as svc:
        yield svc


def cells_by_row(fig) -> dict[int, dict[str, int]]:
    """Row -> {legend name: cells} of a chunk map."""
    rows: dict[int, dict[str, int]] = {}
    for trace in fig.data:
        if trace.type == "bar":
            for y in trace.y:
                rows.setdefault(y, {}).setdefault(trace.name, 0)
                rows[y][trace.name] += 1
    return rows


def test_detached_the_page_says_how_to_attach_and_an_empty_token_is_refused(service):
    monitor = LiveMonitor(address="unix:/nowhere", token="", fetch=lambda a, t: service.snapshot())
    assert "not attached" in monitor.status.value
    assert all("press Attach" in str(f.layout.annotations[0].text) for f in monitor.figures.values())
    monitor.attach.value = True
    assert not monitor.attach.value and "token is empty" in monitor.message.value


def test_each_poll_draws_the_services_contexts_chunks_queue_and_counters(service):
    monitor = LiveMonitor(address="unix:/x", token="t", fetch=lambda a, t: service.snapshot())
    monitor.attach.value = True
    assert monitor.polls == 1 and "no context yet" in str(monitor.figures["live_chunks"].layout.annotations[0].text)
    notes, mail = service.bind("notes"), service.bind("mail")
    a, b = notes.new_ctx(), mail.new_ctx()
    for session, stub, prompt in ((notes, a, "Name a colour."), (mail, b, "Name a bird."), (notes, a, "Another?")):
        session.call(stub, prompt, 4)
    snap = monitor.poll_once()
    fig = monitor.figures["live_chunks"]
    labels = list(fig.layout.yaxis.ticktext)
    assert sorted(labels) == sorted(f"{c['app']} · {c['id'][:6]}" for c in snap["contexts"])
    rows = cells_by_row(fig)
    for row, label in enumerate(labels):                 # every chunk of every context, in its own state's colour
        ctx = next(c for c in snap["contexts"] if label.startswith(f"{c['app']} · {c['id'][:6]}"))
        want: dict[str, int] = {}
        for chunk in ctx["chunks"]:
            want[STATE_LABELS[live_state(chunk)]] = want.get(STATE_LABELS[live_state(chunk)], 0) + 1
        assert rows[row] == want
    queue = monitor.figures["live_queue"]
    shown = sorted(round(x + 0.5) for t in queue.data for x in t.base)
    assert shown == list(range(1, len(snap["queue"]["order"]) + 1))
    assert "data-counter='calls'>3<" in monitor.counters.value
    assert "attached to unix:/x: 2 contexts" in monitor.status.value


def test_a_service_under_pressure_shows_swapped_chunks_and_evictions(service):
    session = service.bind("busy")
    stubs = [session.new_ctx() for _ in range(4)]
    for round_ in range(2):
        for i, stub in enumerate(stubs):
            session.call(stub, f"Tell me a long story about the number {i} and the round {round_}.", 12)
    snap = service.snapshot()
    states = {live_state(ch) for c in snap["contexts"] for ch in c["chunks"]}
    assert "swapped" in states or "killed" in states          # the budget could not hold them all
    html = counters_html(snap)
    assert metric(snap["metrics"], "llms_evictions_total") > 0
    assert f"data-counter='evicted'>{metric(snap['metrics'], 'llms_evictions_total'):.0f}<" in html


def test_a_service_that_stops_answering_detaches_the_page_with_its_reason(service):
    def gone(address, token):
        raise WorkbenchError(f"no LLM service answers on {address}")

    monitor = LiveMonitor(address="unix:/gone", token="t", fetch=gone)
    monitor.attach.value = True
    assert not monitor.attach.value and monitor.attach.description == "Attach"
    assert "no LLM service answers on unix:/gone" in monitor.message.value


@pytest.mark.integration
def test_over_the_socket_the_operators_token_opens_every_apps_snapshot(service, tmp_path):
    from workbench.kvcache.client import connect, operator_snapshot

    server = LLMServer(service, f"unix:{tmp_path / 'sock'}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with connect("notes", server.address) as notes:
            notes.call(notes.new_ctx(), "Hi.", 2)
        monitor = LiveMonitor(address=server.address, token=server.operator_token)
        monitor.attach.value = True
        assert monitor.polls == 1 and [c["app"] for c in monitor.snapshot["contexts"]][0].endswith(":notes")
        with pytest.raises(IdentityError, match="operator's token"):
            operator_snapshot(server.address, "wrong")
        assert [c["app"] for c in operator_snapshot(server.address, server.operator_token)["contexts"]] == \
            [c["app"] for c in monitor.snapshot["contexts"]]
    finally:
        server.shutdown()
        thread.join(10)
        server._close_socket()
