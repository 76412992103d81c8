"""The console check every browser test ends with lets through only Voila's own share-scope warnings."""
from tests.browser.conftest import console_problems

VOILA = ("warning", "Unsatisfied version 4.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module "
                    "@jupyterlab/rendermime (required ^4.5.10)")
OURS = ("warning", "Unsatisfied version 4.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module "
                   "@jupyterlab/notebook (required ^4.6.2)")


def test_only_voilas_known_share_scope_lines_pass():
    assert console_problems([VOILA, ("log", "anything"), ("debug", "Starting WebSocket")]) == []
    assert console_problems([OURS]) == [f"warning: {OURS[1]}"]           # a widget manager newer than Voila's core
    assert console_problems([("error", "Failed to load model class 'FigureModel'")]) == [
        "error: Failed to load model class 'FigureModel'"]
    assert console_problems([("pageerror", "TypeError: x is undefined")]) == ["pageerror: TypeError: x is undefined"]
