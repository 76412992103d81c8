"""The LLMS dashboard on hand-built replays (no model); real tiny replays through the Replay button."""
import subprocess
import sys
from dataclasses import fields, replace

import pytest

from workbench.errors import WorkbenchError
from workbench.kvcache.replay import MAX_IDLE_S, method_config
from workbench.kvcache.replays import ReplaySettings
from workbench.ui import kvcache as kvcache_ui
from workbench.ui.base import RunOutcome
from workbench.ui.kvcache import KVCachePanel, compare
from workbench.viz.kvcache import format_ms
from tests.conftest import PRESET
from tests.viz.test_kvcache import replay_result, sample_replays

PER_CALL = ("chunks", "queue", "gantt", "events")


def panel_on(results=None, **kwargs) -> KVCachePanel:
    results = sample_replays() if results is None else results
    return KVCachePanel("quick", provider=lambda: results, **kwargs)


def test_first_load_draws_every_figure_and_the_engine_numbers(monkeypatch):
    monkeypatch.setattr(kvcache_ui, "HEADLINE_SWITCHES", 2)     # the sample's two switches may carry a headline
    results = dict(sorted(sample_replays().items()))            # as a JSON file with sorted keys gives them
    panel = panel_on(results)
    assert panel.message.value == "" and set(panel.figures) == {"latency", *PER_CALL}
    assert panel.call.max == panel.play.max == len(results["llms"].calls) - 1
    means = {m: r.mean_switch_s() for m, r in results.items()}
    summary = panel.summary.value
    for method, mean in means.items():
        assert f"data-method='{method}'>{format_ms(mean)}</span>" in summary
    assert f"{means['vllm_sq'] / means['llms']:.1f}x faster than vLLM-SQ" in summary
    assert f"{means['lmk'] / means['llms']:.1f}x faster than LMK" in summary
    assert [o[1] for o in panel.method.options] == ["llms", "vllm_sq", "lmk"]          # the paper's order
    assert [t.name.split(":")[0] for t in panel.figures["latency"].data[:3]] == ["LLMS", "vLLM-SQ", "LMK"]
    assert panel.contexts.value == 3 and panel.device.value == "orin-nx" and panel.pattern.value == "markov"
    assert panel.settings_note.value == ""


def test_the_call_slider_redraws_only_the_per_call_figures():
    panel = panel_on()
    before = dict(panel.figures)
    panel.call.value = 4
    after = panel.figures
    assert after["latency"] is before["latency"]
    assert all(after[name] is not before[name] for name in PER_CALL)
    assert "after call 4" in after["chunks"].layout.title.text and "after call 4" in after["queue"].layout.title.text
    assert after["events"].layout.shapes[0].name.startswith("call 4")
    assert "Call 4 of 4" in panel.call_info.value and "switch 6.00 ms" in panel.call_info.value
    runs = panel.updates_run
    panel.call.value = 4                               # no change: nothing runs
    assert panel.updates_run == runs


def test_the_method_shown_redraws_the_per_call_views_of_that_replay():
    panel = panel_on()
    latency = panel.figures["latency"]
    panel.call.value = 2
    panel.method.value = "lmk"
    assert "(LMK)" in panel.figures["chunks"].layout.title.text and panel.call.value == 2
    assert panel.figures["events"].data[0].name.startswith("killed")
    assert panel.figures["latency"] is latency


def test_a_settings_change_says_the_replays_shown_are_older():
    panel = panel_on()
    figures = dict(panel.figures)
    panel.contexts.value = 8
    assert "wb-kv-stale" in panel.settings_note.value and panel.figures == figures
    panel.contexts.value = 3
    assert panel.settings_note.value == ""


def test_a_provider_error_shows_inline_and_the_page_stays_usable():
    def missing():
        raise WorkbenchError("the LLMS replays of the quick preset are not prepared; run `workbench prepare "
                             "--preset quick`")

    panel = KVCachePanel("quick", provider=missing)
    assert "wb-error" in panel.message.value and "workbench prepare --preset quick" in panel.message.value
    assert "Traceback" not in panel.message.value and panel.figures == {}
    panel.call.value = 0                               # nothing to show yet: no error either
    assert "internal error" not in panel.message.value


def test_the_default_provider_names_the_prepare_command(tmp_cache):
    panel = KVCachePanel("quick")
    assert "wb-error" in panel.message.value and "workbench prepare" in panel.message.value
    assert "internal error" not in panel.message.value


