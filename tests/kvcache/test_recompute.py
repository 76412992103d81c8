import copy

import numpy as np
import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.kvcache.chunks import ChunkedKV
from workbench.kvcache.engine import run_call
from workbench.kvcache.recompute import LayerRecompute, held_layers, recompute_chunks
from workbench.models.decoder import KVCache, decoder_tokenizer, load_decoder

TEXT = ("The Danube flows through ten countries, more than any other river in Europe. It rises in the Black "
        "Forest and reaches the Black Sea in Romania, passing Vienna, Bratislava, Budapest and Belgrade. ") * 3


@pytest.fixture(scope="module")
def decoder():
    return load_decoder()


@pytest.fixture(scope="module")
def ids():
    out = decoder_tokenizer().encode(TEXT)[:100]
    assert len(out) == 100
    return out


@pytest.fixture(scope="module")
def prefilled(decoder, ids):
    cache = KVCache.empty(decoder.cfg, len(ids))
    decoder.forward_tokens(torch.tensor(ids), cache)
    return cache


@pytest.fixture
def context(decoder, ids, prefilled):
    """A fresh context of the 100 tokens in 16-token chunks (chunk 6 holds the last 4), held at ``bits``."""
    def make(bits: int) -> ChunkedKV:
        kv = ChunkedKV.for_decoder(decoder.cfg)
        kv.absorb(prefilled, ids, bits=bits)
        return kv
    return make


