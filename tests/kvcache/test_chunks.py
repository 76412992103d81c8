import itertools

import numpy as np
import pytest
import torch

from workbench import bitpack
from workbench.errors import WorkbenchError
from workbench.kvcache.chunks import ChunkData, ChunkedKV, chunk_nbytes, encode_chunk, recompress
from workbench.kvcache.density import assign_levels, context_noise, information_density, level_noise
from workbench.kvcache.engine import run_call
from workbench.models.decoder import KVCache, decoder_tokenizer, load_decoder

SHAPE = (3, 2, 2, 16, 8)


def test_quantization_error_is_bounded_by_half_a_step_and_bytes_add_up():
    rng = np.random.default_rng(0)
    kv = rng.standard_normal(SHAPE).astype(np.float32) * 3
    kv[0, 0, 0, :, 0] = 1.25                                      # a constant key channel
    kv[1, 1, 1, 5, :] = -0.5                                      # a constant value token
    raw = encode_chunk(kv, 32)
    assert np.array_equal(raw.to_array(), kv) and raw.nbytes == kv.nbytes
    for bits in (8, 4, 2):
        q = encode_chunk(kv, bits)
        low, step = q.scales()
        err = np.abs(q.to_array() - kv)
        assert (err <= step / 2 + 1e-3 * np.abs(kv).max()).all(), bits
        assert q.nbytes == chunk_nbytes(SHAPE, bits)
        assert q.to_array()[0, 0, 0, :, 0] == pytest.approx(1.25, abs=1e-3)
        assert q.to_array()[1, 1, 1, 5, :] == pytest.approx(-0.5, abs=1e-3)
        back = ChunkData.from_bytes(q.to_bytes())
        assert np.array_equal(back.to_array(), q.to_array()) and back.bits == bits
    assert chunk_nbytes(SHAPE, 2) < chunk_nbytes(SHAPE, 4) < chunk_nbytes(SHAPE, 8) < chunk_nbytes(SHAPE, 32)


def test_keys_are_scaled_per_channel_and_values_per_token():
    """The groups a scale covers: a key channel (layer, head, feature) over the chunk's tokens, a value token
    (layer, head, token) over its features. A large outlier in one key channel widens that channel's step
    only; one in a value token widens that token's only. Scales per channel for values, or per token for
    keys, fail this."""
    kv = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    plain = encode_chunk(kv, 4).scales()[1]
    kv[1, 0, 0, 3, 5] = 200.0                                     # one key channel (layer 1, head 0, feature 5)
    kv[2, 1, 1, 9, 2] = -200.0                                    # one value token (layer 2, head 1, token 9)
    widened = encode_chunk(kv, 4).scales()[1] != plain
    want = np.zeros(SHAPE, bool)
    want[1, 0, 0, :, 5] = True
    want[2, 1, 1, 9, :] = True
    assert np.array_equal(widened, want)
    L, _, H, T, D = SHAPE
    q = encode_chunk(kv, 8)
    assert q.low.shape == q.step.shape == (L, H, D + T) and q.low.dtype == np.float16
    assert chunk_nbytes(SHAPE, 8) == kv.size + 2 * 2 * L * H * (D + T)


def test_half_precision_raw_chunks_hold_float16_values_in_half_the_bytes():
    """The paper's FP16 baselines: a raw 16-bit chunk is the float16 rounding of the values, twice the codes
    of an 8-bit chunk, half a float32 one."""
    kv = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    half = encode_chunk(kv, 16)
    assert half.payload.dtype == np.float16 and half.bits == 16 and half.low is None
    assert np.array_equal(half.to_array(), kv.astype(np.float16).astype(np.float32))
    assert half.to_array().dtype == np.float32
    assert half.nbytes == chunk_nbytes(SHAPE, 16) == kv.size * 2 == chunk_nbytes(SHAPE, 32) // 2
    assert chunk_nbytes(SHAPE, 16) == 2 * chunk_nbytes(SHAPE, 8) - 2 * 2 * 2 * 3 * 2 * (8 + 16)
    back = ChunkData.from_bytes(half.to_bytes())
    assert back.bits == 16 and np.array_equal(back.payload, half.payload)


