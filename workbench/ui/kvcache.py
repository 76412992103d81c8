"""The LLM context service dashboard: replays of one context-switching trace under LLMS and the paper's
baselines. Step (or play) through the calls to watch the KV-chunk map, the eviction queue and the load
pipeline of each call; "Replay" runs the trace again on the service with the settings above, sitting idle
between calls for the trace's gaps scaled down when asked.

Below the replays, :class:`LiveMonitor` attaches the page to a running `workbench serve llms` process with its
operator's token and polls every app's snapshot, drawing the chunk map, the eviction queue and the service's
counters as clients call it (over the socket protocol or the OpenAI-compatible endpoint)."""
from __future__ import annotations

import asyncio
import html
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.kvcache.client import operator_snapshot
from workbench.kvcache.config import SWAP_DEVICES
from workbench.kvcache.lifecycle import POLICIES
from workbench.kvcache.protocol import default_address
from workbench.kvcache.replays import FRACTION, MEGABYTES, METHODS, ReplaySettings, replay_methods
from workbench.kvcache.traces import PATTERNS
from workbench.presets import default_preset, prepare_hint
from workbench.ui.base import BackgroundRun, Panel, RunOutcome, kernel_loop
from workbench.viz.kvcache import (chunk_map_figure, events_figure, format_ms, latency_figure,
                                   live_chunk_map_figure, live_queue_figure, load_gantt_figure, method_label,
                                   queue_figure)
from workbench.viz.style import message_figure


DEVICES = SWAP_DEVICES
CHUNK_SIZES = (4, 8, 16, 32, 64)
PLAY_INTERVAL_MS = 900

INTRO = """
<h2 class="wb-title">LLM context service (LLMS)</h2>
<p class="wb-lead">Apps keep their conversations as <i>contexts</i> in one on-device LLM service. Each
context's KV cache lives in <b>chunks</b> of tokens, compressed by their <b>tolerance</b> (dense chunks at 8 bits, the
others at 4 or 2), written to swap files ahead of time and evicted by the <b>LCTRU queue</b> (heaviest level first,
least recently used first) when memory is short. Switching to a context brings its missing chunks back, reading
some while <b>recomputing</b> others. Below: one trace replayed under LLMS and the paper's baselines.</p>
"""


def _prepared_replays(preset: str) -> dict:
    """The replays `workbench prepare` made for this preset (method -> ReplayResult)."""
    try:
        from workbench.kvcache.artifacts import default_replays
    except ImportError as exc:
        raise WorkbenchError(f"no prepared LLMS replays in this install yet: run `{prepare_hint(preset)}` "
                             f"once they can be prepared ({exc})") from None
    return default_replays(preset)


def in_method_order(results: dict) -> dict:
    """``results`` with LLMS and the baselines first, in the paper's order, then any other method."""
    return {m: results[m] for m in (*[m for m in METHODS if m in results], *[m for m in results if m not in METHODS])}


HEADLINE_SWITCHES = 10
"""Fewest switches per method behind the page's headline ratio; with fewer it is withheld and says why."""


def compare(ratio: float, name: str) -> str:
    """How a baseline's mean switch reads beside LLMS's (``ratio`` = baseline / LLMS)."""
    if ratio >= 1.05:
        return f"{ratio:.1f}x faster than {name}"
    if ratio > 1 / 1.05:
        return f"about as fast as {name} ({ratio:.2f}x)"
    return f"{1 / ratio:.1f}x slower than {name}"


def scope_html() -> str:
    """Which of the service settings above each method takes (the others keep its preset's values)."""
    from workbench.kvcache.replay import TUNABLE, tunable_settings

    names = {"chunk_size": "chunk size", "global_ratio": "global ratio", "policy": "eviction policy"}
    parts = []
    for name in TUNABLE:
        takers = [method_label(m) for m in METHODS if name in tunable_settings(m)]
        parts.append(f"the {names[name]} to " + ("every method" if len(takers) == len(METHODS) else
                                                 " and ".join(takers) + " only"))
    return (f"<div class='wb-note wb-kv-scope'>Replay applies {'; '.join(parts)}. "
            "vLLM-SQ keeps every chunk at 8 bits and the FP16 baselines keep raw chunks, so no ratio applies to "
            "them; the paper defines the baselines with LRU eviction.</div>")


