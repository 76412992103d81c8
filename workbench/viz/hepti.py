"""Figures of Hepti (heterogeneous partitioning): the shares and mode each layer runs with, the latency per
device (compute, waiting for the slowest, communication) against the deadline, Hepti's MILP beside even and
proportional shares and each mode forced, and the per-layer timeline with Hepti's decisions and faults
marked (predicted, and measured on real processes).

Every builder takes the engine's results (:class:`~workbench.hepti.plan.Partition` with its
``breakdown``, a :class:`~workbench.timeline.Timeline`, :class:`~workbench.hepti.run.Decision`) and
draws their numbers as they are: sums over blocks and layers, nothing of a cost model of its own.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, NamedTuple, Sequence

import plotly.graph_objects as go

from workbench.hepti.plan import MODE_TITLES, Partition
from workbench.hepti.scenario import LayerDecision
from workbench.timeline import Timeline
from workbench.viz.style import INK, LEGEND_DEVICES, MARGIN, TEMPLATE, device_color, message_figure
from workbench.viz.timeline import KIND_COLORS, gantt_figure

MODE_SHORT = {"ws": "WS", "1d": "1D", "2d": "2D", "serial": "serial"}
DEADLINE_COLOR = "#9a3412"
SEGMENT_COLORS = {"compute": KIND_COLORS["compute"], "waiting": "#E9A0A0", "comm": KIND_COLORS["comm"],
                  "no part": "#D9D9D9"}
SEGMENT_NAMES = {"compute": "compute (its own share)", "waiting": "waiting for the slowest device",
                 "comm": "communication (Eq. 6)", "no part": "takes no part (dropped)"}
MARK_KINDS = ("first", "switch", "repartition", "fault")
MARK_NAMES = {"first": "first decision", "switch": "mode switch", "repartition": "re-partition", "fault": "fault"}
MARK_COLORS = {"first": "#4C78A8", "switch": "#7B3294", "repartition": "#7F7F7F", "fault": "#D62728"}


class Mark(NamedTuple):
    """A decision or a fault on a timeline: where (seconds on the figure's clock), which kind, a short label
    and the whole story for the hover."""
    at_s: float
    kind: str                      # one of MARK_KINDS
    text: str
    hover: str
    layer: int | None = None


def mode_title(mode: str) -> str:
    return MODE_TITLES.get(mode, mode)


NO_PLAN_TITLES = {"decision": "Hepti's decision", "breakdown": "Latency per device", "compare": "Hepti against other shares",
                  "timeline": "Hepti's timeline"}
"""The title each figure keeps when there is no partition to draw (its slot's name is internal)."""


def no_plan_figure(name: str, reason: str, height: int = 360) -> go.Figure:
    """What slot ``name`` shows when the settings give no partition to draw: its figure's title, and the reason
    wrapped to fit a half-width slot."""
    return message_figure(NO_PLAN_TITLES.get(name, name), reason, height=height, wrap=60)


# -- the decision

def decision_figure(layers: Sequence[LayerDecision], model: str, seq_len: int, rule: str = "Hepti's MILP",
                    title: str | None = None) -> go.Figure:
    """The shares each device computes at each layer, stacked from 0 to 1 (one bar trace per device, one bar per
    layer; a device with no share at any layer is named dropped and greyed), the layer's mode beside its number,
    and a note where Hepti re-decides (the hover says why)."""
    first = layers[0].partition
    devices, K, L = first.devices, len(first.devices), len(layers)
    ys = list(range(L))
    fig = go.Figure()
    for i, d in enumerate(devices):
        shares = [ld.partition.shares[i] for ld in layers]
        base = [sum(ld.partition.shares[:i]) for ld in layers]
        custom = [[ld.partition.sizes[i], ld.partition.dimension, ld.partition.heads[i] if ld.partition.heads else 0,
                   mode_title(ld.partition.mode)] for ld in layers]
        dropped = not any(shares)                       # greyed in the legend, as in the latency figure
        fig.add_trace(go.Bar(
            y=ys, base=base, x=shares, orientation="h",
            name=f"device {i} ({d.name}): " + ("dropped" if dropped else f"{shares[0]:.1%}"),
            marker={"color": SEGMENT_COLORS["no part"] if dropped else device_color(i),
                    "line": {"color": "white", "width": 1}},
            text=[f"d{i}" if s > 0 else "" for s in shares], textposition="inside", insidetextanchor="middle",
            textangle=0, customdata=custom,
            hovertemplate=(f"device {i} ({d.name}), layer %{{y}}: share %{{x:.2%}}, %{{customdata[0]}} "
                           "%{customdata[1]}, %{customdata[2]} heads<br>%{customdata[3]}<extra></extra>")))
    annotations = []
    for layer, ld in enumerate(layers):
        if ld.changed and ld.changed != "first":
            switched = ld.partition.mode != layers[layer - 1].partition.mode
            what = f"{MODE_SHORT[ld.partition.mode]} from here" if switched else "re-split here"
            annotations.append({"x": 1.0, "xref": "x", "xanchor": "left", "y": layer, "yref": "y", "showarrow": False,
                                "text": f" <b>&#9664; {what}</b>", "hovertext": ld.changed,
                                "font": {"size": 11, "color": MARK_COLORS["switch" if switched else "repartition"]}})
    modes = list(dict.fromkeys(mode_title(ld.partition.mode) for ld in layers))
    split = " then ".join(dict.fromkeys(ld.partition.dimension for ld in layers))
    title = title or (f"Hepti's decision: {' then '.join(modes)}, shares per device per layer<br><sub>{model}, "
                      f"T = {seq_len}, {K} devices; shares: {rule}; {split} split by share</sub>")
    fig.update_yaxes(title="layer", autorange="reversed", tickmode="array", tickvals=ys,
                     ticktext=[f"{layer} · {MODE_SHORT[ld.partition.mode]}" for layer, ld in enumerate(layers)])
    fig.update_xaxes(title="share of the layer's split", range=[0, 1], tickformat=".0%")
    fig.update_layout(template=TEMPLATE, title=title, barmode="overlay", bargap=0.15, showlegend=K <= LEGEND_DEVICES,
                      height=max(360, 220 + 16 * L), margin={**MARGIN, "t": 80, "r": 120 if annotations else 20},
                      annotations=annotations, uniformtext={"minsize": 9, "mode": "hide"})
    return fig


# -- latency per device

def device_segments(layers: Sequence[LayerDecision]) -> dict[str, list[float]]:
    """Seconds per device over every layer, each layer with its own partition's ``breakdown`` (per block: each
    device's compute, the block's communication): its compute, its wait for the slowest device of each block,
    the communication it takes part in, and the layers it takes no part in (their whole latency). The four sum
    to the predicted latency on every device."""
    K = len(layers[0].partition.devices)
    out = {k: [0.0] * K for k in SEGMENT_NAMES}
    for ld in layers:
        for block in ld.partition.breakdown:
            compute, comm = block["compute_s"], block["comm_s"]
            slowest = max(compute)
            for i in range(K):
                if ld.partition.shares[i] > 0:
                    out["compute"][i] += compute[i]
                    out["waiting"][i] += slowest - compute[i]
                    out["comm"][i] += comm
                else:
                    out["no part"][i] += slowest + comm
    return out


def predicted_s(layers: Sequence[LayerDecision]) -> float:
    """The predicted latency of the layers, each with its partition: Eq. (7) per layer, summed."""
    return sum(max(b["compute_s"]) + b["comm_s"] for ld in layers for b in ld.partition.breakdown)


def _deadline_shapes(deadline_s: float) -> tuple[list, list]:
    if not math.isfinite(deadline_s):
        return [], []
    ms = 1e3 * deadline_s
    return ([{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": ms, "y1": ms,
              "line": {"color": DEADLINE_COLOR, "dash": "dash", "width": 2}, "name": "deadline"}],
            [{"xref": "paper", "x": 1, "xanchor": "right", "yref": "y", "y": ms, "yanchor": "bottom",
              "text": f"deadline {ms:g} ms", "showarrow": False, "font": {"color": DEADLINE_COLOR}}])


def verdict(latency_s: float, deadline_s: float) -> str:
    if not math.isfinite(deadline_s):
        return "no deadline"
    return f"{'meets' if latency_s <= deadline_s else 'misses'} the deadline of {1e3 * deadline_s:g} ms"


def breakdown_figure(layers: Sequence[LayerDecision], deadline_s: float = math.inf,
                     title: str | None = None) -> go.Figure:
    """Per device, stacked to the predicted latency (ms): its compute, its waits for the slowest device, the
    communication, and the layers it takes no part in; the deadline as a dashed line."""
    devices = layers[0].partition.devices
    segments = device_segments(layers)
    total = predicted_s(layers)
    x = [f"{i} · {d.name}" for i, d in enumerate(devices)]
    fig = go.Figure()
    for key, name in SEGMENT_NAMES.items():
        values = segments[key]
        if key == "no part" and not any(values):
            continue
        fig.add_trace(go.Bar(x=x, y=[1e3 * v for v in values], name=name, marker={"color": SEGMENT_COLORS[key]},
                             hovertemplate=f"%{{x}}: {name} %{{y:.2f}} ms<extra></extra>"))
    fig.data[-1].text = [f"{1e3 * total:.1f} ms"] * len(x)
    fig.data[-1].textposition = "outside"
    shapes, annotations = _deadline_shapes(deadline_s)
    if title is None:
        modes = " then ".join(dict.fromkeys(mode_title(ld.partition.mode) for ld in layers))
        title = (f"Latency per device: predicted {1e3 * total:.1f} ms, {verdict(total, deadline_s)}<br><sub>"
                 f"{len(layers)} layers in {modes}; every device's bar reaches the predicted latency<br>(Eq. 7: per "
                 f"block the slowest device, then the communication)</sub>")
    top = max([1e3 * total] + ([1e3 * deadline_s] if math.isfinite(deadline_s) else []))
    fig.update_layout(template=TEMPLATE, title=title, barmode="stack", height=440, margin={**MARGIN, "t": 96},
                      yaxis={"title": "predicted time (ms)", "range": [0, 1.18 * top]}, shapes=shapes,
                      annotations=annotations)
    return fig


# -- Hepti against the baselines and the modes

def compare_figure(entries: Mapping[str, Partition | str], deadline_s: float = math.inf, selected: str | None = None,
                   title: str | None = None) -> go.Figure:
    """Predicted latency of each entry (label -> its partition, or why the engine refuses it), stacked as the
    compute on the critical path (per block the slowest device) and the communication, over every layer; the
    deadline as a dashed line, the ``selected`` entry outlined, entries past the deadline said so."""
    labels = list(entries)
    good = {k: p for k, p in entries.items() if isinstance(p, Partition)}

    def path(p: Partition) -> float:
        return p.num_layers * sum(max(b["compute_s"]) for b in p.breakdown)

    def comm(p: Partition) -> float:
        return p.num_layers * sum(b["comm_s"] for b in p.breakdown)

    compute_ms = [1e3 * path(good[k]) if k in good else None for k in labels]
    comm_ms = [1e3 * comm(good[k]) if k in good else None for k in labels]
    totals = [1e3 * good[k].predicted_latency_s if k in good else None for k in labels]
    outline = {"width": [2.5 if k == selected else 0.5 for k in labels],
               "color": [INK if k == selected else "white" for k in labels]}
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=compute_ms, name="compute on the critical path",
                         marker={"color": KIND_COLORS["compute"], "line": outline},
                         customdata=[mode_title(good[k].mode) if k in good else "" for k in labels],
                         hovertemplate="%{x} (%{customdata}): compute %{y:.2f} ms<extra></extra>"))
    missed = [t is not None and math.isfinite(deadline_s) and t > 1e3 * deadline_s for t in totals]
    fig.add_trace(go.Bar(x=labels, y=comm_ms, name="communication", marker={"color": KIND_COLORS["comm"],
                                                                             "line": outline},
                         text=[("" if t is None else f"{t:.1f} ms" + (" (misses)" if m else ""))
                               for t, m in zip(totals, missed)], textposition="outside",
                         hovertemplate="%{x}: communication %{y:.2f} ms<extra></extra>"))
    shapes, annotations = _deadline_shapes(deadline_s)
    annotations += [{"x": k, "y": 0, "yref": "y", "text": "not possible", "showarrow": False, "yanchor": "bottom",
                     "hovertext": reason, "font": {"color": DEADLINE_COLOR}}
                    for k, reason in entries.items() if not isinstance(reason, Partition)]
    if title is None:
        first = next(iter(good.values()), None)
        title = "Hepti's shares against even and proportional shares, and each mode forced"
        if first is not None:
            title += (f"<br><sub>the first three in {mode_title(first.mode)}; {len(first.devices)} devices, "
                      f"{first.num_layers} layers, at the first layer's free memory<br>"
                      f"{verdict(min(p.predicted_latency_s for p in good.values()), deadline_s)} at best"
                      + (f"; outlined: {selected}" if selected else "") + "</sub>")
    tops = [t for t in totals if t is not None] + ([1e3 * deadline_s] if math.isfinite(deadline_s) else [])
    fig.update_layout(template=TEMPLATE, title=title, barmode="stack", height=440, margin={**MARGIN, "t": 96},
                      yaxis={"title": "predicted latency (ms)", "range": [0, 1.18 * max(tops, default=1.0)]},
                      shapes=shapes, annotations=annotations)
    return fig


