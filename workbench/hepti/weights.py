"""What a Hepti rank holds: only its slice of every layer's weights, and the memory that slice really takes.

The parent writes the model's weights into a file once per process and model (:func:`stored_weights`: the
storage every device loads from; a later run finds it there, as a device keeps its model on its storage). A rank memory-maps it, so the whole model is never resident: at each decision it cuts
the slice its split needs out of the mapping (copies of those rows and columns only) and drops the last
split's slice first (:class:`SliceStore`). What a rank holds per mode, for every layer (Hepti keeps the
weights of every layer resident):

- ``ws``: Q, K, V for its heads; the output projection and both FFN matrices whole.
- ``1d``: Q, K, V for its heads and the output projection's columns that read them; its FFN columns of W_1
  and the rows of W_2 that read them.
- ``2d``: Q, K, V for its heads; W_O's block (its column group's rows x its row group's heads), W_1's block
  (its column group's FFN columns x its row group's features) and W_2's transpose block.
- ``serial``: the primary, the whole layer. Biases and LayerNorms are small and kept whole.

The primary also holds the input's embeddings and the classification head (:class:`PrimaryEnds`): it embeds
the request and hands the input to the others. Resident memory is what cutting the slice added to the
process's anonymous resident set (``RssAnon``; the mapped file's pages are not anonymous): the weights as
the operating system counts them, allocator and all, not a sum of tensor sizes.
"""
from __future__ import annotations

import gc
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

from workbench.models.config import EncoderConfig

LAYER_PARTS = ("query", "key", "value", "attn_out", "ln1", "ffn1", "ffn2", "ln2")


def write_weights(model: str, seed: int, directory: str | Path) -> Path:
    """The model's weights as every device stores them: its config, each layer's tensors and the rest
    (embeddings, head), written whole (a temporary file renamed over)."""
    from workbench.models.split import PartitionModel

    net = PartitionModel(model, seed).net
    state = net.state_dict()
    payload = {"cfg": asdict(net.cfg), "layers": {k: v for k, v in state.items() if k.startswith("layers.")},
               "rest": {k: v for k, v in state.items() if not k.startswith("layers.")}}
    path = Path(directory) / f"{model}-seed{seed}.pt"
    torch.save(payload, str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)
    return path


_STORE: dict = {}


def stored_weights(model: str, seed: int = 0) -> Path:
    """The model's file (:func:`write_weights`), written once per process into a folder removed at exit, and
    written again if it is gone."""
    import atexit
    import shutil
    import tempfile

    if "dir" not in _STORE or not Path(_STORE["dir"]).is_dir():
        _STORE["dir"] = tempfile.mkdtemp(prefix="hepti-weights-")
        atexit.register(shutil.rmtree, _STORE["dir"], True)
    path = Path(_STORE["dir"]) / f"{model}-seed{seed}.pt"
    return path if path.is_file() else write_weights(model, seed, _STORE["dir"])


