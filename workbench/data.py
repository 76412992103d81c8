"""Tasks and their data, read offline from installed packages, with recorded splits.

Two classification tasks stand in for the papers' GLUE benchmarks:

- ``sentiment``: 10,605 Rotten Tomatoes snippets rated -4..+4 by people (the
  source SST was built from); ratings with |r| >= 0.5 become negative/positive.
- ``bbc``: 2,225 BBC News articles in 5 topics.

Each task's train/dev/test split is recorded in ``data/splits/<task>.json`` (ids
per split plus a digest of the source rows), so every run and every machine uses
the same examples; a source that no longer matches its recorded split is an error.
The BBC test split also serves as held-out text for the decoder's perplexity.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from workbench.errors import UnknownNameError, WorkbenchError
from workbench.resources import shipped

SPLITS_DIR = shipped("splits")
SPLIT_NAMES = ("train", "dev", "test")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    title: str                 # for figures and `workbench info`
    labels: tuple[str, ...]
    max_length: int            # tokens kept per example (longer texts are truncated)
    fractions: tuple[float, float, float]  # train/dev/test


TASKS: dict[str, TaskSpec] = {
    "sentiment": TaskSpec("sentiment", "Movie-review sentiment (SST-2 analogue)", ("negative", "positive"), 64,
                          (0.8, 0.1, 0.1)),
    "bbc": TaskSpec("bbc", "BBC News topic", ("business", "entertainment", "politics", "sport", "tech"), 128,
                    (0.7, 0.15, 0.15)),
}


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise UnknownNameError("task", name, TASKS)
    return TASKS[name]


@dataclass(frozen=True)
class Split:
    ids: tuple[str, ...]
    texts: tuple[str, ...]
    labels: np.ndarray         # (n,) int64

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, n: int) -> "Split":
        """The first n examples (splits are already shuffled, so this is a random subset)."""
        return Split(self.ids[:n], self.texts[:n], self.labels[:n])

    def sample(self, n: int, seed: int) -> "Split":
        """``n`` examples drawn without replacement by ``seed`` (kept in split order)."""
        if not 0 < n <= len(self):
            raise ValueError(f"sample size must lie in 1..{len(self)}, got {n}")
        keep = np.sort(np.random.default_rng(seed).choice(len(self), n, replace=False))
        return Split(tuple(self.ids[i] for i in keep), tuple(self.texts[i] for i in keep), self.labels[keep])


@dataclass(frozen=True)
class TaskData:
    spec: TaskSpec
    train: Split
    dev: Split
    test: Split

    def split(self, name: str) -> Split:
        if name not in SPLIT_NAMES:
            raise UnknownNameError("split", name, SPLIT_NAMES)
        return getattr(self, name)


def _read_sentiment() -> dict[str, tuple[str, int]]:
    from workbench.assets import movie_reviews_file

    rows = {}
    for line in movie_reviews_file().read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        rid, rating, text = parts[0], float(parts[1]), parts[2].strip()
        if abs(rating) >= 0.5:
            rows[rid] = (text, int(rating > 0))
    return rows


def _read_bbc() -> dict[str, tuple[str, int]]:
    from workbench.assets import bbc_dir

    # the package names the folder "sports"; the label is "sport" as in the BBC data set
    folder_to_label = {"business": 0, "entertainment": 1, "politics": 2, "sport": 3, "sports": 3, "tech": 4}
    rows = {}
    for folder in sorted(bbc_dir().iterdir()):
        if folder.name not in folder_to_label:
            continue
        for path in sorted(folder.glob("*.txt")):
            text = path.read_bytes().decode("utf-8", errors="replace")
            text = " ".join(text.split())
            rows[f"{folder.name}/{path.stem}"] = (text, folder_to_label[folder.name])
    return rows


_READERS = {"sentiment": _read_sentiment, "bbc": _read_bbc}


def _digest(rows: dict[str, tuple[str, int]]) -> str:
    h = hashlib.sha256()
    for rid in sorted(rows):
        text, label = rows[rid]
        h.update(f"{rid}\t{label}\t{text}\n".encode())
    return h.hexdigest()


def make_split(rows: dict[str, tuple[str, int]], fractions, seed: int = 0) -> dict[str, list[str]]:
    """Stratified, seeded shuffle of the row ids into train/dev/test."""
    rng = np.random.default_rng(seed)
    out = {name: [] for name in SPLIT_NAMES}
    labels = sorted({label for _, label in rows.values()})
    for label in labels:
        ids = sorted(rid for rid, (_, lab) in rows.items() if lab == label)
        ids = [ids[i] for i in rng.permutation(len(ids))]
        n_train = round(fractions[0] * len(ids))
        n_dev = round(fractions[1] * len(ids))
        out["train"] += ids[:n_train]
        out["dev"] += ids[n_train:n_train + n_dev]
        out["test"] += ids[n_train + n_dev:]
    for name in SPLIT_NAMES:  # interleave the classes
        out[name] = [out[name][i] for i in rng.permutation(len(out[name]))]
    return out


def record_split(name: str, path: Path | None = None) -> Path:
    """Write the task's split file (done once by the maintainers; the file is shipped)."""
    spec = task_spec(name)
    rows = _READERS[name]()
    path = path or SPLITS_DIR / f"{name}.json"
    payload = {"task": name, "source_sha256": _digest(rows), "seed": 0, **make_split(rows, spec.fractions)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    return path


@lru_cache(maxsize=None)
def split_size(name: str, split: str) -> int:
    """Examples in a task's recorded ``split``, read from its split file alone (for the commands' bounds)."""
    return len(json.loads((SPLITS_DIR / f"{task_spec(name).name}.json").read_text())[split])


@lru_cache(maxsize=4)
def load_task(name: str) -> TaskData:
    """Read a task's examples from its package and its recorded split."""
    spec = task_spec(name)
    rows = _READERS[name]()
    split_file = SPLITS_DIR / f"{name}.json"
    if not split_file.exists():
        raise WorkbenchError(f"the recorded split {split_file} is missing; restore it from git")
    recorded = json.loads(split_file.read_text())
    if recorded.get("source_sha256") != _digest(rows):
        raise WorkbenchError(f"the {name} source data differs from the one {split_file} was recorded on; "
                             "check the installed package version")

    def build(ids):
        return Split(tuple(ids), tuple(rows[i][0] for i in ids), np.array([rows[i][1] for i in ids], dtype=np.int64))

    return TaskData(spec, *(build(recorded[s]) for s in SPLIT_NAMES))


def heldout_text(num_articles: int = 8) -> str:
    """BBC test-split articles joined, for the decoder's perplexity (never trained on)."""
    return "\n\n".join(load_task("bbc").test.texts[:num_articles])
