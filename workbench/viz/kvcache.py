"""Figures of the LLM context service (LLMS): the KV-chunk map and the eviction queue at a call, evictions
over the trace, switching latency of LLMS beside its baselines, and the swap/recompute pipeline of a call.

Every builder takes replay records (``workbench.kvcache.records``) and draws nothing it cannot explain:
states, levels and actions are discrete colours, each with its own legend entry.
"""
from __future__ import annotations

import plotly.graph_objects as go

from workbench.viz.timeline import KIND_COLORS, gantt_figure
from workbench.viz.style import INK, MARGIN, TEMPLATE, log_axis, message_figure, outline

METHOD_LABELS = {"llms": "LLMS", "vllm_sq": "vLLM-SQ", "vllm_s": "vLLM-S", "swapping": "Swapping", "lmk": "LMK"}
METHOD_COLORS = {"llms": "#E45756", "vllm_sq": "#4C78A8", "vllm_s": "#72B7B2", "swapping": "#B279A2",
                 "lmk": "#9D755D"}

STATE_COLORS = {"32": "#08306B", "16": "#08519C", "8": "#2171B5", "4": "#6BAED6", "2": "#C6DBEF", "swapped": "#A6A6A6",
                "recomputed": KIND_COLORS["recompute"], "loaded": KIND_COLORS["swap_in"], "killed": "#3B3B3B"}
STATE_LABELS = {"32": "in memory, raw 32-bit", "16": "in memory, raw 16-bit", "8": "in memory, 8-bit", "4": "in memory, 4-bit",
                "2": "in memory, 2-bit", "swapped": "swapped out (only on disk)",
                "recomputed": "recomputed by this call", "loaded": "swapped in by this call",
                "killed": "killed (no file: recomputed when called)"}
ACTION_COLORS = {"drop": "#72B7B2", "swap_out": "#B279A2", "kill": "#E45756"}
ACTION_LABELS = {"drop": "dropped (file written ahead)", "swap_out": "swapped out (written at eviction)",
                 "kill": "killed (no file)"}
LEVEL_ORDER = (32, 16, 8, 4, 2)


def method_label(method: str) -> str:
    """How a method reads in the page: the paper's name for a preset, else the name itself."""
    return METHOD_LABELS.get(method, method)


def format_ms(seconds: float) -> str:
    """Milliseconds with as many decimals as a reader needs at that size."""
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _context_axis(fig: go.Figure, contexts: int, empty=()) -> None:
    """Contexts as rows, context 0 at the top; ``empty`` ones say they hold no KV yet."""
    fig.update_yaxes(tickvals=list(range(contexts)), range=[contexts - 0.5, -0.5], title="context",
                     ticktext=[f"context {c}" + (" (no KV yet)" if c in empty else "") for c in range(contexts)])


def _cells(fig: go.Figure, rows: list[int], starts: list[int], name: str, color: str, hover: list[str],
           text: list[str] | None = None) -> None:
    """Unit cells (row, start) as one horizontal-bar trace: they fill their place at any zoom."""
    fig.add_trace(go.Bar(
        y=rows, base=[s - 0.5 for s in starts], x=[1] * len(rows), orientation="h", width=0.86, name=name,
        marker={"color": color, "line": {"color": "white", "width": 0.5}}, hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>", text=text, textposition="inside" if text else None,
        insidetextanchor="middle", textangle=0))


