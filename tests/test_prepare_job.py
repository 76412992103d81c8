"""The background prepare: one lock per cache, a status file with each step's state, stopped jobs seen as such."""
import json
import subprocess
import sys

import pytest

from workbench import prepare as prepare_module
from workbench import prepare_job
from workbench.errors import WorkbenchError
from workbench.mechanisms import PrepareStep


def fake_steps(log, ready=()):
    def run(name):
        def step(preset, progress, force):
            from workbench.progress import progress_bar

            with progress_bar(total=4, desc=f"{name} work", enabled=False) as bar:
                for _ in range(4):
                    bar.update(1)
            log.append(name)
            return f"{name} made"
        return step
    return [PrepareStep(name=n, run=run(n), ready=lambda preset, n=n: n in ready or n in log,
                        estimate_s={"quick": 10.0}) for n in ("one", "two")]


def test_the_lock_refuses_a_second_prepare_and_names_the_holder(tmp_cache):
    with prepare_module.prepare_lock():
        assert prepare_module.lock_held()
        with pytest.raises(WorkbenchError, match=r"another `workbench prepare` is running on this cache \(pid \d+\)"):
            with prepare_module.prepare_lock():
                pass
    assert not prepare_module.lock_held()


@pytest.mark.integration
def test_the_lock_is_held_across_processes(tmp_cache):
    code = ("import time\nfrom workbench.prepare import prepare_lock\n"
            "with prepare_lock():\n    print('held', flush=True)\n    time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert prepare_module.lock_held()
        with pytest.raises(WorkbenchError, match=f"pid {holder.pid}"):
            prepare_module.prepare("quick")
    finally:
        holder.kill()
        holder.wait()
    assert not prepare_module.lock_held()


def test_a_job_writes_each_steps_state_and_progress(tmp_cache, monkeypatch):
    log = []
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True: fake_steps(log))
    seen = []
    original = prepare_job.StatusWriter.on_step

    def spy(self, name, state):
        original(self, name, state)
        seen.append({s["name"]: s["state"] for s in json.loads(self.path.read_text())["steps"]})
    monkeypatch.setattr(prepare_job.StatusWriter, "on_step", spy)
    assert prepare_job.run_job("quick") == 0
    assert log == ["one", "two"]
    assert seen[0] == {"one": "running", "two": "pending"} and seen[1] == {"one": "done", "two": "pending"}
    status = prepare_job.read_status("quick")
    assert status["state"] == "done" and [s["state"] for s in status["steps"]] == ["done", "done"]
    assert status["steps"][1]["progress"] == {"desc": "two work", "done": 4, "total": 4,
                                              "elapsed_s": status["steps"][1]["progress"]["elapsed_s"]}


def test_a_failed_job_says_why_and_a_killed_one_reads_as_dead(tmp_cache, monkeypatch):
    def boom(preset, progress, force):
        raise WorkbenchError("disk full")
    steps = [PrepareStep(name="bad", run=boom, ready=lambda preset: False)]
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True: steps)
    with pytest.raises(WorkbenchError):
        prepare_job.run_job("quick")
    status = prepare_job.read_status("quick")
    assert status["state"] == "failed" and status["error"] == "WorkbenchError: disk full"
    assert status["steps"][0]["state"] == "failed"
    status["state"] = "running"                                  # as a job killed outright leaves it
    prepare_job.status_path("quick").write_text(json.dumps(status))
    dead = prepare_job.read_status("quick")
    assert dead["state"] == "dead" and dead["error"] == f"its process (pid {status['pid']}) is gone"


def test_a_job_stopped_by_a_signal_says_stopped_and_the_page_says_it_resumes(tmp_cache, monkeypatch):
    from workbench.ui.preparing import PrepareStatus

    def interrupted(preset, progress, force):
        raise KeyboardInterrupt                                  # what the job's SIGTERM handler raises
    steps = [PrepareStep(name="long", run=interrupted, ready=lambda preset: False)]
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True: steps)
    with pytest.raises(KeyboardInterrupt):
        prepare_job.run_job("quick")
    status = prepare_job.read_status("quick")
    assert (status["state"], status["error"], status["steps"][0]["state"]) == ("stopped", "stopped by a signal",
                                                                              "stopped")
    shown = PrepareStatus("quick").view.value
    assert "The background prepare stopped (stopped by a signal)" in shown and "resumes where it stopped" in shown


