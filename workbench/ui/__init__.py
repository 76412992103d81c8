"""ipywidgets apps: controls -> one engine call -> figures redrawn in place.

``from workbench.ui import ElasticPanel`` finds a registered page's panel by its class name
(``Dashboard.panel`` in :mod:`workbench.mechanisms`), imported only when asked for, so this
package names no mechanism.
"""
from __future__ import annotations


def _panels() -> dict[str, str]:
    from workbench.mechanisms import dashboards

    refs = [d.panel for d in dashboards() if d.panel] + ["workbench.ui.gallery:Gallery"]
    return {ref.partition(":")[2]: ref for ref in refs}


def __getattr__(name: str):
    refs = _panels() if not name.startswith("__") else {}
    if name not in refs:
        raise AttributeError(f"module 'workbench.ui' has no attribute {name!r}")
    from workbench.mechanisms import load

    return load(refs[name])


def __dir__() -> list[str]:
    return sorted(_panels())