# -- the timeline and its marks

def on_devices(timeline: Timeline, names: Sequence[str], shift_s: float = 0.0) -> Timeline:
    """``timeline`` with one lane per device of ``names`` (``device i``, rank i, whatever rank or lane the run
    gave it: a run resumed after a fault numbers its ranks anew), its times moved ``shift_s`` earlier, and the
    zero-length fault markers left out (the figure marks them)."""
    index = {n: i for i, n in enumerate(names)}
    spans = tuple(replace(s, lane=f"device {index[s.device]}", rank=index[s.device], start=s.start - shift_s,
                          end=s.end - shift_s) if s.device in index else replace(s, start=s.start - shift_s,
                                                                                  end=s.end - shift_s)
                  for s in timeline.spans if s.event != "fault")
    return Timeline(spans, timeline.source, timeline.counters, name=timeline.name)


def measured_origin(timeline: Timeline) -> float:
    """Where the measured layers begin on the run's clock (the worker processes' start-up comes before)."""
    starts = [s.start for s in timeline.spans if s.event != "fault"]
    return min(starts) if starts else 0.0


def measured_shift(measured: Timeline, predicted: Timeline) -> float:
    """Seconds to move the measured spans earlier so that the first layer they hold starts where the prediction
    starts that layer: layer 0 at 0, or after a fault (the run keeps the resumed run's spans only) the layer it
    resumed at beside its prediction."""
    layers = [s.layer for s in measured.spans if s.layer is not None and s.event != "fault"]
    first = min(layers, default=0)
    at = min((s.start for s in predicted.spans if s.layer == first), default=0.0)
    return measured_origin(measured) - at


