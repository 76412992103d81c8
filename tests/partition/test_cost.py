"""The cost model against the Voltage paper's equations, counted independently here."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import WorkbenchError
from workbench.partition.cost import (ORDERS, SHAPES, Traffic, all_gather_traffic, all_reduce_traffic,
                                      attention_flops, attention_order, candidate_gammas, comm_bytes,
                                      split_counts)


def matmul(a, b, c):
    """Gamma of an (a x b) times (b x c) product, the paper's count."""
    return a * b * c


def ten_orders(N, P, F, FH):
    """The ten candidate orders of one head, each counted as its chain of products (W_Q W_K^T precomputed)."""
    scores = [
        matmul(P, F, FH) + matmul(P, FH, F) + matmul(P, F, N),            # ((xp Wq) Wk^T) x^T    (10)
        matmul(P, F, FH) + matmul(FH, F, N) + matmul(P, FH, N),           # (xp Wq)(Wk^T x^T)     (11)
        matmul(P, F, F) + matmul(P, F, N),                                # (xp (Wq Wk^T)) x^T    (12)
        matmul(F, F, N) + matmul(P, F, N),                                # xp ((Wq Wk^T) x^T)    (13)
        matmul(FH, F, N) + matmul(F, FH, N) + matmul(P, F, N),            # xp (Wq (Wk^T x^T))    (14)
    ]
    values = [matmul(P, N, FH) + matmul(N, F, FH),                        # S (x Wv)
              matmul(P, N, F) + matmul(P, F, FH)]                         # (S x) Wv
    return [s + v for s in scores for v in values]


def test_the_ten_orders_are_the_papers_equations():
    """Eqs. (10)-(14) and (6) as printed (Eq. 14's last term as its chain counts it, P F N), for one point:
    the model's ten candidates are those sums and the chains' counts."""
    N, P, F, FH = 300, 50, 1024, 64
    eq10, eq11, eq12, eq13, eq14 = (2 * P * F * FH + P * F * N, P * F * FH + N * F * FH + P * N * FH,
                                    P * F * F + P * F * N, N * F * F + P * F * N, 2 * N * F * FH + P * F * N)
    eq6 = (P * N * FH + N * F * FH, P * N * F + P * F * FH)
    expected = sorted(s + v for s in (eq10, eq11, eq12, eq13, eq14) for v in eq6)
    assert sorted(candidate_gammas(N, P, F, FH).values()) == expected
    assert sorted(ten_orders(N, P, F, FH)) == expected


@settings(max_examples=300, deadline=None)
@given(heads=st.sampled_from([2, 3, 4, 8, 12, 16]), head_dim=st.integers(1, 256), N=st.integers(1, 600),
       data=st.data())
def test_theorem_2_picks_the_cheapest_of_the_ten_orders(heads, head_dim, N, data):
    F = heads * head_dim
    P = data.draw(st.integers(1, N))
    best = min(candidate_gammas(N, P, F, head_dim).values())
    chosen = attention_order(N, P, F, head_dim)
    assert attention_flops(chosen, N, P, F, head_dim) == best
    other = {"qk_first": "x_first", "x_first": "qk_first"}[chosen]
    assert attention_flops(other, N, P, F, head_dim) >= best


def test_the_order_flips_where_theorem_2_says():
    """The shipped encoder (F=384, F_H=32) at N=128: threshold (F-F_H)/(F F_H) = 352/12288 = 0.0286.
    P=32 (K=4): 1/32 - 1/128 = 0.0234, Eq. (3); P=16 (K=8): 0.0547, Eq. (8)."""
    assert attention_order(128, 32, 384, 32) == "qk_first"
    assert attention_order(128, 16, 384, 32) == "x_first"
    assert attention_order(128, 128, 384, 32) == "qk_first"       # one device: the usual order is best


def test_theorem_1_and_3_totals():
    N, P, F, FH = 200, 25, 1024, 256
    assert attention_flops("qk_first", N, P, F, FH) == P * F * FH + 2 * N * F * FH + 2 * P * N * FH
    assert attention_flops("x_first", N, P, F, FH) == 3 * P * F * FH + 2 * P * N * F


