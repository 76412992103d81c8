"""Partitioned layers equal rows of the full layer, in both attention orders, on the shipped weights too."""
from __future__ import annotations

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.models.encoder import EncoderConfig, EncoderLayer
from workbench.models.attention import attention_flops
from workbench.models.slices import (causal_bias, finish_attention, finish_ffn, head_orders, partitioned_attention,
                                     partitioned_decoder_layer,
                                        partitioned_layer, tensor_parallel_attention, tensor_parallel_ffn)

ATOL = 2e-5


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    layer = EncoderLayer(EncoderConfig(hidden=64, num_heads=4, ffn=128)).eval()
    with torch.no_grad():                                  # biases away from zero, so dropping one would show
        for lin in (layer.query, layer.key, layer.value, layer.attn_out, layer.ffn1, layer.ffn2):
            lin.bias.normal_(0, 0.5)
    return layer, torch.randn(2, 20, 64)


@pytest.mark.parametrize("order", ["qk_first", "x_first", "auto", ("qk_first", "x_first", "x_first", "qk_first"),
                                   ("x_first", "qk_first", "x_first", "qk_first")])
@pytest.mark.parametrize("start,end", [(0, 20), (3, 9), (19, 20), (0, 1)])
def test_rows_equal_the_full_layer(small, order, start, end):
    layer, x = small
    with torch.no_grad():
        full = layer(x)
        part = partitioned_layer(layer, x, start, end, order)
    assert part.shape == (2, end - start, 64)
    torch.testing.assert_close(part, full[:, start:end], atol=ATOL, rtol=0)


def test_padding_mask_and_causal_mask(small):
    layer, x = small
    mask = torch.ones(2, 20)
    mask[1, 15:] = 0
    bias = ((1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min)
    with torch.no_grad():
        torch.testing.assert_close(partitioned_layer(layer, x, 4, 11, "x_first", attn_bias=bias),
                                   layer(x, bias)[:, 4:11], atol=ATOL, rtol=0)
        torch.testing.assert_close(partitioned_layer(layer, x, 4, 11, "x_first", causal=True),
                                   layer(x, causal_bias(0, 20, 20))[:, 4:11], atol=ATOL, rtol=0)


def test_the_shipped_encoder_layer_at_both_orders():
    from workbench.models.encoder import load_pretrained_encoder

    layer = load_pretrained_encoder().layers[2].eval()
    x = torch.randn(1, 128, 384)
    with torch.no_grad():
        full = layer(x)
        for order in ("qk_first", "x_first"):
            torch.testing.assert_close(partitioned_layer(layer, x, 96, 128, order), full[:, 96:], atol=1e-4, rtol=0)


def _counted_flops(layer, x, start, end, orders) -> int:
    """FLOPs of the matrix products the partitioned attention really runs (torch's counter: 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        partitioned_attention(layer, x, start, end, orders)
    return counter.get_total_flops()


@pytest.mark.parametrize("orders", [("qk_first",) * 4, ("x_first",) * 4, ("qk_first", "x_first", "x_first", "qk_first")])
@pytest.mark.parametrize("start,end", [(0, 20), (3, 9), (19, 20), (0, 1)])
def test_the_products_run_are_the_ones_gamma_counts(small, orders, start, end):
    """Each head computes exactly the multiply-adds of its order's Gamma (Theorems 1 and 3): Eq. (8) never
    projects K or V of all N rows, Eq. (3) does so once; a product in another order, or K/V projected for
    Eq. (8)'s heads too, changes the count. The speed that follows is the benchmark's to show."""
    layer, x = small
    B, N, F = x.shape
    expected = 2 * B * sum(attention_flops(o, N, end - start, F, layer.cfg.head_dim) for o in orders)
    assert _counted_flops(layer, x, start, end, orders) == expected


def test_theorem_2s_order_runs_the_fewest_products_at_every_partition(small):
    layer, x = small
    N = x.shape[1]
    for P in range(1, N + 1):
        counts = {o: _counted_flops(layer, x, 0, P, (o,) * 4) for o in ("qk_first", "x_first")}
        assert _counted_flops(layer, x, 0, P, head_orders(layer, N, P, "auto")) == min(counts.values()), P


def test_theorem_2_chooses_per_head_order(small):
    layer, _ = small
    # F=64, F_H=16: threshold 48/1024 = 0.047; N=20: P=20 gives 0 (Eq. 3), P=2 gives 0.45 (Eq. 8)
    assert head_orders(layer, 20, 20) == ("qk_first",) * 4
    assert head_orders(layer, 20, 2) == ("x_first",) * 4
    with pytest.raises(WorkbenchError, match="one order per head"):
        head_orders(layer, 20, 2, ("x_first",))


def test_rows_outside_the_sequence_are_refused(small):
    layer, x = small
    with pytest.raises(WorkbenchError, match="outside the sequence"):
        partitioned_layer(layer, x, 5, 21)


def test_megatron_split_sums_to_the_full_layer(small):
    layer, x = small
    with torch.no_grad():
        partial = sum(tensor_parallel_attention(layer, x, heads) for heads in ([0], [1, 2], [3]))
        h = finish_attention(layer, x, partial)
        out = finish_ffn(layer, h, sum(tensor_parallel_ffn(layer, h, cols)
                                       for cols in (slice(0, 50), slice(50, 51), slice(51, 128))))
        torch.testing.assert_close(out, layer(x), atol=ATOL, rtol=0)


def test_decoder_prefill_rows_equal_the_full_prefill():
    from workbench.models.decoder import load_decoder

    decoder = load_decoder()
    layer = decoder.layers[5]
    x = torch.randn(40, decoder.cfg.hidden)
    positions = torch.arange(40)
    with torch.no_grad():
        k, v = layer.project_kv(x, positions)
        full = layer(x, positions, k, v, positions)
        for start, end in ((0, 13), (13, 27), (27, 40)):
            torch.testing.assert_close(partitioned_decoder_layer(layer, x, start, end), full[start:end],
                                       atol=1e-4, rtol=0)


def test_head_weights_are_views_not_copies(small):
    """Consecutive heads read the projection weights in place (no copy per call); a scattered set of heads (a mix
    of forced orders) gets the same rows."""
    from workbench.models.slices import _head_block

    layer, _ = small
    w = layer.key.weight
    block = _head_block(w, [1, 2], 4, 16)
    assert block.shape == (2, 16, 64) and block.data_ptr() == w[16].data_ptr() and block._base is not None
    assert torch.equal(_head_block(w, [0, 2], 4, 16), torch.stack([w[0:16], w[32:48]]))


def test_tensor_parallel_heads_read_the_weights_in_place(small):
    """A device's consecutive heads index W_Q, W_K, W_V and W_O by a slice (views, no copy per call, as Voltage's
    rows); a scattered set gets the same rows by an index, and the Megatron split over it still sums to the
    layer (test above)."""
    from workbench.models.slices import head_rows

    layer, x = small
    rows = head_rows(layer, [1, 2])
    assert rows == slice(16, 48)
    w = layer.query.weight
    assert w[rows].data_ptr() == w[16].data_ptr() and layer.attn_out.weight[:, rows]._base is not None
    scattered = head_rows(layer, [0, 2])
    assert torch.equal(w[scattered], torch.cat([w[0:16], w[32:48]]))
    with torch.no_grad():
        torch.testing.assert_close(tensor_parallel_attention(layer, x, [0, 2]) + tensor_parallel_attention(layer, x, [1, 3]),
                                   tensor_parallel_attention(layer, x, [0, 1, 2, 3]), atol=ATOL, rtol=0)