def predicted_marks(layers: Sequence[LayerDecision], timeline: Timeline) -> list[Mark]:
    """Where the predicted timeline re-decides: the start of each layer whose partition was decided there."""
    marks = []
    for layer, ld in enumerate(layers):
        if not ld.changed:
            continue
        at = min((s.start for s in timeline.spans if s.layer == layer), default=0.0)
        kind = ("first" if ld.changed == "first" else
                "switch" if ld.partition.mode != layers[layer - 1].partition.mode else "repartition")
        mode = MODE_SHORT[ld.partition.mode]
        marks.append(Mark(at, kind, f"L{layer}: {mode}" if kind != "repartition" else "",
                          f"layer {layer}: {mode_title(ld.partition.mode)} ({ld.changed}); binding: "
                          f"{ld.partition.binding}", layer))
    return marks


def measured_marks(timeline: Timeline, decisions: Sequence, shift_s: float = 0.0) -> list[Mark]:
    """The run's decisions and faults as they show on its timeline (times moved ``shift_s`` earlier): each
    decision at the earliest of its ranks' decision spans, told by the run's own
    :class:`~workbench.hepti.run.Decision` (a mode switch when its mode differs from the decision
    before); each fault at its marker span. A decision made in a run a fault cut short has no span (the run's
    timeline keeps the last run's spans only) and no mark."""
    spans_at: dict[int, float] = {}
    for s in timeline.spans:
        if s.event == "decision" and s.layer is not None:
            spans_at[s.layer] = min(spans_at.get(s.layer, math.inf), s.start - shift_s)
    by_layer = {d.layer: (k, d) for k, d in enumerate(decisions)}          # the last decision of each layer
    marks = []
    for layer, at in sorted(spans_at.items()):
        if layer not in by_layer:
            continue
        k, d = by_layer[layer]
        kind = "first" if k == 0 else "switch" if d.mode != decisions[k - 1].mode else "repartition"
        text = f"L{layer}: {MODE_SHORT[d.mode]}" if kind in ("first", "switch") else ""
        marks.append(Mark(at, kind, text, f"layer {layer}: {mode_title(d.mode)} ({d.changed}); shares "
                          + ", ".join(f"{s:.3f}" for s in d.shares), layer))
    resumed = measured_origin(timeline) - shift_s
    for s in timeline.spans:
        if s.event == "fault":
            at = s.start - shift_s
            before = (f" ({resumed - at:.1f} s before the resumed layers, drawn from here: the worker processes "
                      "restarted; the layers before the fault ran in the run it cut short, whose spans the run "
                      "does not keep)") if at < resumed else ""
            marks.append(Mark(max(at, resumed), "fault", f"fault at L{s.layer}", s.label + before, s.layer))
    return marks


