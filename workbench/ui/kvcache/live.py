"""A running LLM service, live: the LLMS page attaches to a `workbench serve llms` process with its
operator's token and polls every app's snapshot, drawing the chunk map, the eviction queue and the
service's counters as clients call it (over the socket protocol or the OpenAI-compatible endpoint)."""
from __future__ import annotations

import asyncio
import html
from pathlib import Path
from typing import Callable

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.kvcache.client import operator_snapshot
from workbench.kvcache.protocol import default_address
from workbench.ui.base import CELL, Panel, kernel_loop
from workbench.viz.kvcache import format_ms, live_chunk_map_figure, live_queue_figure
from workbench.viz.style import message_figure

INTRO = """
<h3 style="margin:12px 0 2px 0">A running service, live</h3>
<p style="margin:2px 0 6px 0">Attach to a service started with <code>workbench serve llms</code> (its address, and
its operator's token from <code>operator.token</code> in its swap directory, filled in for this user's own
service) to watch its contexts' chunks, its eviction queue and its counters change as apps call it.</p>
"""
DETACHED_TITLES = {"live_chunks": "KV chunks of the running service", "live_queue": "Eviction queue of the running service"}


def own_operator_token() -> str:
    """The token of this user's service in the default swap directory, or '' when there is none to read."""
    from workbench.kvcache.service import default_swap_dir

    try:
        return (default_swap_dir() / "operator.token").read_text().strip()
    except OSError:
        return ""


def metric(metrics: dict, name: str) -> float:
    """The sum of every sample of one metric (all its labels)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def counters_html(snapshot: dict) -> str:
    """The service's counters as one small table."""
    m = snapshot["metrics"]
    calls = metric(m, "llms_calls_total")
    switch = metric(m, "llms_switch_seconds_total")
    cells = [("calls", f"{calls:.0f}"), ("waiting", f"{snapshot['waiting_calls']}"),
             ("contexts", f"{len(snapshot['contexts'])}"),
             ("mean switch", format_ms(switch / calls) if calls else "–"),
             ("chunks swapped in", f"{metric(m, 'llms_swap_ins_total'):.0f}"),
             ("recomputed", f"{metric(m, 'llms_recomputed_chunks_total'):.0f}"),
             ("evicted", f"{metric(m, 'llms_evictions_total'):.0f}"),
             ("KV in memory", f"{snapshot['memory']['used_bytes'] / 1e6:.2f} of "
                              f"{snapshot['chunk_budget_bytes'] / 1e6:.2f} MB")]
    head = "".join(f"<th style='{CELL}'>{html.escape(k)}</th>" for k, _ in cells)
    row = "".join(f"<td style='{CELL}' data-counter='{html.escape(k)}'>{html.escape(v)}</td>" for k, v in cells)
    return f"<table class='wb-kv-live-counters'><tr>{head}</tr><tr>{row}</tr></table>"


class LiveMonitor(Panel):
    """The live view of a running service. ``fetch(address, token)`` returns its snapshot (by default over
    its socket, ``client.operator_snapshot``). ``poll_once`` draws one snapshot; attached in a kernel, the
    page polls every "Refresh" seconds until detached or the service stops answering."""

    dashboard_page = "kvcache.ipynb"

    def __init__(self, address: str | None = None, token: str | None = None,
                 fetch: Callable[[str, str], dict] = operator_snapshot):
        super().__init__()
        self.fetch = fetch
        label = {"description_width": "110px"}
        self.address = widgets.Text(value=address or default_address(), description="Service address",
                                    placeholder="unix:PATH or tcp:127.0.0.1:PORT", style=label,
                                    layout=widgets.Layout(width="420px"))
        self.token = widgets.Password(value=own_operator_token() if token is None else token,
                                      description="Operator token", style=label, layout=widgets.Layout(width="340px"))
        self.interval = widgets.BoundedFloatText(value=1.0, min=0.2, max=60.0, step=0.5, description="Refresh (s)",
                                                 style={"description_width": "80px"},
                                                 layout=widgets.Layout(width="170px"))
        self.attach = widgets.ToggleButton(value=False, description="Attach", icon="plug",
                                           tooltip="poll the service's snapshot until detached")
        self.status = widgets.HTML(layout=widgets.Layout(min_height="0px"))
        self.counters = widgets.HTML()
        self.snapshot: dict | None = None
        self.polls = 0
        self._task = None
        self.attach.observe(self._toggled, names="value")
        self.children = [widgets.HTML(INTRO),
                         widgets.HBox([self.address, self.token, self.interval, self.attach],
                                      layout=widgets.Layout(flex_flow="row wrap")),
                         self.status, self.message, self.counters,
                         self.figure_slot("live_chunks", height=320), self.figure_slot("live_queue", height=300)]
        self.refresh()

    def _refresh(self) -> None:
        if self.snapshot is None:
            for name, title in DETACHED_TITLES.items():
                self.show_figure(name, message_figure(title, "not attached: fill in the service's address and token "
                                                             "and press Attach", height=300, wrap=70))
            self.status.value = "<span class='wb-kv-live-status'>not attached</span>"
            return
        snap = self.snapshot
        self.show_if_changed("live_chunks", self._chunk_key(snap), lambda: live_chunk_map_figure(snap))
        self.show_if_changed("live_queue", repr(snap["queue"]["order"]), lambda: live_queue_figure(snap))
        self.counters.value = counters_html(snap)

    @staticmethod
    def _chunk_key(snap: dict) -> str:
        last = snap.get("last_call") or {}
        return repr(([(c["id"], c["served"], [(k["bits"], k["state"]) for k in c["chunks"]])
                      for c in snap["contexts"]], snap["memory"]["used_bytes"], last.get("tick")))

    def poll_once(self) -> dict:
        """Fetch one snapshot and draw it; a service that cannot be reached raises a ``WorkbenchError`` that
        says why (and the page detaches)."""
        token = self.token.value.strip()
        if not token:
            raise WorkbenchError("the operator's token is empty: copy it from operator.token in the service's swap "
                                 "directory")
        self._shown(self.fetch(self.address.value.strip(), token))
        return self.snapshot

    def _shown(self, snapshot: dict) -> None:
        self.snapshot = snapshot
        self.polls += 1
        self.status.value = (f"<span class='wb-kv-live-status' data-polls='{self.polls}'>attached to "
                             f"{html.escape(self.address.value.strip())}: {len(snapshot['contexts'])} contexts, swap "
                             f"directory {html.escape(str(Path(snapshot['swap_dir'])))}; every "
                             f"{self.interval.value:g} s</span>")
        self.refresh()

    def _toggled(self, change) -> None:
        self.attach.description = "Detach" if change["new"] else "Attach"
        if not change["new"]:
            self.status.value = self.status.value.replace("attached to", "detached from", 1)
            return
        self.refresh(self._first_poll)
        loop = kernel_loop()
        if loop is not None and self.attach.value:
            self._task = loop.create_task(self._poll_loop())

    def _first_poll(self) -> None:
        try:
            self.poll_once()
        except WorkbenchError:
            self.attach.value = False
            raise

    async def _poll_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.attach.value:
            await asyncio.sleep(float(self.interval.value))
            if not self.attach.value:
                break
            try:
                snapshot = await loop.run_in_executor(None, self.fetch, self.address.value.strip(),
                                                      self.token.value.strip())
            except Exception as exc:                     # shown in the page; the poll stops
                self.attach.value = False
                self.report(self._first_poll, exc)
                break
            if self.attach.value:
                self._shown(snapshot)
