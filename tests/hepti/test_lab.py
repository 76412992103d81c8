"""The Hepti lab's self-checks: the expected answers are the partitioner's, worked out again here from the cost
model's formulas (memory per mode, shares in proportion to speed, a share capped by memory), and wrong answers
are told why (a hint first, the answer after a few tries)."""
from pathlib import Path

import nbformat
import pytest

from tests.nbrun import check_boxes, execute
from workbench import labs
from workbench.hepti import lab
from workbench.hepti.plan import TILED_2D_FROM, memory_bytes, ws_fixed_bytes

LAB = Path(__file__).resolve().parents[2] / "notebooks" / "labs" / "hepti_lab.ipynb"
RIGHT = {"my_mode": "1d", "my_binding": "compute", "my_twice_share": 0.5}


@pytest.fixture(autouse=True)
def fresh_tries():
    labs.forget_tries()
    yield
    labs.forget_tries()


def whole_model_bytes() -> float:
    """The encoder's 6 layers of weights, float32: Q, K, V, the output projection and the MLP's two matrices."""
    S = lab.shape()
    return lab.num_layers() * (4 * S.hidden ** 2 + 2 * S.hidden * S.ffn) * 4


def tiled_fixed_bytes() -> float:
    """What a tiled device holds whatever its share, 6 layers at T = 128: one head's Q, K, V and W_O columns
    (heads are whole), the biases and norms (9 d + f a layer), and the layer's input, context and output (3 T d)."""
    S = lab.shape()
    d = S.hidden
    return 4 * (6 * (4 * d * d / S.heads + 9 * d + S.ffn) + 3 * S.seq_len * d)


def tiled_per_share_bytes() -> float:
    """Per unit of share: every layer's weights, and one layer's scores, Q, K, V and FFN hidden at T = 128."""
    S = lab.shape()
    return whole_model_bytes() + 4 * (S.heads * S.seq_len ** 2 + 3 * S.seq_len * S.hidden + S.seq_len * S.ffn)


def test_the_lab_is_the_encoder_at_128_positions():
    S = lab.shape()
    assert (S.hidden, S.heads, S.ffn, S.seq_len, lab.num_layers()) == (384, 12, 1536, 128, 6)
    fixed, per_share = tiled_fixed_bytes(), tiled_per_share_bytes()
    assert memory_bytes("1d", S, 1.0, 6) == pytest.approx(fixed + per_share)
    assert per_share == pytest.approx(whole_model_bytes() + 4 * (S.heads * S.seq_len ** 2 + 3 * S.seq_len * S.hidden
                                                                  + S.seq_len * S.ffn))
    g = lab.memory_givens()
    assert g["ws_fixed_MB"] == pytest.approx(33.44, abs=0.01) and g["tiled_whole_model_MB"] == pytest.approx(42.47, abs=0.01)
    assert g["tiled_fixed_MB"] == pytest.approx(1.89, abs=0.01) and g["tiled_per_share_MB"] == pytest.approx(44.63, abs=0.01)


def test_exercise_one_a_secondary_short_of_ws_memory_tiles_the_weights():
    ws_needs = ws_fixed_bytes(lab.shape(), lab.num_layers())
    short = [n for n, _, m, _ in lab.MIXED[1:] if m * 1e9 < ws_needs]
    assert short == [lab.SHORT_DEVICE] and len(lab.MIXED) < TILED_2D_FROM
    assert lab.mode_answer() == lab.partition(lab.MIXED).mode == "1d"
    assert lab.check_mode(" 1D ").right and lab.check_mode("'1d'.").right
    wrong = lab.check_mode("ws")
    assert wrong.status == "wrong" and "every secondary holds what WS needs" in wrong.text and "24 MB" not in wrong.text
    for _ in range(labs.TRIES - 1):
        wrong = lab.check_mode("2d")
    assert "the answer: '1d'" in wrong.text and "C 24 MB" in wrong.text and "so C cannot" in wrong.text
    assert "4 devices < 16" in wrong.text
    assert lab.check_mode("tiled").status == "invalid" and lab.check_mode(None).status == "unanswered"


