import numpy as np
import pytest

from workbench.errors import CorruptArtifactError
from workbench.kvcache.chunks import encode_chunk
from workbench.kvcache.swapfile import file_size, read_chunk, read_layer, write_chunk, write_chunk_crc


@pytest.mark.parametrize("bits", [32, 16, 8, 4, 2])
@pytest.mark.parametrize("tokens", [16, 5])
def test_a_chunk_comes_back_whole_and_layer_by_layer(tmp_path, bits, tokens):
    kv = np.random.default_rng(bits + tokens).standard_normal((4, 2, 3, tokens, 64)).astype(np.float32)
    chunk = encode_chunk(kv, bits)
    path = tmp_path / "c.bin"
    assert write_chunk(path, chunk) == path.stat().st_size == file_size(bits, chunk.shape)
    assert not (tmp_path / "c.bin.tmp").exists()
    back = read_chunk(path, bits, chunk.shape)
    assert np.array_equal(back.to_array(), chunk.to_array())
    with open(path, "rb") as handle:
        for layer in range(4):
            assert np.array_equal(read_layer(handle, bits, chunk.shape, layer), chunk.to_array()[layer])


@pytest.mark.parametrize("bits", [32, 16, 8, 4, 2])
def test_the_crc_taken_while_writing_is_the_files(tmp_path, bits):
    import zlib

    kv = np.random.default_rng(bits).standard_normal((3, 2, 3, 7, 64)).astype(np.float32)
    chunk = encode_chunk(kv, bits)
    size, crc = write_chunk_crc(tmp_path / "c.bin", chunk)
    data = (tmp_path / "c.bin").read_bytes()
    assert size == len(data) == file_size(bits, chunk.shape) and crc == zlib.crc32(data)


def test_a_short_file_is_named(tmp_path):
    chunk = encode_chunk(np.zeros((2, 2, 3, 16, 64), np.float32), 4)
    path = tmp_path / "c.bin"
    write_chunk(path, chunk)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CorruptArtifactError, match="expected"):
        read_chunk(path, 4, chunk.shape)
