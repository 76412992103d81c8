"""The overview page: the shipped models, a device profile's per-layer costs, and each registered mechanism's
part (its ``OverviewSection``), built from that mechanism's prepared artifacts or saying what it waits for."""
from __future__ import annotations

import html

import ipywidgets as widgets

from workbench.devices import DISTILBERT, MINILM, get_profile, profile_names
from workbench.presets import default_preset
from workbench.ui.base import Panel
from workbench.ui.messages import error_html
from workbench.ui.preparing import PrepareStatus
from workbench.viz.overview import layer_times_figure

SHAPES = {"MiniLM layer (d=384)": MINILM, "DistilBERT layer (d=768)": DISTILBERT}
BITWIDTHS = (2, 3, 4, 5, 6, 32)

INTRO = """
<h2 class="wb-title">Edge transformer workbench: overview</h2>
<p class="wb-lead">Encoder <b>all-MiniLM-L6-v2</b> (6 layers x 12 heads, hidden 384) and decoder
<b>SmolLM2-135M-Instruct</b> (30 layers, 9/3 heads). Pick a device profile to see what one layer costs there;
below it, each mechanism shows what its prepared artifacts say.</p>
"""


def section_view(section, preset: str) -> widgets.VBox:
    """``section`` (an ``OverviewSection``) built once its prepare steps are ready; until then, which are missing."""
    from workbench.mechanisms import load
    from workbench.presets import prepare_hint

    head = widgets.HTML(f"<h3 class='wb-subtitle'>{html.escape(section.title)}</h3>")
    box = widgets.VBox([head])
    box.add_class("wb-overview-section")

    def build() -> None:
        try:
            box.children = [head, load(section.panel)(preset)]
        except Exception as exc:              # one mechanism's failure leaves the rest of the page working
            box.children = [head, widgets.HTML(error_html(exc))]

    status = PrepareStatus(preset, list(section.requires), on_ready=build)
    if status.all_ready:
        build()
    else:
        missing = [name for name in section.requires if not status.ready.get(name)]
        box.children = [head, widgets.HTML(
            f"<div class='wb-notice wb-section-missing'>Not prepared for the {html.escape(preset)} "
            f"preset: missing {html.escape(', '.join(missing))}. Run <code>{html.escape(prepare_hint(preset))}"
            f"</code>; this part appears here by itself when they are ready.</div>"), status]
    return box


class OverviewPanel(Panel):
    """Device profile + layer shape + bitwidth -> per-layer IO and compute times; then every mechanism's section."""

    dashboard_page = "overview.ipynb"

    def __init__(self, preset: str | None = None):
        from workbench.mechanisms import mechanisms

        super().__init__()
        self.preset = preset or default_preset()
        self.device = widgets.Dropdown(options=profile_names(), value="odroid-n2", description="Device")
        self.shape = widgets.Dropdown(options=list(SHAPES), value="DistilBERT layer (d=768)", description="Layer")
        self.bits = widgets.SelectionSlider(options=BITWIDTHS, value=6, description="Shard bits",
                                            continuous_update=False)
        self.device_info = widgets.HTML()
        self.observe_controls(self.device, self.shape, self.bits)
        self.sections = {m.name: section_view(m.overview, self.preset) for m in mechanisms() if m.overview}
        self.children = [
            widgets.HTML(INTRO),
            widgets.HBox([self.device, self.shape, self.bits]),
            self.device_info,
            self.message,
            self.figure_slot("times"),
            *self.sections.values(),
        ]
        self.refresh()

    def section(self, name: str) -> widgets.Widget | None:
        """Mechanism ``name``'s part as built (None while it waits for its prepare steps)."""
        children = self.sections[name].children
        return children[1] if len(children) == 2 else None

    def _refresh(self) -> None:
        profile = get_profile(self.device.value)
        shape = SHAPES[self.shape.value]
        self.show_figure("times", layer_times_figure(profile, shape, int(self.bits.value)))
        full_ms = profile.layer_compute_s(shape.heads, shape) * 1e3
        io_ms = shape.heads * profile.shard_read_s(int(self.bits.value), shape) * 1e3
        self.device_info.value = (
            f"<span class='wb-device-info'>{html.escape(profile.title)}: full layer computes in {full_ms:.2f} ms, "
            f"loads in {io_ms:.2f} ms at {self.bits.value} bits (IO/compute {io_ms / full_ms:.2f}) "
            f"&middot; <i>{html.escape(profile.source)}</i></span>")