def test_start_background_does_nothing_when_ready_or_locked(tmp_cache, monkeypatch):
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True:
                        fake_steps([], ready=("one", "two")))
    assert prepare_job.start_background("quick") == ("ready", None)
    with prepare_module.prepare_lock():
        assert prepare_job.start_background("quick") == ("running", None)


def test_the_waiting_page_shows_progress_then_builds_itself(tmp_cache, monkeypatch):
    from workbench.ui.preparing import PrepareStatus, prepared_page
    from workbench.ui.stylesheet import stylesheet

    log = []
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True: fake_steps(log))
    built = []
    page = prepared_page(lambda preset: built.append(1) or __import__("ipywidgets").Label("the page"),
                         ("one", "two"), "A page", "quick")
    status = page.children[2]
    assert isinstance(status, PrepareStatus) and built == []
    assert stylesheet() in page.children                # no figure brings the page's stylesheet here
    assert "2 prepare step(s) missing" in status.view.value and "workbench prepare --preset quick" in status.view.value
    with prepare_module.prepare_lock():
        writer = prepare_job.StatusWriter("quick", fake_steps(log))
        writer.on_step("one", "running")
        status.refresh()
        assert "Preparing the quick preset in the background: 0 of 2 steps ready" in status.view.value
        assert "<tr class='wb-step' data-state='running'><td>one</td>" in status.view.value
        log.append("one")
        writer.on_step("one", "done")
        status.refresh()
        assert "1 of 2 steps ready" in status.view.value and built == []
        log.append("two")
        status.refresh()
    assert built == [1] and page.children[0].value == "the page"


def test_a_running_steps_bar_detail_and_time_left_agree():
    """Catches: "12%" shown beside "llms replays: 81 of 150" (the bar from elapsed time against the estimate),
    and "99 %, 0 s left" for minutes once the estimate ran out."""
    from workbench.ui.preparing import running_progress

    report = {"desc": "llms replays", "done": 81, "total": 150, "elapsed_s": 162.0}
    fraction, left, detail = running_progress(report, elapsed_s=70.0, estimate_s=550.0)
    assert detail == "llms replays: 81 of 150" and fraction == pytest.approx(0.54)
    assert left == pytest.approx(2.0 * 69)                                # 2 s a replay, 69 to go
    fraction, left, _ = running_progress({**report, "done": 149}, elapsed_s=900.0, estimate_s=200.0)
    assert fraction == pytest.approx(149 / 150) and left == pytest.approx(162.0 / 149)
    assert running_progress({}, elapsed_s=50.0, estimate_s=200.0) == (0.25, 150.0, "")
    assert running_progress({}, elapsed_s=500.0, estimate_s=200.0) == (0.99, 0.0, "")


def preset_steps(log, ready=()):
    """Fake steps "one" and "two" per preset, ready once made (``log`` holds (preset, name)) or in ``ready``."""
    def run(name):
        def step(preset, progress, force):
            log.append((preset, name))
        return step
    return lambda preset, tasks=None, measure_host=True: [
        PrepareStep(name=n, run=run(n), ready=lambda p, n=n: (p, n) in log or (p, n) in ready,
                    estimate_s={"quick": 1.0, "full": 10.0}) for n in ("one", "two")]


def test_a_full_job_makes_the_quick_versions_first(tmp_cache, monkeypatch):
    log, seen = [], []
    monkeypatch.setattr(prepare_module, "steps", preset_steps(log))
    written = prepare_job.StatusWriter.write

    def spy(self, force=False):
        if self.status["preset"] == "full":
            seen.append((self.status["state"], (self.status.get("phase") or {}).get("preset")))
        written(self, force)

    monkeypatch.setattr(prepare_job.StatusWriter, "write", spy)
    prepare_job.run_job("full")
    assert log == [("quick", "one"), ("quick", "two"), ("full", "one"), ("full", "two")]
    assert ("running", "quick") in seen and seen[-1] == ("done", None)
    assert prepare_job.read_status("quick")["state"] == prepare_job.read_status("full")["state"] == "done"
    log.clear()
    log += [("quick", "one"), ("quick", "two")]                     # made before: straight to the full steps
    prepare_job.run_job("full")
    assert log[2:] == [("full", "one"), ("full", "two")]


