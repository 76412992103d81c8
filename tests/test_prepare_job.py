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

    log = []
    monkeypatch.setattr(prepare_module, "steps", lambda preset, tasks=None, measure_host=True: fake_steps(log))
    built = []
    page = prepared_page(lambda: built.append(1) or __import__("ipywidgets").Label("the page"), ("one", "two"),
                         "A page", "quick")
    status = page.children[1]
    assert isinstance(status, PrepareStatus) and built == []
    assert "2 prepare step(s) missing" in status.view.value and "workbench prepare --preset quick" in status.view.value
    with prepare_module.prepare_lock():
        writer = prepare_job.StatusWriter("quick", fake_steps(log))
        writer.on_step("one", "running")
        status.refresh()
        assert "Preparing the quick preset in the background: 0 of 2 steps ready" in status.view.value
        assert "<tr class='wb-step' data-state='running'><td style='padding:2px 10px;border-bottom:1px solid " \
               "#e5e7eb;text-align:left'>one</td>" in status.view.value
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