def test_sub_byte_codes_are_packed_by_the_extension_as_the_numpy_reference_packs_them():
    rng = np.random.default_rng(1)
    kv = rng.standard_normal(SHAPE).astype(np.float32)
    for bits in (4, 2):
        q = encode_chunk(kv, bits)
        codes = bitpack.unpack_bits_reference(q.payload, int(np.prod(SHAPE)), bits)
        assert np.array_equal(bitpack.pack_bits_reference(codes, bits), q.payload)


@pytest.mark.parametrize("source, bits", [(8, 4), (8, 2), (4, 2)])
def test_a_lower_level_keeps_each_groups_range_and_errs_by_at_most_half_its_step(source, bits):
    """Further compression works on the values the chunk holds: each group's minimum and maximum (a key
    channel's over the tokens, a value token's over the features) survive (to float16), every value moves by
    at most half the new step, and the codes use the level's whole range. Checked from 8 bits and 4 -> 2."""
    kv = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32) * 2
    held = encode_chunk(kv, 8) if source == 8 else encode_chunk(encode_chunk(kv, 8).to_array(), 4)
    values = held.to_array()
    lower = recompress(held, bits)
    assert lower.bits == bits and lower.shape == held.shape and lower.nbytes == chunk_nbytes(SHAPE, bits)
    out = lower.to_array()
    step = lower.scales()[1]
    assert (np.abs(out - values) <= step / 2 + 2e-3 * np.abs(values).max()).all()
    for kv, axis in ((0, 2), (1, 3)):
        np.testing.assert_allclose(out[:, kv].min(axis=axis), values[:, kv].min(axis=axis), rtol=0, atol=2e-3)
        np.testing.assert_allclose(out[:, kv].max(axis=axis), values[:, kv].max(axis=axis), rtol=0, atol=2e-2)
    codes = bitpack.unpack_bits_reference(lower.payload, int(np.prod(SHAPE)), bits)
    assert codes.min() == 0 and codes.max() == (1 << bits) - 1
    assert recompress(held, held.bits) is held


def test_bad_bits_and_shapes_are_named():
    with pytest.raises(WorkbenchError, match="32 or 16 \\(raw float\\), 8, 4 or 2 bits, got 3"):
        encode_chunk(np.zeros(SHAPE, np.float32), 3)
    with pytest.raises(WorkbenchError, match="got shape \\(2, 3\\)"):
        encode_chunk(np.zeros((2, 3), np.float32), 8)


def test_density_of_the_papers_figure_6_token():
    # "You are a good boy": column "a" receives 0.3 (its own row), 0.5 ("good") and 0.1 ("boy").
    a = np.array([[1.0, 0, 0, 0, 0],
                  [0.6, 0.4, 0, 0, 0],
                  [0.3, 0.4, 0.3, 0, 0],
                  [0.2, 0.2, 0.5, 0.1, 0],
                  [0.3, 0.3, 0.1, 0.2, 0.1]])
    per_token = information_density(a[None, None], chunk_size=1)
    assert per_token[2] == pytest.approx(0.3)
    assert per_token.tolist() == pytest.approx([2.4 / 5, 1.3 / 4, 0.3, 0.3 / 2, 0.1])
    assert information_density(np.stack([a, a])[None], chunk_size=2).tolist() == pytest.approx(
        [(2.4 / 5 + 1.3 / 4) / 2, (0.3 + 0.15) / 2, 0.1])


def brute_force(density, levels, ratio):
    """Every assignment of levels to chunks (not only density-ordered ones): the smallest gap to the ratio,
    then the least attention noise."""
    best = None
    for combo in itertools.product(levels, repeat=len(density)):
        total = sum(combo) / 8
        if total > ratio * len(density) + 1e-9:
            continue
        key = (round(ratio * len(density) - total, 9), context_noise(density, combo))
        best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("seed", range(12))
def test_assign_levels_meets_the_ratio_keeps_density_order_and_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    density = rng.random(n) ** 3
    ratio = float(rng.choice([0.25, 0.4, 0.5, 0.6, 0.75, 1.0]))
    bits = assign_levels(density, (8, 4, 2), ratio)
    assert bits.mean() / 8 <= ratio + 1e-9
    for i, j in itertools.permutations(range(n), 2):
        if density[i] > density[j]:
            assert bits[i] >= bits[j]
    gap, noise = brute_force(density, (8, 4, 2), ratio)
    assert round(ratio * n - bits.sum() / 8, 9) == gap
    assert context_noise(density, bits) == pytest.approx(noise, rel=1e-12, abs=0)