@pytest.mark.parametrize("F_H", [1, 8, 64, 384])
@pytest.mark.parametrize("N", [1, 5, 128, 512])
def test_one_head_is_outside_theorem_2_and_refused_with_the_reason(F_H, N):
    """With one head (F = F_H) the theorem's pick can cost up to 1.49x the cheapest of the ten orders: the
    order is refused with the reason, for every P, and the explicit orders still count."""
    worst = 1.0
    for P in range(1, N + 1):
        with pytest.raises(WorkbenchError, match="H >= 2 heads.*force an order"):
            attention_order(N, P, F_H, F_H)
        picked = "x_first" if (N - P) * F_H * F_H > P * N * 0 else "qk_first"       # the formula's pick at F = F_H
        worst = max(worst, attention_flops(picked, N, P, F_H, F_H) / min(candidate_gammas(N, P, F_H, F_H).values()))
    assert attention_flops("qk_first", N, 1, F_H, F_H) > 0
    if N > 1:
        assert worst > 1.0          # the case the refusal guards: the theorem's formula would pick a dearer order
    with pytest.raises(WorkbenchError, match="H >= 2 heads"):
        attention_order(N, 1, 3 * F_H + 1, F_H) if F_H > 1 else attention_order(N, 1, F_H, F_H)


def test_bad_attention_sizes_are_refused():
    with pytest.raises(WorkbenchError, match="longer than the sequence"):
        attention_order(10, 11, 64, 16)
    with pytest.raises(WorkbenchError, match="order must be one of"):
        attention_flops("sideways", 10, 5, 64, 16)
    with pytest.raises(WorkbenchError, match="N must be a whole number"):
        attention_order(0, 0, 64, 16)


@pytest.mark.parametrize("K", [2, 3, 4, 6])
@pytest.mark.parametrize("N", [128, 200, 7 * 13])
def test_voltage_sends_a_quarter_of_tensor_parallel(N, K):
    F = 384
    assert comm_bytes("voltage", N, F, K) == (K - 1) * N * F / K * 4
    assert comm_bytes("tensor_parallel", N, F, K) == 4 * (K - 1) * N * F / K * 4
    assert comm_bytes("tensor_parallel", N, F, K) == 4 * comm_bytes("voltage", N, F, K)


def simulate_ring_all_reduce(elements, K):
    """Walk the ring (reduce-scatter then all-gather) step by step and add up what each device sends."""
    chunks = split_counts(elements, K)
    sent, received = [0] * K, [0] * K
    for phase in (0, 1):
        for step in range(K - 1):
            for i in range(K):
                c = (i - step) % K if phase == 0 else (i + 1 - step) % K
                sent[i] += chunks[c]
                received[(i + 1) % K] += chunks[c]
    return sent, received


@pytest.mark.parametrize("elements,K", [(12, 2), (12, 3), (13, 4), (128 * 384, 6), (5, 5), (1, 3)])
def test_ring_all_reduce_bytes_are_what_the_ring_sends(elements, K):
    sent, received = simulate_ring_all_reduce(elements, K)
    assert all_reduce_traffic(elements, K, dtype_bytes=1) == [Traffic(s, r) for s, r in zip(sent, received)]


def test_all_gather_of_unequal_parts():
    assert all_gather_traffic([3, 0, 5], dtype_bytes=2) == [Traffic(12, 10), Traffic(0, 16), Traffic(20, 6)]


def test_shapes_of_the_paper_and_the_shipped_models():
    assert (SHAPES["bert-large"].hidden, SHAPES["bert-large"].heads, SHAPES["bert-large"].num_layers) == (1024, 16, 24)
    assert SHAPES["encoder"].head_dim == 32 and SHAPES["decoder"].num_kv_heads == 3
    assert set(ORDERS) == {"qk_first", "x_first"}
    assert split_counts(10, 4) == [3, 3, 2, 2] and sum(split_counts(7, 7)) == 7
    assert list(itertools.accumulate(split_counts(10, 3))) == [4, 7, 10]
