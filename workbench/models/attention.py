"""What one head's attention costs in each order of its matrix products (the Voltage paper's Gamma count and its
Theorem 2's choice): pure arithmetic on the layer's sizes, shared by the cost models and the layers that compute
P of N rows in the order chosen."""
from __future__ import annotations

from typing import Literal

from workbench.errors import WorkbenchError

Order = Literal["qk_first", "x_first"]
ORDERS: tuple[str, ...] = ("qk_first", "x_first")
"""Theorem 2's two candidates: Eq. (3) computes Q_p, K and V first; Eq. (8) multiplies x in last."""

SCORE_ORDERS: tuple[str, ...] = ("((xp Wq) Wk^T) x^T", "(xp Wq)(Wk^T x^T)", "(xp (Wq Wk^T)) x^T",
                                 "xp ((Wq Wk^T) x^T)", "xp (Wq (Wk^T x^T))")
"""The five orders of x_p W_Q W_K^T x^T, Eqs. (10)-(14)."""
VALUE_ORDERS: tuple[str, ...] = ("S (x Wv)", "(S x) Wv")
"""The two orders of S x W_V, Eq. (6)."""



def score_gamma(index: int, N: int, P: int, F: int, F_H: int) -> float:
    """Gamma of score order ``index`` (0..4 for Eqs. 10..14).

    Eq. (14) is printed as 2 N F F_H + P N F_H; its last product, x_p (P x F) times an F x N matrix,
    costs P F N, which is what is counted here. Either way Eq. (11) is never dearer (P <= N), so the
    choice is the same."""
    return (2 * P * F * F_H + P * F * N,
            P * F * F_H + N * F * F_H + P * N * F_H,
            P * F * F + P * F * N,
            N * F * F + P * F * N,
            2 * N * F * F_H + P * F * N)[index]


def value_gamma(index: int, N: int, P: int, F: int, F_H: int) -> float:
    """Gamma of value order ``index`` (0: S(xW_V), 1: (Sx)W_V), Eq. (6)."""
    return (P * N * F_H + N * F * F_H, P * N * F + P * F * F_H)[index]


def candidate_gammas(N: int, P: int, F: int, F_H: int) -> dict[tuple[str, str], float]:
    """Gamma of each of the ten orders of one head's attention (five score orders x two value orders)."""
    return {(SCORE_ORDERS[s], VALUE_ORDERS[v]): score_gamma(s, N, P, F, F_H) + value_gamma(v, N, P, F, F_H)
            for s in range(5) for v in range(2)}


def _check_attention(N: int, P: int, F: int, F_H: int) -> None:
    for name, value in (("N", N), ("P", P), ("F", F), ("F_H", F_H)):
        if not (isinstance(value, int) or float(value).is_integer()) or value < 1:
            raise WorkbenchError(f"{name} must be a whole number >= 1, got {value!r}")
    if P > N:
        raise WorkbenchError(f"a partition of {P} positions is longer than the sequence's {N}")
    if F_H > F:
        raise WorkbenchError(f"a head's width F_H={F_H} exceeds the layer's F={F}")


def order_threshold(F: int, F_H: int) -> float:
    """(F - F_H) / (F F_H): Theorem 2 picks Eq. (8) once 1/P - 1/N exceeds it."""
    return (F - F_H) / (F * F_H)


def attention_order(N: int, P: int, F: int, F_H: int) -> Order:
    """Theorem 2: the cheaper order to compute P of N rows of one head's attention.

    ``"x_first"`` (Eq. 8, ((x_p W_Q) W_K^T) x^T, then (S x) W_V) when 1/P - 1/N > (F - F_H)/(F F_H),
    else ``"qk_first"`` (Eq. 3: Q_p, K and V computed first). The comparison is made in integers,
    so a point exactly on the boundary keeps Eq. (3), as the theorem states.

    The theorem assumes F = H F_H with H >= 2 heads; outside it (one head: F = F_H) its pick can cost 1.49x the
    cheapest of the ten orders (:func:`candidate_gammas`), so such a shape is refused with the reason."""
    _check_attention(N, P, F, F_H)
    if F % F_H or F < 2 * F_H:
        raise WorkbenchError(f"Theorem 2 assumes F = H x F_H with H >= 2 heads; F={F}, F_H={F_H} is outside it "
                             f"(its pick there can cost 1.49x the cheapest order): force an order, "
                             f"{' or '.join(ORDERS)}")
    return "x_first" if (N - P) * F * F_H > P * N * (F - F_H) else "qk_first"


def attention_flops(order: str, N: int, P: int, F: int, F_H: int) -> float:
    """Gamma of one head's attention over P of N rows in ``order`` (the softmax's O(PN) left out).

    ``"qk_first"``: P F F_H + 2 N F F_H + 2 P N F_H (Theorem 1); ``"x_first"``: 3 P F F_H + 2 P N F
    (Theorem 3)."""
    _check_attention(N, P, F, F_H)
    if order == "qk_first":
        return score_gamma(1, N, P, F, F_H) + value_gamma(0, N, P, F, F_H)
    if order == "x_first":
        return score_gamma(0, N, P, F, F_H) + value_gamma(1, N, P, F, F_H)
    raise WorkbenchError(f"attention order must be one of {', '.join(ORDERS)}, got {order!r}")
