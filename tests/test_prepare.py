"""The order of `workbench prepare`: page by page, the quickest page first; and the one figure for its length."""
import re
from pathlib import Path

import pytest

from workbench import mechanisms as registry
from workbench import prepare
from workbench.mechanisms import Dashboard, Mechanism, PrepareStep

README = Path(__file__).resolve().parent.parent / "README.md"


def _step(name: str, seconds: float) -> PrepareStep:
    return PrepareStep(name=name, run=lambda preset, progress, force: None, ready=lambda preset: False,
                       estimate_s={"full": seconds})


def _page(title: str, *requires: str) -> Dashboard:
    return Dashboard(page=f"{title}.ipynb", title=title, summary="", requires=requires)


def test_the_quicker_page_goes_first_though_registered_last():
    slow = [_step("slow a", 900), _step("slow b", 600)]
    quick = [_step("quick a", 60), _step("quick b", 300)]
    order = prepare.page_order([*slow, *quick], [_page("slow", "slow a", "slow b"), _page("quick", "quick a",
                                                                                            "quick b")], "full")
    assert [s.name for s in order] == ["quick a", "quick b", "slow a", "slow b"]


def test_a_shared_step_runs_once_and_only_what_is_left_counts():
    steps = [_step("train", 400), _step("profile", 300), _step("replay", 450), _step("unused", 1)]
    pages = [_page("overview", "train"), _page("big", "train", "profile"), _page("service", "replay")]
    # overview (400) first; then "big" needs 300 more (700 in all), less than the service's 450
    assert [s.name for s in prepare.page_order(steps, pages, "full")] == ["train", "profile", "replay", "unused"]


def test_a_pages_later_steps_come_after_every_pages_own():
    """The flagship opens with its first task; its other task's steps wait until every page has its own."""
    steps = [_step("first task", 100), _step("other task", 100), _step("service", 500)]
    flagship = Dashboard(page="f.ipynb", title="f", summary="", requires=("first task",), later=("other task",),
                         first=True)
    order = prepare.page_order(steps, [flagship, _page("service", "service")], "full")
    assert [s.name for s in order] == ["first task", "service", "other task"]
    names = [s.name for s in prepare.steps("full")]
    (elastic,) = [d for d in registry.dashboards() if d.first]
    required = {n for d in registry.dashboards() for n in d.requires}
    assert min(names.index(n) for n in elastic.later) > max(names.index(n) for n in required)


def test_a_tie_keeps_gallery_order_and_steps_keep_their_declared_order():
    steps = [_step("b2", 5), _step("a1", 10), _step("b1", 5)]
    pages = [_page("a", "a1"), _page("b", "b1", "b2")]
    assert [s.name for s in prepare.page_order(steps, pages, "full")] == ["a1", "b2", "b1"]


def _ready_at(preset: str) -> dict[str, float]:
    """Seconds into a prepare from an empty cache at which each page has all it requires, by the estimates."""
    elapsed, done = 0.0, set()
    ready = {page.title: 0.0 for page in registry.dashboards() if not page.requires}
    for step in prepare.steps(preset):
        elapsed += step.estimate_s.get(preset, 0.0)
        done.add(step.name)
        for page in registry.dashboards():
            if page.title not in ready and set(page.requires) <= done:
                ready[page.title] = elapsed
    return ready


@pytest.mark.parametrize("preset", ["full", "quick"])
def test_the_flagship_page_is_ready_first_then_the_page_needing_least_time(preset):
    ready = _ready_at(preset)
    assert set(ready) == {d.title for d in registry.dashboards()}
    assert all(ready[d.title] == 0.0 for d in registry.dashboards() if not d.requires)
    (flagship,) = [d for d in registry.dashboards() if d.first]
    shared_s = sum(s.estimate_s.get(preset, 0.0) for s in prepare.SHARED_STEPS)
    needs = {d.title: sum(s.estimate_s.get(preset, 0.0) for s in prepare.steps(preset) if s.name in d.requires)
             for d in registry.dashboards() if d.requires}
    assert ready[flagship.title] == pytest.approx(shared_s + needs[flagship.title]), \
        "the flagship waits for nothing it does not need"
    rest = {title: need for title, need in needs.items() if title != flagship.title}
    assert min(rest, key=lambda title: ready[title]) == min(rest, key=rest.get)


def test_the_llms_page_waits_for_the_flagship_and_its_own_steps_only():
    names = [s.name for s in prepare.steps("full")]
    llms = next(d for d in registry.dashboards() if d.page == "kvcache.ipynb")
    (flagship,) = [d for d in registry.dashboards() if d.first]
    before = set(names[:max(names.index(n) for n in llms.requires)])
    assert before <= {s.name for s in prepare.SHARED_STEPS} | set(flagship.requires) | set(llms.requires)


def test_a_mechanism_registered_later_still_goes_first_after_the_flagship_when_quicker(monkeypatch):
    tiny = Mechanism(name="tiny", title="Tiny", paper="a test", prepare_steps=lambda preset: [_step("tiny step", 1)],
                     dashboard=_page("tiny", "tiny step"))
    monkeypatch.setattr(registry, "mechanisms", lambda: (*registry.load_registered(registry.REGISTERED), tiny))
    names = [s.name for s in prepare.steps("full")]
    (flagship,) = [d for d in registry.dashboards() if d.first]
    assert names[len(prepare.SHARED_STEPS) + len(flagship.requires)] == "tiny step"


def test_one_figure_for_the_full_prepare_in_the_notice_and_the_readme():
    minutes = round(prepare.estimate_s("full") / 60)
    assert prepare.estimate_s("full") == sum(s.estimate_s.get("full", 0.0) for s in prepare.steps("full"))
    assert f"(about {minutes} minutes on 2 cores)" in prepare.preset_notice("quick")
    quoted = re.findall(r"about (\d+) minutes on 2 cores", README.read_text())
    assert quoted and set(quoted) == {str(minutes)}, "README's figure for the full prepare is not the registry's"


def test_the_gallery_counts_down_from_the_same_figure(tmp_cache):
    from workbench.prepare_job import StatusWriter
    from workbench.ui.gallery import Gallery

    with prepare.prepare_lock():
        StatusWriter("full", prepare.steps("full"))
        shown = Gallery("full").status.view.value
    assert f"about {round(prepare.estimate_s('full') / 60)} min left" in shown