def timeline_figure(predicted: Timeline, names: Sequence[str], measured: Timeline | None = None,
                    marks: Sequence[tuple[str, Sequence[Mark]]] = (), title: str = "") -> go.Figure:
    """The shared Gantt (:func:`~workbench.viz.timeline.gantt_figure`) of the predicted timeline, with a
    measured run overlaid, one row per device of ``names``; each mark a vertical line with a triangle on top
    (``marks``: (tag, its marks), e.g. ("predicted", ...), ("measured", ...)), one legend entry per kind. The
    triangles sit on the plot's top edge (a hidden second y axis from 0 to 1), above every row."""
    fig = gantt_figure(on_devices(predicted, names), None if measured is None else on_devices(measured, names),
                       title=title)
    shapes = list(fig.layout.shapes)
    for tag, group in marks:
        for kind in MARK_KINDS:
            mine = [m for m in group if m.kind == kind]
            if not mine:
                continue
            color = MARK_COLORS[kind]
            xs = [1e3 * m.at_s for m in mine]
            fig.add_trace(go.Scatter(
                x=xs, y=[1.0] * len(mine), yaxis="y2", mode="markers+text", name=f"{MARK_NAMES[kind]} ({tag})",
                text=[m.text for m in mine], textposition="top center", textfont={"color": color, "size": 11},
                hovertext=[m.hover for m in mine], hoverinfo="text", cliponaxis=False,
                marker={"symbol": "x" if kind == "fault" else "triangle-down", "size": 12, "color": color}))
            shapes += [{"type": "line", "xref": "x", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1,
                        "line": {"color": color, "width": 2 if kind in ("switch", "fault") else 1,
                                 "dash": "dot" if tag == "predicted" or kind == "repartition" else "solid"}}
                       for x in xs]
    fig.update_layout(shapes=shapes, margin={**MARGIN, "l": 140, "t": 100},
                      yaxis2={"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True})
    return fig


def timeline_note(layers: Sequence[LayerDecision], predicted: Timeline, steps: Sequence) -> str:
    """A timeline title's second line when its prediction (the executed split's ``steps``) differs from the
    decision's: the decision's model leaves out the links' latency and computes shares of heads, where the
    split executes whole heads."""
    decided, timed = predicted_s(layers), predicted.end
    if abs(timed - decided) < 5e-5:
        return ""
    latency = sum(step.latency_s for step in steps if step.kind != "compute")
    heads = timed - decided - latency
    parts = [f"the links' latency {1e3 * latency:.1f} ms"] if latency >= 5e-5 else []
    if abs(heads) >= 5e-5:
        parts.append(f"whole heads per device {1e3 * heads:+.1f} ms")
    return (f"<br><sub>{1e3 * timed:.1f} ms, not the decision's {1e3 * decided:.1f} ms: "
            f"{' and '.join(parts)}, which the decision's model leaves out</sub>")


def drawn_note(shifted: Timeline, result) -> str:
    """After a fault, what of the run's time the drawn spans are: the resumed layers, from the layer they
    resumed at (drawn where the prediction starts it), and what the rest of the total is."""
    spans = [x for x in shifted.spans if x.layer is not None and x.event != "fault"]
    if not result.faults or not spans:
        return ""
    first, last = min(x.layer for x in spans), max(x.layer for x in spans)
    drawn = max(x.end for x in spans) - min(x.start for x in spans)
    return (f"<br><sub>drawn: layers {first}-{last} after the fault, {1e3 * drawn:.1f} ms, from where the "
            f"prediction starts layer {first}; the other {1e3 * (result.latency_s - drawn):.1f} ms are the run "
            "the fault cut short (its spans went with its worker) and the restart</sub>")

