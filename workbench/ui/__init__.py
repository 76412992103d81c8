"""ipywidgets apps: controls -> one engine call -> figures updated in place."""
from workbench.ui.overview import OverviewPanel

__all__ = ["OverviewPanel"]