def full_pass_over_held_values(decoder, kv: ChunkedKV, missing) -> np.ndarray:
    """K/V (layers, 2, kv_heads, tokens, head_dim) of a forward pass over every token in which, at each layer,
    the tokens of chunks not in ``missing`` take the values their chunks hold (what the service has)."""
    held = np.concatenate([np.zeros(c.shape, np.float32) if i in missing else c.to_array()
                           for i, c in enumerate(kv.chunks)], axis=3)
    keep = torch.tensor([i // kv.chunk_size not in missing for i in range(len(kv.tokens))])
    positions = torch.arange(len(kv.tokens))
    out = []
    with torch.no_grad():
        x = decoder.embed(torch.tensor(kv.tokens))
        for n, layer in enumerate(decoder.layers):
            k, v = layer.project_kv(x, positions)
            k[:, keep] = torch.from_numpy(held[n, 0])[:, keep]
            v[:, keep] = torch.from_numpy(held[n, 1])[:, keep]
            out.append(torch.stack([k, v]).numpy())
            x = layer(x, positions, k, v, positions)
    return np.stack(out)


@pytest.mark.parametrize("missing", [[1, 3, 5], [0, 2, 6], [6], list(range(7))],
                         ids=["interleaved", "with-the-short-tail", "tail-only", "all"])
def test_interleaved_chunks_of_a_raw_context_come_back_as_they_were_and_generation_continues_alike(
        decoder, ids, context, missing):
    kv = context(32)
    pristine = copy.deepcopy(kv)
    original = kv.to_array()
    kept = {i: c for i, c in enumerate(kv.chunks) if i not in missing}
    for i in missing:
        kv.chunks[i] = None
    assert recompute_chunks(decoder, ids, kv, missing, bits=32) is kv
    assert all(kv.chunks[i] is c for i, c in kept.items())
    assert kv.levels() == [32] * 7
    np.testing.assert_allclose(kv.to_array(), original, rtol=0, atol=1e-4)
    if missing in ([1, 3, 5], [0, 2, 6]):
        follow = decoder_tokenizer().encode(" Which capitals does it pass?")
        assert run_call(decoder, kv, follow, 6, bits=32).output_ids == run_call(decoder, pristine, follow, 6,
                                                                                 bits=32).output_ids


def test_a_recompute_without_global_positions_and_context_is_far_off(decoder, ids, context):
    """The tolerance above can fail: the missing tokens run alone from position 0 give other K/V."""
    kv = context(32)
    cache = KVCache.empty(decoder.cfg, 48)
    decoder.forward_tokens(torch.tensor(ids[16:32] + ids[48:64] + ids[80:96]), cache)
    naive_k = cache.k[:, :, 16:32].numpy()                     # chunk 3's tokens, at positions 16..31
    assert np.abs(naive_k - kv.chunks[3].to_array()[:, 0]).max() > 1.0


def test_over_eight_bit_chunks_recompute_equals_a_full_pass_over_the_held_values(decoder, ids, context):
    """With quantized chunks the original K/V is gone; what can be exact is the model's output given the
    values the service holds. A full pass over all 100 tokens, with the held chunks' K/V substituted at
    every layer, computes that independently of the recompute's slot insertion and position handling."""
    kv = context(8)
    missing = [1, 3, 6]
    reference = full_pass_over_held_values(decoder, kv, missing)
    for i in missing:
        kv.chunks[i] = None
    recompute_chunks(decoder, ids, kv, missing, bits=32)
    for i in missing:
        start, end = kv.span(i)
        np.testing.assert_allclose(kv.chunks[i].to_array(), reference[:, :, :, start:end], rtol=0, atol=1e-4)
    original = context(32).to_array()
    drift = np.abs(kv.chunks[3].to_array() - original[:, :, :, 48:64]).max()
    assert 0 < drift < 0.2 * np.abs(original).max()           # near the float original, not equal to it


def test_recomputed_chunks_are_stored_at_the_level_asked_for(decoder, ids, context):
    kv = context(8)
    kv.chunks[2] = None
    recompute_chunks(decoder, ids, kv, [2, 4])                 # 2: not in memory, default 8; 4: keeps its level
    assert kv.levels()[2] == 8 and kv.levels()[4] == 8
    recompute_chunks(decoder, ids, kv, [1, 5], bits={1: 2, 5: 4})
    assert kv.levels() == [8, 2, 8, 8, 8, 4, 8]
    recompute_chunks(decoder, ids, kv, [0], bits=32)
    assert kv.levels()[0] == 32


def test_layer_at_a_time_needs_only_the_chunks_before_the_last_missing_one(decoder, ids, context):
    kv = context(32)
    original = kv.to_array()
    kv.chunks[1] = kv.chunks[3] = kv.chunks[5] = kv.chunks[6] = None     # chunks after chunk 3 are not needed
    job = LayerRecompute(decoder, ids, kv, [3, 1])
    assert job.missing == [1, 3] and job.needed == [0, 2] and job.positions.tolist() == list(range(16, 32)) + \
        list(range(48, 64))
    held = held_layers(kv, job.needed)
    with pytest.raises(WorkbenchError, match=r"layer 0 needs the K/V of chunks \[2\]"):
        job.step({0: held[0][0]})
    outputs = [job.step({i: a[n] for i, a in held.items()}) for n in range(job.num_layers)]
    with pytest.raises(WorkbenchError, match="all 30 layers are already recomputed"):
        job.step({})
    arrays = job.chunk_arrays(outputs)
    np.testing.assert_allclose(arrays[3], original[:, :, :, 48:64], rtol=0, atol=1e-4)
    with pytest.raises(WorkbenchError, match=r"chunks \[1, 3, 5\] are neither in memory nor to be recomputed"):
        recompute_chunks(decoder, ids, kv, [6])


def test_bad_requests_are_named(decoder, ids, context):
    kv = context(8)
    with pytest.raises(WorkbenchError, match=r"chunks \[7\] do not exist; the context has 7 chunks"):
        recompute_chunks(decoder, ids, kv, [7])
    with pytest.raises(WorkbenchError, match="holds 100 tokens, 99 token ids given"):
        recompute_chunks(decoder, ids[:99], kv, [1])
    before = [c for c in kv.chunks]
    assert recompute_chunks(decoder, ids, kv, []) is kv and kv.chunks == before
