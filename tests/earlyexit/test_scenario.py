"""A scenario turns the page's and the commands' knobs into the optimizer's and simulator's inputs."""
import pytest

from workbench.earlyexit.artifacts import load_record
from workbench.earlyexit.profiles import gpu_profile
from workbench.earlyexit.scenario import Scenario, inside_ramps, parse_gpus
from workbench.errors import WorkbenchError

PRESET = "quick"


@pytest.fixture(scope="module")
def scenario(prepared):
    return Scenario(preset=PRESET, gpus={"v100": 2, "k80": 2}, slo_s=0.05, threshold=0.6, easy=0.5)


def test_the_encoders_profile_is_the_share_of_the_mix_past_each_ramp(scenario):
    from workbench.earlyexit.artifacts import mix_rows

    rec = load_record("sentiment", PRESET)
    rows = mix_rows(rec, 0.5, 2048, seed=0)
    exits = []
    for r in rows:                      # the first ramp under the threshold, the last layer otherwise
        k = next((k for k in range(rec.num_layers - 1) if rec.entropies[k, r] < 0.6), rec.num_layers - 1)
        exits.append(k)
    expected = [sum(e > k for e in exits) / len(exits) for k in range(rec.num_layers)]
    assert list(scenario.profile().remaining) == pytest.approx(expected)


def test_a_bert_shapes_disabled_ramps_are_its_own_layers(scenario):
    bert = scenario.with_(model="bert-base", threshold=0.69)
    full = bert.profile().remaining
    off = bert.with_(disabled=(1, 7, 8)).profile().remaining
    # nobody leaves at a disabled ramp: they ride on to the next enabled one; elsewhere nothing changes
    assert off[1] == off[0] == full[0] and off[7] == off[8] == full[6]
    assert [off[k] for k in (0, 2, 3, 4, 5, 6, 9, 10, 11)] == [full[k] for k in (0, 2, 3, 4, 5, 6, 9, 10, 11)]
    assert full[1] < full[0] and full[8] < full[6]      # the mix does leave there when the ramps are on


def test_a_bert_shape_stretches_the_encoders_profile_over_its_depth(scenario):
    own = scenario.profile().remaining
    bert = scenario.with_(model="bert-base").profile().remaining
    assert len(bert) == 12 and bert[-1] == 0
    # after layer 2k+1 of 12 BERT has run the same share of its depth as the encoder after layer k of 6
    assert [bert[2 * k + 1] for k in range(5)] == pytest.approx(own[:5])


def test_the_latency_is_each_types_profile_without_the_disabled_ramps(scenario):
    lat = scenario.with_(disabled=(1,)).layer_latency()
    v100 = gpu_profile("v100", "encoder")
    assert lat(2, 8, "v100") == pytest.approx(v100.latency(2, 8))
    assert lat(1, 8, "v100") == pytest.approx(v100.latency(1, 8, ramp=False))
    assert lat(1, 8, "k80") > lat(1, 8, "v100")


def test_the_plan_uses_only_the_gpus_given_and_meets_the_budget(scenario):
    plan = scenario.optimize()
    assert plan and plan.latency_s <= scenario.slo_s * (1 - scenario.slack)
    for gpu, used in plan.gpus_used.items():
        assert used <= scenario.gpus[gpu]


def test_disabling_the_ramps_inside_splits_plans_again_without_them(scenario):
    plan = scenario.with_(slo_s=0.2).optimize()
    inside = inside_ramps(plan.splits)
    assert inside, plan.splits
    again = scenario.with_(slo_s=0.2, disable_inside=True).optimize()
    expected = scenario.with_(slo_s=0.2, disabled=tuple(sorted(inside))).optimize()
    assert (again.splits, again.replicas, again.gpu_types, again.stage_s) == \
        (expected.splits, expected.replicas, expected.gpu_types, expected.stage_s)
    assert again.stage_s != plan.stage_s
    assert inside_ramps([(0, 3), (3, 4), (4, 6)]) == {0, 1, 4}


def test_an_slo_no_plan_meets_gives_an_explained_empty_plan(scenario):
    plan = scenario.with_(slo_s=1e-5).optimize()
    assert not plan and plan.goodput == 0 and plan.reason
    with pytest.raises(WorkbenchError, match="nothing to simulate"):
        scenario.simulate(plan)


def test_the_simulation_serves_the_plans_arrivals(scenario):
    plan = scenario.optimize()
    result = scenario.simulate(plan, requests=400, rate=0.3 * plan.goodput)
    assert len(result.requests) == 400
    assert result.goodput > 0 and result.drop_rate < 0.05


@pytest.mark.parametrize("gpus, message", [
    ("v100=0", "no GPUs"), ({}, "no GPUs"), ("v100=65", "0..64"), ("v100=-1", "0..64"), ("tpu=2", "unknown GPU"),
    ("v100", "TYPE=COUNT"), ("v100=1.5", "whole number")])
def test_bad_gpu_counts_are_refused(gpus, message):
    with pytest.raises(WorkbenchError, match=message):
        parse_gpus(gpus)


