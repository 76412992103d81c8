"""One figure widget for every dashboard: a Plotly figure redrawn in place with ``Plotly.react``.

:class:`FigureView` is a small anywidget whose figure lives in one synced trait
(``figure``: the figure's JSON). The browser side draws it with ``Plotly.react``, which
diffs against what is on screen, so a control change sends only the new figure (a few
kilobytes) and redraws without re-creating the plot. State sync cannot lose an update:
whatever happens to messages in between, the browser ends on the trait's last value.

plotly.js (4.8 MB) reaches the page once per kernel: every view references one
:class:`PlotlyLibrary` widget, which carries plotly.js as a synced string and, when the
page creates it, hands it to the browser as an asynchronous script (it sets
``window.Plotly``); the views' modules wait for it. The library is not the widget's own
module: anywidget gives a model 2 s to import its module and initialize, and parsing
4.8 MB of script on a busy 2-core machine took longer (the page then logged "Failed to
initialize model"). Nothing is fetched from outside the server, so pages work offline,
in Voila and in JupyterLab alike.

Two approaches were measured and rejected before this one: plotly's ``FigureWidget``
updated in place loses updates under anywidget (about 1 browser run in 3), and a new
``FigureWidget`` per update ships its 4.96 MB bundle each time; Plotly MIME outputs in
``Output`` widgets are reliable but re-render whole figures (0.6 s for five figures) and
drew at 0 px height on first load in Voila.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import anywidget
import ipywidgets as widgets
import plotly
import plotly.graph_objects as go
import traitlets

from workbench.ui.stylesheet import Stylesheet, stylesheet

DEFAULT_HEIGHT_PX = 420

_VIEW_ESM = r"""
function plotlyReady() {
  return new Promise((resolve) => {
    const poll = () => (window.Plotly ? resolve(window.Plotly) : setTimeout(poll, 25));
    poll();
  });
}

async function render({ model, el }) {
  const Plotly = await plotlyReady();
  const plot = document.createElement("div");
  plot.className = "wb-figure-plot";
  el.classList.add("wb-figure");
  el.dataset.name = model.get("name");
  el.appendChild(plot);
  const draw = () => {
    const figure = model.get("figure") || {};
    const layout = Object.assign({}, figure.layout || {});
    const height = layout.height || model.get("height");
    plot.style.height = height + "px";
    layout.height = height;
    layout.autosize = true;
    delete layout.width;
    Plotly.react(plot, figure.data || [], layout, model.get("config")).then(() => {
      el.dataset.revision = String(model.get("revision"));
      el.dataset.title = (layout.title && (layout.title.text || layout.title)) || "";
    });
  };
  const stale = () => el.classList.toggle("wb-stale", Boolean(model.get("stale")));
  draw();
  stale();
  model.on("change:revision", draw);
  model.on("change:stale", stale);
  const resize = new ResizeObserver(() => {
    if (plot.offsetWidth > 0) Plotly.Plots.resize(plot);
  });
  resize.observe(el);
  return () => {
    model.off("change:revision", draw);
    model.off("change:stale", stale);
    resize.disconnect();
    Plotly.purge(plot);
  };
}

export default { render };
"""


_LIBRARY_ESM = r"""
function initialize({ model }) {
  if (window.Plotly || document.querySelector("script[data-wb-plotly]")) return;
  const script = document.createElement("script");
  script.dataset.wbPlotly = "plotly.js";
  script.async = true;
  script.src = URL.createObjectURL(new Blob([model.get("source")], { type: "text/javascript" }));
  document.head.appendChild(script);
}
export default { initialize };
"""


@lru_cache(maxsize=1)
def _plotly_js() -> str:
    """plotly.js as shipped in the plotly package (a script that sets ``window.Plotly``)."""
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()


class PlotlyLibrary(anywidget.AnyWidget):
    """plotly.js, delivered to the page once and run there as an asynchronous script; never displayed."""
    _esm = _LIBRARY_ESM
    source = traitlets.Unicode().tag(sync=True)

    def __init__(self):
        super().__init__(source=_plotly_js())


@lru_cache(maxsize=1)
def plotly_library() -> PlotlyLibrary:
    """The kernel's one library widget (every figure view references it)."""
    return PlotlyLibrary()


class FigureView(anywidget.AnyWidget):
    """A Plotly figure shown in the page and redrawn in place when :meth:`show` is called."""
    _esm = _VIEW_ESM
    figure = traitlets.Dict().tag(sync=True)
    config = traitlets.Dict({"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": [
        "select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d", "toggleSpikelines",
        "hoverClosestCartesian", "hoverCompareCartesian"]}).tag(sync=True)
    height = traitlets.Int(DEFAULT_HEIGHT_PX).tag(sync=True)
    revision = traitlets.Int(0).tag(sync=True)          # bumped with every new figure; the browser redraws on it
    name = traitlets.Unicode("").tag(sync=True)         # the panel's slot name, as data-name in the page
    stale = traitlets.Bool(False).tag(sync=True)        # drawn dimmed: an update for it waits (Panel.defer)
    library = traitlets.Instance(PlotlyLibrary).tag(sync=True, **widgets.widget_serialization)
    styles = traitlets.Instance(Stylesheet).tag(sync=True, **widgets.widget_serialization)   # the page's look

    def __init__(self, name: str = "", height: int = DEFAULT_HEIGHT_PX, **kwargs):
        super().__init__(name=name, height=height, library=plotly_library(), styles=stylesheet(), **kwargs)
        self.layout.width = "100%"
        self.layout.min_height = f"{height}px"
        self.last: go.Figure | None = None

    def show(self, figure: go.Figure) -> go.Figure:
        """Draw ``figure`` here, replacing what was drawn (one state message; safe from any thread)."""
        payload = json.loads(figure.to_json())
        height = payload.get("layout", {}).get("height") or self.height
        with self.hold_sync():
            self.last = figure
            self.figure = payload
            self.layout.min_height = f"{height}px"
            self.revision += 1
        return figure
