"""What a Hepti rank holds: its slice cut from the memory-mapped model file, never more than the memory model
says, and equal to the whole layer's numbers where it keeps them."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from workbench.devices import PRESETS
from workbench.models.shapes import SHAPES
from workbench.hepti.plan import hepti_partition, memory_bytes
from workbench.hepti.run import shape_of, split_of
from workbench.hepti.weights import SliceStore, resident_anon_bytes, write_weights

ENC = SHAPES["encoder"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return SliceStore(write_weights("encoder", 0, tmp_path_factory.mktemp("weights")))


@pytest.mark.parametrize("mode", ["ws", "1d", "2d", "serial"])
@pytest.mark.parametrize("seq_len", [16, 128])
def test_a_slice_never_holds_more_than_the_memory_model_counts(store, mode, seq_len):
    """Over unequal boards, whole heads can give a device more than its share of Q, K, V: the memory model
    counts a head beyond the share (a model without it failed here, and a real run with it)."""
    shape = shape_of(ENC, seq_len)
    boards = [replace(PRESETS["rpi4"], name=f"d{i}", flops_per_s=s * 1e9, net_bytes_per_s=125e6)
              for i, s in enumerate((3.0, 7.0, 2.0, 5.0))]
    part = hepti_partition(boards, shape, num_layers=ENC.num_layers, mode=mode)
    split = split_of(part, list(range(4)), shape)
    for rank, share in enumerate(part.shares):
        store.hold(split, rank)
        model = memory_bytes(mode, shape, share, ENC.num_layers)
        if share:
            assert 0.5 * model < store.held_bytes <= model, (rank, share)
        else:
            assert store.held_bytes < 0.01 * memory_bytes("1d", shape, 1.0, ENC.num_layers)


def test_a_rank_keeps_the_layers_own_numbers_and_frees_the_last_slice(store):
    shape = shape_of(ENC, 32)
    boards = [replace(PRESETS["rpi4"], name=f"d{i}", net_bytes_per_s=125e6) for i in range(2)]
    split = split_of(hepti_partition(boards, shape, num_layers=6, mode="1d"), [0, 1], shape)
    store.hold(split, 1)
    mapped = store._w(2, "ffn1", "weight")
    c0 = split.ffn[0]
    assert torch.equal(store.layers[2].ffn1.weight, mapped[c0:c0 + split.ffn[1]])
    assert store.layers[2].ffn1.weight.untyped_storage().data_ptr() != mapped.untyped_storage().data_ptr()
    first = store.layers
    store.hold(split, 1)
    assert store.layers is first                           # the same split: nothing cut again
    store.hold(split_of(hepti_partition(boards, shape, num_layers=6, mode="ws"), [0, 1], shape), 1)
    assert store.layers is not first and store.layers[0].ffn1.weight.shape == (ENC.ffn, ENC.hidden)
    assert resident_anon_bytes() > 0


def test_the_model_file_is_written_once_per_process_and_again_when_gone():
    from workbench.hepti.weights import stored_weights

    first = stored_weights("encoder", 0)
    written = first.stat().st_mtime_ns
    assert stored_weights("encoder", 0) == first and first.stat().st_mtime_ns == written
    first.unlink()
    again = stored_weights("encoder", 0)
    assert again == first and again.is_file()
    assert SliceStore(again).cfg.num_layers == 6
