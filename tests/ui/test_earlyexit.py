"""The E3 page headless: its figures carry the engine's numbers (plans and simulations made here independently
from the engine's Scenario), every control moved off its default changes what the engine is asked and what the
figures show, bad input is said in the page, and one real run on Ray Serve (the suite's shared local Ray)
overlays measured bubbles."""
import html

import pytest

from workbench.earlyexit.artifacts import load_record, model_ready, profile_series
from workbench.earlyexit.batchprofile import BatchProfile
from workbench.earlyexit.scenario import (SIM_MAX_REQUESTS, Scenario, StudySettings, default_threshold,
                                          exit_share)
from workbench.presets import default_preset
from workbench.ui.earlyexit import FEW_EXITS, SERIES_WINDOWS, EarlyExitPanel
from workbench.viz.earlyexit import one_based

PRESET = default_preset()


def reference(task="sentiment", easy=0.8, threshold=None, **knobs):
    """The plan and the simulation the page should show, made from the engine directly."""
    record = load_record(task, PRESET)
    threshold = default_threshold(record) if threshold is None else threshold
    series = profile_series(record, easy, threshold, windows=SERIES_WINDOWS)
    sc = Scenario(task=task, preset=PRESET, easy=easy, threshold=threshold,
                  **{k: v for k, v in knobs.items() if k in ("gpus", "slo_s", "batch_size")})
    plan = sc.optimize(series.forecast[-1])
    pattern, rate = knobs.get("pattern", "poisson"), knobs.get("rate", 2000)
    requests = StudySettings(task, easy, threshold, sc.slo_s, sc.batch_size, tuple(sc.gpus.items()), pattern,
                             rate).sim_requests()
    sim = sc.simulate(plan, pattern=pattern, rate=rate, requests=requests,
                      profile=series.measured[-1]) if plan else None
    return series, plan, sim


def same_plan(a, b) -> bool:
    return (a.splits, a.replicas, a.gpu_types, a.batch_sizes, a.goodput) == \
        (b.splits, b.replicas, b.gpu_types, b.batch_sizes, b.goodput)


def plan_bars(panel):
    return [(t.base[0], t.base[0] + t.x[0], len(t.y)) for t in panel.figures["plan"].data]


@pytest.fixture(scope="module")
def panel():
    return EarlyExitPanel()


def test_first_load_shows_the_engines_plan_simulation_profile_and_goodput(panel):
    series, plan, sim = reference()
    assert panel.message.value == "" and set(panel.figures) == {"profile", "plan", "bubbles", "goodput"}
    assert panel.threshold.value == pytest.approx(default_threshold(load_record("sentiment", PRESET)))
    assert same_plan(panel.plan, plan)
    assert plan_bars(panel) == [(s, e, r) for (s, e), r in zip(plan.splits, plan.replicas)]
    why = html.unescape(panel.why.value)
    assert f"goodput {plan.goodput:,.0f} samples/s" in why and plan.binding in why
    for row in plan.rows():
        assert f"split {row['split']}: {row['layers']} on {row['replicas']} × {row['gpu_type']}" in why
    assert f"{plan.gain:.2f}x the goodput of the early-exit model as is, data parallel on 4 × v100" in why
    forecast = panel.figures["profile"].data[-1]
    assert list(forecast.y) == pytest.approx([16 * f for f in series.forecast[-1].remaining])
    assert f"goodput {sim.goodput:,.0f} samples/s" in panel.sim_info.value
    assert panel.simulation.goodput == pytest.approx(sim.goodput)
    e3 = next(t for t in panel.figures["goodput"].data if t.name.startswith("E3"))
    at16 = list(e3.x).index(16)
    assert e3.y[at16] == pytest.approx(plan.goodput)
    as_is = next(t for t in panel.figures["goodput"].data if t.name.startswith("early-exit"))
    assert as_is.y[at16] == pytest.approx(plan.baseline.goodput)
    lanes = {t for trace in panel.figures["bubbles"].data for t in (trace.y or ()) if t}
    assert all(any(row.endswith(one_based(r.lane)) for row in lanes) for r in sim.replicas)
    assert "split 1 · replica 1" in lanes and not any("split 0" in row for row in lanes)
    assert f"Simulated {len(sim.requests):,} poisson requests" in panel.sim_info.value


