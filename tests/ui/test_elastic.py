import base64
import json

from workbench.data import TASKS
from workbench.elastic.planner import plan_elastic
from workbench.elastic.artifacts import load_context
from workbench.ui import ElasticPanel
from tests.conftest import PRESET


def expected_plan(task, device, target_ms, preload_mb):
    ctx = load_context(task, device, PRESET)
    return plan_elastic(ctx.cost_model, target_ms / 1e3, ctx.importance.accuracy, preload_mb * 1e6)


def test_controls_replan_and_redraw(prepared):
    panel = ElasticPanel(PRESET)
    assert panel.message.value == ""
    assert set(panel.figures) >= {"importance", "candidates", "aib", "gantt", "memory"}
    for target in (150, 400):
        panel.target.value = target
        plan = expected_plan("sentiment", "odroid-n2", target, 1.0)
        assert f"Submodel {plan.n} x {plan.m}</b>" in panel.submodel.value
        assert f"predicted {1e3 * plan.predicted_s:.1f} ms" in panel.submodel.value
        gantt = panel.figures["gantt"]
        computes = [t for t in gantt.data if t.name == "compute (predicted)"][0]
        assert len(computes.x) == plan.n
        assert panel.step.max == len(plan.io.steps) - 1
    heat = panel.figures["importance"].data[0]
    assert heat.text[0][0] == str(int(panel.plan.bits[0, 0]))
    panel.step.value = 0
    assert "step 0/" in panel.figures["aib"].layout.title.text
    panel.device.value = "jetson-nano"
    panel.preload.value = 5.0
    plan = expected_plan("sentiment", "jetson-nano", 400, 5.0)
    assert f"Submodel {plan.n} x {plan.m}</b>" in panel.submodel.value


def test_run_for_real_overlays_the_measurement_and_exports(prepared):
    panel = ElasticPanel(PRESET, device="jetson-nano", target_ms=150)
    panel.runs.value = 2
    panel.runner.button.click()                 # no event loop in a test: the run completes here
    assert panel.message.value == "" and panel.runner.message.value == "" and panel.measured is not None
    assert "2 real run(s)" in panel.run_info.value
    names = {t.name for t in panel.figures["gantt"].data}
    assert {"compute (predicted)", "compute (measured)", "io (measured)"} <= names
    panel.export_button.click()
    href = panel.download.value.split("href='")[1].split("'")[0]
    trace = json.loads(base64.b64decode(href.split(",", 1)[1]))
    assert trace["otherData"]["source"] == "measured"


def test_a_run_that_misses_its_prediction_says_so_beside_the_number(prepared, monkeypatch):
    from workbench.prediction import PredictionCheck

    panel = ElasticPanel(PRESET, device="jetson-nano", target_ms=150)
    panel.runs.value = 1
    missed = PredictionCheck(measured_s=0.9, predicted_s=0.15, causes=("busy host (load average 3.0 on 2 cores)",))
    monkeypatch.setattr("workbench.elastic.pipeline.RunResult.check", lambda self, plan: missed)
    panel.runner.button.click()
    assert "wb-miss" in panel.run_info.value and "500 % above the predicted 150 ms" in panel.run_info.value
    assert "busy host (load average 3.0 on 2 cores)" in panel.run_info.value
    within = PredictionCheck(measured_s=0.151, predicted_s=0.15)
    monkeypatch.setattr("workbench.elastic.pipeline.RunResult.check", lambda self, plan: within)
    panel.runner.button.click()
    assert "wb-miss" not in panel.run_info.value


def test_pages_say_when_they_show_quick_prepared_artifacts(prepared):
    from workbench.prepare import preset_notice
    from workbench.ui import Gallery

    for widget in (ElasticPanel.page("quick"), Gallery("quick")):
        notice = widget.children[0]
        assert "wb-preset-notice" in notice.value and "workbench prepare" in notice.value
    assert preset_notice("full") == ""
    assert all("wb-preset-notice" not in getattr(w, "value", "") for w in Gallery("full").children)


def test_missing_store_shows_inline_with_the_command_that_builds_it(prepared, tmp_cache):
    panel = ElasticPanel(PRESET)
    assert "wb-error" in panel.message.value and "workbench prepare --preset quick" in panel.message.value
    assert "Traceback" not in panel.message.value


