"""The gallery page: a card per dashboard (from the mechanism registry) and whether each page's prepared
artifacts are ready; a page still waiting links its quick version once the quick preset has what it needs."""
from __future__ import annotations

import html

import ipywidgets as widgets

from workbench.presets import page_preset, prepare_hint
from workbench.ui.base import preset_notice_widget
from workbench.ui.preparing import QUICK, PrepareStatus, quick_ready
from workbench.ui.stylesheet import stylesheet


class Gallery(widgets.VBox):
    """Cards linking every dashboard, with the state of the prepare steps each one needs."""

    def __init__(self, preset: str | None = None):
        super().__init__()
        self.preset = preset or page_preset()
        self.cards = widgets.HTML()
        self.status = PrepareStatus(self.preset, on_ready=self.refresh)
        self.status.on_refresh = self.refresh          # the cards follow every status tick, as the table does
        self.refresh()
        notice = preset_notice_widget(self.preset)
        self.children = ([notice] if notice else []) + [widgets.HTML(
            "<h2 class='wb-title'>Edge transformer workbench</h2><p class='wb-lead'>Live views of the "
            "inference systems the workbench implements. Each page starts its own kernel; move a control and the "
            "engine re-plans and the figures redraw.</p>"), self.cards, self.status, stylesheet()]

    def refresh(self) -> None:
        from workbench.mechanisms import dashboards

        ready, status = self.status.ready, self.status.status        # read once, by the status view
        how = ("being prepared in the background, see below" if status and status.get("state") == "running"
               else f"<code>{html.escape(prepare_hint(self.preset))}</code>")
        from workbench.prepare import serve_now_hint

        waiting = {d.title: [name for name in d.requires if not ready.get(name, False)] for d in dashboards()}
        serving = sum(not missing for missing in waiting.values())
        other = serve_now_hint(self.preset) if serving < len(waiting) else ""
        parts = [f"<div class='wb-serving'>Serving the <b>{html.escape(self.preset)}</b> preset: "
                 f"{serving} of {len(waiting)} pages ready.{' ' + html.escape(other) if other else ''}</div>"]
        for d in dashboards():
            missing = waiting[d.title]
            state = ("<span class='wb-ready'>ready</span>" if not missing else
                     f"<span class='wb-not-ready'>waiting for {html.escape(', '.join(missing))} ({how})</span>")
            later = [name for name in d.later if not ready.get(name, False)]
            if not missing and later:
                state += f" <small class='wb-later'>(still being prepared: {html.escape(', '.join(later))})</small>"
            if missing and self.preset != QUICK and quick_ready(d.requires):
                state += (f" &middot; <a class='wb-quick-link' href='{html.escape(d.page)}?preset={QUICK}'>open its "
                          f"quick version now</a> <small>(every step on a few batches: real figures, rough "
                          f"numbers)</small>")
            parts.append(f"<div class='wb-card'><a href='{html.escape(d.page)}'><b>"
                         f"{html.escape(d.title)}</b></a> &middot; {state}<br><small>{html.escape(d.summary)}</small>"
                         f"</div>")
        cards = "".join(parts)
        if cards != self.cards.value:
            self.cards.value = cards
