"""The LLMS lab's self-checks: the expected answers come from the engine and the feedback says why."""
from pathlib import Path

import nbformat
import pytest

from tests.nbrun import check_boxes, execute
from workbench import labs
from workbench.kvcache import lab

LAB = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "kvcache_lab.ipynb"


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


def test_exercise_one_counts_codes_and_the_scales_of_key_channels_and_value_tokens():
    assert lab.chunk_bytes(4) == 30 * 2 * 3 * 16 * 64 // 2 + 30 * 3 * (64 + 16) * 2 * 2 == 120960
    assert lab.check_chunk_bytes("120960").right and lab.check_chunk_bytes(120960.0).right
    assert lab.check_chunk_bytes(92160).status == "low" and "float16 minimum and step" in \
        lab.check_chunk_bytes(92160).text
    assert lab.check_chunk_bytes(10**6).status == "high"
    assert lab.check_chunk_bytes("lots").status == "invalid" and lab.check_chunk_bytes(None).status == "unanswered"


def test_exercise_one_hints_before_it_tells_and_calls_a_negative_size_impossible():
    first = lab.check_chunk_bytes(92160)
    assert first.status == "low" and "120,960" not in first.text and "120960" not in first.text
    for _ in range(labs.TRIES - 2):
        lab.check_chunk_bytes(92160)
    assert "the answer: 120960" in lab.check_chunk_bytes(92160).text
    assert "the answer: 120960" in lab.check_chunk_bytes("answer").text
    impossible = lab.check_chunk_bytes(-1)
    assert impossible.status == "impossible" and "too low" not in impossible.text


def test_exercise_two_shows_the_densities_as_the_question_does():
    question = lab.shown_densities()
    assert question == "0.3, 0.015, 0.06, 0.25, 0.01, 0.02, 0.1, 0.025"
    for _ in range(labs.TRIES):
        told = lab.check_eight_bit_count(5).text
    assert [pair.split("->")[0] for pair in told.split("levels are ")[1].split(":")[0].split(", ")] == \
        question.split(", ")
    assert lab.check_eight_bit_count(-1).status == lab.check_eight_bit_count(9).status == "impossible"
    nb = nbformat.read(LAB, as_version=4)
    assert any("lab.shown_densities()" in c.source for c in nb.cells)


def test_exercise_two_levels_meet_four_bits_with_the_densest_at_eight():
    levels = lab.levels_answer()
    assert levels.tolist() == [8, 2, 4, 8, 2, 2, 4, 2] and levels.mean() == 4
    assert lab.check_eight_bit_count(" 2 ").right
    assert lab.check_eight_bit_count(3).status == "high" and lab.check_eight_bit_count(1).status == "low"


def test_exercise_four_lctru_and_lru_disagree():
    assert lab.eviction_order("lctru") == ["B1", "A0", "B0", "C0", "A1"]
    assert lab.eviction_order("lru") == ["A1", "B0", "B1", "C0", "A0"]
    assert lab.check_first_out("b1").right and lab.check_first_out("B1.").right
    assert lab.check_first_out("b1").text.startswith("right, 'b1'")
    wrong = lab.check_first_out("a1")
    assert wrong.status == "wrong" and "'a1'" in wrong.text and "B1" not in wrong.text
    for _ in range(labs.TRIES - 1):
        wrong = lab.check_first_out("A1")
    assert "the answer: 'B1'" in wrong.text and "plain LRU would start with A1" in wrong.text


def test_exercise_three_follows_the_planner():
    known = lab.PipelineAnswer(tx2=14, mi14=0, ratio_tx2=10.3, ratio_mi14=42.7)
    assert lab.check_pipeline("More", known).right
    assert lab.check_pipeline("fewer", known).status == "wrong" and "14 of 64" in lab.check_pipeline("answer", known).text
    assert lab.check_pipeline("same", lab.PipelineAnswer(tx2=3, mi14=3, ratio_tx2=1, ratio_mi14=1)).right


def run_lab(answers: dict) -> list[str]:
    """The lab run with ``answers`` typed in: the HTML of each self-check box it showed."""
    return check_boxes(execute(LAB, answers=answers))


def pipeline_end_s(costs, recompute: int, load: int, nbytes: int) -> float:
    """When a load that recomputes ``recompute`` chunks and reads ``load`` ends: layer after layer, each
    layer's recompute starting once that layer's reads are done and the previous layer's recompute is."""
    layers = costs.num_layers
    io_s = costs.t_io(load * nbytes, load) / layers
    re_s = costs.t_re(recompute) / layers if recompute else 0.0
    read = done = 0.0
    for _ in range(layers):
        read += io_s
        done = max(done, read) + re_s
    return max(read, done)


def best_recompute_count(costs, chunks: int, nbytes: int) -> int:
    """The fewest chunks to recompute among the fastest loads, found by trying every count (not the planner)."""
    ends = [pipeline_end_s(costs, x, chunks - x, nbytes) for x in range(chunks + 1)]
    return min(range(chunks + 1), key=lambda x: (round(ends[x], 12), x))


def tx2_recomputes_by_search() -> str:
    """Exercise 3's answer found independently of the planner the lab checks against: every split of 64
    missing 8-bit chunks of the decoder tried on the TX2's and the MI14's cost models."""
    from workbench.kvcache.chunks import chunk_nbytes
    from workbench.kvcache.costmodel import device_cost_model, profile_host
    from workbench.models.decoder import load_decoder

    model = load_decoder()
    cfg = model.cfg
    nbytes = chunk_nbytes((cfg.num_layers, 2, cfg.num_kv_heads, 16, cfg.head_dim), 8)
    host = profile_host(model)
    tx2, mi14 = (best_recompute_count(device_cost_model(name, host), 64, nbytes) for name in ("jetson-tx2", "mi14"))
    return "more" if tx2 > mi14 else "fewer" if tx2 < mi14 else "same"


def test_the_search_finds_the_split_that_balances_reading_and_recomputing():
    from dataclasses import replace

    from workbench.kvcache.costmodel import SwapCostModel

    base = SwapCostModel(device="toy", source="emulated", num_layers=4, chunk_size=16, io_fixed_s=0.0,
                         io_per_chunk_s=0.0, read_bytes_per_s=100.0, recompute_fixed_s=0.0,
                         recompute_per_chunk_s=1.0, chunk_bytes={8: 100})
    assert best_recompute_count(base, 10, 100) == 5                     # 5 read (5 s) beside 5 recomputed (5 s)
    assert best_recompute_count(replace(base, recompute_per_chunk_s=20.0), 10, 100) == 0
    assert best_recompute_count(replace(base, read_bytes_per_s=1.0), 10, 100) == 10


@pytest.mark.notebooks
def test_the_lab_with_right_and_with_wrong_answers(prepared):
    pipeline = tx2_recomputes_by_search()
    right = run_lab({"my_bytes": "120960", "my_eight_bit": 2, "my_pipeline": pipeline.title(), "my_first_out": "b1"})
    assert len(right) == 4 and all("wb-check-right" in box for box in right)
    other = next(c for c in lab.MORE_OR_FEWER if c != pipeline)
    wrong = run_lab({"my_bytes": 92160, "my_eight_bit": 5, "my_pipeline": other, "my_first_out": "A1"})
    assert ["wb-check-low" in wrong[0], "wb-check-high" in wrong[1], "wb-check-wrong" in wrong[2],
            "wb-check-wrong" in wrong[3]] == [True] * 4