def idle_phrase(result, i: int) -> str:
    """How long the service sat idle before call ``i``, when the replay paced its calls."""
    idle = result.calls[i].idle_s
    return f"after {idle:.2f} s idle " if idle > 0 else ""


def made_with(results: dict) -> str:
    """What the replays shown were made with, as they recorded it: the trace (pattern, seed, the mean gap
    between calls in trace time, the idle put between them) and the service settings the page sets."""
    first = results.get("llms") or next(iter(results.values()))
    times = [c.time_s for c in first.calls]
    gap = (times[-1] - times[0]) / (len(times) - 1) / 60 if len(times) > 1 else 0.0
    idle = sum(c.idle_s for c in first.calls)
    seed = first.setting("seed")
    how = (f"replayed with {60 * first.setting('idle_scale', 0.0):.2f} s idle per trace minute "
           f"({idle:.1f} s idle in all per method)" if idle > 0 else "replayed back to back (no idle)")
    text = (f"Trace: {html.escape(first.pattern)} switching{f', seed {seed}' if seed is not None else ''}, calls "
            f"every {gap:.1f} min on average in trace time; {how}.")
    sizes = {r.setting("chunk_size") for r in results.values()} - {None}
    if len(sizes) == 1:
        text += f" Service: {sizes.pop()}-token chunks for every method"
        if first.method == "llms" and first.setting("global_ratio") is not None:
            text += (f"; LLMS at global ratio {first.setting('global_ratio'):g} with "
                     f"{html.escape(str(first.setting('policy', 'lctru')).upper())} eviction")
        text += "."
    return text


class KVCacheOverview(Panel):
    """LLMS's part of the overview page: the prepared replays' mean switching latency per method and per call."""

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.preset = preset or default_preset()
        self.summary = widgets.HTML()
        self.children = [self.summary, self.message, self.figure_slot("latency", height=400)]
        self.refresh()

    def _refresh(self) -> None:
        results = in_method_order(_prepared_replays(self.preset))
        self.summary.value = KVCachePanel._summary_html(results)
        self.show_figure("latency", latency_figure(results, "LLMS and its baselines: switching latency per call"))


