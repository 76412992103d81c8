"""Slices of a layer, for every mechanism that splits one over devices: rows by position (Voltage's Algorithm 1),
heads and FFN columns (Megatron-style tensor parallelism, Hepti's modes).

Both run the shipped models' own layers (:class:`~workbench.models.encoder.EncoderLayer`,
:class:`~workbench.models.decoder.DecoderLayer`) from their weights, with no copy of the model:

- :func:`partitioned_layer` computes rows ``start:end`` of an encoder layer's output from the whole
  input, each head in the order Theorem 2 picks (or one forced), equal to those rows of the full
  layer. Eq. (8)'s order drops the key bias and moves the value bias: adding ``q . b_K`` to a whole
  row of scores leaves its softmax unchanged, and the rows of S sum to 1, so ``S (x W_V^T + b_V) =
  (S x) W_V^T + b_V``. Both are exact in real arithmetic.
- :func:`partitioned_decoder_layer` does the same for the decoder's prefill with the causal mask over
  global positions; rotary keys keep Eq. (3) (see :func:`workbench.partition.cost.layer_orders`).
- :func:`tensor_parallel_attention` / :func:`tensor_parallel_ffn` give one device's partial sums of
  Megatron's split; the caller All-Reduces them and finishes with :func:`finish_attention` /
  :func:`finish_ffn`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from workbench.errors import WorkbenchError
from workbench.models.attention import ORDERS, attention_order


def _check_rows(x: torch.Tensor, start: int, end: int) -> int:
    N = x.shape[-2]
    if not 0 <= start <= end <= N:
        raise WorkbenchError(f"rows {start}:{end} are outside the sequence's 0..{N}")
    return N


def causal_bias(start: int, end: int, N: int, dtype=torch.float32) -> torch.Tensor:
    """(end-start, N) additive mask: global row start+i sees columns 0..start+i."""
    rows = torch.arange(start, end)[:, None]
    return torch.where(torch.arange(N)[None, :] <= rows, 0.0, torch.finfo(dtype).min).to(dtype)


def head_orders(layer, N: int, P: int, order: str | Sequence[str] = "auto") -> tuple[str, ...]:
    """The order of each head for P of N rows: Theorem 2's, one for all, or one per head."""
    H, F_H, Fd = layer.cfg.num_heads, layer.cfg.head_dim, layer.cfg.hidden
    if isinstance(order, str):
        if order == "auto":
            return (attention_order(N, P, Fd, F_H),) * H if P else ("qk_first",) * H
        order = (order,) * H
    order = tuple(order)
    if len(order) != H or any(o not in ORDERS for o in order):
        raise WorkbenchError(f"give one order per head ({H}) out of {', '.join(ORDERS)}, got {order!r}")
    return order


def _head_block(weight: torch.Tensor, heads: list[int], H: int, dh: int) -> torch.Tensor:
    """Rows of ``heads`` in a (H dh, F) projection weight as (h, dh, F): a view when they are consecutive (every
    head, in the usual case of one order for all), a copy only for a scattered mix of forced orders."""
    blocks = weight.view(H, dh, weight.shape[-1])
    if heads == list(range(heads[0], heads[0] + len(heads))):
        return blocks[heads[0]:heads[0] + len(heads)]
    return blocks[torch.tensor(heads)]


def _head_bias(bias: torch.Tensor, heads: list[int], H: int, dh: int) -> torch.Tensor:
    return _head_block(bias[:, None], heads, H, dh).transpose(1, 2)                # (h, 1, dh)


def partitioned_attention(layer, x: torch.Tensor, start: int, end: int, orders: Sequence[str],
                          attn_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Context vectors of rows start:end, (B, P, F), before the output projection.

    x (B, N, F); attn_bias broadcastable to (B, H, P, N) (a padding mask (B, 1, 1, N), a causal
    (P, N) mask, or None). The weights are read through views (nothing copied per call); heads of Eq. (3)
    that are all the layer's heads use one product per projection, as the unpartitioned layer does."""
    B, N, Fd = x.shape
    H, dh = layer.cfg.num_heads, layer.cfg.head_dim
    xp = x[:, start:end]                                                           # (B, P, F)
    P = xp.shape[1]
    q = F.linear(xp, layer.query.weight, layer.query.bias).view(B, P, H, dh).transpose(1, 2)   # (B, H, P, dh)
    scale = 1.0 / math.sqrt(dh)
    if set(orders) == {"qk_first"}:                                                # Eq. (3) for every head
        k = F.linear(x, layer.key.weight, layer.key.bias).view(B, N, H, dh).transpose(1, 2)
        v = F.linear(x, layer.value.weight, layer.value.bias).view(B, N, H, dh).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) * scale
        if attn_bias is not None:
            scores = scores + attn_bias
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, P, H * dh)
    out = torch.empty(B, H, P, dh, dtype=x.dtype)
    for order in sorted(set(orders)):
        idx = [h for h, o in enumerate(orders) if o == order]
        sel = slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else torch.tensor(idx)
        qh = q[:, sel]                                                             # (B, h, P, dh)
        wk = _head_block(layer.key.weight, idx, H, dh)                             # (h, dh, F)
        wv = _head_block(layer.value.weight, idx, H, dh)
        bv = _head_bias(layer.value.bias, idx, H, dh)
        if order == "qk_first":                                                    # Eq. (3)
            k = (x[:, None] @ wk.transpose(1, 2)) + _head_bias(layer.key.bias, idx, H, dh)   # (B, h, N, dh)
            v = (x[:, None] @ wv.transpose(1, 2)) + bv
            scores = (qh @ k.transpose(-1, -2)) * scale                            # (B, h, P, N)
        else:                                                                      # Eq. (8)
            scores = ((qh @ wk) @ x[:, None].transpose(-1, -2)) * scale           # (B, h, P, F) -> (B, h, P, N)
        if attn_bias is not None:
            scores = scores + attn_bias
        s = scores.softmax(-1)
        if order == "qk_first":
            out[:, sel] = s @ v                                                    # (B, h, P, dh)
        else:
            out[:, sel] = ((s @ x[:, None]) @ wv.transpose(1, 2)) + bv
    return out.transpose(1, 2).reshape(B, P, H * dh)


