"""ipywidgets apps: controls -> one engine call -> figures redrawn."""
from workbench.ui.elastic import ElasticPanel
from workbench.ui.overview import OverviewPanel

__all__ = ["ElasticPanel", "OverviewPanel"]