def test_exercise_two_short_for_ws_is_not_short_when_tiled():
    p = lab.partition(lab.MIXED)
    speeds = [s for _, s, _, _ in lab.MIXED]
    unit = 1 / lab.shape().ffn                    # the mixed-integer program splits whole FFN columns: a device
    # off the critical path may sit a column or two below its proportion
    assert p.shares == pytest.approx([s / sum(speeds) for s in speeds], abs=2 * unit)    # shares follow speed
    c = lab.names(lab.MIXED).index(lab.SHORT_DEVICE)
    assert p.shares[c] * whole_model_bytes() < lab.MIXED[c][2] * 1e9                # C's share fits in its 24 MB
    assert lab.binding_answer() == lab.binding_kind(p) == "compute" and not p.binding.startswith("memory")
    assert lab.check_binding("Compute").right
    wrong = lab.check_binding("memory")
    assert wrong.status == "wrong" and "does not fit" in wrong.text and "20.4 MB" not in wrong.text
    told = lab.check_binding("answer")
    assert told.status == "shown" and f"1.89 MB + {p.shares[c]:.3f} x 44.6 MB = 21.7 MB of its 24 MB" in told.text
    assert p.binding in told.text


def test_exercise_three_twice_as_fast_takes_half():
    speeds = [s for _, s, _, _ in lab.TWICE]
    q = lab.names(lab.TWICE).index(lab.TWICE_DEVICE)
    assert speeds[q] == 2 * speeds[0] == 2 * speeds[2]
    assert lab.twice_share() == pytest.approx(speeds[q] / sum(speeds), abs=1e-6) == pytest.approx(0.5)
    assert lab.partition(lab.TWICE).mode == "ws"
    assert lab.check_twice("0.5").right and lab.check_twice(0.509).right
    high = lab.check_twice(2 / 3)
    assert high.status == "high" and "not twice as fast as both together" in high.text and "0.500" not in high.text
    low = lab.check_twice(1 / 3)
    assert low.status == "low" and "finish together" in low.text
    third = lab.check_twice(0.25)
    assert "the answer: 0.5 (within 0.01)" in third.text and "12 / (6 + 12 + 6) = 0.500" in third.text
    assert lab.check_twice(1.5).status == "impossible" and lab.check_twice(-0.1).status == "impossible"


def test_exercise_four_a_fallen_memory_caps_the_share_and_the_rest_follows_speed():
    cap = (lab.FALLEN_GB * 1e9 - tiled_fixed_bytes()) / tiled_per_share_bytes()
    unit = 1 / lab.shape().ffn                    # whole FFN columns: the most that fits, one column at most below
    assert cap - unit <= lab.capped_share() <= cap and cap == pytest.approx(0.2265, abs=1e-4)
    p = lab.partition(lab.fallen_table())
    assert p.mode == "1d" and lab.binding_kind(p) == "memory" and p.binding.startswith(f"memory of {lab.SHORT_DEVICE}")
    others = [(share, s) for (n, s, _, _), share in zip(lab.MIXED, p.shares) if n != lab.SHORT_DEVICE]
    total = sum(s for _, s in others)
    assert [share for share, _ in others] == pytest.approx([(1 - cap) * s / total for _, s in others], abs=2 * unit)
    assert lab.check_capped(f"{cap + 0.004:.4f}").right
    high = lab.check_capped(0.444)                        # the share its speed earns, as before the fall
    assert high.status == "high" and "cannot hold more than its free memory" in high.text
    low = lab.check_capped(0.1)
    assert low.status == "low" and "as much as its memory lets" in low.text
    told = lab.check_capped("answer")
    assert "(12 MB - 1.89 MB) / 44.63 MB = 0.2265, 0.2259 in whole FFN columns" in told.text
    assert "A 0.310, B 0.309, D 0.155" in told.text