def finish_attention(layer, x_rows: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
    """LayerNorm(x_p + projected + b_O): the attention block's end (rows given)."""
    return F.layer_norm(x_rows + projected + layer.attn_out.bias, (x_rows.shape[-1],), layer.ln1.weight,
                        layer.ln1.bias, layer.cfg.layer_norm_eps)


def finish_ffn(layer, h: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
    """LayerNorm(h + projected + b_2): the layer's end."""
    return F.layer_norm(h + projected + layer.ffn2.bias, (h.shape[-1],), layer.ln2.weight, layer.ln2.bias,
                        layer.cfg.layer_norm_eps)


def ffn_rows(layer, h: torch.Tensor) -> torch.Tensor:
    return finish_ffn(layer, h, F.linear(F.gelu(F.linear(h, layer.ffn1.weight, layer.ffn1.bias)), layer.ffn2.weight))


def partitioned_layer(layer, x: torch.Tensor, start: int, end: int, order: str | Sequence[str] = "auto",
                      attn_bias: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """Rows start:end of an encoder layer's output (Algorithm 1), (B, P, F) from x (B, N, F) or (P, F) from (N, F).

    ``order``: "auto" (Theorem 2 per head), "qk_first", "x_first", or one per head. ``attn_bias``: a
    padding mask (B, 1, 1, N); ``causal`` masks each global row's later positions."""
    single = x.dim() == 2
    x = x[None] if single else x
    N = _check_rows(x, start, end)
    orders = head_orders(layer, N, end - start, order)
    if causal:
        mask = causal_bias(start, end, N, x.dtype)
        attn_bias = mask if attn_bias is None else attn_bias + mask
    ctx = partitioned_attention(layer, x, start, end, orders, attn_bias)
    h = finish_attention(layer, x[:, start:end], F.linear(ctx, layer.attn_out.weight))
    out = ffn_rows(layer, h)
    return out[0] if single else out


def partitioned_decoder_layer(layer, x: torch.Tensor, start: int, end: int,
                              positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rows start:end of a decoder layer's prefill output, (P, d) from x (N, d), causal over global
    ``positions`` (default 0..N-1): keys and values of every row, queries of rows start:end only."""
    N = _check_rows(x, start, end)
    positions = torch.arange(N) if positions is None else positions
    k, v = layer.project_kv(x, positions)
    return layer(x[start:end], positions[start:end], k, v, positions)


# -- Megatron-style tensor parallelism: one device's partial sums

def head_rows(layer, heads: Sequence[int]) -> torch.Tensor | slice:
    """The rows of ``heads`` in a (H dh, F) projection weight: a slice (indexing with it gives a view) when the
    heads are consecutive, as every even split's are; an index tensor (a copy) for a scattered set."""
    dh, heads = layer.cfg.head_dim, list(heads)
    if heads and heads == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0] * dh, (heads[0] + len(heads)) * dh)
    idx = torch.as_tensor(heads, dtype=torch.long)
    return (idx[:, None] * dh + torch.arange(dh)).reshape(-1)


def head_context(layer, x: torch.Tensor, heads: Sequence[int], attn_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The attention outputs of ``heads`` over every position, (B, N, len(heads) * F_H), before the output
    projection: columns of W_Q, W_K, W_V (rows of torch's weights) by heads (an R column-wise MatMul)."""
    B, N, Fd = x.shape
    dh, rows = layer.cfg.head_dim, head_rows(layer, heads)
    h = len(heads)
    split = lambda t: t.view(B, N, h, dh).transpose(1, 2)                         # (B, h, N, dh)
    q = split(F.linear(x, layer.query.weight[rows], layer.query.bias[rows]))
    k = split(F.linear(x, layer.key.weight[rows], layer.key.bias[rows]))
    v = split(F.linear(x, layer.value.weight[rows], layer.value.bias[rows]))
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    if attn_bias is not None:
        scores = scores + attn_bias
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, N, h * dh)


def tensor_parallel_attention(layer, x: torch.Tensor, heads: Sequence[int],
                              attn_bias: torch.Tensor | None = None) -> torch.Tensor:
    """This device's part of the attention block's output projection, (B, N, F), for its ``heads``:
    their context times the rows of W_O that read it. Summed over devices, plus b_O, it is the full
    projection."""
    return F.linear(head_context(layer, x, heads, attn_bias), layer.attn_out.weight[:, head_rows(layer, heads)])


def tensor_parallel_ffn(layer, h: torch.Tensor, columns: slice) -> torch.Tensor:
    """This device's part of the FFN's second product, (B, N, F), for FFN ``columns``: columns of W_1
    (rows of torch's weight, with their bias) and rows of W_2. Summed over devices, plus b_2, it is
    the full FFN."""
    inner = F.gelu(F.linear(h, layer.ffn1.weight[columns], layer.ffn1.bias[columns]))
    return F.linear(inner, layer.ffn2.weight[:, columns])
