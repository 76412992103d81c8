"""The evaluation notebook's tables come from the engine, and every statement its prose makes holds there."""
import pytest

from workbench.hepti import evaluation as ev

pytestmark = pytest.mark.xdist_group("hepti-evaluation")     # one worker makes the module's shared fixture, once


@pytest.fixture(scope="module")
def tables():
    return ev.shares_table(), ev.mode_map(), ev.latency_by_count()


def test_every_statement_of_the_prose_holds(tables):
    said = ev.statements(*tables)
    assert len(said) == 8
    assert [s.text for s in said if not s.holds] == []


def test_a_statement_fails_when_the_engine_says_otherwise(tables):
    rows, modes, latencies = tables
    rows = [dict(r, split=r["split"] + ", rpi3 0.100") if (r["devices"], r["shares"]) == ("the four boards", "Hepti")
            else r for r in rows]
    modes = {label: ({K: "2d 4x4" if K >= 16 else cell for K, cell in by.items()} if label == "24" else by)
             for label, by in modes.items()}
    latencies = {**latencies, 64: latencies[32] + 1.0}
    failed = {s.text for s in ev.statements(rows, modes, latencies) if not s.holds}
    assert failed == {"on the four boards the program leaves the rpi3 out",
                      "1D-tiled holds at 16 and more devices, as the optimum never has 16 taking part",
                      "at 4000 MB free the predicted latency never rises with more devices"}


def test_the_shares_table_prices_each_rule_in_hepti_s_mode(tables):
    rows = tables[0]
    four = [r for r in rows if r["devices"] == "the four boards"]
    assert [r["shares"] for r in four] == ["Hepti", "even", "proportional"]
    assert len({r["mode"] for r in four}) == 1
    assert ev.predicted_gain(rows) == pytest.approx(four[1]["predicted ms"] / four[0]["predicted ms"])
    refused = ev.lookup(rows, "rpi4-b with 12 MB free", "even")
    assert "rpi4-b" in refused["binding / reason"]


def test_copies_keep_the_primary_s_memory_and_cycle_the_boards():
    devices = ev.copies(6, 24)
    assert [d.name for d in devices] == ["rpi4-a-0", "jetson-nano-cpu-1", "rpi4-b-2", "rpi3-3", "rpi4-a-4",
                                         "jetson-nano-cpu-5"]
    assert devices[0].memory_bytes == ev.boards()[0].memory_bytes
    assert {d.memory_bytes for d in devices[1:]} == {24e6}


def test_solve_times_time_each_call_with_the_clock_given():
    ticks = iter(range(1000))
    rows = ev.solve_times(repeats=3, counts=(4,), clock=lambda: next(ticks) / 1e3)
    assert [(r["devices"], r["memory"]) for r in rows] == [(4, "ample"), (4, "short")]
    assert all(r["median ms"] == 1.0 and r["p95 ms"] == 1.0 for r in rows)


def test_the_live_runs_reuse_hepti_s_run_where_proportional_gives_its_split():
    made = []
    plans = ev.run_plans()
    same = (plans["proportional"].sizes, plans["proportional"].heads) == (plans["Hepti"].sizes, plans["Hepti"].heads)
    runs = ev.live_runs(run=lambda devices, **options: made.append(options["shares"]) or object())
    assert len(made) == (2 if same else 3)
    assert (runs["proportional"] is runs["Hepti"]) == same