def test_with_no_exits_the_headline_shows_no_gain_from_exits():
    panel = EarlyExitPanel()
    panel.threshold.value = 0.0                       # no ramp is ever confident enough: nobody leaves early
    assert panel.exit_share == 0.0
    title = panel.figures["goodput"].layout.title.text
    assert title.startswith("E3: 1.00x the early-exit model's goodput at batch 16<br>")
    e3, as_is = (next(t for t in panel.figures["goodput"].data if t.name.startswith(k)) for k in ("E3", "early-exit"))
    assert all(a is None or b is None or a <= b * (1 + 1e-9) for a, b in zip(e3.y, as_is.y))


def test_every_control_off_its_default_reaches_the_engine_and_the_figures(panel, monkeypatch):
    from workbench.earlyexit.scenario import Scenario

    titles = lambda: {n: f.layout.title.text for n, f in panel.figures.items()}   # noqa: E731
    before = dict(panel.figures)
    optimized = []
    optimize = Scenario.optimize
    monkeypatch.setattr(Scenario, "optimize", lambda sc, *a, **k: optimized.append(sc.slo_s) or optimize(sc, *a, **k))

    panel.slo.value = 20
    assert panel.plan.budget_s == pytest.approx(0.016) and "of 16.0 ms" in titles()["plan"]
    assert 0.02 in optimized                                  # the engine ran for the new SLO, not a cached plan

    panel.batch.value = 32
    assert panel.plan.batch_size == 32 and "batch 32 on every replica" in titles()["plan"]
    assert "(of 32)" in panel.figures["profile"].layout.yaxis.title.text
    assert panel.figures["goodput"].layout.shapes[0].x0 == 32

    panel.gpus["v100"].value = 2
    panel.gpus["k80"].value = 3
    panel.gpus["p100"].value = 1
    assert panel.scenario(panel.settings()).gpus == {"v100": 2, "p100": 1, "k80": 3}
    assert sum(panel.plan.gpus_used.values()) <= 6 and set(panel.plan.gpus_used) <= {"v100", "p100", "k80"}

    panel.mix.value = 0.2
    assert "easy share" in panel.figures["profile"].data[1].name and panel.series.easy[-1] != pytest.approx(0.8)
    panel.threshold.value = 0.5
    assert panel.settings().threshold == 0.5 and "0.50" not in titles()["profile"]
    assert "below 0.50 nats" in panel.threshold_info.value
    assert "accuracy" in panel.threshold_info.value

    panel.pattern.value = "bursty"
    assert "bursty requests" in panel.sim_info.value
    panel.rate.value = 5000
    assert "5,000 per second" in panel.sim_info.value

    series, plan, sim = reference(easy=0.2, threshold=0.5, gpus={"v100": 2, "p100": 1, "k80": 3}, slo_s=0.02, batch_size=32,
                                  pattern="bursty", rate=5000)
    assert same_plan(panel.plan, plan) and panel.simulation.goodput == pytest.approx(sim.goodput)
    assert list(panel.figures["profile"].data[-1].y) == pytest.approx([32 * f for f in series.forecast[-1].remaining])
    for name in ("profile", "plan", "bubbles", "goodput"):
        assert panel.figures[name] is not before[name], name
    assert panel.message.value == ""


def test_the_task_sets_the_thresholds_range_and_the_record():
    if not model_ready("bbc", PRESET):                 # decided when the test runs, after any prepare before it
        pytest.skip(f"bbc's exit ramps are not prepared for the {PRESET} preset (workbench prepare --preset {PRESET})")
    panel = EarlyExitPanel(slo_ms=30)
    panel.task.value = "bbc"
    record = load_record("bbc", PRESET)
    assert panel.threshold.max == pytest.approx(1.6, abs=0.01)           # ln 5
    assert panel.threshold.value == pytest.approx(default_threshold(record))
    _, plan, _ = reference(task="bbc", slo_s=0.03)
    assert same_plan(panel.plan, plan) and panel.message.value == ""