@pytest.mark.parametrize("change, message", [
    ({"slo_s": 0}, "the SLO: must be more than 0 ms"), ({"slo_s": 61.0}, "the SLO: must be at most 60000 ms"),
    ({"batch_size": 0}, "the batch per replica: must be at least 1"),
    ({"batch_size": 10**6}, "the batch per replica: must be at most 64 samples"),
    ({"batch_size": 2.5}, "the batch per replica: expected a whole number"),
    ({"easy": 1.2}, r"easy share of a mix: must be at most 1 \(all inputs easy"), ({"threshold": -1}, "exit threshold .*must be at least 0 nats"),
    ({"slack": 1.0}, r"the slack \(a share of the SLO\): must be at most 0.99"),
    ({"model": "gpt"}, "unknown model"), ({"disabled": (5,)}, "cannot be disabled"), ({"slo_s": True}, "the SLO: expected a number of ms, got True"),
    ({"model": "bert-base", "gpus": {"host": 2}}, "host's measured profile"),
    ({"gpus": {"v100": 64, "p100": 64, "k80": 64, "a6000": 64}}, "too many GPUs to plan over")])
def test_bad_knobs_are_refused_before_any_work(change, message):
    with pytest.raises(WorkbenchError, match=message):
        Scenario(preset=PRESET, **change)


def test_the_layer_times_and_transfers_follow_the_tasks_sequence_length(prepared):
    short = Scenario(preset=PRESET, task="sentiment")
    long = Scenario(preset=PRESET, task="bbc")
    assert (short.seq_len, long.seq_len) == (64, 128)
    assert long.layer_latency()(2, 8, "v100") > short.layer_latency()(2, 8, "v100")
    assert long.transfer_s()(1, 8) > short.transfer_s()(1, 8)
    assert short.with_(model="bert-base").seq_len == 128


def test_the_optimizer_takes_a_batch_profile_as_it_is(scenario):
    from workbench.earlyexit.optimizer import optimize_splits

    profile = scenario.profile()
    args = (scenario.layer_latency(), profile, scenario.gpus, scenario.slo_s)
    assert optimize_splits(*args, batch_size=16).splits == \
        optimize_splits(args[0], list(profile.remaining), *args[2:], batch_size=16).splits


def test_numpy_whole_numbers_are_whole_numbers():
    import numpy as np

    assert Scenario(preset=PRESET, batch_size=np.int64(8)).batch_size == 8


# -- a study as its page sets it --------------------------------------------------------------------

def study(**changes):
    from workbench.earlyexit.scenario import StudySettings

    base = dict(task="sentiment", easy=0.8, threshold=0.4, slo_s=0.05, batch_size=16, gpus=(("v100", 4),),
                pattern="poisson", rate=2000.0)
    return StudySettings(**{**base, **changes})


@pytest.mark.parametrize("changes, requests", [
    ({}, 2000),                                                    # the floor: 2000 x 0.05 x 20 is 2000 too
    ({"rate": 3000.0}, 3000),                                      # 20 SLOs of arrivals
    ({"rate": 100.0, "slo_s": 2.0}, 4000),
    ({"rate": 3000.0, "slo_s": 1.0}, 20_000),                      # 60,000 wanted, capped
    ({"pattern": "bursty", "rate": 1000.0}, 10_000),               # 5 on/off cycles of 0.5 s x 4 at 1000/s
])
def test_a_studys_simulation_covers_its_slos_and_bursts_within_the_cap(changes, requests):
    assert study(**changes).sim_requests() == requests


def test_a_study_is_the_engines_scenario_of_its_numbers():
    s = study(gpus=(("v100", 2), ("p100", 1)), batch_size=8)
    sc = s.scenario("quick")
    assert (sc.gpus, sc.batch_size, sc.slo_s, sc.easy, sc.threshold, sc.task, sc.preset) == \
        ({"v100": 2, "p100": 1}, 8, 0.05, 0.8, 0.4, "sentiment", "quick")
    assert hash(s) == hash(study(gpus=(("v100", 2), ("p100", 1)), batch_size=8))      # a memo's key
    with pytest.raises(WorkbenchError, match="no GPUs"):
        study(gpus=()).scenario("quick")


def test_the_stock_model_has_only_its_classifier_and_exit_share_reads_the_last_ramp():
    from workbench.earlyexit.scenario import exit_share, stock_of

    stock = stock_of(Scenario(preset="quick"))
    assert stock.disabled == (0, 1, 2, 3, 4) and stock.num_layers == 6
    assert exit_share((1.0, 0.9, 0.7, 0.6, 0.55, 0.0)) == pytest.approx(0.45)
    assert exit_share((1.0,)) == 0.0


def test_goodput_rows_take_each_plans_baseline_or_zero():
    from types import SimpleNamespace as NS

    from workbench.earlyexit.scenario import GoodputRow, goodput_rows

    plans = {4: NS(goodput=900.0, baseline=NS(goodput=600.0)), 8: NS(goodput=0.0, baseline=None)}
    stock = {4: NS(goodput=0.0, baseline=NS(goodput=400.0)), 8: NS(goodput=0.0, baseline=None)}
    assert goodput_rows(plans, stock) == [GoodputRow(batch=4, e3=900.0, early_exit=600.0, stock=400.0),
                                          GoodputRow(batch=8, e3=0.0, early_exit=0.0, stock=0.0)]
