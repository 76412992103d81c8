"""The cost model of partitioned inference: FLOPs, bytes of every collective, seconds on a device profile.

Pure Python (no torch): the dashboards' first figures and the planner read it at once, and the
runtime pads its emulated compute and communication to the seconds it gives.

FLOPs follow the Voltage paper's count Gamma: a product of an (a x b) and a (b x c) matrix costs
a*b*c "floating operations" (multiply-adds). Seconds on a device use 2*Gamma FLOPs, as the
shared :class:`~workbench.devices.DeviceProfile` counts FLOP/s.

Bytes follow what the runtime really sends (:mod:`workbench.partition.runtime` counts the tensors
it hands to each collective):

- All-Gather of parts (Voltage, one per layer): a device sends its own part to each of the K-1
  others and receives every other part. Evenly split, a device sends (K-1)NF/K elements.
- All-Reduce (tensor parallelism, two per layer) as a ring: the tensor is cut into K chunks;
  over K-1 reduce-scatter steps and K-1 all-gather steps a device sends every chunk but two.
  Evenly split, 2(K-1)NF/K elements, so a layer's two cost 4(K-1)NF/K: four times Voltage's.
- Send (the layer pipeline): one device's whole activation to the next.
- Voltage's Algorithm 2 in full: the terminal broadcasts the N x F input to the K-1 others before the first
  layer (it sends (K-1)NF elements), every layer but the last ends in an All-Gather, and the last layer's parts
  go to the terminal only (it receives (N-P_0)F).

Time of a collective on a switch with one full-duplex link per device (the shaped network's
topology): each device's bytes go through its own link, so it takes the steps' latencies plus
the slowest device's bytes over its bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from workbench.errors import WorkbenchError
from workbench.network import NETWORKS, check_network, collective_s  # noqa: F401  (the cost model's names)

Order = Literal["qk_first", "x_first"]
ORDERS: tuple[str, ...] = ("qk_first", "x_first")
"""Theorem 2's two candidates: Eq. (3) computes Q_p, K and V first; Eq. (8) multiplies x in last."""

SCORE_ORDERS: tuple[str, ...] = ("((xp Wq) Wk^T) x^T", "(xp Wq)(Wk^T x^T)", "(xp (Wq Wk^T)) x^T",
                                 "xp ((Wq Wk^T) x^T)", "xp (Wq (Wk^T x^T))")
"""The five orders of x_p W_Q W_K^T x^T, Eqs. (10)-(14)."""
VALUE_ORDERS: tuple[str, ...] = ("S (x Wv)", "(S x) Wv")
"""The two orders of S x W_V, Eq. (6)."""

DTYPE_BYTES = 4
"""Activations travel as float32."""


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


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a model's cost; the shipped models and the paper's, as random layers of their shapes."""
    name: str
    title: str
    hidden: int                     # F
    heads: int                      # H
    ffn: int                        # d_ff
    num_layers: int
    kind: Literal["encoder", "decoder"] = "encoder"
    kv_heads: int = 0               # 0: as many as heads (no grouped-query attention)
    ffn_matrices: int = 2           # 2 (BERT: in, out) or 3 (Llama: gate, up, down)
    rotary: bool = False            # keys rotated by position: Eq. (8)'s score order does not apply
    causal: bool = False
    shipped: bool = False           # the real pretrained weights (else random weights of this shape)
    max_positions: int = 512        # the longest input its position embeddings (or context) allow

    @property
    def head_dim(self) -> int:      # F_H
        return self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def layer_params(self) -> int:
        F, kv = self.hidden, self.num_kv_heads * self.head_dim
        return 2 * F * F + 2 * F * kv + self.ffn_matrices * F * self.ffn


SHAPES: dict[str, ModelShape] = {
    "encoder": ModelShape("encoder", "shipped encoder (all-MiniLM-L6-v2)", 384, 12, 1536, 6, shipped=True),
    "decoder": ModelShape("decoder", "shipped decoder prefill (SmolLM2-135M)", 576, 9, 1536, 30, kind="decoder",
                          kv_heads=3, ffn_matrices=3, rotary=True, causal=True, shipped=True, max_positions=8192),
    "bert-large": ModelShape("bert-large", "BERT-Large shape (random weights)", 1024, 16, 4096, 24),
    "gpt2": ModelShape("gpt2", "GPT-2 shape (random weights, causal)", 768, 12, 3072, 12, causal=True,
                       max_positions=1024),
    "vit": ModelShape("vit", "ViT-Base/16 shape (random weights; 197 patch tokens at 224 x 224)", 768, 12, 3072, 12),
}
"""Models the runtime runs: the two shipped ones and the Voltage paper's shapes."""


def get_shape(name: str) -> ModelShape:
    from workbench.errors import UnknownNameError

    if name not in SHAPES:
        raise UnknownNameError("model", name, SHAPES)
    return SHAPES[name]


