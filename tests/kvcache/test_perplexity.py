"""Perplexity through a compressed KV cache: raw chunks score as the plain decoder, 2 bits worse than 8, and the
tolerance setting is the service's own assignment after a conversation."""
import pytest

from workbench.data import heldout_text
from workbench.kvcache import perplexity as ppl
from workbench.models.decoder import decoder_tokenizer, load_decoder


@pytest.fixture(scope="module")
def model():
    return load_decoder()


def test_raw_chunks_score_as_the_plain_decoder_and_2_bits_worse_than_8(model):
    ids = decoder_tokenizer().encode(heldout_text(1))
    windows = ppl.perplexity_windows(ids, 64, 24, limit=2)
    assert len(windows) == 2 and all(len(w) == 64 + 24 + 1 for w in windows)
    got = ppl.kv_perplexity(model, windows, 64, settings=("plain", 32, 8, 2))
    assert got[32][0] == pytest.approx(got["plain"][0], rel=1e-5)
    assert got[32][1] == got["plain"][1] == 4 * 2 * 30 * 3 * 64 * 64         # float32 K and V of 64 tokens
    assert got[2][0] > got[8][0] and got[2][1] < got[8][1]


def test_the_tolerance_setting_is_the_services_assignment_after_a_conversation(model):
    """The table's tolerance row reads a context kept as the service keeps it: fed in several calls, every
    full chunk at the level ``assign_levels`` gives over the whole context, made from its 8-bit base; the
    open last chunk at 8 bits; the mean of the full chunks at the 0.5 ratio."""
    from workbench.kvcache.chunks import recompress
    from workbench.kvcache.density import assign_levels

    ids = decoder_tokenizer().encode(heldout_text(1))[:100]
    kv, bases = ppl.service_conversation(model, ids, 4)
    cfg = model.cfg
    full = kv.full_chunks()
    assert len(kv.tokens) == 100 and full == list(range(6)) and kv.chunks[6].bits == 8
    bits = [kv.chunks[i].bits for i in full]
    assert bits == assign_levels(kv.chunk_density(cfg.num_layers * cfg.num_heads)[full], (8, 4, 2), 0.5).tolist()
    assert sum(bits) == 4 * len(full) and sorted(bases) == full
    for i in full:
        assert bases[i].bits == 8 and recompress(bases[i], kv.chunks[i].bits).payload.tobytes() == \
            kv.chunks[i].payload.tobytes()


def test_windows_do_not_overlap_and_stop_at_the_limit():
    windows = ppl.perplexity_windows(list(range(100)), 16, 8, limit=3)
    assert windows == [list(range(0, 25)), list(range(25, 50)), list(range(50, 75))]
    assert ppl.perplexity_windows(list(range(20)), 16, 8) == []
