"""The elastic tutorial opened in JupyterLab (as `make lab` serves it), every cell run from the page:
its Plotly figures and the dashboard panel's widgets render, seen at a real size."""
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.browser.conftest import ARTIFACTS, assert_figures_visible, assert_seen
from workbench.serving import free_port, lab_command, stop_group, wait_for_http

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
TUTORIAL = "elastic_pipelining.ipynb"
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def jupyterlab(prepared, tmp_path_factory):
    """JupyterLab on 127.0.0.1 over a copy of notebooks/ (running cells must not rewrite the repository's)."""
    root = tmp_path_factory.mktemp("lab")
    subprocess.run(["cp", "-r", f"{NOTEBOOKS}/.", str(root)], check=True)
    settings = tmp_path_factory.mktemp("lab-settings")       # no "news" prompt drawn over the notebook
    news = settings / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        lab_command(port, root, token="") + ["--LabApp.expose_app_in_browser=True"], cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "WORKBENCH_PRESET": os.environ.get("WORKBENCH_PRESET", "quick"),
             "JUPYTER_CONFIG_DIR": str(root / ".jupyter-config"), "JUPYTERLAB_SETTINGS_DIR": str(settings)})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/lab", proc, timeout_s=120)
        yield base
    finally:
        stop_group(proc)
        log.close()


def test_tutorial_runs_in_jupyterlab_with_figures_and_widgets(jupyterlab, page):
    page.goto(f"{jupyterlab}/lab/tree/{TUTORIAL}", timeout=180_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext "
                           "&& window.jupyterapp.shell.currentWidget.sessionContext.session", timeout=180_000)
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                           ".connectionStatus === 'connected'", timeout=180_000)
    started = time.perf_counter()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # Done when every code cell has an execution count and the kernel is idle again.
    page.wait_for_function("""() => {
        const nb = window.jupyterapp.shell.currentWidget;
        const cells = nb.content.model.cells;
        for (let i = 0; i < cells.length; i++) {
            const cell = cells.get(i);
            if (cell.type === 'code' && !cell.executionCount) return false;
        }
        return nb.sessionContext.session.kernel.status === 'idle';
    }""", timeout=RUN_TIMEOUT_S * 1000, polling=1000)
    print(f"\nall cells ran in JupyterLab in {time.perf_counter() - started:.0f} s")

    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [e.inner_text() for e in errors.all() if "Traceback" in e.inner_text()]
    assert tracebacks == [], tracebacks[0][:2000] if tracebacks else ""

    # JupyterLab draws only the cells near the view: scroll to each cell with a figure, then look at it.
    with_figures = page.evaluate("""() => {
        const cells = window.jupyterapp.shell.currentWidget.content.model.cells, found = [];
        for (let i = 0; i < cells.length; i++) {
            const outputs = cells.get(i).type === 'code' ? cells.get(i).outputs.toJSON() : [];
            if (outputs.some(o => o.data && o.data['application/vnd.plotly.v1+json'])) found.push(i);
        }
        return found;
    }""")
    assert len(with_figures) == 4, f"cells with a Plotly figure: {with_figures}"
    for index in with_figures:
        page.evaluate("i => window.jupyterapp.shell.currentWidget.content.scrollToItem(i, 'start')", index)
        figure = page.locator(f".jp-Cell[data-windowed-list-index='{index}'] .js-plotly-plot").first
        figure.locator(".main-svg").first.wait_for(timeout=60_000)
        assert_seen(figure, f"the figure of cell {index}")

    assert_figures_visible(page, ["importance", "candidates", "aib", "gantt", "memory"], timeout_ms=120_000)
    slider = page.locator(".widget-slider", has=page.locator("label", has_text="Target (ms)"))
    slider.scroll_into_view_if_needed()
    assert slider.is_visible()
    assert "Submodel" in page.locator(".wb-submodel").inner_text()
