"""The Panel pattern: browser changes are coalesced, Python changes apply at once, errors stay inline."""
import asyncio
from concurrent.futures import ThreadPoolExecutor

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.ui.base import SETTLE_S, Panel


class Echo(Panel):
    """Records the slider value each engine update saw; 13 is an error the user can act on."""

    def __init__(self):
        super().__init__()
        self.slider = widgets.IntSlider(value=0, min=0, max=100)
        self.seen = []
        self.observe_controls(self.slider)
        self.children = [self.slider, self.message]

    def _refresh(self):
        if self.slider.value == 13:
            raise WorkbenchError("13 is not allowed")
        self.seen.append(self.slider.value)


def test_python_changes_apply_at_once():
    panel = Echo()
    panel.slider.value = 5
    panel.slider.value = 7
    assert panel.seen == [5, 7]


def test_a_burst_of_browser_changes_runs_one_update_with_the_latest_value():
    panel = Echo()

    async def burst():
        for value in (10, 20, 30, 40):
            panel.slider.set_state({"value": value})      # what a comm message from the browser does
        assert panel.seen == []                           # nothing ran yet: the updates wait to settle
        await asyncio.sleep(SETTLE_S * 4)
        panel.slider.set_state({"value": 50})
        await asyncio.sleep(SETTLE_S * 4)

    # A thread of its own, so no event loop left running by another test (Playwright's) is in the way.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, burst()).result()
    assert panel.seen == [40, 50]
    assert panel.updates_run == 2


def test_an_error_shows_inline_and_clears_on_the_next_good_value():
    panel = Echo()
    panel.slider.value = 13
    assert "13 is not allowed" in panel.message.value and "Traceback" not in panel.message.value
    panel.slider.value = 14
    assert panel.message.value == "" and panel.seen[-1] == 14
