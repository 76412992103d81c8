"""The on-disk shard store: N layers x M shards x K bitwidths, plus the fp32 version.

Layout of a store directory::

    CURRENT                 {"version": "v-..."}: the complete version readers use
    v-<id>/manifest.json    shapes, bitwidths, per-shard offsets, sizes and CRC32s
    v-<id>/layer-00.bin     every version of layer 0's shards, side by side
    v-<id>/resident.safetensors   embeddings, LayerNorms, biases, classifier (full precision)

Inside ``layer-NN.bin`` the blobs are ordered by bitwidth, then shard, so the m most
important shards of a layer at one bitwidth are one contiguous read. What one blob
holds, and how, is :mod:`workbench.elastic.shardblob`'s business.

Writes are atomic: a new version is built in a hidden directory, fsynced, renamed, and
only then does ``CURRENT`` (itself replaced atomically) point to it, so an interrupted
``prepare`` leaves the previous store readable. Opening checks every shard's size and
CRC32 and names the file, layer, shard and bitwidth of any damage.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.cache import write_json
from workbench.elastic.quantize import BITWIDTHS, gobo_quantize, inlier_order, outlier_mask
from workbench.elastic.shardblob import FP32, decode_blob, encode_fp32, flatten_shard, quantized_blob
from workbench.errors import CorruptArtifactError
from workbench.models.config import SHARD_KEYS, EncoderConfig

if TYPE_CHECKING:
    import torch

    from workbench.models.encoder import Encoder

FORMAT = 1


class ShardStoreError(CorruptArtifactError):
    """A store, or one shard in it, is missing, truncated or corrupted."""


@dataclass(frozen=True)
class ShardEntry:
    """Where one version of one shard lives in its layer file."""
    bits: int
    offset: int          # byte offset in the layer file
    nbytes: int          # blob size
    outliers: int        # outlier count (0 for fp32)
    crc32: int


def shard_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, int]]:
    """Shapes of one shard's matrices (torch Linear layout), as in WRX Table 1."""
    d, dh, f = cfg.hidden, cfg.head_dim, cfg.ffn_per_shard
    return {"q": (dh, d), "k": (dh, d), "v": (dh, d), "o": (d, dh), "ffn1": (f, d), "ffn2": (d, f)}


def _resident_state(model: Encoder) -> dict[str, torch.Tensor]:
    """Everything but the shard matrices: embeddings, LayerNorms, biases, classifier head."""
    shard_weights = {"query.weight", "key.weight", "value.weight", "attn_out.weight", "ffn1.weight", "ffn2.weight"}
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()
            if not (k.startswith("layers.") and k.split(".", 2)[2] in shard_weights)}