def test_the_noise_objective_spends_8_bits_only_where_attention_leans():
    """At a 4-bit mean, one 8-bit chunk costs two 2-bit ones. A chunk 10x denser than the two sparsest is
    worth it (0.01 x 1/225 > 2 x 0.0001 x 1/9); one 3x denser is not, so all stay at 4 bits (the linear
    objective of the paper's printed equation would pick 8 + 2 + 2 in both cases)."""
    assert assign_levels([0.1, 0.01, 0.01], (8, 4, 2), 0.5).tolist() == [8, 2, 2]
    assert assign_levels([0.03, 0.01, 0.01], (8, 4, 2), 0.5).tolist() == [4, 4, 4]
    assert context_noise([0.03, 0.01, 0.01], [4, 4, 4]) < context_noise([0.03, 0.01, 0.01], [8, 2, 2])
    assert level_noise([8, 4, 2]).tolist() == pytest.approx([255.0 ** -2, 15.0 ** -2, 3.0 ** -2])


def test_assign_levels_hits_half_exactly_and_refuses_unreachable_ratios():
    bits = assign_levels(np.linspace(1, 0, 32), (8, 4, 2), 0.5)
    assert bits.mean() == 4.0 and bits[0] == 8 and bits[-1] == 2
    with pytest.raises(WorkbenchError, match="outside what levels"):
        assign_levels([0.1, 0.2], (8, 4, 2), 0.2)
    for bad in ([0.1, -0.2], [0.1, float("nan")]):
        with pytest.raises(WorkbenchError, match="finite and not negative"):
            assign_levels(bad, (8, 4, 2), 0.5)


@pytest.fixture(scope="module")
def decoder():
    return load_decoder()


