"""Serving the dashboards: the Voila command, its lifecycle, and Debian's chromium for driving pages.

One place for what `workbench dashboards`, `workbench bench browser` and the browser
tests share: Voila bound to 127.0.0.1 with idle kernels culled, started in a process
group of its own so stopping it stops its kernels too, and the chromium flags that keep
a headless browser from reaching outside the machine.
"""
from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workbench.resources import shipped

DASHBOARDS_DIR = shipped("dashboards")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic")


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that is free now."""
    from workbench.listen import check_tcp_port

    return check_tcp_port(0, host)


try:
    from jupyter_server.auth.identity import PasswordIdentityProvider
except ImportError:                    # serving needs jupyter_server; the engine does not
    PasswordIdentityProvider = object


class XsrfCookieIdentityProvider(PasswordIdentityProvider):
    """Jupyter's identity provider, plus the ``_xsrf`` cookie on every page Voila serves.

    Voila 0.5.13 renders its pages without touching tornado's ``xsrf_token``, so the
    browser never gets an ``_xsrf`` cookie, and the page's one POST (``voila/api/shutdown``,
    sent when the page closes, which reads the token from that cookie) is refused with
    "'_xsrf' argument missing from POST": a closed page's kernel then lives until it is
    culled. Reading ``handler.xsrf_token`` sets a random per-browser token, as Jupyter's
    own pages do; XSRF checks stay on.
    """

    async def get_user(self, handler):
        user = super().get_user(handler)
        if inspect.isawaitable(user):
            user = await user
        if user is not None and handler.request.method == "GET":
            handler.current_user = user          # what the handler's prepare() sets next; the token needs it
            handler.xsrf_token
        return user


TEMPLATE = "workbench"
TEMPLATE_ROOT = Path(__file__).resolve().parent / "share"
"""A Jupyter data folder holding ``voila/templates/workbench``: Voila's lab template without its
CDN links, so a page makes no request beyond 127.0.0.1 (on ``JUPYTER_PATH`` for the server)."""


def voila_env(extra: dict | None = None) -> dict:
    """The environment of a Voila server: this one, with the workbench template findable."""
    env = {**os.environ, **(extra or {})}
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(TEMPLATE_ROOT), env.get("JUPYTER_PATH", "")) if p)
    return env


KERNEL_CULL_S = 300
"""Seconds a served kernel may sit idle before the server stops it."""
KERNEL_TRANSPORT = "--KernelManager.transport=ipc"
"""Kernels talk to the server over Unix sockets in Jupyter's runtime folder, not TCP ports on 127.0.0.1. With TCP,
the server picks free ports and the kernel binds them later; a test or program that took one of them in between
killed the kernel at start ("Address already in use") and its page stayed at "Running ...". Sockets in a folder
of the user's own also keep other local users from reaching a kernel's channels."""
IOPUB_WAIT_S = 120
"""Seconds Voila waits for a cell's output after the kernel says the cell is done (nbclient's ``iopub_timeout``,
4 s by default). A page's output follows its widgets' state on the same channel, megabytes of it (plotly.js, the
figures); on a loaded host, pre-heating a kernel per page at once, reading them took longer than 4 s, and
Voila stopped listening before the output came: a blank page, whose widgets the browser still loaded."""


def voila_command(port: int, directory: Path = DASHBOARDS_DIR, preheat: bool = True) -> list[str]:
    """The Voila server command for the gallery: loopback only, kernels on Unix sockets (:data:`KERNEL_TRANSPORT`),
    idle kernels culled after 5 minutes, a cell's output awaited up to :data:`IOPUB_WAIT_S`.

    ``preheat`` keeps one started kernel per dashboard, its notebook already run, so a
    page shows its figures without waiting for a kernel to start and import the engine.
    """
    cmd = [sys.executable, "-m", "voila", str(directory), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
           "--Voila.port_retries=0", "--Voila.identity_provider_class=workbench.serving.XsrfCookieIdentityProvider",
           f"--template={TEMPLATE}",
           "--MappingKernelManager.cull_interval=60", f"--MappingKernelManager.cull_idle_timeout={KERNEL_CULL_S}",
           f"--VoilaExecutor.iopub_timeout={IOPUB_WAIT_S}", KERNEL_TRANSPORT]
    if preheat:
        cmd += ["--preheat_kernel=True", "--pool_size=1"]
    return cmd


def default_lab_root() -> Path:
    """The repository's notebooks/ folder (tutorials and labs) in a clone; the current folder otherwise."""
    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    return notebooks if notebooks.is_dir() else Path.cwd()


def lab_command(port: int, root: Path, token: str | None = None) -> list[str]:
    """JupyterLab on 127.0.0.1 over ``root`` (`workbench lab`, `make lab`); ``token=""`` turns the token off
    (tests), ``None`` keeps Jupyter's own random one (printed in the log with the URL)."""
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}", "--allow-root",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", KERNEL_TRANSPORT]
    if token is not None:
        cmd += [f"--IdentityProvider.token={token}"]
    return cmd


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for_http(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before answering {url}")
        if answers(url):
            return
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s")


def stop_group(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    """SIGTERM the process group of ``proc`` (server and kernels); SIGKILL what is left after ``timeout_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def voila_server(port: int | None = None, log_path: Path | None = None, preheat: bool = True,
                 env: dict | None = None, directory: Path = DASHBOARDS_DIR) -> Iterator[str]:
    """Serve the dashboards (or the pages in ``directory``) on 127.0.0.1 for the block's duration (a
    :class:`~workbench.workers.WorkerGroup` of one, its log at ``log_path``); yields the base URL."""
    from workbench.workers import WorkerGroup

    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    with WorkerGroup(voila_command(port, directory, preheat=preheat), name="voila", cwd=directory, env=voila_env(env),
                     logs=[log_path] if log_path else None, grace_s=20, ready_timeout_s=90,
                     ready=lambda worker: answers(f"{base}/voila/render/index.ipynb")):
        yield base


@contextmanager
def chromium() -> Iterator[object]:
    """Debian's chromium, headless, driven by Playwright (never a downloaded browser)."""
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        from workbench.errors import WorkbenchError

        raise WorkbenchError(f"{CHROMIUM} is missing: install Debian's chromium (`apt-get install chromium`)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True)
        try:
            yield browser
        finally:
            browser.close()