def test_exercise_five_even_shares_wait_for_the_slow_boards():
    g = lab.gain_givens()
    speeds = g["speeds_gflops"]
    compute_s = lambda share, speed: lab.num_layers() * share * g["layer_gflop"] / speed       # noqa: E731
    comm_s = lab.num_layers() * g["all_gather_ms_per_layer"] / 1e3
    by_hand = (compute_s(0.25, min(speeds.values())) + comm_s) / (compute_s(1, sum(speeds.values())) + comm_s)
    assert lab.gain() == pytest.approx(by_hand, rel=1e-2)     # the engine rounds the shares to whole rows
    assert lab.gain() == pytest.approx(1.46, abs=0.01) and abs(lab.gain() - 1.5) < lab.GAIN_TOLERANCE
    assert lab.check_gain("1.5").right and lab.check_gain(lab.gain() - 0.04).right
    high = lab.check_gain(2)                              # fast over slow
    assert high.status == "high" and "summed speed" in high.text
    low = lab.check_gain(1)
    assert low.status == "low" and "every block waits" in low.text
    assert "36 / (4 x 6) = 1.50" in lab.check_gain("answer").text
    assert lab.check_gain(-1).status == "impossible" and lab.check_gain("fast").status == "invalid"


def test_the_questions_state_the_labs_figures():
    text = "\n".join(c.source for c in nbformat.read(LAB, as_version=4).cells if c.cell_type == "markdown")
    for name, speed, memory, _ in lab.MIXED:
        assert f"{name}" in text and f"{speed:g} GFLOP/s" in text and f"{1e3 * memory:g} MB" in text
    assert f"{1e3 * lab.FALLEN_GB:g} MB free" in text
    assert f"within {lab.SHARE_TOLERANCE:g})" in text and f"within {lab.CAP_TOLERANCE:g})" in text
    assert f"within {lab.GAIN_TOLERANCE:g})" in text
    assert "Q at 12 GFLOP/s" in text and "P (the primary) and R at 6 GFLOP/s" in text
    assert "A and B at 12 GFLOP/s, C and D at 6" in text
    assert "10 000 Mbit/s" in text and f"{lab.FAST_MBIT:g}" == "10000"
    assert f"T = {lab.SEQ_LEN}" in text and f"below {TILED_2D_FROM} devices" in text


def test_answers_are_the_checks_right_answers():
    checks = {"my_mode": lab.check_mode, "my_binding": lab.check_binding, "my_twice_share": lab.check_twice,
              "my_capped_share": lab.check_capped, "my_gain": lab.check_gain}
    answers = lab.answers()
    assert set(answers) == set(checks) and {k: answers[k] for k in RIGHT} == RIGHT
    assert all(checks[name](value).right for name, value in answers.items())


def run_lab(answers: dict) -> list[str]:
    """The lab run with ``answers`` typed in: the HTML of each self-check box it showed."""
    return check_boxes(execute(LAB, answers=answers))


@pytest.mark.notebooks
def test_the_lab_with_right_and_with_wrong_answers():
    right = run_lab({"my_mode": " 1D ", "my_binding": "Compute", "my_twice_share": "0.5", "my_capped_share": 0.226,
                     "my_gain": "1.5"})
    assert len(right) == 5 and all("wb-check-right" in box for box in right)
    wrong = run_lab({"my_mode": "ws", "my_binding": "memory", "my_twice_share": 0.667, "my_capped_share": 0.1,
                     "my_gain": 2})
    assert ["wb-check-wrong" in wrong[0], "wb-check-wrong" in wrong[1], "wb-check-high" in wrong[2],
            "wb-check-low" in wrong[3], "wb-check-high" in wrong[4]] == [True] * 5
