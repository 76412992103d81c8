"""The public face of `workbench.kvcache`: DESIGN's names import from the package, each loaded on first use."""
import subprocess
import sys

import pytest

import workbench.kvcache as kvcache

DESIGN_NAMES = ("LLMService", "AppSession", "CtxStub", "ServiceConfig", "information_density", "assign_levels",
                "LCTRUQueue", "recompute_chunks", "plan_swap_recompute")


def _loaded_after(code: str) -> list[str]:
    """Which of torch and scipy a fresh interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"import sys\n{code}\n"
                          "print(','.join(m for m in ('torch', 'scipy') if m in sys.modules))"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [m for m in out.stdout.strip().split(",") if m]


def test_design_names_import_from_the_package():
    from workbench.kvcache import LLMService, assign_levels
    from workbench.kvcache.density import assign_levels as defined
    from workbench.kvcache.service import LLMService as service_class

    assert assign_levels is defined and LLMService is service_class
    for name in DESIGN_NAMES:
        value = getattr(kvcache, name)
        assert getattr(sys.modules[value.__module__], name) is value, name
    assert set(DESIGN_NAMES) <= set(dir(kvcache)) and set(DESIGN_NAMES) <= set(kvcache.__all__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'LLMServer'"):
        kvcache.LLMServer


@pytest.mark.integration
def test_the_package_alone_loads_neither_torch_nor_scipy():
    assert _loaded_after("import workbench.kvcache") == []
    assert _loaded_after("from workbench.kvcache import assign_levels, information_density, LCTRUQueue") == []


@pytest.mark.integration
def test_torch_loads_when_the_service_is_asked_for():
    assert "torch" in _loaded_after("from workbench.kvcache import LLMService")


@pytest.mark.integration
def test_the_configuration_and_the_commands_load_neither_torch_nor_scipy():
    """`workbench serve llms --help` and `workbench kvcache ...` read the presets and devices from the
    torch-free configuration module, not from copies of their own."""
    assert _loaded_after("import workbench.kvcache.config, workbench.kvcache.commands") == []
    from workbench.kvcache import commands, config

    parser = __import__("argparse").ArgumentParser()
    commands.configure_serve(parser)
    actions = {a.dest: a for a in parser._actions}
    assert tuple(actions["method"].choices) == tuple(config.PRESETS)
    assert tuple(actions["device"].choices) == config.SWAP_DEVICES == ("host", "mi14", "orin-nx", "jetson-tx2")
    assert kvcache.ServiceConfig is config.ServiceConfig