def test_replay_results_replace_the_shown_ones(monkeypatch):
    """The Replay button hands its results to the page (the work itself stubbed: no model here)."""
    panel = panel_on()
    new = {"llms": replay_result(scale=2.0), "vllm_sq": replay_result("vllm_sq", 9.0, "swap_out", "lru")}
    monkeypatch.setattr(panel, "_replay_all", lambda handle: RunOutcome(panel.settings(), new))
    panel.runner.work = panel._replay_all
    panel.contexts.value = 4
    panel.runner.button.click()                        # no event loop in a test: the run completes here
    assert panel.runner.message.value == panel.message.value == "" and panel.results == new
    assert f"data-method='llms'>{format_ms(new['llms'].mean_switch_s())}" in panel.summary.value
    assert [o[1] for o in panel.method.options] == ["llms", "vllm_sq"] and panel.settings_note.value == ""


def test_a_budget_fraction_above_one_is_refused_beside_the_button():
    panel = panel_on()
    panel.budget_unit.value, panel.budget.value = "of the working set", 1.5
    panel.runner.button.click()
    assert "fraction of the working set lies in (0, 1]" in panel.runner.message.value
    assert panel.message.value == ""


def test_a_real_tiny_replay_through_the_button():
    panel = panel_on()
    panel.contexts.value, panel.calls.value, panel.device.value = 2, 3, "host"
    panel.budget_unit.value, panel.budget.value = "of the working set", 0.5
    panel.runner.button.click()
    assert panel.runner.message.value == "" and panel.message.value == ""
    assert set(panel.results) == {"llms", "vllm_sq", "vllm_s", "swapping", "lmk"}
    assert all(len(r.calls) == 3 and r.contexts == 2 for r in panel.results.values())
    assert panel.figures["chunks"].layout.title.text.startswith("KV chunks after call 0 (LLMS)")


def test_replay_generates_as_many_tokens_per_call_as_the_replays_shown():
    """The prepared full replays generate one token a call; Replay with the same settings must too."""
    shown = {m: replace(r, settings={**r.settings, "max_new_tokens": 1}) for m, r in sample_replays().items()}
    panel = panel_on(shown)
    panel.contexts.value, panel.calls.value, panel.device.value = 2, 2, "host"
    panel.runner.button.click()
    assert panel.runner.message.value == ""
    assert {r.settings["max_new_tokens"] for r in panel.results.values()} == {1}


def test_a_headline_ratio_from_too_few_switches_is_withheld_and_says_why():
    results = sample_replays()                                   # two switches per method
    summary = panel_on(results).summary.value
    assert "No headline ratio: 2 switches per method, fewer than the 10 a mean should rest on" in summary
    assert "faster than" not in summary
    assert f"data-method='llms'>{format_ms(results['llms'].mean_switch_s())}</span>" in summary
    assert results["llms"].switches_s() == [0.004, 0.006]


def test_the_summary_says_which_budgets_were_raised_and_reads_close_ratios_plainly(monkeypatch):
    monkeypatch.setattr(kvcache_ui, "HEADLINE_SWITCHES", 2)
    llms = replace(replay_result(), settings={"requested_budget_bytes": 2_000_000, "config": {"policy": "lctru"}})
    lmk = replace(replay_result("lmk", 1.02, "kill", "lru"), memory_budget_bytes=5_000_000)
    summary = panel_on({"llms": llms, "lmk": lmk}).summary.value
    assert "2.00 MB budget, raised to what serves every call's context alone for LMK 5.00 MB" in summary
    assert "LLMS switches about as fast as LMK (1.02x)" in summary
    assert compare(0.5, "LMK") == "2.0x slower than LMK" and compare(3.0, "LMK") == "3.0x faster than LMK"


OFF_DEFAULT = {"contexts": 2, "calls": 3, "budget_unit": "of the working set", "budget": 0.4, "global_ratio": 0.75,
               "chunk_size": 8, "policy": "lru", "pattern": "random", "mean_interval_s": 120.0, "device": "host",
               "seed": 7, "idle_s_per_min": 0.3}


