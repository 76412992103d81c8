"""Checkpoints in the cache: a model's tensors plus a JSON record, sealed by a checksum manifest.

A checkpoint directory is complete only when its ``manifest.json`` lists every file
with its size and SHA-256; a damaged one (truncated, corrupted, half written) is
reported as such by :func:`load_checkpoint`, and :func:`cached_checkpoint` rebuilds it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

from workbench.cache import atomic_path, record, verify
from workbench.errors import CorruptArtifactError

MANIFEST = "manifest.json"


def training_key(cfg, format_version: int) -> str:
    """A fingerprint of every input of a training run: its settings (a dataclass with ``task``), the format
    it is saved in, the pretrained model's package, the task's data and the torch version."""
    import json
    from dataclasses import asdict
    from importlib.metadata import version

    from workbench.assets import MINILM
    from workbench.cache import fingerprint
    from workbench.data import SPLITS_DIR

    data_sig = json.loads((SPLITS_DIR / f"{cfg.task}.json").read_text())["source_sha256"]
    return fingerprint({"cfg": asdict(cfg), "format": format_version, "model": f"{MINILM.package}=={MINILM.version}",
                        "data": data_sig, "torch": version("torch")})


def save_checkpoint(path: Path, state: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write ``state`` (safetensors) and ``meta`` (JSON) to ``path`` and seal them."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / "model.safetensors") as tmp:
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp))
    with atomic_path(path / "meta.json") as tmp:
        tmp.write_text(json.dumps(meta))
    record([path / "model.safetensors", path / "meta.json"], path / MANIFEST)
    return path


def is_checkpoint(path: Path) -> bool:
    """A sealed checkpoint exists at ``path`` (not verified: that reads every byte)."""
    return (Path(path) / MANIFEST).exists()


def read_meta(path: Path) -> dict:
    """A checkpoint's JSON record, without loading its tensors."""
    return json.loads((Path(path) / "meta.json").read_text())


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Verify and load a checkpoint: (state, meta); CorruptArtifactError when damaged."""
    from safetensors.torch import load_file

    path = Path(path)
    verify(path / MANIFEST)
    return load_file(path / "model.safetensors"), read_meta(path)


def cached_checkpoint(path: Path, build: Callable[[], tuple[dict, dict]], force: bool = False,
                      what: str = "checkpoint") -> tuple[dict[str, torch.Tensor], dict]:
    """Load the checkpoint at ``path``, or ``build()`` (state, meta), save and return it; a damaged one is rebuilt."""
    if not force and is_checkpoint(path):
        try:
            return load_checkpoint(path)
        except CorruptArtifactError as exc:
            print(f"workbench: cached {what} is damaged ({exc}); building it again")
    state, meta = build()
    save_checkpoint(path, state, meta)
    return state, meta
