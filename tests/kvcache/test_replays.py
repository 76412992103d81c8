"""The typed replay settings: read back from replay records, the budget in bytes, every setting checked before
the decoder loads."""
import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.records import ReplayResult
from workbench.kvcache.replays import FRACTION, MEGABYTES, METHODS, ReplaySettings, replay_methods

CONTROLS = ReplaySettings(contexts=4, calls=12, pattern="markov", mean_interval_s=300.0, seed=5, device="orin-nx",
                          budget=0.5, budget_unit=FRACTION, global_ratio=0.5, chunk_size=16, policy="lctru")


def result(method="llms", **settings) -> ReplayResult:
    return ReplayResult(method=method, device="jetson-tx2", memory_budget_bytes=3_000_000, contexts=3,
                        pattern="random", settings=settings)


def test_the_settings_of_replays_are_their_records_with_the_controls_where_the_records_are_silent():
    """Catches: the settings read from a baseline when LLMS's replay is there, a recorded value lost to the
    fallback (or the reverse), a budget in bytes shown as a fraction, the trace's and config's settings not
    looked up where the replay records them."""
    llms = result(budget_fraction=0.25, idle_scale=0.01, trace={"calls": 9, "seed": 7, "mean_interval_s": 60.0},
                  config={"chunk_size": 8, "global_ratio": 0.75, "policy": "lru"})
    lmk = result("lmk", requested_budget_bytes=2_500_000)
    got = ReplaySettings.of_results({"lmk": lmk, "llms": llms}, CONTROLS)
    assert got == ReplaySettings(contexts=3, calls=9, pattern="random", mean_interval_s=60.0, seed=7,
                                 device="jetson-tx2", budget=0.25, budget_unit=FRACTION, global_ratio=0.75,
                                 chunk_size=8, policy="lru", idle_s_per_min=0.6)
    silent = ReplaySettings.of_results({"lmk": lmk}, CONTROLS)
    assert (silent.budget, silent.budget_unit, silent.calls, silent.seed, silent.chunk_size, silent.policy) == \
        (2.5, MEGABYTES, 0, 5, 16, "lctru")
    assert ReplaySettings.of_results({}, CONTROLS) is None


@pytest.mark.parametrize("budget, unit, message", [
    (1.5, FRACTION, r"a budget as a fraction of the working set lies in \(0, 1\], got 1.5"),
    (0.0, FRACTION, r"lies in \(0, 1\], got 0.0"),
    (-2.0, MEGABYTES, "the memory budget must be positive, got -2.0 MB"),
    (1.0, "GB", "a budget is given of the working set or MB, got 'GB'"),
])
def test_a_wrong_budget_is_refused_before_the_decoder_loads(budget, unit, message):
    from dataclasses import replace

    loads = []
    with pytest.raises(WorkbenchError, match=message):
        replay_methods(replace(CONTROLS, budget=budget, budget_unit=unit), lambda: loads.append(1), new_tokens=1)
    assert loads == []


def test_a_setting_the_service_refuses_is_refused_before_the_decoder_loads():
    from dataclasses import replace

    loads = []
    with pytest.raises(WorkbenchError, match="chunk_size"):
        replay_methods(replace(CONTROLS, chunk_size=0), lambda: loads.append(1), new_tokens=1)
    assert loads == []
    assert replace(CONTROLS, budget=12.5, budget_unit=MEGABYTES).budget_bytes() == 12_500_000
    assert set(CONTROLS.service_configs()) == set(METHODS)
    assert CONTROLS.service_configs()["llms"].chunk_size == 16 and CONTROLS.service_configs()["lmk"].chunk_size == 16
