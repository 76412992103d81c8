"""ipywidgets apps: controls -> one engine call -> figures redrawn in place."""
from workbench.ui.elastic import ElasticPanel
from workbench.ui.gallery import Gallery
from workbench.ui.overview import OverviewPanel

__all__ = ["ElasticPanel", "Gallery", "OverviewPanel"]