def test_bad_input_is_said_in_the_page_and_clears_when_fixed():
    panel = EarlyExitPanel()
    for box in panel.gpus.values():
        box.value = 0
    assert "no GPUs" in panel.message.value and "Traceback" not in panel.message.value
    assert panel.figures["plan"].layout.title.text == "E3's split plan"          # a human title, not "plan"
    assert "no GPUs" in panel.figures["plan"].layout.annotations[0].text
    assert "no GPUs" in panel.figures["bubbles"].layout.annotations[0].text
    panel.gpus["a6000"].value = 2
    assert panel.message.value == "" and panel.plan.gpus_used == {"a6000": 2}
    for typed in (46, -1):                                    # said with the range, not clamped in silence
        panel.gpus["v100"].value = typed
        said = html.unescape(panel.message.value)
        assert f"the count of V100 GPUs on this page is a whole number in 0..32, got {typed}" in said
        assert "0..32" in panel.figures["plan"].layout.annotations[0].text.replace("<br>", " ")
    panel.gpus["v100"].value = 0
    assert panel.message.value == "" and panel.plan.gpus_used == {"a6000": 2}

    panel.slo.value = 1                                       # nothing meets 0.8 ms
    assert not panel.plan and panel.message.value == ""
    said = panel.figures["plan"].layout.annotations[0].text.replace("<br>", " ")
    assert "no plan" in said.lower() and "raise the SLO" in said
    assert "no plan: no plan" not in said.lower() and "slack or" not in said      # the page has no slack control
    assert all(len(line) <= 70 for line in panel.figures["plan"].layout.annotations[0].text.split("<br>"))
    assert "Nothing to simulate. No plan meets" in panel.figures["bubbles"].layout.annotations[0].text
    why = html.unescape(panel.why.value)
    assert "No plan meets the SLO" in why and "no plan: no plan" not in why.lower() and "slack or" not in why
    e3 = next(t for t in panel.figures["goodput"].data if t.name.startswith("E3"))
    assert all(v is None for v in e3.y)
    assert any("no batch size meets the SLO of 1 ms" in (a.text or "")
               for a in panel.figures["goodput"].layout.annotations)
    panel.slo.value = 50
    assert panel.plan and panel.figures["plan"].data


@pytest.mark.alone
@pytest.mark.integration
def test_run_for_real_overlays_measured_bubbles(ray_cluster):
    """A real run on the suite's shared Ray: 48 requests through E3's plan for CPU replicas of this host; the
    measured batches are drawn hatched over the simulator's prediction of that same run, in their own slot. The
    run uses the task, mix, threshold and pattern only: moving the GPU controls keeps it; moving the pattern
    hides it (and says why) until set back."""
    panel = EarlyExitPanel()
    assert panel.figure_slot("hostrun") not in panel.hostrun_box.children
    stages = []
    panel.run_stage.observe(lambda change: stages.append(change["new"]), names="value")
    panel.runner.button.click()                              # no event loop in a test: the run completes here
    assert panel.runner.message.value == "" and panel.message.value == ""
    assert "starting Ray and deploying" in stages[0] and any("serving: 48 of 48" in v for v in stages)
    assert panel.run_stage.value == ""
    (outcome,) = panel.runs.values()
    real = outcome.result
    names = lambda: {t.name for t in panel.figures["hostrun"].data}      # noqa: E731
    assert {"busy (measured)", "busy (simulated)"} <= names()
    assert any(n.endswith("(measured)") and n.startswith(("bubble", "idle")) for n in names())
    measured = next(t for t in panel.figures["hostrun"].data if t.name == "busy (measured)")
    served = [s for s in real.served.timeline.spans if s.kind == "compute"]
    assert sorted(measured.base) == pytest.approx(sorted(1e3 * s.start for s in served))
    assert "measured on Ray Serve" in panel.figures["hostrun"].layout.title.text
    assert "its own plan" in panel.figures["hostrun"].layout.title.text
    assert panel.figure_slot("hostrun") in panel.hostrun_box.children
    assert "Measured on this host" in panel.run_info.value and len(real.served.requests) == 48
    assert "busy (measured)" not in {t.name for t in panel.figures["bubbles"].data}   # the GPU plan's own slot
    for move in (lambda: setattr(panel.rate, "value", 3000), lambda: setattr(panel.slo, "value", 80),
                 lambda: setattr(panel.batch, "value", 8), lambda: setattr(panel.gpus["k80"], "value", 2)):
        move()                                               # what the real run does not use: it stays
        assert "busy (measured)" in names() and panel.figure_slot("hostrun") in panel.hostrun_box.children
    panel.pattern.value = "uniform"                          # what it uses: hidden, and said why
    assert panel.figure_slot("hostrun") not in panel.hostrun_box.children
    assert "another task" in panel.run_info.value
    panel.pattern.value = "poisson"
    assert panel.figure_slot("hostrun") in panel.hostrun_box.children
    assert "Measured on this host" in panel.run_info.value


