"""The Panel pattern: browser changes are coalesced, Python changes apply at once, errors stay inline."""
import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest

from workbench.errors import WorkbenchError
from workbench.ui import base
from workbench.ui.base import DEFER_S, SETTLE_S, BackgroundRun, Panel


def in_event_loop(coro):
    """Run ``coro`` on a fresh event loop in its own thread (as the kernel's loop would), so no loop left
    running by another test (Playwright's) is in the way."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture
def as_in_a_kernel(monkeypatch):
    """Background runs hand work to a thread and post back to the running loop, as inside a kernel."""
    monkeypatch.setattr(base, "kernel_loop", asyncio.get_running_loop)


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

    in_event_loop(burst())
    assert panel.seen == [40, 50]
    assert panel.updates_run == 2


class Steered(Panel):
    """A fast figure drawn on every change and a slow one deferred until the hand pauses."""

    def __init__(self):
        super().__init__()
        self.slider = widgets.IntSlider(value=0, min=0, max=100)
        self.fast, self.slow = [], []
        self.observe_controls(self.slider)
        self.children = [self.slider, self.message]

    def _refresh(self):
        self.fast.append(self.slider.value)
        self.show_figure("fast", go.Figure(layout_title_text=f"fast {self.slider.value}"))
        self.defer(self._slow, "slow")

    def _slow(self):
        if self.slider.value == 13:
            raise WorkbenchError("13 has no comparison")
        self.slow.append(self.slider.value)
        self.show_figure("slow", go.Figure(layout_title_text=f"slow {self.slider.value}"))


def test_python_changes_run_deferred_work_at_once():
    panel = Steered()
    panel.slider.value = 5
    assert (panel.fast, panel.slow, panel.deferred) == ([5], [5], [])
    assert panel.figures["slow"].layout.title.text == "slow 5" and not panel.figure_slot("slow").stale


def test_browser_changes_draw_the_steered_figure_at_once_and_the_rest_when_the_hand_pauses():
    panel = Steered()
    seen = {}

    async def drag():
        for value in range(10, 18):                       # a drag longer than DEFER_S, its changes closer together
            panel.slider.set_state({"value": value})
            await asyncio.sleep(SETTLE_S * 3)
            assert panel.fast[-1] == value and panel.slow == []
            assert panel.figure_slot("slow").stale and panel.deferred == [panel._slow]
        await asyncio.sleep(DEFER_S * 2)                  # the hand pauses
        seen["after pause"] = (list(panel.slow), panel.figure_slot("slow").stale, panel.deferred)
        panel.slider.set_state({"value": 13})
        await asyncio.sleep(SETTLE_S * 3 + DEFER_S * 2)

    in_event_loop(drag())
    assert panel.fast == [*range(10, 18), 13]
    assert seen["after pause"] == ([17], False, [])       # once, with the last value
    assert panel.slow == [17] and "13 has no comparison" in panel.message.value
    assert not panel.figure_slot("slow").stale and panel.figures["fast"].layout.title.text == "fast 13"


def test_an_error_shows_inline_and_clears_on_the_next_good_value():
    panel = Echo()
    panel.slider.value = 13
    assert "13 is not allowed" in panel.message.value and "Traceback" not in panel.message.value
    panel.slider.value = 14
    assert panel.message.value == "" and panel.seen[-1] == 14


class Broken(Panel):
    """An update with a bug in it (an exception that is not a WorkbenchError)."""

    def __init__(self):
        super().__init__()
        self.slider = widgets.IntSlider(value=0)
        self.observe_controls(self.slider)

    def _refresh(self):
        if self.slider.value:
            {}["missing"]


def test_a_bug_shows_as_an_internal_error_with_its_traceback_and_is_logged(caplog):
    panel = Broken()
    with caplog.at_level(logging.ERROR, logger="workbench.ui"):
        panel.slider.value = 1
    assert "internal error: KeyError: &#x27;missing&#x27;" in panel.message.value
    assert "<details><summary>traceback</summary>" in panel.message.value and "_refresh" in panel.message.value
    assert any("internal error" in r.message for r in caplog.records)
    panel.slider.value = 0
    assert panel.message.value == ""


class Runner(Panel):
    """A panel with a background run whose work counts up until cancelled or done."""

    def __init__(self, steps=5, fail=None):
        super().__init__()
        self.steps, self.fail, self.done = steps, fail, []
        self.release = threading.Event()
        self.runner = BackgroundRun(self, "Go", self._work, self._finished)
        self.children = [self.runner, self.message]

    def _work(self, handle):
        self.thread = threading.current_thread().name
        count = 0
        for i in range(self.steps):
            if handle.should_stop():
                break
            self.release.wait(5)
            count += 1
            handle.progress(i + 1, self.steps)
        if self.fail is not None:
            raise self.fail
        return count

    def _finished(self, result, cancelled):
        self.done.append((result, cancelled, threading.current_thread().name))


def test_background_run_reports_progress_on_the_loop_and_counts_runs(as_in_a_kernel):
    panel = Runner(steps=4)
    panel.release.set()

    async def go():
        panel.runner.button.click()
        assert panel.runner.running and panel.runner.button.disabled
        while panel.runner.running:
            await asyncio.sleep(0.01)
        return threading.current_thread().name

    loop_thread = in_event_loop(go())
    assert panel.thread == "workbench-run" and panel.done == [(4, False, loop_thread)]
    assert panel.runner.bar.value == 4 and panel.runner.bar.max == 4
    assert "1 run<" in panel.runner.counter.value and not panel.runner.button.disabled
    assert panel.runner.bar.layout.visibility == "hidden" and panel.message.value == ""


def test_cancel_stops_the_work_and_a_second_start_is_refused_while_running(as_in_a_kernel):
    panel = Runner(steps=1000)

    async def go():
        panel.runner.button.click()
        await asyncio.sleep(0.05)
        panel.runner.start()                        # a second start while the first runs
        assert "a run is already in progress" in panel.runner.message.value
        panel.runner.cancel_button.click()
        panel.release.set()
        while panel.runner.running:
            await asyncio.sleep(0.01)

    in_event_loop(go())
    [(count, cancelled, _)] = panel.done
    assert cancelled and count < 1000
    assert "cancelled" in panel.runner.status.value and panel.runner.message.value == ""


@pytest.mark.parametrize("error, shown", [(WorkbenchError("no plan to run"), "no plan to run"),
                                          (ZeroDivisionError("boom"), "internal error: ZeroDivisionError: boom")])
def test_errors_of_background_work_show_beside_its_button(error, shown):
    panel = Runner(steps=1, fail=error)
    panel.release.set()
    panel.runner.button.click()                     # not in a kernel: runs at once in this thread
    assert shown in panel.runner.message.value and panel.message.value == ""
    assert panel.done == [] and "failed" in panel.runner.status.value


def test_figures_are_redrawn_in_place_by_one_view_per_slot():
    panel = Panel()
    view = panel.figure_slot("f")
    first = panel.show_figure("f", go.Figure(go.Bar(y=[1, 2]), layout={"title": {"text": "one"}, "height": 250}))
    panel.show_if_changed("f", "k", lambda: go.Figure(go.Bar(y=[3]), layout={"title": {"text": "two"}}))
    panel.show_if_changed("f", "k", lambda: pytest.fail("same key: not rebuilt"))
    assert panel.figure_slot("f") is view and view.revision == 2
    assert view.figure["layout"]["title"]["text"] == "two" and view.figure["data"][0]["y"] == [3]
    assert panel.figures["f"] is view.last and first.layout.title.text == "one"
    assert view.library is panel.figure_slot("g").library          # plotly.js shipped once per kernel


def test_outside_a_kernel_a_registered_loop_is_not_used():
    async def check():
        return base.kernel_loop()
    assert in_event_loop(check()) is None           # a running loop, but no kernel: work runs inline


def test_kept_runs_replace_a_key_move_it_last_and_drop_the_oldest_beyond_their_size():
    """Catches: a run of a key kept twice, a re-run left in its old place (so dropped too early), the newest
    dropped instead of the oldest, and a run found under another key."""
    runs = base.KeptRuns(2)
    runs.keep(base.RunOutcome("a", 1))
    runs.keep(base.RunOutcome("b", 2))
    runs.keep(base.RunOutcome("a", 3))
    assert [(r.key, r.result) for r in runs.values()] == [("b", 2), ("a", 3)] and len(runs) == 2
    runs.keep(base.RunOutcome("c", 4, made_with="plan c", note="said"))
    assert [r.key for r in runs.latest_first()] == ["c", "a"] and runs.get("b") is None
    assert runs["c"].made_with == "plan c" and runs["c"].note == "said" and runs.get("a").result == 3


def test_work_says_its_stage_on_the_page_through_its_handle(as_in_a_kernel):
    """What work hands to ``on_page`` runs on the kernel's loop, never on the work's own thread."""
    panel = Panel()
    where = []

    def work(handle):
        handle.on_page(lambda: where.append(threading.current_thread().name))
        return "done"

    run = BackgroundRun(panel, "Run", work, lambda result, cancelled: None)

    async def go():
        run.start()
        while run.running:
            await asyncio.sleep(0.01)
        return threading.current_thread().name

    loop_thread = in_event_loop(go())
    assert where == [loop_thread] and loop_thread != "workbench-run"


def test_a_memo_keeps_the_recently_used_and_keeps_the_engines_refusal():
    """Catches: a result computed again on every call, the most recently used dropped before an older one, a
    refusal computed again (or swallowed) each time the page comes back to the setting."""
    memo, made = base.Memo(2), []

    def make(key):
        def run():
            made.append(key)
            if key == "bad":
                raise WorkbenchError("refused: bad")
            return key.upper()
        return run

    assert memo.get_or("a", make("a")) == "A" and memo.get_or("a", make("a")) == "A" and made == ["a"]
    memo.get_or("b", make("b"))
    memo.get_or("a", make("a"))                       # a used last: b is the one to go
    memo.get_or("c", make("c"))
    assert len(memo) == 2 and memo.get_or("a", make("a")) == "A" and made == ["a", "b", "c"]
    for _ in range(2):
        with pytest.raises(WorkbenchError, match="refused: bad"):
            memo.get_or("bad", make("bad"))
    assert made.count("bad") == 1