def move_every_control(panel: KVCachePanel) -> None:
    """Every replay setting of the panel set to OFF_DEFAULT, which must name each of them and differ from
    what the page opened with."""
    controls = {"contexts": panel.contexts, "calls": panel.calls, "budget_unit": panel.budget_unit,
                "budget": panel.budget, "global_ratio": panel.ratio, "chunk_size": panel.chunk_size,
                "policy": panel.policy, "pattern": panel.pattern, "mean_interval_s": panel.interval,
                "device": panel.device, "seed": panel.seed, "idle_s_per_min": panel.idle}
    assert set(controls) == set(OFF_DEFAULT) == {f.name for f in fields(ReplaySettings)}
    before = panel.settings()
    for name, control in controls.items():
        control.value = OFF_DEFAULT[name]
    after = panel.settings()
    assert all(getattr(after, name) != getattr(before, name) for name in OFF_DEFAULT)
    assert after == ReplaySettings(**OFF_DEFAULT)


def test_every_control_off_its_default_replays_with_it():
    """A tiny real replay with every setting changed: each reaches the replays and shows in the page."""
    panel = panel_on()
    move_every_control(panel)
    assert "wb-kv-stale" in panel.settings_note.value
    panel.runner.button.click()
    assert panel.runner.message.value == "" and panel.message.value == "" and panel.settings_note.value == ""
    results = panel.results
    assert set(results) == {"llms", "vllm_sq", "vllm_s", "swapping", "lmk"}
    llms = results["llms"].settings["config"]
    assert (llms["chunk_size"], llms["global_ratio"], llms["policy"]) == (8, 0.75, "lru")
    for method, result in results.items():
        config = method_config(method, chunk_size=8, global_ratio=0.75, policy="lru")
        assert result.settings["config"]["chunk_size"] == 8
        assert (result.settings["config"]["global_ratio"], result.settings["config"]["policy"]) == \
            (config.global_ratio, config.policy), method
        trace = result.settings["trace"]
        assert (trace["contexts"], trace["calls"], trace["pattern"], trace["mean_interval_s"], trace["seed"]) == \
            (2, 3, "random", 120.0, 7)
        assert result.device == "host" and len(result.calls) == 3
        times = [c.time_s for c in result.calls]
        expected = [0.0] + [(b - a) * 0.3 / 60 for a, b in zip(times, times[1:])]
        assert [c.idle_s for c in result.calls] == pytest.approx(expected) and expected[1] > 0
    shown = panel._settings_of(results)
    assert replace(shown, budget=0.4, budget_unit="of the working set") == panel.settings()
    assert "Replay applies the chunk size to every method; the global ratio to LLMS only" in panel.scope_note.value
    mean_gap = (times[-1] - times[0]) / 2 / 60
    assert (f"Trace: random switching, seed 7, calls every {mean_gap:.1f} min on average in trace time; replayed "
            f"with 0.30 s idle per trace minute") in panel.summary.value
    assert "Service: 8-token chunks for every method; LLMS at global ratio 0.75 with LRU eviction." \
        in panel.summary.value
    assert "(LLMS, LRU)" in panel.figures["queue"].layout.title.text
    assert all(len(t.x) == 3 for t in panel.figures["latency"].data if t.mode == "lines+markers")
    panel.call.value = 1
    idle = f"after {results['llms'].calls[1].idle_s:.2f} s idle"
    assert idle in panel.figures["chunks"].layout.title.text and idle in panel.call_info.value


def test_a_configuration_the_service_refuses_is_said_beside_the_button():
    panel = panel_on()
    shown = panel.results
    panel.chunk_size.options = [*panel.chunk_size.options, 9000]
    panel.chunk_size.value = 9000
    panel.runner.button.click()
    assert "chunk_size is a whole number from 1 to 8192 tokens, got 9000" in panel.runner.message.value
    assert panel.message.value == "" and panel.results is shown


def test_more_idle_than_a_replay_may_sit_is_refused_beside_the_button():
    panel = panel_on()
    shown = panel.results
    panel.calls.value, panel.interval.value, panel.idle.value = 30, 300.0, 60.0
    panel.runner.button.click()
    assert f"more than the {MAX_IDLE_S:.0f} s allowed" in panel.runner.message.value
    assert "over 5 replays" in panel.runner.message.value
    assert panel.message.value == "" and panel.results is shown


@pytest.mark.integration
def test_the_page_opens_with_every_figure_and_no_torch():
    """The page says which settings apply to which method from the replay module, which must stay light:
    torch comes only with the first Replay."""
    from workbench.kvcache.artifacts import prepare_replays

    prepare_replays(PRESET)                            # made once, then read from the cache
    code = ("import sys\nfrom workbench.ui.kvcache import KVCachePanel\np = KVCachePanel('quick')\n"
            "assert 'wb-error' not in p.message.value and len(p.figures) == 5, p.message.value\n"
            "assert 'the global ratio to LLMS only' in p.scope_note.value\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