def test_few_exits_are_said_with_their_share():
    """At threshold 0 nobody leaves early: the page says so, and that E3's gain is pipelining; at a threshold
    where many leave, it says nothing."""
    panel = EarlyExitPanel(threshold=0.0)
    assert exit_share(panel.profile) == pytest.approx(0.0, abs=1e-9)
    note = html.unescape(panel.exits_note.value)
    assert "no sample leaves" in note and "pipelining the layers over GPUs" in note and "0.00 nats" in note
    panel.mix.value = 0.8
    panel.threshold.value = panel.threshold.max
    share = exit_share(panel.profile)
    if share >= FEW_EXITS:
        assert panel.exits_note.value == ""
    else:
        assert f"{100 * share:.1f} % of samples leave" in panel.exits_note.value


def test_the_simulation_states_the_offered_rate_and_shows_overload():
    """The caption and the bubbles title give the offered rate against what the plan sustains; at five times
    that rate the simulation drops requests or misses the SLO (400 requests used to report 0 % dropped), and
    bursty arrivals are simulated over several bursts."""
    panel = EarlyExitPanel()
    plan = panel.plan
    share = 2000 / plan.goodput
    said = f"offered 2,000/s = {100 * share:,.0f}% of what the plan sustains ({plan.goodput:,.0f}/s)"
    assert said in panel.sim_info.value and said in panel.figures["bubbles"].layout.title.text
    assert "modelled worst case without them" in panel.sim_info.value
    panel.rate.value = rate = min(panel.rate.max, int(round(5 * plan.goodput, -1)))     # 4-5 times over
    assert rate >= 4 * plan.goodput
    sim = panel.simulation
    assert sim.drop_rate + sim.straggler_rate > 0.5
    assert f"{100 * rate / plan.goodput:,.0f}% of what the plan sustains" in panel.sim_info.value
    assert len(sim.requests) == min(SIM_MAX_REQUESTS, panel.settings().sim_requests())
    panel.rate.value = 2000
    panel.pattern.value = "bursty"
    assert len(panel.simulation.requests) >= 2000 * 2 * 5 or len(panel.simulation.requests) == SIM_MAX_REQUESTS
    sim = panel.simulation
    drawn = len(sim.requests) / max(r.arrival_s for r in sim.requests)
    assert sim.goodput <= 1.05 * drawn              # never above the arrivals; the caption names a lucky draw
    if abs(drawn - 2000) > 200:
        assert f"this draw's arrivals average {drawn:,.0f}/s" in panel.sim_info.value


def test_a_forecast_profile_is_what_the_optimizer_gets(panel):
    assert panel.profile == tuple(panel.series.forecast[-1].remaining)
    assert BatchProfile(panel.profile).num_layers == load_record("sentiment", PRESET).num_layers


@pytest.mark.alone
@pytest.mark.integration
def test_a_drifting_run_lists_each_replan_in_the_page(ray_cluster):
    """The drifting run on the suite's Ray: the mix switches halfway, the forecast moves the plan (here a study's
    re-plan hook answers with a 2-split plan whatever the forecast, so the first window re-plans once), and the
    page lists that re-plan with its time, window and the plans before and after."""
    from types import SimpleNamespace

    panel = EarlyExitPanel()
    other = SimpleNamespace(splits=[(0, 3), (3, 6)], replicas=[2, 1], batch_sizes=[4, 4], gpu_types=["host", "host"])
    panel.drift_replan = lambda forecast: other
    panel.drifter.button.click()                             # no event loop in a test: the run completes here
    assert panel.drifter.message.value == "" and panel.message.value == ""
    run = panel.drift_run
    assert len(run.served.replans) == 1 and run.equal
    text = html.unescape(panel.drift_info.value)
    replan = run.served.replans[0]
    assert "1 re-plan(s)" in text and f"re-plan at {replan.at_s:.1f} s (after window {replan.window + 1})" in text
    assert "[[0, 3], [3, 6]] x [2, 1]" in text and "outputs equal the model" in text