class KVCachePanel(Panel):
    """Replays (from a provider, or run here) -> the chunk map, queue, evictions, latency and load Gantt."""

    dashboard_page = "kvcache.ipynb"

    def __init__(self, preset: str | None = None, provider: Callable[[], dict] | None = None, method: str = "llms"):
        super().__init__()
        self.preset = preset or default_preset()
        self.provider = provider or (lambda: _prepared_replays(self.preset))
        self.results: dict | None = None
        self.shown_settings: ReplaySettings | None = None
        self._model = None
        self._syncing = False                  # controls set from code, not by the user
        label = {"description_width": "120px"}
        wide = widgets.Layout(width="340px")
        self.budget = widgets.BoundedFloatText(value=0.3, min=0.001, max=1e6, step=0.05, description="Memory budget",
                                               style=label, layout=widgets.Layout(width="230px"))
        self.budget_unit = widgets.Dropdown(options=[FRACTION, MEGABYTES], value=FRACTION,
                                            layout=widgets.Layout(width="130px"))
        self.contexts = widgets.IntSlider(value=6, min=2, max=16, description="Active contexts", style=label,
                                          layout=wide, continuous_update=False)
        self.calls = widgets.BoundedIntText(value=30, min=2, max=1000, description="Calls", style=label,
                                            layout=widgets.Layout(width="230px"))
        self.ratio = widgets.FloatSlider(value=0.5, min=0.25, max=1.0, step=0.05, description="Global ratio",
                                         style=label, layout=wide, continuous_update=False, readout_format=".2f")
        self.chunk_size = widgets.Dropdown(options=list(CHUNK_SIZES), value=16, description="Chunk (tokens)",
                                           style=label, layout=widgets.Layout(width="230px"))
        self.pattern = widgets.Dropdown(options=list(PATTERNS), value="markov", description="Switching pattern",
                                        style=label, layout=widgets.Layout(width="260px"))
        self.interval = widgets.BoundedFloatText(value=300.0, min=1.0, max=86400.0, step=30,
                                                 description="Mean interval (s)", style=label,
                                                 layout=widgets.Layout(width="230px"))
        self.policy = widgets.Dropdown(options=list(POLICIES), value="lctru", description="Eviction policy",
                                       style=label, layout=widgets.Layout(width="260px"))
        self.device = widgets.Dropdown(options=list(DEVICES), value="orin-nx", description="Device", style=label,
                                       layout=widgets.Layout(width="260px"))
        self.seed = widgets.BoundedIntText(value=0, min=0, max=2**31 - 1, description="Seed", style=label,
                                           layout=widgets.Layout(width="230px"))
        self.idle = widgets.BoundedFloatText(value=0.0, min=0.0, max=60.0, step=0.05, description="Idle (s/trace min)",
                                             style=label, layout=widgets.Layout(width="230px"),
                                             tooltip="real seconds the service sits idle per minute of trace time "
                                                     "between calls; 0 runs the calls back to back")
        self.runner = BackgroundRun(self, "Replay", self._replay_all, self._show_replays, icon="refresh")
        self.settings_note = widgets.HTML()
        self.scope_note = widgets.HTML(scope_html())
        self.summary = widgets.HTML()
        self.method = widgets.Dropdown(options=[(method_label(m), m) for m in METHODS], value=method,
                                       description="Method shown", style=label, layout=widgets.Layout(width="260px"))
        self.call = widgets.IntSlider(value=0, min=0, max=0, description="Call", continuous_update=False,
                                      style={"description_width": "40px"}, layout=widgets.Layout(width="520px"))
        self.play = widgets.Play(value=0, min=0, max=0, interval=PLAY_INTERVAL_MS, description="play the trace")
        widgets.jslink((self.play, "value"), (self.call, "value"))
        self.call_info = widgets.HTML()
        self.observe_controls(self.method, update=self._show_method)
        self.observe_controls(self.call, update=self._redraw_call)
        self.observe_controls(self.budget, self.budget_unit, self.contexts, self.calls, self.ratio, self.chunk_size,
                              self.pattern, self.interval, self.policy, self.device, self.seed, self.idle,
                              update=self._note_settings)
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.budget, self.budget_unit, self.contexts, self.calls]),
            widgets.HBox([self.ratio, self.chunk_size, self.policy, self.device]),
            widgets.HBox([self.pattern, self.interval, self.idle, self.seed]),
            self.scope_note,
            self.runner,
            self.settings_note,
            self.message,
            self.summary,
            self.figure_slot("latency", height=440),
            widgets.HBox([self.method, self.play, self.call]),
            self.call_info,
            self.figure_slot("chunks"),
            self.figure_slot("queue", height=320),
            self.figure_slot("gantt", height=320),
            self.figure_slot("events"),
        ]
        self.refresh()

    # -- settings

    def settings(self) -> ReplaySettings:
        """The replay settings the controls give now."""
        return ReplaySettings(
            contexts=int(self.contexts.value), calls=int(self.calls.value), pattern=self.pattern.value,
            mean_interval_s=float(self.interval.value), seed=int(self.seed.value), device=self.device.value,
            budget=float(self.budget.value), budget_unit=self.budget_unit.value,
            global_ratio=round(float(self.ratio.value), 4), chunk_size=int(self.chunk_size.value),
            policy=self.policy.value, idle_s_per_min=float(self.idle.value))

    def _settings_of(self, results: dict) -> ReplaySettings | None:
        """The settings the shown replays were made with, as far as their records say (the controls' values
        where they are silent)."""
        return ReplaySettings.of_results(results, self.settings())

    @contextmanager
    def _quietly(self):
        """Set controls from code without running the updates they trigger."""
        self._syncing = True
        try:
            yield
        finally:
            self._syncing = False

    def _set_controls(self, settings: ReplaySettings) -> None:
        """Show ``settings`` in the controls without marking them as changed."""
        with self._quietly():
            self.contexts.value = min(max(settings.contexts, self.contexts.min), self.contexts.max)
            self.calls.value = min(max(settings.calls, self.calls.min), self.calls.max)
            self.budget_unit.value = settings.budget_unit
            self.budget.value = settings.budget
            for control, value in ((self.pattern, settings.pattern), (self.device, settings.device),
                                   (self.policy, settings.policy), (self.chunk_size, settings.chunk_size)):
                if value in control.options:
                    control.value = value
            self.ratio.value = settings.global_ratio
            self.interval.value = settings.mean_interval_s
            self.seed.value = settings.seed
            self.idle.value = settings.idle_s_per_min

    def _note_settings(self) -> None:
        if self._syncing:
            return
        changed = self.shown_settings is not None and self.settings() != self.shown_settings
        self.settings_note.value = ("<span class='wb-warn wb-kv-stale'>The settings changed since "
                                    "the replays shown were made: press Replay to run them.</span>" if changed else "")

    # -- updates

    def _refresh(self) -> None:
        if self.results is None:
            results = self.provider()
            if not results:
                raise WorkbenchError(f"no LLMS replays to show: run `{prepare_hint(self.preset)}` or press Replay")
            self.results = in_method_order(results)
            self.shown_settings = self._settings_of(self.results)
            if self.shown_settings is not None:
                self._set_controls(self.shown_settings)
        self._show_results()

    def _show_results(self) -> None:
        results = self.results
        options = [(method_label(m), m) for m in results]
        shown = self.method.value if self.method.value in results else options[0][1]
        with self._quietly():
            self.method.options = options
            self.method.value = shown
        self.show_if_changed("latency", id(results), lambda: latency_figure(results))
        self.summary.value = self._summary_html(results)
        self._note_settings()
        self._show_method()

    def _show_method(self) -> None:
        if self.results is None or self._syncing:
            return
        last = len(self.results[self.method.value].calls) - 1
        with self._quietly():
            self.play.max = self.call.max = max(0, last)
            self.call.value = min(self.call.value, self.call.max)
        self._redraw_call()

    def _redraw_call(self) -> None:
        if self.results is None or self._syncing:
            return
        result = self.results[self.method.value]
        if not result.calls:
            raise WorkbenchError(f"the {method_label(result.method)} replay has no calls")
        i = min(self.call.value, len(result.calls) - 1)
        record = result.calls[i]
        self.call_info.value = (
            f"<span class='wb-kv-call'>Call {i} of {len(result.calls) - 1} at {record.time_s / 60:.1f} min "
            f"{idle_phrase(result, i)}"
            f"({html.escape(method_label(result.method))} on {html.escape(result.device)}): context "
            f"{record.context}, switch {format_ms(record.switch_s)} (swap-in {format_ms(record.io_s)}, recompute "
            f"{format_ms(record.recompute_s)}), inference {format_ms(record.inference_s)}, "
            f"{len(record.evictions)} eviction(s)</span>")
        key = (id(result), i)
        self.show_if_changed("chunks", key, lambda: chunk_map_figure(result, i))
        self.show_if_changed("queue", key, lambda: queue_figure(result, i))
        self.show_if_changed("gantt", key, lambda: load_gantt_figure(result, i))
        self.show_if_changed("events", key, lambda: events_figure(result, i))

    @staticmethod
    def _summary_html(results: dict) -> str:
        """Mean switching latency of each method, LLMS beside vLLM-SQ and LMK, and the budgets used."""
        means = {m: r.mean_switch_s() for m, r in results.items()}
        llms = means.get("llms", 0.0)
        parts = [f"<b>{html.escape(method_label(m))}</b> <span class='wb-kv-mean' data-method='{m}'>"
                 f"{format_ms(mean)}</span>" + (f" ({mean / llms:.1f}x LLMS)" if m != "llms" and llms > 0 else "")
                 for m, mean in means.items()]
        versus = [compare(means[m] / llms, method_label(m)) for m in ("vllm_sq", "lmk") if m in means and llms > 0]
        switches = min(len(r.switches_s()) for r in results.values())
        if switches < HEADLINE_SWITCHES:
            head = (f"<span class='wb-kv-withheld'>No headline ratio: {switches} switches per method, fewer than "
                    f"the {HEADLINE_SWITCHES} a mean should rest on (replay more calls).</span> ")
        else:
            head = f"LLMS switches {' and '.join(versus)} (means of {switches} switches or more). " if versus else ""
        first = next(iter(results.values()))
        requested = first.setting("requested_budget_bytes", first.memory_budget_bytes)
        raised = [f"{method_label(m)} {r.memory_budget_bytes / 1e6:.2f} MB" for m, r in results.items()
                  if r.memory_budget_bytes > requested]
        budget = f"{requested / 1e6:.2f} MB budget" + (
            f", raised to what serves every call's context alone for {', '.join(raised)}" if raised else "")
        return (f"<div class='wb-kv-summary'>{head}Mean switching latency over the calls to existing contexts "
                f"({len(first.calls)} calls, {first.contexts} contexts, {html.escape(first.device)}, {budget}): "
                f"{' &middot; '.join(parts)}<br><span class='wb-kv-made'>{made_with(results)}</span></div>")

    # -- the replay run

    def _new_tokens(self) -> int:
        """Tokens each call of a replay generates: as many as in the replays shown (the prepared ones generate
        no more than the page needs: it shows switching, not answers), so Replay with unchanged settings makes
        them again; the replay's own default when none are shown."""
        from workbench.kvcache.replay import DEFAULT_NEW_TOKENS

        first = next(iter((self.results or {}).values()), None)
        return DEFAULT_NEW_TOKENS if first is None else int(first.setting("max_new_tokens",
                                                                             DEFAULT_NEW_TOKENS))

    def _replay_all(self, handle) -> RunOutcome:
        """Worker thread: the trace of the current settings replayed under every method."""
        settings = self.settings()
        results = replay_methods(settings, self._decoder, new_tokens=self._new_tokens(), progress=handle.progress,
                                 should_stop=handle.should_stop)
        return RunOutcome(settings, results)

    def _decoder(self):
        if self._model is None:
            from workbench.models.decoder import load_decoder

            self._model = load_decoder()
        return self._model

    def _show_replays(self, outcome: RunOutcome, cancelled: bool) -> None:
        """Kernel loop: show the new replays (those finished, when cancelled)."""
        results = {m: r for m, r in outcome.result.items() if r.calls}
        if not results:
            raise WorkbenchError("the replay was cancelled before any method finished; the replays shown are "
                                 "the earlier ones")
        self.results = in_method_order(results)
        self.shown_settings = outcome.key
        self._show_results()
        if cancelled:
            self.settings_note.value = ("<span class='wb-warn wb-kv-stale'>Cancelled: showing the "
                                        f"methods that finished ({', '.join(map(method_label, results))}).</span>")

LIVE_INTRO = """
<h3 class="wb-subtitle">A running service, live</h3>
<p class="wb-lead">Attach to a service started with <code>workbench serve llms</code> (its address, and
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
    head = "".join(f"<th>{html.escape(k)}</th>" for k, _ in cells)
    row = "".join(f"<td data-counter='{html.escape(k)}'>{html.escape(v)}</td>" for k, v in cells)
    return f"<table class='wb-table wb-kv-live-counters'><tr>{head}</tr><tr>{row}</tr></table>"


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
        self.children = [widgets.HTML(LIVE_INTRO),
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