def layer_orders(shape: ModelShape, N: int, P: int, policy: str = "auto") -> tuple[str, ...]:
    """The order each head of a layer uses for P of N rows: Theorem 2's (``"auto"``), or one forced.

    A rotary model keeps Eq. (3): its keys are rotated by position after x W_K, so x^T cannot be
    multiplied in last (the V side could be, but one order per head keeps the count simple)."""
    if policy not in ("auto", *ORDERS):
        raise WorkbenchError(f"attention order policy must be auto, qk_first or x_first, got {policy!r}")
    if shape.rotary:
        return ("qk_first",) * shape.heads
    order = attention_order(N, P, shape.hidden, shape.head_dim) if policy == "auto" else policy
    return (order,) * shape.heads


def voltage_layer_gamma(shape: ModelShape, N: int, P: int, orders: Sequence[str] | None = None) -> float:
    """Gamma of one layer computing P of N positions (Algorithm 1): attention per head in its order, the
    output projection and the position-wise FFN on P rows. P = N is the whole layer on one device."""
    if P == 0:
        return 0.0
    F, F_H = shape.hidden, shape.head_dim
    orders = layer_orders(shape, N, P) if orders is None else orders
    if shape.num_kv_heads != shape.heads:
        kv = shape.num_kv_heads * F_H
        attention = P * F * F + 2 * N * F * kv + 2 * P * N * F
    else:
        attention = sum(attention_flops(o, N, P, F, F_H) for o in orders)
    return attention + P * F * F + shape.ffn_matrices * P * F * shape.ffn


def tensor_parallel_gammas(shape: ModelShape, N: int, heads: int, ffn: int) -> tuple[float, float]:
    """Gamma of a device's attention part (``heads`` heads and their output-projection rows) and FFN part
    (``ffn`` columns) over all N positions, Megatron-style."""
    F, F_H = shape.hidden, shape.head_dim
    attention = 3 * N * F * heads * F_H + 2 * N * N * heads * F_H + N * heads * F_H * F
    return attention, shape.ffn_matrices * N * F * ffn


# -- bytes

def split_counts(total: int, parts: int) -> list[int]:
    """``total`` items cut into ``parts`` near-equal contiguous pieces, the first ones one longer."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


@dataclass(frozen=True)
class Traffic:
    """Bytes one device sends and receives in one collective (or one layer)."""
    sent: int
    received: int

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.sent + other.sent, self.received + other.received)


def all_gather_traffic(part_elements: Sequence[int], dtype_bytes: int = DTYPE_BYTES) -> list[Traffic]:
    """Each device sends its part to the K-1 others and receives the rest."""
    K, total = len(part_elements), sum(part_elements)
    return [Traffic((K - 1) * p * dtype_bytes, (total - p) * dtype_bytes) for p in part_elements]


def gather_traffic(part_elements: Sequence[int], dtype_bytes: int = DTYPE_BYTES, root: int = 0) -> list[Traffic]:
    """Every device sends its part to ``root`` only (Algorithm 2's last layer); the root receives the rest."""
    total = sum(part_elements)
    return [Traffic(0, (total - p) * dtype_bytes) if i == root else Traffic(p * dtype_bytes, 0)
            for i, p in enumerate(part_elements)]


def all_reduce_traffic(elements: int, K: int, dtype_bytes: int = DTYPE_BYTES) -> list[Traffic]:
    """A ring All-Reduce of ``elements`` over K devices: chunk i+1 is the one device i never sends in the
    reduce-scatter, chunk i+2 the one it never sends in the all-gather."""
    if K == 1:
        return [Traffic(0, 0)]
    chunks = split_counts(elements, K)
    return [Traffic((2 * elements - chunks[(i + 1) % K] - chunks[(i + 2) % K]) * dtype_bytes,
                    (2 * elements - chunks[i] - chunks[(i + 1) % K]) * dtype_bytes) for i in range(K)]


def comm_bytes(scheme: str, N: int, F: int, K: int, dtype_bytes: int = DTYPE_BYTES) -> float:
    """Bytes a device sends per layer, averaged over the K devices of an even split: (K-1)NF/K elements
    for ``"voltage"`` (one All-Gather), 4(K-1)NF/K for ``"tensor_parallel"`` (two ring All-Reduces).
    Per device, :func:`layer_traffic` gives the exact integers the runtime counts."""
    if scheme == "voltage":
        traffic = all_gather_traffic([n * F for n in split_counts(N, K)], dtype_bytes)
    elif scheme == "tensor_parallel":
        traffic = [t + t for t in all_reduce_traffic(N * F, K, dtype_bytes)]
    else:
        raise WorkbenchError(f"comm_bytes knows voltage and tensor_parallel, got {scheme!r}")
    return sum(t.sent for t in traffic) / K