def chunk_map_figure(result, call: int, title: str | None = None) -> go.Figure:
    """Contexts (rows) x chunks (columns) after ``call``, one colour per chunk state, the served context
    outlined."""
    record = result.calls[call]
    label = method_label(result.method)
    idle = f" after {record.idle_s:.2f} s idle" if record.idle_s > 0 else ""
    title = title or (f"KV chunks after call {call} ({label}): context {record.context} served at "
                      f"{record.time_s / 60:.1f} min{idle}")
    if not any(record.chunk_map):
        return message_figure(title, "this replay recorded no chunk map", height=360)
    contexts = max(len(record.chunk_map), result.contexts, record.context + 1)
    width = max(len(row) for row in record.chunk_map)
    fig = go.Figure()
    for state in STATE_COLORS:
        cells = [(c, k) for c, row in enumerate(record.chunk_map) for k, s in enumerate(row) if s == state]
        if cells:
            _cells(fig, [c for c, _ in cells], [k for _, k in cells], STATE_LABELS[state], STATE_COLORS[state],
                   [f"context {c}, chunk {k}: {STATE_LABELS[state]}" for c, k in cells])
    x, y = outline([(-0.5, record.context - 0.5, width - 0.5, record.context + 0.5)])
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line={"color": INK, "width": 2.5}, hoverinfo="skip",
                             name=f"served by call {call}: context {record.context}"))
    fig.update_layout(
        template=TEMPLATE, barmode="overlay", height=max(340, 190 + 28 * contexts), margin={**MARGIN, "t": 80},
        title=f"{title}<br><sub>{record.chunks_missing} chunks were missing: {record.chunks_loaded} swapped in, "
              f"{record.chunks_recomputed} recomputed; {record.memory_bytes / 1e6:.2f} of "
              f"{_chunk_budget(result) / 1e6:.2f} MB of KV in memory after the call</sub>",
        xaxis={"title": "chunk (position in the context)", "range": [-0.5, width - 0.5], "tick0": 0,
               "dtick": max(1, width // 16)})
    _context_axis(fig, contexts, [c for c in range(contexts)
                                  if c >= len(record.chunk_map) or not record.chunk_map[c]])
    return fig


def _chunk_budget(result) -> int:
    """What a replay's budget left for chunks: the whole budget less the working cache reserved for a call."""
    return result.memory_budget_bytes - int(result.setting("working_reserve_bytes", 0))


def _last_uses(result, call: int) -> dict[int, int]:
    """Context -> the last call (up to ``call``) that served it: when all its chunks were last used."""
    return {c.context: c.index for c in result.calls[:call + 1]}


def queue_reason(policy: str, bits: int, heavier: int, context: int, last_use: int | None,
                 whole_contexts: bool) -> str:
    """Why a chunk sits where it does in the eviction order."""
    used = f"context {context} last used by call {last_use}" if last_use is not None else \
        f"context {context} not used in this trace yet"
    if policy == "lctru":
        why = (f"{bits}-bit sub-queue: heavier levels leave first (32, 16, 8, 4, 2 bits), so the {heavier} chunks "
               f"of heavier levels go before it; inside it least recently used first ({used})")
    elif policy == "density":
        why = f"lowest information density first, older use breaking ties ({used})"
    else:
        why = f"least recently used first ({used})"
    return why + ("; whole contexts leave together" if whole_contexts else "")


def queue_figure(result, call: int, policy: str | None = None, title: str | None = None) -> go.Figure:
    """The eviction order after ``call``, first out on the left, one row per sub-queue (level); each chunk
    labelled context/chunk, its hover says why it is in that place."""
    record = result.calls[call]
    policy = policy or result.setting("policy", "lctru" if result.method.startswith("llms") else "lru")
    label = method_label(result.method)
    title = title or f"Eviction queue after call {call} ({label}, {policy.upper()})"
    queue = list(record.queue)
    if not queue:
        return message_figure(title, "nothing is in the queue: no chunk in memory can leave", height=300)
    last = _last_uses(result, call)
    whole = result.setting("granularity", "context" if result.method in ("swapping", "lmk") else
                             "chunk") == "context"
    levels = _queue_levels(q[2] for q in queue)
    fig = go.Figure()
    for row, bits in enumerate(levels):
        items = [(pos, c, k) for pos, (c, k, b) in enumerate(queue, start=1) if b == bits]
        heavier = sum(1 for q in queue if q[2] > bits)
        hover = [f"#{pos} to leave: context {c}, chunk {k} ({bits}-bit)<br>why here: "
                 + queue_reason(policy, bits, heavier, c, last.get(c), whole) for pos, c, k in items]
        _cells(fig, [row] * len(items), [pos for pos, _, _ in items], f"{bits}-bit chunks",
               STATE_COLORS.get(str(bits), INK), hover, [f"{c}/{k}" for _, c, k in items])
    order = ("sub-queues per level, heaviest first, each least recently used first" if policy == "lctru" else
             "one order by recency" if policy == "lru" else "one order by information density")
    return _queue_layout(fig, levels, len(queue), f"{title}<br><sub>{len(queue)} chunks in memory may leave "
                                                   f"({order}); labels are context/chunk</sub>")


def _queue_levels(bits) -> list[int]:
    """The levels present, heaviest first (the known ones in ``LEVEL_ORDER``, then any others)."""
    present = set(bits)
    return [b for b in LEVEL_ORDER if b in present] + sorted(present - set(LEVEL_ORDER), reverse=True)


def _queue_layout(fig: go.Figure, levels: list[int], count: int, title: str) -> go.Figure:
    """An eviction-order figure's axes: positions 1..``count`` across, one row per level."""
    fig.update_layout(
        template=TEMPLATE, barmode="overlay", height=max(300, 220 + 40 * len(levels)),
        margin={**MARGIN, "t": 80}, uniformtext={"minsize": 9, "mode": "hide"}, title=title,
        xaxis={"title": "position in the eviction order (1 = first to leave)", "range": [0.5, count + 0.5]},
        yaxis={"tickvals": list(range(len(levels))), "ticktext": [f"{b}-bit" for b in levels],
               "range": [len(levels) - 0.5, -0.5], "title": "sub-queue (level)"})
    return fig


def events_figure(result, call: int | None = None, title: str | None = None) -> go.Figure:
    """Every eviction over trace time (y: its context, spread by chunk), coloured by action, hover the
    recorded reason; the calls themselves on their context, and the selected call as a line."""
    label = method_label(result.method)
    times = {c.index: c.time_s / 60 for c in result.calls}
    events = [e for c in result.calls for e in c.evictions]
    title = title or (f"Evictions over the trace ({label}): {len(events)} chunks left memory"
                      + (f"; call {call} marked" if call is not None else ""))
    fig = go.Figure()
    widest = max([e.chunk for e in events] + [0]) + 1
    for action, color in ACTION_COLORS.items():
        picked = [e for e in events if e.action == action]
        if picked:
            fig.add_trace(go.Scatter(
                x=[times[e.call] for e in picked], y=[e.context - 0.35 + 0.7 * (e.chunk + 0.5) / widest
                                                      for e in picked],
                mode="markers", name=f"{ACTION_LABELS[action]}: {len(picked)}",
                marker={"color": color, "size": 7, "symbol": "x" if action == "kill" else "circle"},
                hovertext=[e.reason for e in picked], hovertemplate="%{hovertext}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[c.time_s / 60 for c in result.calls], y=[c.context for c in result.calls], mode="markers",
        name="call (on the context it serves)", marker={"color": INK, "size": 11, "symbol": "diamond-open",
                                                         "line": {"width": 2}},
        hovertext=[f"call {c.index} at {c.time_s / 60:.1f} min: context {c.context}, switch {format_ms(c.switch_s)}"
                   f" ({c.chunks_loaded} swapped in, {c.chunks_recomputed} recomputed), {len(c.evictions)} "
                   f"evictions" for c in result.calls], hovertemplate="%{hovertext}<extra></extra>"))
    if call is not None:
        at = result.calls[call].time_s / 60
        fig.add_shape(type="line", x0=at, x1=at, yref="y domain", y0=0, y1=1, showlegend=True,
                      name=f"call {call} (the call shown)", line={"color": INK, "dash": "dot", "width": 1.5})
    contexts = max([result.contexts] + [c.context + 1 for c in result.calls])
    fig.update_layout(template=TEMPLATE, title=title, height=max(340, 190 + 28 * contexts), margin=MARGIN,
                      xaxis_title="trace time (min)")
    _context_axis(fig, contexts)
    return fig


def latency_figure(results: dict, title: str = "Switching latency per call") -> go.Figure:
    """Switching latency of every call under each method (log axis); the legend gives each method's mean
    over calls to contexts that already existed. Calls that cost nothing have no point on a log axis: their
    lines break there, and one mark at the axis floor names the methods."""
    results = {m: r for m, r in results.items() if r.calls}
    if not results:
        return message_figure(title, "no replay to show")
    fig = go.Figure()
    positive = [c.switch_s for r in results.values() for c in r.calls if c.switch_s > 0]
    floor = (min(positive) if positive else 1e-3) * 1e3 / 4
    for method, result in results.items():
        calls = result.calls
        fig.add_trace(go.Scatter(
            x=[c.index for c in calls], y=[c.switch_s * 1e3 if c.switch_s > 0 else None for c in calls],
            mode="lines+markers",
            name=f"{method_label(method)}: mean {format_ms(result.mean_switch_s())}",
            line={"color": METHOD_COLORS.get(method), "width": 3 if method == "llms" else 1.5},
            marker={"size": 6}, hovertext=[f"{method_label(method)}, call {c.index} (context {c.context}): "
                                           f"{format_ms(c.switch_s)}" for c in calls],
            hovertemplate="%{hovertext}<extra></extra>"))
    calls_shown = max(len(r.calls) for r in results.values())
    free: dict[int, list[str]] = {}
    for method, result in results.items():
        for c in result.calls:
            if c.switch_s <= 0:
                free.setdefault(c.index, []).append(method_label(method))
    if free:
        fig.add_trace(go.Scatter(
            x=list(free), y=[floor] * len(free), mode="markers", cliponaxis=False,
            name="0 ms: nothing to bring back (marked on the axis)",
            marker={"color": "#79706E", "symbol": "line-ew-open", "size": 14, "line": {"width": 3}},
            hovertext=[f"call {i}: nothing to bring back under {', '.join(names)}" for i, names in free.items()],
            hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(
        template=TEMPLATE, height=440, margin={**MARGIN, "t": 80},
        title=f"{title}<br><sub>legend: mean over calls to contexts that already existed (a first call "
              f"brings nothing back)</sub>",
        xaxis={"title": "call in the trace", "tick0": 0, "dtick": max(1, calls_shown // 16)},
        yaxis=log_axis(floor, max(positive, default=1e-3) * 1e3 * 10 ** 0.2, "switching latency (ms, log scale)"))
    return fig


def load_gantt_figure(result, call: int, title: str | None = None) -> go.Figure:
    """The swap/recompute pipeline that brought ``call``'s missing chunks back: predicted solid, measured
    hatched over it (the shared Gantt)."""
    record = result.calls[call]
    title = title or (f"Loading context {record.context} for call {call} ({method_label(result.method)}): "
                      f"{record.chunks_loaded} swapped in, {record.chunks_recomputed} recomputed")
    if record.predicted is None and record.measured is None:
        first = all(c.context != record.context for c in result.calls[:call])
        why = (f"nothing to load: the first call of context {record.context} builds its KV" if first else
               f"nothing to load: every chunk of context {record.context} was in memory"
               if record.chunks_missing == 0 else "this replay recorded no load timeline")
        if record.evictions and record.switch_s > 0:
            why += (f";<br>its {format_ms(record.switch_s)} switch went to making room "
                    f"({len(record.evictions)} chunk(s) evicted)")
        return message_figure(title, why, height=300)
    return gantt_figure(record.predicted, record.measured, title=title)



# ----------------------------------------------------------------------------- a running service, live

LIVE_STATES = {"memory": None, "memory+file": None, "file": "swapped", "dropped": "killed"}
"""A served chunk's state -> its colour key (None: in memory, keyed by its level)."""


def live_state(chunk: dict) -> str:
    """The colour key of one chunk of a service's snapshot: its level in memory, swapped, or dropped."""
    key = LIVE_STATES.get(chunk["state"], "killed")
    return str(chunk["bits"]) if key is None else key


def live_context_label(ctx: dict) -> str:
    return f"{ctx['app']} · {ctx['id'][:6]}" + (" (being served)" if ctx.get("served") else "")


def _live_contexts(snapshot: dict) -> list[dict]:
    """Contexts by app, then most recently used first within an app."""
    return sorted(snapshot["contexts"], key=lambda c: (c["app"], -c["last_tick"], c["id"]))


def live_chunk_map_figure(snapshot: dict, title: str = "KV chunks of the running service") -> go.Figure:
    """A running service's contexts (rows, named by app and id) x chunks (columns), one colour per level
    or state, from its snapshot (``LLMService.snapshot``)."""
    contexts = _live_contexts(snapshot)
    if not contexts:
        return message_figure(title, "the service holds no context yet: apps' contexts appear here as they call it",
                              height=300, wrap=70)
    width = max([len(c["chunks"]) for c in contexts] + [1])
    fig = go.Figure()
    for state in STATE_COLORS:
        cells = [(row, k) for row, c in enumerate(contexts) for k, ch in enumerate(c["chunks"]) if live_state(ch) == state]
        if cells:
            _cells(fig, [r for r, _ in cells], [k for _, k in cells], STATE_LABELS[state], STATE_COLORS[state],
                   [f"{live_context_label(contexts[r])}, chunk {k}: {STATE_LABELS[state]}" for r, k in cells])
    used, budget = snapshot["memory"]["used_bytes"], snapshot["chunk_budget_bytes"]
    last = snapshot.get("last_call")
    said = (f"; last call: {last['app']} on {last['ctx'][:6]}, switch {format_ms(last['switch_s'])}"
            if last else "")
    fig.update_layout(
        template=TEMPLATE, barmode="overlay", height=max(320, 190 + 28 * len(contexts)), margin={**MARGIN, "t": 80},
        title=f"{title}<br><sub>{len(contexts)} contexts; {used / 1e6:.2f} of {budget / 1e6:.2f} MB of KV in "
              f"memory{said}</sub>",
        xaxis={"title": "chunk (position in the context)", "range": [-0.5, width - 0.5], "tick0": 0,
               "dtick": max(1, width // 16)},
        yaxis={"tickvals": list(range(len(contexts))), "ticktext": [live_context_label(c) for c in contexts],
               "range": [len(contexts) - 0.5, -0.5], "title": "context (app · id)", "automargin": True})
    return fig


def live_queue_figure(snapshot: dict, title: str = "Eviction queue of the running service") -> go.Figure:
    """The running service's eviction order (first out on the left), one row per level, each chunk
    labelled by its context's short id and its index."""
    queue = snapshot["queue"]
    order = queue["order"]
    policy = queue["policy"]
    if not order:
        return message_figure(title, "nothing is in the queue: no chunk in memory can leave (the context being "
                                     "served is locked)", height=300, wrap=70)
    apps = {c["id"]: c["app"] for c in snapshot["contexts"]}
    levels = _queue_levels(e["bits"] for e in order)
    fig = go.Figure()
    for row, bits in enumerate(levels):
        items = [(pos, e) for pos, e in enumerate(order, start=1) if e["bits"] == bits]
        _cells(fig, [row] * len(items), [pos for pos, _ in items], f"{bits}-bit chunks",
               STATE_COLORS.get(str(bits), INK),
               [f"#{pos} to leave: {apps.get(e['ctx'], '?')} · {e['ctx'][:6]}, chunk {e['chunk']} ({bits}-bit, "
                f"last used at call {e['last_used']})" for pos, e in items],
               [f"{e['ctx'][:4]}/{e['chunk']}" for _, e in items])
    return _queue_layout(fig, levels, len(order), f"{title} ({policy.upper()})<br><sub>{len(order)} chunks in "
                                                   f"memory may leave; labels are context id/chunk</sub>")