def test_chunked_generation_equals_plain_generation_over_several_calls(decoder):
    tok = decoder_tokenizer()
    prompts = [tok.chat("Name three rivers in Europe."), tok.encode(" And one in Africa?"), tok.encode(" Thanks.")]
    ctx = ChunkedKV.for_decoder(decoder.cfg, chunk_size=16)
    plain = KVCache.empty(decoder.cfg, 512)
    pending: list[int] = []
    for prompt in prompts:
        ours = run_call(decoder, ctx, prompt, max_new_tokens=12, bits=32).output_ids
        logits = decoder.forward_tokens(torch.tensor(pending + prompt), plain)
        ref = []
        for _ in range(12):
            ref.append(int(logits[-1].argmax()))
            if len(ref) == 12:
                break
            logits = decoder.forward_tokens(torch.tensor(ref[-1:]), plain)
        pending = ref[-1:]
        assert ours == ref
    assert len(ctx.tokens) == plain.length and ctx.num_chunks == -(-plain.length // 16)
    assert np.allclose(ctx.to_array()[:, 0], plain.k[:, :, :plain.length].numpy(), atol=1e-4)   # explicit vs fused attention


@torch.no_grad()
def test_the_density_a_conversation_accumulates_is_equation_1_on_its_whole_attention_matrix(decoder):
    """The service's density grows call by call from the new tokens' attention; it must equal
    ``information_density`` of the attention matrix of the whole conversation, taken here from each
    layer's queries and keys in one plain forward pass."""
    from workbench.models.decoder import rms_norm, rotary

    cfg = decoder.cfg
    tok = decoder_tokenizer()
    ctx = ChunkedKV.for_decoder(cfg, chunk_size=8)
    for prompt in (tok.chat("Name a river."), tok.encode(" And a lake?"), tok.encode(" Thanks.")):
        run_call(decoder, ctx, prompt, max_new_tokens=3, bits=32)
    matrices = []

    def capture(layer, args):
        x, positions, k_ctx, _, ctx_positions = args[:5]
        q = rotary(layer.q(rms_norm(x, layer.attn_norm, cfg.rms_eps)).view(x.shape[0], cfg.num_heads, cfg.head_dim)
                   .transpose(0, 1), positions, cfg.rope_theta)
        k = k_ctx.repeat_interleave(cfg.num_heads // cfg.num_kv_heads, 0)
        scores = (q @ k.transpose(1, 2)) / cfg.head_dim ** 0.5
        causal = ctx_positions[None, :] <= positions[:, None]
        matrices.append(scores.masked_fill(~causal[None], float("-inf")).softmax(-1).numpy())

    hooks = [layer.register_forward_pre_hook(capture) for layer in decoder.layers]
    try:
        decoder.forward_tokens(torch.tensor(ctx.tokens), KVCache.empty(cfg, len(ctx.tokens)))
    finally:
        for h in hooks:
            h.remove()
    expected = information_density(np.stack(matrices), chunk_size=8)
    got = ctx.chunk_density(cfg.num_layers * cfg.num_heads)
    assert len(got) == ctx.num_chunks == len(expected) >= 4
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=0)


def test_eight_bit_chunks_keep_the_continuation_of_a_short_call(decoder):
    tok = decoder_tokenizer()
    prompt = tok.encode("The capital of France is Paris. The capital of Italy is")
    raw, q8 = (ChunkedKV.for_decoder(decoder.cfg) for _ in range(2))
    run_call(decoder, raw, prompt, max_new_tokens=1, bits=32)
    run_call(decoder, q8, prompt, max_new_tokens=1, bits=8)
    follow = tok.encode(" The capital of Spain is")
    assert tok.decode(run_call(decoder, q8, follow, 3, bits=8).output_ids) == \
        tok.decode(run_call(decoder, raw, follow, 3, bits=32).output_ids)
    assert q8.nbytes() == sum(chunk_nbytes(c.shape, 8) for c in q8.chunks) < raw.nbytes() / 2


def test_the_working_cache_is_float16_unless_a_chunk_is_raw_float32_and_is_built_chunk_by_chunk(decoder):
    tok = decoder_tokenizer()
    q8, raw = (ChunkedKV.for_decoder(decoder.cfg) for _ in range(2))
    run_call(decoder, q8, tok.chat("Name a river."), max_new_tokens=2, bits=8)
    run_call(decoder, raw, tok.chat("Name a river."), max_new_tokens=2, bits=32)
    cache = q8.to_cache(decoder.cfg, extra=5)
    assert cache.k.dtype == torch.float16 and cache.length == len(q8.tokens) and cache.capacity == len(q8.tokens) + 5
    values = q8.to_array()
    np.testing.assert_allclose(cache.k[:, :, :cache.length].float().numpy(), values[:, 0], rtol=1e-3, atol=1e-3)
    assert raw.to_cache(decoder.cfg).k.dtype == torch.float32
    assert ChunkedKV.for_decoder(decoder.cfg).to_cache(decoder.cfg, 4, new_bits=32).k.dtype == torch.float32
    q8.chunks[0] = None
    with pytest.raises(WorkbenchError, match=r"chunks \[0\] are not in memory"):
        q8.to_cache(decoder.cfg)


@pytest.mark.parametrize("bits", [32, 16, 8, 4, 2])
def test_the_tensor_a_switch_dequantizes_into_equals_the_numpy_values(bits):
    chunk = encode_chunk(np.random.default_rng(bits).standard_normal(SHAPE).astype(np.float32), bits)
    got = chunk.to_tensor()
    assert got.dtype == torch.float32 and tuple(got.shape) == SHAPE
    np.testing.assert_allclose(got.numpy(), chunk.to_array(), rtol=1e-6, atol=1e-6)


def _chunk(shape, bits, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4
    return encode_chunk(values, 16) if bits == 16 else recompress(encode_chunk(values, 8), bits)


def _written(chunk, start=2, extra=3, **options):
    L, _, H, T, D = chunk.shape
    k, v = (np.full((L, H, start + T + extra, D), np.float16(7.5)) for _ in range(2))
    chunk.into_half(k, v, start, **options)
    return k, v


@pytest.mark.parametrize("bits", [16, 8, 4, 2])
@pytest.mark.parametrize("shape", [(3, 2, 3, 16, 64), (2, 2, 1, 7, 64), (1, 2, 2, 1, 64), (2, 2, 3, 5, 5),
                                   (1, 2, 1, 3, 12)])
def test_the_fused_kernel_equals_its_numpy_twin_bit_for_bit(bits, shape):
    """Every level, odd token counts and odd head widths (the portable kernel where the vector one cannot
    go), one thread and two: the cache holds the twin's float16 bits at the chunk's positions, nothing else
    is touched, and the twin is what the unfused path (float32 values, then a float16 copy) gave."""
    chunk = _chunk(shape, bits, seed=sum(shape) + bits)
    want = chunk.to_half_reference()
    assert np.array_equal(want.view(np.uint16), chunk.to_tensor().half().numpy().view(np.uint16))
    for simd, threads in itertools.product((True, False), (1, 2)):
        k, v = _written(chunk, simd=simd, num_threads=threads)
        T = shape[3]
        for out, kv in ((k, 0), (v, 1)):
            assert np.array_equal(out[:, :, 2:2 + T].view(np.uint16), want[:, kv].view(np.uint16)), (simd, threads)
            assert (out[:, :, :2] == np.float16(7.5)).all() and (out[:, :, 2 + T:] == np.float16(7.5)).all()


def test_the_kernel_rounds_like_numpy_at_the_edges_of_float16():
    """Steps and minima drawn over every finite float16 (subnormals, ties, values rounding to 65504 or past it
    to infinity): the vector and the portable kernel give NumPy's float16 bits for every value."""
    rng = np.random.default_rng(3)
    shape = (2, 2, 4, 16, 64)
    halves = rng.integers(0, 0x7c00, size=(2, shape[0], shape[2], shape[4] + shape[3]), dtype=np.uint16)  # finite, >= 0
    signs = rng.integers(0, 2, size=halves.shape[1:], dtype=np.uint16) << 15
    step, low = halves[0].view(np.float16), (halves[1] | signs).view(np.float16)
    codes = rng.integers(0, 256, size=int(np.prod(shape)), dtype=np.uint8)
    chunk = ChunkData(bits=8, shape=shape, payload=codes, low=low, step=step)
    with np.errstate(over="ignore"):
        want = chunk.to_half_reference()
    assert np.isinf(want).any() and (np.abs(want[want != 0]) < np.float16(6.2e-5)).any()
    for simd in (True, False):
        k, v = _written(chunk, simd=simd)
        assert np.array_equal(k[:, :, 2:18].view(np.uint16), want[:, 0].view(np.uint16)), simd
        assert np.array_equal(v[:, :, 2:18].view(np.uint16), want[:, 1].view(np.uint16)), simd


def test_the_kernel_allocates_nothing_per_chunk_where_the_unfused_path_allocated_the_chunk_twice():
    import tracemalloc

    chunk = _chunk((30, 2, 3, 16, 64), 4)
    L, _, H, T, D = chunk.shape
    k, v = (np.zeros((L, H, 64, D), np.float16) for _ in range(2))
    chunk.into_half(k, v, 0)
    tracemalloc.start()
    try:
        for start in range(0, 64, T):
            chunk.into_half(k, v, start)
        fused = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        bitpack.unpack_bits(chunk.payload, int(np.prod(chunk.shape)), 4)
        unpacked = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert unpacked >= np.prod(chunk.shape)              # the step the kernel fuses away: one byte a value
    assert fused < 4096, fused                           # a few array views, no buffer


def test_the_kernel_refuses_what_it_cannot_write():
    chunk = _chunk((1, 2, 1, 4, 8), 8)
    k, v = (np.zeros((1, 1, 8, 8), np.float16) for _ in range(2))
    for bad, match in (((k.astype(np.float32), v, 0), "writable C-contiguous float16"),
                       ((k, v, 5), "does not fit the cache"), ((k, v, -1), "does not fit the cache"),
                       ((np.zeros((1, 2, 8, 8), np.float16), v, 0), "does not fit the cache")):
        with pytest.raises(WorkbenchError, match=match):
            chunk.into_half(*bad)
    with pytest.raises(WorkbenchError, match="32-bit chunk"):
        encode_chunk(np.zeros((1, 2, 1, 4, 8), np.float32), 32).into_half(k, v, 0)


def test_the_switch_builds_the_float16_cache_with_the_kernel(decoder):
    tok = decoder_tokenizer()
    kv = ChunkedKV.for_decoder(decoder.cfg)
    run_call(decoder, kv, tok.chat("Name a river and a lake."), max_new_tokens=2, bits=8)
    kv.chunks[0] = recompress(kv.chunks[0], 2)
    cache = kv.to_cache(decoder.cfg, extra=3)
    want = np.concatenate([c.to_half_reference() for c in kv.chunks], axis=3)
    n = cache.length
    assert np.array_equal(cache.k[:, :, :n].numpy().view(np.uint16), want[:, 0].view(np.uint16))
    assert np.array_equal(cache.v[:, :, :n].numpy().view(np.uint16), want[:, 1].view(np.uint16))
