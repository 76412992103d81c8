"""The Voltage lab's self-checks: the expected answers are the engine's, counted again here by the paper's
formulas, and wrong answers are told why (a hint first, the answer after a few tries)."""
from pathlib import Path

import nbformat
import pytest

from tests.nbrun import check_boxes, execute
from workbench import labs
from workbench.partition import lab
from workbench.partition.cost import attention_flops, attention_order, comm_bytes

LAB = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "partition_lab.ipynb"
RIGHT = {"my_order": "qk_first", "my_voltage_bytes": 147456, "my_tp_bytes": 589824}


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


def test_exercise_one_is_theorem_two_at_the_encoders_four_way_split():
    N, P, F, F_H = lab.ORDER_POINT
    assert (N, P, F, F_H) == (128, 128 // 4, lab.shape().hidden, lab.shape().head_dim)
    assert lab.order_answer() == attention_order(N, P, F, F_H) == "qk_first"
    assert attention_flops("qk_first", N, P, F, F_H) < attention_flops("x_first", N, P, F, F_H)
    assert lab.check_order(" QK_first. ").right
    wrong = lab.check_order("x_first")
    assert wrong.status == "wrong" and "(F - F_H)/(F F_H)" in wrong.text and "0.0286" not in wrong.text
    for _ in range(labs.TRIES - 1):
        wrong = lab.check_order("x_first")
    assert "the answer: 'qk_first'" in wrong.text and "0.0234 is not above" in wrong.text and "0.0286" in wrong.text
    assert lab.check_order("Eq. 3").status == "invalid" and lab.check_order(None).status == "unanswered"


def test_exercises_two_and_three_count_the_papers_bytes():
    K, N, F = lab.BYTES_DEVICES, lab.SEQ_LEN, lab.shape().hidden
    assert lab.bytes_sent("voltage") == (K - 1) * (N // K) * F * 4 == comm_bytes("voltage", N, F, K) == 147456
    assert lab.bytes_sent("tensor_parallel") == 4 * lab.bytes_sent("voltage") == 589824
    assert lab.check_voltage_bytes("147456").right and lab.check_voltage_bytes(147456.0).right
    assert lab.check_tp_bytes(" 589824 ").right


def test_a_wrong_count_of_bytes_is_told_which_way_and_why_before_the_answer():
    high = lab.check_voltage_bytes(589824)             # the whole activation to each of the others
    assert high.status == "high" and "only the rows it computed" in high.text and "147" not in high.text
    low = lab.check_voltage_bytes(49152)               # its rows once, to one device
    assert low.status == "low" and "every one of the 3 others" in low.text
    told = lab.check_voltage_bytes(49152)
    assert "the answer: 147456" in told.text and "3 x 32 x 384 x 4" in told.text
    assert lab.check_tp_bytes(147456).status == "low" and "twice per layer" in lab.check_tp_bytes(147456).text
    assert lab.check_tp_bytes(4 * 589824).status == "high"
    assert lab.check_tp_bytes(-1).status == "impossible" and lab.check_tp_bytes(12.5).status == "invalid"
    assert "4x Voltage's" in lab.check_tp_bytes("answer").text


def test_exercise_four_is_the_plans_prediction_and_the_sum_by_hand():
    given = lab.latency_givens()
    rate, lat = given["bandwidth_mbit"] * 1e6 / 8, given["link_latency_ms"]
    by_hand = (lat + 1e3 * given["input_bytes_sent_by_terminal"] / rate
               + (given["layers"] - 1) * (given["compute_ms_per_layer"] + lat
                                          + 1e3 * given["bytes_sent_per_layer"] / rate)
               + given["compute_ms_per_layer"] + lat + 1e3 * given["last_layer_bytes_received_by_terminal"] / rate)
    assert given["input_bytes_sent_by_terminal"] == 3 * 128 * 384 * 4
    assert given["last_layer_bytes_received_by_terminal"] == 3 * 32 * 384 * 4
    assert lab.predicted_ms() == pytest.approx(1e3 * lab.latency_plan().predicted_s)
    assert lab.predicted_ms() == pytest.approx(by_hand, abs=0.01)
    assert lab.check_latency(f"{lab.predicted_ms() + 0.9:.2f} ms").right
    assert lab.check_latency(lab.predicted_ms() - 0.9).right
    compute_only = lab.check_latency(given["layers"] * given["compute_ms_per_layer"])
    assert compute_only.status == "low" and "All-Gather" in compute_only.text and "(within 1 ms)" in compute_only.text
    four_times = lab.check_latency(4 * lab.predicted_ms())
    assert four_times.status == "high" and "at the same time" in four_times.text
    assert lab.check_latency(-3).status == "impossible"


def test_exercise_five_is_where_the_plans_cross():
    mbit = lab.break_even_mbit()
    tp = lambda m: lab.plan("tensor_parallel", lab.BREAK_EVEN_DEVICES, m).predicted_s
    one = lab.plan("single", lab.BREAK_EVEN_DEVICES).predicted_s
    assert tp(mbit - 0.5) > one > tp(mbit + 0.5)
    g = lab.break_even_givens()
    spare_s = (g["single_ms_per_layer"] - g["tp_compute_ms_per_layer"]
               - g["all_reduces_per_layer"] * g["latency_ms_per_all_reduce"]) / 1e3
    assert mbit == pytest.approx(g["bytes_sent_per_layer"] * 8 / spare_s / 1e6, rel=1e-3)
    assert lab.check_break_even(f"{mbit + 4:.1f} Mbit/s").right
    assert lab.check_break_even(mbit + 20).status == "high" and lab.check_break_even(mbit / 2).status == "low"
    assert "slower than one device" in lab.check_break_even("answer").text


def test_exercise_six_the_slowest_part_is_not_the_one_rows_over_speed_points_at():
    rows, times = lab.uneven_rows(), lab.uneven_ms()
    assert sum(rows.values()) == lab.SEQ_LEN
    seconds = next(s for s in lab.uneven_plan().steps if s.kind == "compute").seconds
    assert lab.bottleneck() == max(times, key=times.get) == lab.UNEVEN[seconds.index(max(seconds))][0] == "D"
    speeds = dict(lab.UNEVEN)
    assert max(rows, key=lambda n: rows[n] / speeds[n]) == "A"          # the trap the exercise sets
    assert lab.check_bottleneck("d").right and lab.check_bottleneck(' "D" ').right
    naive = lab.check_bottleneck("A")
    assert naive.status == "wrong" and "costs per row" in naive.text and "17.9" not in naive.text
    for _ in range(labs.TRIES - 1):
        naive = lab.check_bottleneck("A")
    assert "the answer: 'D'" in naive.text and "Rows over speed points at A" in naive.text
    assert lab.check_bottleneck("E").status == "invalid"


def test_the_questions_state_the_labs_figures():
    text = "\n".join(c.source for c in nbformat.read(LAB, as_version=4).cells if c.cell_type == "markdown")
    N, P, F, F_H = lab.ORDER_POINT
    assert f"F = {F}, F_H = {F_H}) at N = {N}" in text and f"P = {P}" in text
    assert f"over {lab.BYTES_DEVICES} devices" in text
    assert f"{lab.LATENCY[1]:g} Mbit/s" in text and f"within {lab.LATENCY_TOLERANCE_MS:g} ms" in text
    assert f"within {lab.BREAK_EVEN_TOLERANCE_MBIT:g} Mbit/s" in text
    *first, last = (f"{round(100 * s)} %" for s in lab.UNEVEN_SHARES)
    shares = f"{', '.join(first)} and {last}"
    assert shares in text
    assert all(f"{name} " in text for name, _ in lab.UNEVEN)


def test_answers_are_the_checks_right_answers():
    checks = {"my_order": lab.check_order, "my_voltage_bytes": lab.check_voltage_bytes,
              "my_tp_bytes": lab.check_tp_bytes, "my_latency_ms": lab.check_latency,
              "my_break_even_mbit": lab.check_break_even, "my_bottleneck": lab.check_bottleneck}
    answers = lab.answers()
    assert set(answers) == set(checks) and {k: answers[k] for k in RIGHT} == RIGHT
    assert all(checks[name](value).right for name, value in answers.items())


def run_lab(answers: dict) -> list[str]:
    """The lab run with ``answers`` typed in: the HTML of each self-check box it showed."""
    return check_boxes(execute(LAB, answers=answers))


@pytest.mark.notebooks
def test_the_lab_with_right_and_with_wrong_answers():
    right = run_lab({"my_order": "QK_first", "my_voltage_bytes": "147456", "my_tp_bytes": 589824,
                     "my_latency_ms": "169.4 ms", "my_break_even_mbit": 158, "my_bottleneck": "d"})
    assert len(right) == 6 and all("wb-check-right" in box for box in right)
    wrong = run_lab({"my_order": "x_first", "my_voltage_bytes": 589824, "my_tp_bytes": 147456,
                     "my_latency_ms": 107, "my_break_even_mbit": 300, "my_bottleneck": "A"})
    assert ["wb-check-wrong" in wrong[0], "wb-check-high" in wrong[1], "wb-check-low" in wrong[2],
            "wb-check-low" in wrong[3], "wb-check-high" in wrong[4], "wb-check-wrong" in wrong[5]] == [True] * 6