def test_a_waiting_page_offers_its_quick_version_and_the_full_one_behind_a_button(tmp_cache, monkeypatch):
    import ipywidgets as widgets

    from workbench.ui.preparing import prepared_page

    log = []
    monkeypatch.setattr(prepare_module, "steps", preset_steps(log))
    built = []
    page = prepared_page(lambda preset: built.append(preset) or widgets.Label(f"the {preset} page"), ("one", "two"),
                         "A page", "full")
    intro, offer, status, _sheet = page.children
    assert offer.children == () and built == []                        # no quick version yet: nothing offered
    log += [("quick", "one"), ("quick", "two")]
    status.refresh()
    text, button = offer.children
    assert "the quick artifacts: every prepare step run on a few batches" in text.value
    button.click()
    banner, shown = page.children
    assert built == ["quick"] and shown.value == "the quick page" and "Quick version." in banner.value
    log += [("full", "one"), ("full", "two")]
    status.refresh()
    assert built == ["quick"] and page.children[-1].value == "the quick page"   # not swept away under the user
    note, switch = page.children[:2]
    assert "The full artifacts are ready" in note.value and switch.description == "Switch to the full version"
    switch.click()
    assert built == ["quick", "full"] and [w.value for w in page.children] == ["the full page"]


def test_a_preheated_waiting_page_builds_its_quick_version_before_the_request_that_asks_for_it(tmp_cache,
                                                                                               monkeypatch):
    """In a preheated kernel the quick version is built while nobody watches; the ``?preset=quick`` request
    only points the page at it. Widgets made while the browser reads the kernel's widget list can be named
    by a box before the browser knows them (Voila's "widget model not found"); and the switch is sent again
    later, since one sent while the browser loads can be dropped."""
    import asyncio
    import threading

    import ipywidgets as widgets

    from workbench.ui import preparing

    log = [("quick", "one"), ("quick", "two")]
    monkeypatch.setattr(prepare_module, "steps", preset_steps(log))
    callbacks = []
    monkeypatch.setattr(preparing, "when_requested", lambda callback: callbacks.append(callback) or True)
    built, made = [], []
    banner_of = preparing.quick_banner
    monkeypatch.setattr(preparing, "quick_banner", lambda extra="": made.append(banner_of(extra)) or made[-1])
    page = preparing.prepared_page(lambda preset: built.append(preset) or made.append(
        widgets.Label(f"the {preset} page")) or made[-1], ("one", "two"), "A page", "full")
    assert built == ["quick"] and len(made) == 2 and len(page.children) == 4 and len(callbacks) == 1
    monkeypatch.setenv("QUERY_STRING", "preset=quick")
    monkeypatch.setattr(preparing, "RESEND_S", (0.0, 0.01))
    sent = []
    monkeypatch.setattr(page, "send_state", lambda key=None: sent.append((key, tuple(page.children))))

    async def request() -> None:                                     # as the kernel's loop runs the callback
        callbacks[0]()
        await asyncio.sleep(0.05)

    runner = threading.Thread(target=lambda: asyncio.run(request()))   # a loop of its own, whatever this thread runs
    runner.start()
    runner.join()
    banner, shown = page.children
    assert shown.value == "the quick page" and "Quick version." in banner.value
    assert list(page.children) == made and built == ["quick"]         # the request made no widget
    assert sent == [("children", tuple(made))] * 3     # the change, then twice again for a browser that dropped it


def test_a_waiting_page_nobody_opened_early_becomes_the_full_page_by_itself(tmp_cache, monkeypatch):
    import ipywidgets as widgets

    from workbench.ui.preparing import prepared_page

    log = [("quick", "one"), ("quick", "two")]
    monkeypatch.setattr(prepare_module, "steps", preset_steps(log))
    page = prepared_page(lambda preset: widgets.Label(f"the {preset} page"), ("one", "two"), "A page", "full")
    log += [("full", "one"), ("full", "two")]
    page.children[2].refresh()
    assert [w.value for w in page.children] == ["the full page"]


def test_the_flagship_pages_steps_are_prepared_before_any_other_pages():
    from workbench.mechanisms import dashboards

    flagship = [d for d in dashboards() if d.first]
    assert [d.page for d in flagship] == ["elastic.ipynb"]
    for preset in ("full", "quick"):
        names = [s.name for s in prepare_module.steps(preset)]
        shared = len(prepare_module.SHARED_STEPS)
        assert set(names[shared:shared + len(flagship[0].requires)]) == set(flagship[0].requires), preset


@pytest.mark.parametrize("query, preset", [("preset=quick", "quick"), ("x=1&preset=full", "full"),
                                           ("preset=nonsense", "full"), ("", "full")])
