import functools
import shutil

import numpy as np

import pytest
import torch

from workbench.models.decoder import KVCache, converted_decoder_dir, decoder_tokenizer, load_decoder

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def decoder():
    return load_decoder()


def test_generates_the_same_tokens_as_the_reference(decoder, monkeypatch):
    import gguf
    from transformers import AutoModelForCausalLM

    from workbench.assets import smollm2_gguf

    readers, opened = {}, gguf.GGUFReader

    def read_once(path, *args, **kwargs):
        """transformers reads the file's metadata twice (the config, then the weights), each a Python loop
        over the 49,152-entry vocabulary: one reader serves both."""
        if str(path) not in readers:
            readers[str(path)] = opened(path, *args, **kwargs)
        return readers[str(path)]

    monkeypatch.setattr(gguf, "GGUFReader", read_once)
    # and it builds the same tensor-name table (a pure function of the architecture and block count) once per
    # submodule, 397 times: built once here
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    path = smollm2_gguf()
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = decoder_tokenizer().encode(PROMPT)
    with torch.no_grad():
        ref_logits = ref(torch.tensor([ids])).logits[0]
        ref_tokens = ref.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0, len(ids):].tolist()
    ours = decoder.forward_tokens(torch.tensor(ids), KVCache.empty(decoder.cfg, len(ids)))
    assert (ours - ref_logits).abs().max().item() < 1e-3
    tokens, _ = decoder.generate(ids, 10)
    assert tokens == ref_tokens
    assert decoder_tokenizer().decode(tokens).startswith(" Rome")


def test_incremental_decoding_equals_one_pass(decoder):
    ids = decoder_tokenizer().encode("Edge devices run small language models.")
    whole = decoder.forward_tokens(torch.tensor(ids), KVCache.empty(decoder.cfg, len(ids)))
    cache = KVCache.empty(decoder.cfg, len(ids))
    first = decoder.forward_tokens(torch.tensor(ids[:4]), cache)
    rest = decoder.forward_tokens(torch.tensor(ids[4:]), cache)
    assert cache.length == len(ids) and cache.positions[: len(ids)].tolist() == list(range(len(ids)))
    assert torch.allclose(torch.cat([first, rest]), whole, atol=1e-4)
    assert cache.nbytes() == 2 * 30 * 3 * len(ids) * 64 * 4


def test_cache_overflow_is_refused(decoder):
    with pytest.raises(ValueError, match="KV cache holds 2 tokens"):
        decoder.forward_tokens(torch.tensor([1, 2, 3]), KVCache.empty(decoder.cfg, 2))


def test_tokenizer_round_trip_and_digits_split():
    tok = decoder_tokenizer()
    text = "In 2024 the BBC reported 1,234 new cases."
    assert tok.decode(tok.encode(text)) == text
    assert [tok.decode([t]) for t in tok.encode("1234")] == ["1", "2", "3", "4"]


def test_corrupted_conversion_is_detected_and_rebuilt(tmp_path, monkeypatch, capsys):
    from workbench.cache import verify

    original = converted_decoder_dir()              # in the suite's own cache
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    target = tmp_path / "models" / original.name
    shutil.copytree(original, target)
    with open(target / "model.safetensors", "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\xff" * 64)
    assert converted_decoder_dir() == target
    assert "converted decoder is damaged" in capsys.readouterr().out
    verify(target / "manifest.json")


def test_attention_kept_for_density_is_computed_in_row_blocks_with_the_same_result(decoder, monkeypatch):
    """A long prompt's explicit attention (kept for the column sums) runs a block of rows at a time, so its
    scores never take heads x prompt x context floats; the logits and the columns are those of one block."""
    from workbench.models import decoder as decoder_module

    ids = torch.tensor(np.random.default_rng(3).integers(3, decoder.cfg.vocab_size, 300).tolist())
    results = []
    for block in (10_000, 64):
        monkeypatch.setattr(decoder_module, "ATTENTION_ROW_BLOCK", block)
        columns = torch.zeros(300)
        logits = decoder.forward_tokens(ids, KVCache.empty(decoder.cfg, 300), attn_columns=columns)
        results.append((logits, columns))
    (one_logits, one_columns), (blocked_logits, blocked_columns) = results
    torch.testing.assert_close(blocked_logits, one_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(blocked_columns, one_columns, rtol=1e-5, atol=1e-4)
    assert one_columns.sum().item() == pytest.approx(300 * decoder.cfg.num_heads * decoder.cfg.num_layers, rel=1e-5)


def test_a_half_precision_cache_serves_the_same_continuation(decoder):
    """The service's working cache holds K/V in float16: the layers compute in float32 from it."""
    ids = decoder_tokenizer().encode("The capital of France is Paris. The capital of Italy is")
    full = decoder.forward_tokens(torch.tensor(ids), KVCache.empty(decoder.cfg, len(ids)))
    half = decoder.forward_tokens(torch.tensor(ids), KVCache.empty(decoder.cfg, len(ids), dtype=torch.float16))
    assert half.dtype == torch.float32 and int(half[-1].argmax()) == int(full[-1].argmax())
    torch.testing.assert_close(half, full, rtol=0, atol=0.05)