def resident_anon_bytes() -> int:
    """This process's anonymous resident memory (``RssAnon`` of /proc/self/status), in bytes; 0 where the
    kernel does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _proj(weight=None, bias=None) -> SimpleNamespace:
    return SimpleNamespace(weight=weight, bias=bias)


@dataclass
class LayerSlice:
    """One layer as a rank holds it: the attributes the layer functions read, each its compact slice."""
    cfg: EncoderConfig
    query: SimpleNamespace
    key: SimpleNamespace
    value: SimpleNamespace
    attn_out: SimpleNamespace
    ln1: SimpleNamespace
    ffn1: SimpleNamespace
    ffn2: SimpleNamespace
    ln2: SimpleNamespace

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for part in LAYER_PARTS
                   for t in vars(getattr(self, part)).values() if t is not None)


def _starts(values, members) -> dict[int, int]:
    out, acc = {}, 0
    for m in members:
        out[m] = acc
        acc += values[m]
    return out


class SliceStore:
    """A rank's weights: the model's file memory-mapped, and the slice of every layer its current split needs."""

    def __init__(self, path: str | Path):
        data = torch.load(str(path), mmap=True, weights_only=True)
        self.cfg = EncoderConfig(**data["cfg"])
        self.rest = data["rest"]
        self._mapped = data["layers"]
        self.layers: list[LayerSlice] = []
        self.key = None
        self.resident = 0

    def _w(self, layer: int, part: str, kind: str) -> torch.Tensor:
        return self._mapped[f"layers.{layer}.{part}.{kind}"]

    def hold(self, split, rank: int) -> None:
        """Cut this rank's slice of every layer for ``split`` (a :class:`~workbench.hepti.run.LayerSplit`),
        freeing the previous split's first; nothing is cut again while the split stays."""
        key = (rank, split.mode, split.participants, split.heads, split.rows, split.ffn, split.grid, split.row_heads,
               split.row_dims, split.col_dims, split.col_ffn)
        if key == self.key:
            return
        self.layers, self.key = [], None
        gc.collect()
        before = resident_anon_bytes()
        self.layers = [self._cut(split, rank, n) for n in range(self.cfg.num_layers)]
        self.key = key
        self.resident = max(0, resident_anon_bytes() - before)

    def _cut(self, split, rank: int, n: int) -> LayerSlice:
        dh = self.cfg.head_dim
        w = lambda part, kind="weight": self._w(n, part, kind)
        whole = lambda part: _proj(w(part).clone(), w(part, "bias").clone())
        norms = {"ln1": whole("ln1"), "ln2": whole("ln2")}
        if rank not in split.participants:
            empty = _proj()
            return LayerSlice(self.cfg, empty, empty, empty, _proj(bias=w("attn_out", "bias").clone()), norms["ln1"],
                              empty, _proj(bias=w("ffn2", "bias").clone()), norms["ln2"])
        if split.mode == "serial":
            return LayerSlice(self.cfg, *(whole(p) for p in ("query", "key", "value", "attn_out")), norms["ln1"],
                              whole("ffn1"), whole("ffn2"), norms["ln2"])
        start = _starts(split.heads, split.participants)[rank]
        rows = slice(start * dh, (start + split.heads[rank]) * dh)
        qkv = [_proj(w(p)[rows].clone(), w(p, "bias")[rows].clone()) for p in ("query", "key", "value")]
        if split.mode == "ws":
            return LayerSlice(self.cfg, *qkv, whole("attn_out"), norms["ln1"], whole("ffn1"), whole("ffn2"), norms["ln2"])
        if split.mode == "1d":
            c0 = _starts(split.ffn, split.participants)[rank]
            cols = slice(c0, c0 + split.ffn[rank])
            return LayerSlice(self.cfg, *qkv, _proj(w("attn_out")[:, rows].clone(), w("attn_out", "bias").clone()),
                              norms["ln1"], _proj(w("ffn1")[cols].clone(), w("ffn1", "bias")[cols].clone()),
                              _proj(w("ffn2")[:, cols].clone(), w("ffn2", "bias").clone()), norms["ln2"])
        i, j = split.position(rank)
        at = lambda sizes, k: sum(sizes[:k])
        head_block = slice(at(split.row_heads, i) * dh, (at(split.row_heads, i) + split.row_heads[i]) * dh)
        N_j = slice(at(split.col_dims, j), at(split.col_dims, j) + split.col_dims[j])
        D_i = slice(at(split.row_dims, i), at(split.row_dims, i) + split.row_dims[i])
        F_j = slice(at(split.col_ffn, j), at(split.col_ffn, j) + split.col_ffn[j])
        return LayerSlice(self.cfg, *qkv, _proj(w("attn_out")[N_j, head_block].clone(), w("attn_out", "bias").clone()),
                          norms["ln1"], _proj(w("ffn1")[F_j, D_i].clone(), w("ffn1", "bias")[F_j].clone()),
                          _proj(w("ffn2")[D_i, F_j].clone(), w("ffn2", "bias").clone()), norms["ln2"])

    @property
    def held_bytes(self) -> int:
        """The bytes of every layer's slice this rank holds (the tensors' sizes)."""
        return sum(layer.nbytes for layer in self.layers)

    def resident_bytes(self) -> int:
        """What the slice took as the operating system counts it: the anonymous resident memory its cutting added."""
        return self.resident


class PrimaryEnds:
    """The primary's part beyond the layers: the request's embedding and the classification head."""

    def __init__(self, store: SliceStore, num_classes: int):
        from workbench.models.encoder import Encoder

        self.net = Encoder(replace(store.cfg, num_layers=0), num_classes).eval()
        self.net.load_state_dict({k: v.clone() for k, v in store.rest.items()})

    def token_ids(self, seq_len: int, seed: int) -> torch.Tensor:
        from workbench.models.split import token_ids

        return token_ids(self.net.cfg.vocab_size, seq_len, seed)

    @torch.no_grad()
    def inputs(self, ids: torch.Tensor) -> dict:
        return {"x": self.net.embed(ids[None]), "mask": torch.ones(1, ids.shape[0]), "bias": None}

    @torch.no_grad()
    def logits(self, x: torch.Tensor, inputs: dict) -> torch.Tensor:
        return self.net.classify(x, inputs["mask"])[0]
