"""The cache directory: where `prepare` writes converted models, checkpoints and results.

Artifacts are written atomically (temporary file, fsync, rename) and recorded in a
sidecar manifest with sizes and SHA-256 checksums, so a reader can tell a complete
artifact from a truncated or corrupted one and rebuild it instead of using it.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workbench.errors import CacheError, CorruptArtifactError

ENV_VAR = "WORKBENCH_CACHE"


def cache_dir(create: bool = True) -> Path:
    """The cache root: $WORKBENCH_CACHE, else $XDG_CACHE_HOME/workbench, else ~/.cache/workbench."""
    root = os.environ.get(ENV_VAR)
    if root:
        path = Path(root).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "workbench"
    if create:
        ensure_writable(path)
    return path


def ensure_writable(path: Path) -> Path:
    """Create ``path`` if needed and check that files can be written in it."""
    if path.exists() and not path.is_dir():
        raise CacheError(f"cache path {path} exists but is not a directory; set {ENV_VAR} to a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        raise CacheError(f"cache directory {path} is not writable ({exc.strerror}); "
                         f"set {ENV_VAR} to a writable directory") from exc
    return path


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(obj) -> str:
    """A short stable hash of a JSON-serialisable object (cache keys)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success fsync it and rename it into place."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp_path, final)
        dir_fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(path: Path, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))


def record(paths: list[Path], manifest: Path, meta: dict | None = None) -> None:
    """Write ``manifest`` listing each file's size and checksum (the artifact's seal)."""
    entries = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in paths}
    write_json(manifest, {"files": entries, "meta": meta or {}})


def verify(manifest: Path) -> dict:
    """Check every file a manifest lists; return its ``meta`` or raise CorruptArtifactError."""
    if not manifest.exists():
        raise CorruptArtifactError(f"{manifest} is missing")
    try:
        data = json.loads(manifest.read_text())
        files = data["files"]
    except (ValueError, KeyError) as exc:
        raise CorruptArtifactError(f"{manifest} is not a valid manifest") from exc
    for name, entry in files.items():
        path = manifest.parent / name
        if not path.exists():
            raise CorruptArtifactError(f"{path} is missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CorruptArtifactError(f"{path} has {size} bytes, expected {entry['bytes']} (truncated?)")
        if sha256_file(path) != entry["sha256"]:
            raise CorruptArtifactError(f"{path} fails its SHA-256 checksum (corrupted)")
    return data.get("meta", {})