def test_target_below_one_layer_explains_the_empty_plan(prepared):
    panel = ElasticPanel(PRESET, target_ms=50, device="jetson-nano")
    assert "No plan: no submodel fits 50.0 ms" in panel.submodel.value
    panel.runner.button.click()
    assert "nothing to run" in panel.runner.message.value and panel.message.value == ""     # beside the button


def test_the_memory_figure_follows_the_target_without_evaluated_cells(prepared, monkeypatch):
    monkeypatch.setattr(ElasticPanel, "evaluation_cells", lambda self: [])
    panel = ElasticPanel(PRESET, target_ms=200)
    assert "200 ms" in panel.figures["memory"].layout.title.text
    panel.target.value = 350
    title = panel.figures["memory"].layout.title.text
    assert "350 ms" in title and "200 ms" not in title
    assert panel.figures["memory"].layout.height <= 200


def test_every_figure_title_follows_the_controls_it_depends_on(prepared):
    """Task, device, target, preload and step each move the titles of the figures drawn from them."""
    panel = ElasticPanel(PRESET)
    titles = lambda: {name: fig.layout.title.text for name, fig in panel.figures.items()}
    before = titles()
    first = expected_plan("sentiment", "odroid-n2", 200, 1.0)
    assert f"and the {first.n} x {first.m} plan<br><sub>{TASKS['sentiment'].title}</sub>" in before["importance"]
    assert "at 200 ms on odroid-n2" in before["candidates"] and "1.00 MB preload" in before["aib"]
    panel.task.value = "bbc"
    plan = expected_plan("bbc", "odroid-n2", 200, 1.0)
    assert f"and the {plan.n} x {plan.m} plan<br><sub>{TASKS['bbc'].title}</sub>" in titles()["importance"]
    panel.device.value = "jetson-nano"
    assert "on jetson-nano" in titles()["candidates"] and "on jetson-nano" in titles()["gantt"]
    assert "on jetson-nano" in titles()["memory"]
    panel.target.value = 300
    assert "at 300 ms on jetson-nano" in titles()["candidates"] and "300 ms" in titles()["memory"]
    panel.preload.value = 4.5
    assert "4.50 MB preload buffer" in titles()["aib"]
    panel.step.value = 0
    assert "step 0/" in titles()["aib"]


def test_the_page_opens_with_its_first_task_and_says_which_are_still_being_prepared(prepared, monkeypatch):
    """The flagship page is ready once its first task is (the full prepare takes the other task's steps after
    every page's own): the task menu offers the ready tasks only and names the rest."""
    from workbench import mechanisms as registry
    from workbench.elastic import artifacts

    board = next(d for d in registry.dashboards() if d.page == ElasticPanel.dashboard_page)
    assert board.requires == tuple(f"{what}: sentiment" for what in ("elastic fine-tuning", "shard store",
                                                                    "shard importance"))
    assert board.later and all(name.endswith(": bbc") for name in board.later)
    monkeypatch.setattr(artifacts, "task_ready", lambda task, preset: task == "sentiment")
    panel = ElasticPanel(PRESET, task="bbc")
    assert [v for _, v in panel.task.options] == ["sentiment"] and panel.task.value == "sentiment"
    assert "BBC News topic: still being prepared" in panel.tasks_waiting.value and panel.message.value == ""
    monkeypatch.setattr(artifacts, "task_ready", lambda task, preset: True)
    panel = ElasticPanel(PRESET, task="bbc")
    assert panel.task.value == "bbc" and len(panel.task.options) == 2 and panel.tasks_waiting.value == ""
    # the overview's section needs the first task's fine-tuning only, and offers what is fine-tuned
    from workbench.ui.elastic import ElasticOverview

    section = next(m.overview for m in registry.mechanisms() if m.name == "elastic")
    assert section.requires == ("elastic fine-tuning: sentiment",)
    monkeypatch.setattr(artifacts, "model_ready", lambda task, preset: task == "sentiment")
    overview = ElasticOverview(PRESET)
    assert [v for _, v in overview.task.options] == ["sentiment"] and "BBC" in overview.tasks_waiting.value
    assert overview.figures["grid"].layout.title.text.startswith("Movie-review sentiment")
