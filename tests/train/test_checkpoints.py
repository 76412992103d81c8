import pytest
import torch

from workbench.errors import CorruptArtifactError
from workbench.train.checkpoints import cached_checkpoint, is_checkpoint, load_checkpoint, read_meta, save_checkpoint


def test_round_trip_and_damage_detection(tmp_path):
    state = {"w": torch.arange(6.0).view(2, 3), "b": torch.zeros(3)}
    path = save_checkpoint(tmp_path / "ck", state, {"task": "t", "steps": 3})
    assert is_checkpoint(path) and read_meta(path) == {"task": "t", "steps": 3}
    loaded, meta = load_checkpoint(path)
    assert torch.equal(loaded["w"], state["w"]) and meta["steps"] == 3
    blob = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(CorruptArtifactError, match="fails its SHA-256 checksum"):
        load_checkpoint(path)


def test_cached_checkpoint_builds_once_and_rebuilds_a_damaged_one(tmp_path, capsys):
    calls = []

    def build():
        calls.append(1)
        return {"w": torch.ones(2)}, {"n": len(calls)}

    path = tmp_path / "ck"
    assert cached_checkpoint(path, build)[1] == {"n": 1}
    assert cached_checkpoint(path, build)[1] == {"n": 1} and len(calls) == 1
    (path / "meta.json").write_text("{}")
    assert cached_checkpoint(path, build, what="test model")[1] == {"n": 2}
    assert "cached test model is damaged" in capsys.readouterr().out
