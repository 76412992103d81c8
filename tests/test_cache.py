import pytest

from workbench import cache
from workbench.errors import CacheError, CorruptArtifactError


def test_cache_dir_follows_the_environment(tmp_cache):
    assert cache.cache_dir() == tmp_cache and tmp_cache.is_dir()


def test_unwritable_cache_directory_is_named(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("WORKBENCH_CACHE", str(blocker))
    with pytest.raises(CacheError, match="exists but is not a directory; set WORKBENCH_CACHE"):
        cache.cache_dir()
    monkeypatch.setenv("WORKBENCH_CACHE", "/proc/workbench-cache")
    with pytest.raises(CacheError, match="/proc/workbench-cache is not writable"):
        cache.cache_dir()


def test_manifest_detects_truncation_and_corruption(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(bytes(range(256)) * 10)
    cache.record([f], tmp_path / "manifest.json", {"kind": "test"})
    assert cache.verify(tmp_path / "manifest.json") == {"kind": "test"}
    f.write_bytes(bytes(range(256)) * 9)
    with pytest.raises(CorruptArtifactError, match="weights.bin has 2304 bytes, expected 2560"):
        cache.verify(tmp_path / "manifest.json")
    f.write_bytes(bytes(reversed(range(256))) * 10)
    with pytest.raises(CorruptArtifactError, match="fails its SHA-256 checksum"):
        cache.verify(tmp_path / "manifest.json")
    f.unlink()
    with pytest.raises(CorruptArtifactError, match="is missing"):
        cache.verify(tmp_path / "manifest.json")


def test_failed_atomic_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "result.json"
    cache.write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with cache.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text().replace(" ", "").replace("\n", "") == '{"v":1}'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