def build_store(model: Encoder, root: Path, bitwidths=BITWIDTHS, threshold: float = -4.0, meta: dict | None = None,
                progress: bool = True) -> "ShardStore":
    """Quantize every layer of ``model`` at each bitwidth and write a new store version under ``root``."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    bitwidths = tuple(sorted(set(int(b) for b in bitwidths)))
    if not bitwidths or min(bitwidths) < 1 or max(bitwidths) > 8:
        raise ValueError(f"bitwidths must lie in 1..8, got {bitwidths}")
    cfg = model.cfg
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".building-*"):
        shutil.rmtree(stale, ignore_errors=True)
    version = f"v-{uuid.uuid4().hex[:12]}"
    work = root / f".building-{version}"
    work.mkdir()
    layers = []
    for n in tqdm(range(cfg.num_layers), desc="quantizing layers", disable=not progress):
        layer = model.layers[n]
        flats = [flatten_shard(layer.shard(i)) for i in range(cfg.num_heads)]
        per_shard = flats[0].size
        layer_flat = np.concatenate(flats)
        mask = outlier_mask(layer_flat, threshold)
        order = inlier_order(layer_flat, mask)
        entries: list[list[dict]] = [[] for _ in range(cfg.num_heads)]
        offset = 0
        with open(work / f"layer-{n:02d}.bin", "wb") as handle:
            for bits in (*bitwidths, FP32):
                q = None if bits == FP32 else gobo_quantize(layer_flat, bits, threshold, outliers=mask, order=order)
                for i in range(cfg.num_heads):
                    if q is None:
                        blob, outliers = encode_fp32(flats[i]), 0
                    else:
                        part = q.select(i * per_shard, (i + 1) * per_shard)
                        blob, outliers = quantized_blob(part).to_bytes(), int(part.outlier_pos.size)
                    handle.write(blob)
                    entries[i].append({"bits": bits, "offset": offset, "nbytes": len(blob), "outliers": outliers,
                                       "crc32": zlib.crc32(blob)})
                    offset += len(blob)
            handle.flush()
            os.fsync(handle.fileno())
        layers.append({"file": f"layer-{n:02d}.bin", "bytes": offset, "shards": entries,
                       "outlier_fraction": float(mask.mean())})
    save_file(_resident_state(model), str(work / "resident.safetensors"))
    manifest = {"format": FORMAT, "encoder": cfg.__dict__, "num_classes": model.head.out_features if model.head else 0,
                "bitwidths": [*bitwidths, FP32], "threshold": threshold, "shard_params": per_shard,
                "shard_shapes": {k: list(v) for k, v in shard_shapes(cfg).items()}, "layers": layers,
                "meta": meta or {}}
    write_json(work / "manifest.json", manifest)
    final = root / version
    os.replace(work, final)
    previous = _current_version(root)
    write_json(root / "CURRENT", {"version": version})
    if previous and previous != version:
        shutil.rmtree(root / previous, ignore_errors=True)
    return ShardStore.open(root)


def _current_version(root: Path) -> str | None:
    try:
        return json.loads((root / "CURRENT").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


class ShardStore:
    """Read access to a verified store version."""

    def __init__(self, root: Path, version: str, manifest: dict):
        self.root, self.version = Path(root), version
        self.dir = self.root / version
        self.manifest = manifest
        self.cfg = EncoderConfig(**manifest["encoder"])
        self.bitwidths: tuple[int, ...] = tuple(manifest["bitwidths"])
        self.shard_params: int = manifest["shard_params"]
        self.shapes = {k: tuple(v) for k, v in manifest["shard_shapes"].items()}
        self.entries = [[{e["bits"]: ShardEntry(**e) for e in shard} for shard in layer["shards"]]
                        for layer in manifest["layers"]]

    # -- opening and verification

    @classmethod
    def open(cls, root: Path | str, verify: bool = True) -> "ShardStore":
        root = Path(root)
        version = _current_version(root)
        if version is None:
            raise ShardStoreError(f"{root} holds no complete shard store (CURRENT is missing); run `workbench prepare`")
        manifest_path = root / version / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise ShardStoreError(f"{manifest_path} is missing or unreadable") from exc
        if manifest.get("format") != FORMAT:
            raise ShardStoreError(f"{manifest_path} has format {manifest.get('format')}, expected {FORMAT}")
        store = cls(root, version, manifest)
        if verify:
            store.verify()
        return store

    def verify(self) -> None:
        """Check every layer file's size and every shard's CRC32; raise naming the first damage."""
        for n, layer in enumerate(self.manifest["layers"]):
            path = self.dir / layer["file"]
            if not path.exists():
                raise ShardStoreError(f"{path} is missing (layer {n}: all its shards)")
            data = path.read_bytes()
            in_file_order = sorted(((e.offset, i, bits, e) for i, versions in enumerate(self.entries[n])
                                    for bits, e in versions.items()))
            for _, i, bits, e in in_file_order:
                self._check(path, n, i, bits, e, data[e.offset:e.offset + e.nbytes])

    @staticmethod
    def _check(path: Path, layer: int, shard: int, bits: int, e: ShardEntry, blob: bytes) -> None:
        where = f"{path.name}: shard {shard} of layer {layer} at {bits} bits"
        if len(blob) != e.nbytes:
            raise ShardStoreError(f"{where} is truncated ({len(blob)} of {e.nbytes} bytes)")
        if zlib.crc32(blob) != e.crc32:
            raise ShardStoreError(f"{where} fails its CRC32 check (corrupted)")

    # -- reading

    def entry(self, layer: int, shard: int, bits: int) -> ShardEntry:
        if not 0 <= layer < self.cfg.num_layers or not 0 <= shard < self.cfg.num_heads:
            raise ValueError(f"no shard {shard} of layer {layer} in a {self.cfg.num_layers} x {self.cfg.num_heads} store")
        if bits not in self.entries[layer][shard]:
            raise ValueError(f"the store holds bitwidths {list(self.bitwidths)}, not {bits}")
        return self.entries[layer][shard][bits]

    def shard_nbytes(self, bits: int) -> int:
        """Bytes one shard takes at ``bits`` (layer 0's shard 0; all differ only by outlier counts)."""
        return self.entry(0, 0, bits).nbytes

    def layer_path(self, layer: int) -> Path:
        return self.dir / self.manifest["layers"][layer]["file"]

    def read_blob(self, layer: int, shard: int, bits: int) -> bytes:
        """One shard version's bytes, read from disk and checked."""
        e = self.entry(layer, shard, bits)
        path = self.layer_path(layer)
        with open(path, "rb", buffering=0) as handle:
            handle.seek(e.offset)
            blob = handle.read(e.nbytes)
        self._check(path, layer, shard, bits, e, blob)
        return blob

    def decode(self, blob: bytes, bits: int, out: np.ndarray | None = None, num_threads: int | None = None) -> np.ndarray:
        """A shard blob -> its flat float32 weights, written into ``out`` (the working buffer) if given."""
        return decode_blob(blob, self.shard_params, bits, out, num_threads)

    def split(self, flat: np.ndarray) -> dict[str, torch.Tensor]:
        """Flat shard weights -> its matrices (views of ``flat``)."""
        import torch

        out, start = {}, 0
        for key in SHARD_KEYS:
            shape = self.shapes[key]
            size = shape[0] * shape[1]
            out[key] = torch.from_numpy(flat[start:start + size]).view(*shape)   # a view: no copy
            start += size
        return out

    def shard_weights(self, layer: int, shard: int, bits: int) -> dict[str, torch.Tensor]:
        return self.split(self.decode(self.read_blob(layer, shard, bits), bits))

    def resident_state(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(self.dir / "resident.safetensors")

    def outlier_fraction(self) -> float:
        return float(np.mean([layer["outlier_fraction"] for layer in self.manifest["layers"]]))

    def model_with_bits(self, bits: np.ndarray) -> Encoder:
        """An :class:`Encoder` whose shard (n, i) holds the store's ``bits[n, i]`` version."""
        import torch

        from workbench.models.encoder import Encoder

        bits = np.asarray(bits)
        model = Encoder(self.cfg, self.manifest["num_classes"])
        model.load_state_dict(self.resident_state(), strict=False)
        with torch.no_grad():
            for n, layer in enumerate(model.layers):
                for i in range(self.cfg.num_heads):
                    set_shard(layer, i, self.shard_weights(n, i, int(bits[n, i])))
        return model.eval()


def set_shard(layer, i: int, weights: dict[str, torch.Tensor]) -> None:
    """Write shard i's matrices into a trainable :class:`EncoderLayer` (inverse of ``layer.shard``)."""
    dh, fs = layer.cfg.head_dim, layer.cfg.ffn_per_shard
    rows, cols = slice(i * dh, (i + 1) * dh), slice(i * fs, (i + 1) * fs)
    layer.query.weight[rows] = weights["q"]
    layer.key.weight[rows] = weights["k"]
    layer.value.weight[rows] = weights["v"]
    layer.attn_out.weight[:, rows] = weights["o"]
    layer.ffn1.weight[cols] = weights["ffn1"]
    layer.ffn2.weight[:, cols] = weights["ffn2"]
