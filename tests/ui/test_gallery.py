"""The gallery says what is ready, for which preset, and how to serve what is ready now."""
import pytest

from workbench import mechanisms as registry
from workbench import prepare
from workbench.mechanisms import Dashboard, PrepareStep

PAGES = tuple(Dashboard(page=f"p{i}.ipynb", title=f"Page {i}", summary="one line", requires=(f"step {i}",),
                        probe_control="x", probe_figure="f") for i in range(2))


@pytest.fixture
def only_quick_ready(monkeypatch, tmp_cache):
    """Two pages whose steps are ready for the quick preset only, as after `make test`."""
    made = [PrepareStep(name=f"step {i}", run=lambda preset, progress, force: "made",
                        ready=lambda preset: preset == "quick", estimate_s={"full": 60, "quick": 5}) for i in range(2)]
    monkeypatch.setattr(registry, "dashboards", lambda: PAGES)
    monkeypatch.setattr(prepare, "steps", lambda preset, tasks=None, measure_host=True: made)


def test_the_gallery_of_an_unprepared_preset_says_another_serves_every_page_now(only_quick_ready):
    from workbench.ui.gallery import Gallery
    from workbench.ui.stylesheet import stylesheet

    gallery = Gallery("full")
    assert stylesheet() in gallery.children             # no figure brings the page's stylesheet here
    cards = gallery.cards.value
    assert "Serving the <b>full</b> preset: 0 of 2 pages ready." in cards
    assert "the quick preset&#x27;s artifacts serve every page now: `workbench dashboards --preset quick`" in cards
    assert "not meaningful" in cards
    quick = Gallery("quick").cards.value
    assert "Serving the <b>quick</b> preset: 2 of 2 pages ready." in quick and "--preset" not in quick


def test_the_hint_names_the_preset_that_serves_now_and_only_when_one_does(only_quick_ready, monkeypatch):
    assert prepare.pages_waiting("full") == {"Page 0": ["step 0"], "Page 1": ["step 1"]}
    assert prepare.serving_now("full") == "quick" and prepare.serving_now("quick") is None
    assert prepare.serve_now_hint("full").startswith("2 of 2 pages wait for the full prepare; the quick preset")
    assert prepare.serve_now_hint("quick") == ""
    monkeypatch.setattr(prepare, "steps", lambda preset, tasks=None, measure_host=True: [
        PrepareStep(name=f"step {i}", run=lambda preset, progress, force: "made", ready=lambda preset: False)
        for i in range(2)])
    assert prepare.serve_now_hint("full") == ""


def test_a_waiting_page_links_its_quick_version_once_the_quick_preset_has_it(only_quick_ready, monkeypatch):
    from workbench.ui.gallery import Gallery

    cards = Gallery("full").cards.value
    for page in PAGES:
        assert f"<a class='wb-quick-link' href='{page.page}?preset=quick'>open its quick version now</a>" in cards
    assert "real figures, rough numbers" in cards
    assert "wb-quick-link" not in Gallery("quick").cards.value          # the quick gallery serves them already
    monkeypatch.setattr(prepare, "steps", lambda preset, tasks=None, measure_host=True: [
        PrepareStep(name=f"step {i}", run=lambda preset, progress, force: "made", ready=lambda preset: False)
        for i in range(2)])
    assert "wb-quick-link" not in Gallery("full").cards.value            # nothing to offer yet


def test_a_ready_page_names_the_steps_of_its_further_choices_still_being_prepared(monkeypatch, tmp_cache):
    from workbench.ui.gallery import Gallery

    page = Dashboard(page="p.ipynb", title="Page", summary="one line", requires=("first",), later=("second",),
                     probe_control="x", probe_figure="f")
    done = {"first"}
    monkeypatch.setattr(registry, "dashboards", lambda: (page,))
    monkeypatch.setattr(prepare, "steps", lambda preset, tasks=None, measure_host=True: [
        PrepareStep(name=n, run=lambda preset, progress, force: "made", ready=lambda preset, n=n: n in done)
        for n in ("first", "second")])
    cards = Gallery("quick").cards.value
    assert "<span class='wb-ready'>ready</span> <small class='wb-later'>(still being prepared: second)" in cards
    done.add("second")
    assert "wb-later" not in Gallery("quick").cards.value