def test_a_page_address_may_ask_for_a_preset(monkeypatch, query, preset):
    from workbench.presets import page_preset

    monkeypatch.setenv("QUERY_STRING", query)
    monkeypatch.delenv("WORKBENCH_PRESET", raising=False)
    monkeypatch.delenv("WORKBENCH_PROFILE", raising=False)
    assert page_preset() == preset


def _row_states(html_text: str) -> dict[str, str]:
    import re

    return {name: state for state, name in re.findall(r"<tr class='wb-step' data-state='([^']+)'><td[^>]*>([^<]+)</td>",
                                                       html_text)}


def test_every_surface_tells_the_same_step_states_at_each_change(tmp_cache, monkeypatch):
    """The gallery's cards, the gallery's step table and a waiting page's table, read after each change of a
    toy page's two steps (waiting, one running, one ready, both ready): they never disagree."""
    import ipywidgets as widgets

    from workbench import mechanisms as registry
    from workbench.mechanisms import Dashboard
    from workbench.ui.gallery import Gallery
    from workbench.ui.preparing import prepared_page

    log = []
    monkeypatch.setattr(prepare_module, "steps", preset_steps(log))
    monkeypatch.setattr(registry, "dashboards", lambda: (Dashboard(page="toy.ipynb", title="Toy", summary="s",
                                                                   requires=("one", "two")),))
    page = prepared_page(lambda preset: widgets.Label("built"), ("one", "two"), "Toy", "full")
    page_status = page.children[2]
    gallery = Gallery("full")                                     # one gallery, kept open as a visitor would

    def surfaces():
        gallery.status.refresh()                                  # what the page's own once-a-second tick runs
        page_status.refresh()
        return (_row_states(gallery.status.view.value), _row_states(page_status.view.value), gallery.cards.value)

    table, banner, card = surfaces()
    assert table == banner == {"one": "waiting", "two": "waiting"} and "waiting for one, two" in card
    assert "wb-quick-link" not in card
    log += [("quick", "one"), ("quick", "two")]                  # the quick versions made first
    table, banner, card = surfaces()
    assert "href='toy.ipynb?preset=quick'" in card and "Open the quick version now" in repr(page.children[1])
    with prepare_module.prepare_lock():
        writer = prepare_job.StatusWriter("full", prepare_module.steps("full"))
        writer.on_step("one", "running")
        table, banner, card = surfaces()
        assert table == banner == {"one": "running", "two": "waiting"} and "waiting for one, two" in card
        log.append(("full", "one"))
        writer.on_step("one", "done")
        table, banner, card = surfaces()
        assert table == banner == {"one": "ready", "two": "waiting"} and "waiting for two (" in card
        writer.on_step("two", "running")
        log.append(("full", "two"))
        writer.on_step("two", "done")
        writer.finish(None)
    gallery.status.refresh()
    assert "wb-ready'>ready</span>" in gallery.cards.value and "All 2 prepare steps" in gallery.status.view.value
    page_status.refresh()
    assert [w.value for w in page.children] == ["built"]


def test_time_left_comes_from_what_a_step_took_on_this_host(tmp_cache, monkeypatch):
    """Catches: the registry's 2-core figure kept after this host measured the step (estimates off 2x both
    ways on a new machine)."""
    import time as clock

    from workbench.ui.preparing import describe_steps

    made = []

    def slow(preset, progress, force):
        if made and not force:                                                      # cached: as real steps do
            return
        clock.sleep(0.2)
        made.append(preset)

    step = PrepareStep(name="slow", run=slow, ready=lambda preset: bool(made), estimate_s={"quick": 10.0})
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True: [step])
    assert describe_steps("quick", None, {}, None)[0]["left_s"] == 10.0           # nothing measured yet
    prepare_module.prepare("quick", progress=False)
    measured = prepare_module.host_step_times()["quick"]["slow"]
    assert 0.2 <= measured < 5
    made.clear()                                                                    # the artifact is gone again
    assert describe_steps("quick", None, {}, None)[0]["left_s"] == pytest.approx(measured)
    prepare_module.prepare("quick", progress=False)
    prepare_module.prepare("quick", progress=False)                                 # ready: skipped, not timed
    assert prepare_module.host_step_times()["quick"]["slow"] >= 0.2
    assert list(prepare_module._step_times()) == [prepare_module.host_key()]
