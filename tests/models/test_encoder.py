import pytest
import torch

from workbench.models.encoder import SHARD_KEYS, load_pretrained_encoder, sharded_layer, stack_shards
from workbench.models.tokenizer import encoder_tokenizer

TEXTS = ["A gripping, beautifully shot film.", "The plot was a mess and I left early; the worst film this year."]


@pytest.fixture(scope="module")
def encoder():
    return load_pretrained_encoder().eval()


def test_full_width_equals_reference_implementation(encoder):
    from transformers import AutoModel, AutoTokenizer

    from workbench.assets import minilm_dir

    ids, mask = encoder_tokenizer()(TEXTS)
    ref_tok = AutoTokenizer.from_pretrained(str(minilm_dir()))
    assert ref_tok(TEXTS, padding=True, return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    ref = AutoModel.from_pretrained(str(minilm_dir())).eval()
    with torch.no_grad():
        ours = encoder.hidden_states(ids, mask)
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours - theirs).abs().max().item() < 1e-4


def test_shard_subset_equals_full_layer_with_other_shards_zeroed(encoder):
    torch.manual_seed(0)
    layer = encoder.layers[2]
    x = torch.randn(2, 9, 384)
    keep = [7, 1, 4]
    with torch.no_grad():
        ours = layer(x, None, keep)
        zeroed = load_pretrained_encoder().layers[2].eval()
        dh, fs = 32, 128
        for h in set(range(12)) - set(keep):
            for lin in (zeroed.query, zeroed.key, zeroed.value):
                lin.weight[h * dh:(h + 1) * dh] = 0
                lin.bias[h * dh:(h + 1) * dh] = 0
            zeroed.attn_out.weight[:, h * dh:(h + 1) * dh] = 0
            zeroed.ffn1.weight[h * fs:(h + 1) * fs] = 0
            zeroed.ffn1.bias[h * fs:(h + 1) * fs] = 0
        # a zeroed head still adds a uniform-attention average of zero values: nothing; zeroed FFN rows give gelu(0)=0
        reference = zeroed(x, None)
    assert torch.allclose(ours, reference, atol=1e-5)


def test_layer_runs_from_per_shard_weights(encoder):
    layer = encoder.layers[0]
    x = torch.randn(1, 5, 384)
    shards = [3, 0, 11]
    parts = stack_shards([layer.shard(i) for i in shards], [layer.shard_biases(i) for i in shards])
    with torch.no_grad():
        direct = layer(x, None, shards)
        from_parts = sharded_layer(x, None, layer.resident(), parts, 32, layer.cfg.layer_norm_eps)
    assert torch.equal(direct, from_parts)
    assert set(layer.shard(0)) == set(SHARD_KEYS)
    assert layer.shard(5)["q"].shape == (32, 384) and layer.shard(5)["o"].shape == (384, 32)
    assert layer.shard(5)["ffn1"].shape == (128, 384) and layer.shard(5)["ffn2"].shape == (384, 128)


def test_prefix_width_equals_explicit_subset(encoder):
    ids, mask = encoder_tokenizer()(TEXTS)
    with torch.no_grad():
        a = encoder.hidden_states(ids, mask, depth=4, width=5)
        b = encoder.hidden_states(ids, mask, depth=4, shards=[list(range(5))] * 4)
        c = encoder.hidden_states(ids, mask, depth=4, shards=[[4, 3, 2, 1, 0]] * 4)
    assert torch.equal(a, b)
    assert torch.allclose(a, c, atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"depth": 0}, "depth must be in 1..6"), ({"depth": 7}, "depth must be in 1..6"),
    ({"width": 13}, "width must be in 1..12"), ({"shards": [[0, 0]] * 6}, "distinct"),
    ({"shards": [[12]] * 6}, "distinct indexes in 0..11"),
])
def test_bad_submodel_is_named(encoder, kwargs, message):
    ids, mask = encoder_tokenizer()(TEXTS[:1])
    with pytest.raises(ValueError, match=message):
        encoder.hidden_states(ids, mask, **kwargs)


def test_user_text_is_refused_when_empty_and_its_truncation_counted():
    from workbench.errors import WorkbenchError

    tok = encoder_tokenizer(64)
    for empty in ("", "   ", "\n\t"):
        with pytest.raises(WorkbenchError, match="the text is empty"):
            tok.encode_text(empty, pad_to=64)
    short = tok.encode_text("a gripping film", pad_to=64)
    assert (short.kept, short.given, short.truncated, short.note()) == (5, 5, False, "")
    long = tok.encode_text("film " * 500, pad_to=64)                  # 500 word tokens + [CLS] + [SEP]
    assert (long.kept, long.given) == (64, 502) and long.ids.shape == (1, 64)
    assert long.note() == "note: the text was cut to its first 64 of 502 tokens (the model reads at most 64)"
